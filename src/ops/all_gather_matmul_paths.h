// What the paths of all_gather_matmul share (all_gather_matmul.cpp: the op, its protocol and the
// split and fallback paths; all_gather_matmul_native.cpp: the native path).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ops/context.h"
#include "ops/matmul_common.h"

namespace asynctp::detail::agmm {

constexpr int kBarrierChannel = 0;  // see NOTE [signal pads and channels]

struct AgMmCall {
  const char* op;
  Tensor a_shard;
  Tensor a_scale;  // undefined unless scaled
  std::span<const Tensor> bs;
  std::span<const Tensor> b_scales;
  std::span<const Tensor> outs;
  Tensor a_out;
  int g = 0;
  bool scaled = false;
  size_t push_piece_bytes = 0;  // the native path's (the call's option, else the context's)
  // all_gather_matmul_swiglu: one B [K, 2N] (gate | up), outs[0] [.., N] = silu(g) * u, and
  // pre_out [.., 2N] the products (or undefined).
  bool swiglu = false;
  Tensor pre_out;
  // The call's option (AllGatherMatmulOptions::fast_accum): empty, one value, or one per B.
  std::vector<bool> fast_accum;

  bool rowwise() const { return scaled && is_rowwise_scale(a_scale, a_shard); }
  bool k_gather() const { return g == a_shard.dim() - 1; }
  Tensor b_scale(size_t i) const { return scaled ? b_scales[i] : Tensor(); }
  // Whether the GEMMs of Bs[i] may accumulate fast.
  bool fast(size_t i) const {
    if (fast_accum.empty()) return false;
    return fast_accum.size() == 1 ? fast_accum[0] : fast_accum[i];
  }
  // The GEMM of one chunk (or all) of the gathered A with Bs[i]: d = a @ Bs[i], scaled for the
  // scaled form (a_scale: the rows' scale view matching a, or the tensor-wise scale).
  GemmArgs product(size_t i, const Tensor& a, const Tensor& d, const Tensor& a_scale) const {
    return {.a = a,
            .b = bs[i],
            .d = d,
            .a_scale = a_scale,
            .b_scale = b_scale(i),
            .fast_accum = scaled && fast(i)};
  }
};

// ---- The push buffers (see the file comment) ----------------------------------------------------

constexpr int kCapturedReadyChannel = 1;  // to 1 + kMaxPushPieces - 1: see NOTE [signal pads and
constexpr int kEagerReadyChannel = 8;     // to 8 + kMaxPushPieces - 1:  channels]
static_assert(kCapturedReadyChannel + kMaxPushPieces <= kEagerReadyChannel &&
              kEagerReadyChannel + kMaxPushPieces <= kNumChannels);

// One buffer of the push workspace: [ws shard slots | ws scale slots] (row-wise scales), each
// part 256-byte aligned.
inline size_t push_buffer_bytes(int ws, size_t shard_bytes, size_t scale_bytes) {
  return align_up(ws * shard_bytes, 256) + align_up(ws * scale_bytes, 256);
}

// The push workspace both overlapped paths need per rank (kOpBuffers buffers).
inline size_t push_symm_bytes(int ws, size_t shard_bytes, size_t scale_bytes) {
  return op_buffers_bytes(push_buffer_bytes(ws, shard_bytes, scale_bytes));
}

// This op's buffer of the push workspace (OpBuffer) and its ready flags.
struct PushBuffer : OpBuffer {
  PushBuffer(OpContext& ctx, size_t shard_bytes, size_t scale_bytes)
      : OpBuffer(ctx, ctx.push_workspace(),
                 push_buffer_bytes(ctx.world_size(), shard_bytes, scale_bytes)),
        ws(ctx.world_size()),
        shard_bytes(shard_bytes),
        scale_bytes(scale_bytes),
        channel(captured ? kCapturedReadyChannel : kEagerReadyChannel) {}

  // Slot p (rank p's shard) of `owner`'s buffer, viewed as `shape`.
  Tensor slot(int owner, int p, const Dims& shape, DType dtype) const {
    return sm.buffer(owner, shape, dtype, offset + p * shard_bytes);
  }
  // Rank p's row-wise scale in `owner`'s buffer.
  Tensor scale_slot(int owner, int p, const Dims& shape) const {
    return sm.buffer(owner, shape, DType::kF32,
                     offset + align_up(ws * shard_bytes, 256) + p * scale_bytes);
  }
  // `owner`'s flags: piece q of chunk p is flag q * ws + p.
  uint32_t* ready(int owner) const { return sm.signal_pad_ptr(owner) + channel * ws; }

  int ws;
  size_t shard_bytes, scale_bytes;
  int channel;
};

// The native path (all_gather_matmul_native.cpp).
struct NativePlan {
  int64_t rows = 0;  // rows of the shard as a matrix
  int64_t k = 0;
};

// The native plan where the native GEMM can take the call's shapes, else nullopt and why.
std::optional<NativePlan> native_plan(const AgMmCall& c, std::string* why);
// The native GEMM's arguments for a (the gathered A), b and out, chunked by the shards; with
// the call's SwiGLU epilogue, pre (the call's pre_out or a descriptor of it) as its pre_out. The
// scaled form: a_scale (the gathered row-wise scale [m], or the tensor-wise one) and b_scale (B's).
ChunkedGemmArgs native_args(OpContext& ctx, const NativePlan& plan, const AgMmCall& c,
                            const Tensor& a, const Tensor& b, const Tensor& out, const Tensor& pre,
                            const Tensor& a_scale = Tensor(), const Tensor& b_scale = Tensor());
// The gathered row-wise scale's descriptor [m] of the GEMM (scale slots, contiguous in rank
// order), or the tensor-wise scale; undefined unless scaled.
Tensor native_a_scale(const AgMmCall& c, const Tensor& gathered_scales);
void run_native(OpContext& ctx, const AgMmCall& c, const NativePlan& plan);

}  // namespace asynctp::detail::agmm
