// What the paths of matmul_reduce_scatter share (matmul_reduce_scatter.cpp: the op, its protocol
// and the split and fallback paths; matmul_reduce_scatter_native.cpp: the native path).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ops/context.h"
#include "ops/fused_matmul.h"
#include "ops/matmul_common.h"

namespace asynctp::detail::mmrs {

constexpr int kBarrierChannel = 0;
constexpr int kLandedChannel = 5;       // see NOTE [signal pads and channels]
constexpr int kEagerLandedChannel = 6;  // same
// The native path's landed flags, one channel per piece (up to kMaxPushPieces).
constexpr int kEagerNativeLandedChannel = 12;  // same
constexpr int kNativeLandedChannel = 16;       // same
static_assert(kEagerLandedChannel < kNumChannels);
static_assert(kEagerNativeLandedChannel + kMaxPushPieces <= kNativeLandedChannel &&
              kNativeLandedChannel + kMaxPushPieces <= kNumChannels);

// Pieces a chunk at most where the native path pushes inline (ContextOptions::push_inline_min_k).
constexpr int kInlinePushPieces = 2;

struct MmRsCall {
  const char* op;
  std::vector<Tensor> as;  // one or more products sum_i as[i] @ bs[i]
  std::vector<Tensor> bs;
  Tensor a_scale;  // undefined unless scaled (scaled calls have exactly one pair)
  Tensor b_scale;
  Tensor out;
  int g = 0;
  bool scaled = false;
  bool fast_accum = false;  // the call's option (MatmulReduceScatterOptions::fast_accum)

  const Tensor& a() const { return as[0]; }
  int64_t n() const { return bs[0].size(1); }
  bool rowwise() const { return scaled && is_rowwise_scale(a_scale, a()); }
  bool colwise() const { return scaled && b_scale.numel() != 1; }
  bool last_dim() const { return g == a().dim() - 1; }
};

inline size_t chunk_bytes(const Tensor& out) {
  return static_cast<size_t>(out.numel()) * out.element_size();
}

// The shared workspace both overlapped paths need per rank (kOpBuffers sets of ws chunks).
inline size_t slots_symm_bytes(int ws, size_t chunk_bytes) {
  return op_buffers_bytes(ws * chunk_bytes);
}

// The split path's staging: the ws - 1 chunks computed for peers, before they are pushed.
inline Dims staging_shape(const Dims& chunk, int ws) {
  Dims shape = chunk;
  shape.insert(0, std::max(ws - 1, 1));
  return shape;
}

// The native path's done counters: one per piece of every chunk.
inline size_t native_done_flags(int ws, const RsPieces& pieces) {
  return static_cast<size_t>(ws) * pieces.count;
}

struct Slots : OpBuffer {
  Slots(OpContext& ctx, const Tensor& out)
      : OpBuffer(ctx, ctx.workspace(), ctx.world_size() * chunk_bytes(out)),
        chunk(out.shape()),
        dtype(out.dtype()),
        bytes(chunk_bytes(out)) {}
  Tensor at(int owner, int src) const {
    return sm.buffer(owner, chunk, dtype, offset + src * bytes);
  }

  Dims chunk;
  DType dtype;
  size_t bytes;
};

// The native path (matmul_reduce_scatter_native.cpp).
// Whether its GEMM can push the peers' rows of a product with n columns itself: there are peers,
// up to kMaxPushChunks ranks, and rows TMA can store into the slots (n % 8 == 0).
inline bool kernel_push_possible(const OpContext& ctx, int64_t n) {
  const int ws = ctx.world_size();
  return ws > 1 && ws <= kernels::NativeGemmParams::kMaxPushChunks && n % 8 == 0;
}
// Whether it may, as ContextOptions::kernel_push allows (not 0).
inline bool kernel_push_allowed(const OpContext& ctx, int64_t n) {
  return ctx.options().kernel_push != KernelPush::kOff && kernel_push_possible(ctx, n);
}

struct NativeRsPlan {
  int64_t m = 0, k = 0, n = 0;
};

// The native plan where the native GEMM can run the call (a0: As[0], contiguous), pushing the
// peers' rows itself where `kernel_push`, else nullopt and why.
std::optional<NativeRsPlan> native_rs_check(OpContext& ctx, const MmRsCall& c, const Tensor& a0,
                                            ReduceOp reduce_op, bool kernel_push, std::string* why);
// The native path's routes for a call (ContextOptions::kernel_push): the GEMM pushing where
// allowed and it can, copy streams pushing unless the GEMM must and can (both under auto, for
// the dispatcher to measure). `plan` where either can run, else nullopt and *why.
struct NativeRsRoutes {
  std::optional<NativeRsPlan> plan;
  bool copies = false;
  bool kernel_pushes = false;
};
NativeRsRoutes native_rs_routes(OpContext& ctx, const MmRsCall& c, const Tensor& a0,
                                ReduceOp reduce_op, std::string* why);
// a: As[0], contiguous; a_scale: the call's A scale, contiguous where row-wise (scaled calls).
// kernel_push: the GEMM pushes the peers' rows (native_rs_check passed with it), else copy streams.
void run_native(OpContext& ctx, const MmRsCall& c, const Tensor& a, const Tensor& a_scale,
                const NativeRsPlan& plan, bool kernel_push,
                const MatmulReduceScatterOptions& options);

}  // namespace asynctp::detail::mmrs
