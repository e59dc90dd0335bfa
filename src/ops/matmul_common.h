// Internals shared by the fused ops: GEMM operand views, input checks, path choice.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "ops/context.h"
#include "ops/dispatch.h"

namespace asynctp::detail {

// t viewed as [batch, m, last] where batch = product of dims [0, split) and m = product of dims
// [split, rank-1); nullopt if t's strides do not allow that view.
std::optional<Tensor> as_gemm_3d(const Tensor& t, int split);

// Like as_gemm_3d, but throws (naming `what`) instead of returning nullopt.
Tensor gemm_view(const Tensor& t, int split, const char* what);

struct PathDecision {
  Path path;
  std::string reason;
  bool requested = false;  // the caller forced this path
  bool measured = false;   // the dispatcher measured it fastest
  // Whether every later call of the same problem takes the same path (ops/call_memo.h): not a
  // capture's provisional pick of an unmeasured problem.
  bool settled = true;
  // The native matmul_reduce_scatter's GEMM pushes the peers' rows itself (Route::kernel_push).
  bool kernel_push = false;
  // Whether a fallback is worth a warning: neither asked for nor chosen for its speed.
  bool warns() const { return path == Path::kFallback && !requested && !measured; }
};

// What choose_path needs to know about one call.
struct CallPaths {
  std::string native_unsupported;  // why the native path cannot run this call ("" when it can)
  size_t native_symm_bytes = 0;    // symmetric workspace the native path needs per rank
  // The native path's routes, where it can run: with copy streams pushing (the native
  // matmul_reduce_scatter) or as the op's only way (the others), and with the GEMM pushing
  // (ContextOptions::kernel_push). The first of them is taken where nothing is measured.
  bool native_copies = true;
  bool native_kernel_pushes = false;
  std::string key;                 // the problem, for the dispatcher
  std::function<void(Route)> run;  // runs the op any way (the dispatcher measures with it)
};

// The colour of an op's NVTX range on `path` (device/nvtx.h).
uint32_t path_color(Path path);
// The shapes of `ts`, space-separated ("[16, 4] [16, 6]"): the operands in an NVTX range's text.
std::string shapes_text(std::span<const Tensor> ts);
// How a call's float8 operands are scaled, in an NVTX range's text: "" where they are not
// (unscaled ops), else ", row-wise scales" or ", tensor-wise scales" (A's).
std::string_view scales_text(bool scaled, bool rowwise);

// The caller's choice where possible. Under kAuto, on a backend that times paths
// (Backend::times_paths), the dispatcher's pick among the routes that can run (native by each of
// its routes, split, fallback: the fallback always can); elsewhere native (its first route) where
// it can run, else split, else the fallback with the reason. Throws if the caller insisted on a
// path that cannot run, saying why.
PathDecision choose_path(OpContext& ctx, std::optional<PathChoice> requested, size_t symm_bytes,
                         const char* op, const CallPaths& paths);

// The paths a call may take, for reserving their buffers: the requested one, or under kAuto every
// one choose_path could pick (an overlapped path where its `symm_bytes` fit the workspace; the
// fallback where they do not, or where the dispatcher measures it beside them). The native and
// split paths need the same symmetric bytes, so `overlapped` stands for both.
struct PossiblePaths {
  bool overlapped = false;
  bool native = false;  // the native path (under kAuto or kNative: where the call allows it)
  bool fallback = false;
};
PossiblePaths possible_paths(OpContext& ctx, std::optional<PathChoice> requested,
                             size_t symm_bytes);

// "op|MxNxK|in dtype->out dtype|B row/col|wsN|device", then "|variant" unless it is empty: a
// dispatcher key. m x n x k: the whole product (every rank's rows; n over every B; k summed over
// several products); the variant names what else sets the paths' times (a gather or scatter dim
// other than 0, several Bs or products, a returned A, ...).
std::string problem_key(OpContext& ctx, const char* op, int64_t m, int64_t n, int64_t k, DType in,
                        DType out, const Tensor& b, const std::string& variant);

// A tensor of `t`'s shape, strides and dtype at a 256-byte aligned dummy address: for asking
// Backend::native_gemm_unsupported about shapes and strides before the real buffers exist. An
// undefined `t` (an absent optional operand) gives an undefined tensor.
Tensor shape_only(const Tensor& t);
// A contiguous tensor of `shape` at that dummy address (reserve's descriptors of buffers).
Tensor shape_only_contiguous(DType dtype, const Dims& shape, Device device);
// A contiguous [rows, cols] matrix at that dummy address.
Tensor shape_only_matrix(DType dtype, int64_t rows, int64_t cols, Device device);

// A tensor's data's offset from the last 16-byte boundary (0 for an undefined tensor): all that
// the native kernel's alignment checks read of a pointer (16 bytes for TMA, 8 or 4 for some
// outputs and the scales).
int64_t offset_from_16_bytes(const Tensor& t);
// Whether a defined tensor's data lies off a 16-byte boundary, where the native kernel's TMA
// cannot read or write it: such a call keeps its path choices apart from the aligned call's.
bool off_16_bytes(const Tensor& t);
bool off_16_bytes(std::span<const Tensor> ts);

void check_on_device(OpContext& ctx, const Tensor& t, const char* op, const std::string& name);
void check_gemm_dtype(const Tensor& t, const char* op, const std::string& name, bool scaled);
void check_out_dtype(const Tensor& t, const char* op, const std::string& name);
// Row-wise: `like`'s shape with the last dim 1 (even when that is one element: a one-row shard's
// row-wise scale is still its own). Anything else with one element is tensor-wise.
bool is_rowwise_scale(const Tensor& scale, const Tensor& like);
// a_scale: one element, or `like`'s shape with the last dim 1. b_scale: one element or [1, n].
void check_a_scale(const Tensor& scale, const Tensor& like, const char* op,
                   const std::string& name);
void check_b_scale(const Tensor& scale, int64_t n, const char* op, const std::string& name);

// How the native all_gather_matmul pushes a shard of `rows` rows and `bytes` bytes: `count`
// pieces of `rows` rows each (the last may be shorter), each at least piece_bytes (see
// ContextOptions::push_piece_bytes) and a multiple of 128 rows (the native GEMM's tile height:
// where the chunks start on the tile grid, a tile waits for one piece; elsewhere tiles straddle
// pieces and wait for each), at most kMaxPushPieces. One piece where that leaves no
// room (piece_bytes 0, small or short shards).
inline constexpr int kMaxPushPieces = 4;

// Why the native path does not take a float8 call without fast accumulation: the native GEMM
// accumulates float8 products in the tensor cores' fast mode only (no promotion into separate f32
// registers, which cuBLASLt does without use_fast_accum).
inline constexpr const char* kNativeFloat8NeedsFastAccum =
    "float8 without fast accumulation (the native GEMM accumulates float8 products in the tensor "
    "cores' fast mode only: pass use_fast_accum / fast_accum to take it)";
struct PushPieces {
  int count = 1;
  int64_t rows = 0;
};
PushPieces push_pieces(int64_t rows, size_t bytes, size_t piece_bytes);

// How the native matmul_reduce_scatter pushes a finished chunk of `n` columns and `bytes`
// bytes: `count` pieces of `cols` columns each (the last may be narrower; cols 0: one piece of
// all n), a multiple of 256 (the native GEMM's tile width, so a tile counts in one piece), at
// least kRsPieceBytes a piece on average, at most max_pieces (<= kMaxPushPieces). By columns, not
// rows: the GEMM's walk may then take up to 16 m-tiles of the chunk per group (see
// kernels/native/schedule.h on group heights) and still finish the pieces one after the other,
// within each group. (A chunk of more than 16 m-tiles finishes all its pieces in its last group:
// its pushes come nearer the chunk's end than with groups of the whole chunk. Of the anchor shapes
// only those at ws 2 have such chunks, and there the native path got faster with groups of 16.)
inline constexpr size_t kRsPieceBytes = size_t{4} << 20;
struct RsPieces {
  int count = 1;
  int64_t cols = 0;
};
RsPieces native_rs_pieces(int64_t n, size_t bytes, int max_pieces = kMaxPushPieces);

// The native matmul_reduce_scatter's part of its GEMM's arguments (args: the plain GEMM, with
// chunk_rows): stored tiles counted in `done` per piece of `pieces` (done[c * count + q]: piece q
// of chunk c); the own chunk (`rank`, of
// `ws`) reduced with `parts` ([ws, rows, n], part s = rank s's partial) into `out` ([rows, n])
// once flags[q * ws + s] is up for `value` for every peer s (a timeout names channel + q).
void set_native_rs_reduction(ChunkedGemmArgs& args, int rank, int ws, const RsPieces& pieces,
                             const Tensor& parts, const Tensor& out, uint32_t* done,
                             const uint32_t* flags, uint32_t value, int channel, bool avg);

inline size_t align_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

// The buffers of the overlapped ops' protocol (see all_gather_matmul.cpp): a symmetric workspace
// of kOpBuffers equal parts, which are thirds of the whole allocation, not of one op's need (ops
// of other shapes in between must not move them: op e+1's part may not overlap op e's). An eager
// op takes op number e (SymmetricMemory::next_use, the same on every rank) and part e % 2; an op
// captured into a CUDA graph takes part 2, and raises its 0/1 flags to 1.
inline constexpr int kOpBuffers = 3;
inline constexpr int kCapturedBuffer = 2;

// The workspace for parts of `per_buffer` bytes each (256-byte aligned).
inline size_t op_buffers_bytes(size_t per_buffer) {
  return kOpBuffers * align_up(per_buffer, 256);
}

struct OpBuffer {
  OpBuffer(OpContext& ctx, SymmWorkspace& workspace, size_t per_buffer)
      : sm(workspace.get(op_buffers_bytes(per_buffer), ctx.stream())),
        captured(ctx.capturing()),
        number(captured ? 1 : sm.next_use()),
        offset((captured ? kCapturedBuffer : number % 2) * (sm.size() / kOpBuffers / 256 * 256)) {}

  SymmetricMemory& sm;
  bool captured;
  uint32_t number;  // the value flags are raised to: the op's number, or 1 when captured
  size_t offset;    // of this op's part, in every rank's allocation
};

}  // namespace asynctp::detail
