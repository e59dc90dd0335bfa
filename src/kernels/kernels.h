// Host launchers of the project's CUDA kernels. Each enqueues on the given stream and returns the
// launch status (callers wrap it in ASYNCTP_CUDA_CHECK). Plain C++: includable without nvcc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "core/scalar_types.h"

namespace asynctp::kernels {

// A strided tensor as the kernels see it.
struct KTensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i)
      n *= shape[i];
    return n;
  }
  bool contiguous() const {
    int64_t expected = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != expected) return false;
      expected *= shape[i];
    }
    return true;
  }
};

// Where a timed-out device wait reports what it waited for (host-mapped memory, read by the host
// after the stream has run). `flagged` goes 0 -> 1 once; the first timeout wins.
struct DeviceErrorSlot {
  volatile int flagged;
  int rank;
  int peer;
  int channel;
  // 0 put_signal, 1 wait_signal, 2 barrier, 3 async GEMM waiting for a chunk, 4 async GEMM
  // waiting for its own split tiles, 5 reduction waiting for a peer's partial
  int what;
  unsigned long long timeout_ns;
};

struct SignalSite {
  int rank;
  int peer;
  int channel;
};

// *flag: 0 -> 1 once it is 0 (release, system scope). See NOTE [signal pads and channels].
cudaError_t put_signal(uint32_t* flag, SignalSite site, uint64_t timeout_ns, DeviceErrorSlot* slot,
                       cudaStream_t stream);
// *flag: 1 -> 0 once it is 1 (acquire, system scope).
cudaError_t wait_signal(uint32_t* flag, SignalSite site, uint64_t timeout_ns, DeviceErrorSlot* slot,
                        cudaStream_t stream);
// pads: device array of every rank's signal pad (kNumChannels x world_size u32 flags each).
// reset (optional): `reset_count` u32 flags set to 0 first, visible to every peer past the barrier.
cudaError_t barrier(uint32_t* const* pads, int rank, int world_size, int channel,
                    uint64_t timeout_ns, DeviceErrorSlot* slot, cudaStream_t stream,
                    uint32_t* reset = nullptr, int reset_count = 0);

// dst <- src (same shape, any strides, dtype conversion as the CPU backend does it).
cudaError_t copy(const KTensor& dst, const KTensor& src, cudaStream_t stream);
cudaError_t fill(const KTensor& dst, float value, cudaStream_t stream);
// op: 0 silu, 1 relu, 2 gelu (erf).
cudaError_t unary(int op, const KTensor& dst, const KTensor& src, cudaStream_t stream);

inline constexpr int kMaxReduceInputs = 64;
// Flags a reduction (or wait_flags) waits for: flags[i] up for op `value` (flag - value is 0 or
// 1, mod 2^32; acquire, system scope) for every i in [first, count) but `skip`; bounded by
// timeout_ns, a timeout recorded in `slot` with peer = i and `what`.
struct ReduceWait {
  const uint32_t* flags = nullptr;  // null: no wait
  uint32_t value = 1;               // the op's number (1 for 0/1 flags)
  int first = 0;                    // flags [first, count) but skip
  int count = 0;
  int skip = -1;
  uint64_t timeout_ns = 0;
  DeviceErrorSlot* slot = nullptr;
  int rank = 0;
  int channel = -1;
  int what = 5;  // the error slot's code on timeout: 5 a reduction's inputs, 6 a shard (wait_flags)
};
// Holds later work of the stream until w's flags are raised: one block that spins (bounded by
// w.timeout_ns; a timeout is recorded in w.slot with what = w.what). It needs an SM.
cudaError_t wait_flags(const ReduceWait& w, cudaStream_t stream);
// out = sum (avg: mean) of count inputs that all share `in_layout`'s shape, strides and dtype,
// added in f32 in the order given and rounded once; first (every block) the wait, if any, which
// also takes place for an empty output.
cudaError_t reduce(const KTensor& out, const void* const* inputs, int count,
                   const KTensor& in_layout, bool avg, cudaStream_t stream,
                   const ReduceWait& wait = {});

// d[i, j] = src[i, j] * row_scale[i] * col_scale[j] over a [rows, cols] f32 source (contiguous),
// written to d (row-major with leading dim ldd, dtype d_dtype). Scales: null = 1, or a single
// element when the matching *_broadcast is true.
cudaError_t scale_epilogue(void* d, DType d_dtype, int64_t ldd, const float* src, int64_t rows,
                           int64_t cols, const float* row_scale, bool row_broadcast,
                           const float* col_scale, bool col_broadcast, cudaStream_t stream);

// ---- The async-input GEMM (async_gemm.cu) ----
//
// C[M, N] = A[M, K] @ B, f32 accumulation, in one persistent warp-specialized sm_90a kernel
// (TMA loads, wgmma, 128x256x64 tiles, 4-stage pipeline). A's rows form chunks of
// `chunk_rows` rows (the last may be shorter); the tiles are walked chunk by chunk starting at
// `first_chunk`, and
//   - ready (optional, AG+MM): before loading A rows of chunk c the producer waits until
//     ready[c] is up for op ready_value: ready[c] - ready_value is 0 or 1 (mod 2^32), so 0/1
//     flags (ready_value 1) and flags that carry op numbers (this op's or the next) both work
//     (acquire, bounded by timeout_ns; a timeout is recorded in `slot` with
//     peer = c, channel = the piece (below), what = 3 and the kernel finishes with garbage
//     rather than hang). With ready_rows < chunk_rows a chunk lands in pieces of ready_rows rows
//     (the last may be shorter), piece j of chunk c flagged by ready[j * ready_stride + c], and
//     a tile waits only for the pieces its rows overlap;
//   - done (optional, MM+RS): after the stores of each 64-row half tile in rows
//     [i * done_rows, (i + 1) * done_rows), done[i] is incremented (release at GPU scope: for
//     this GPU's stream waits and copy engines, not for the host or a peer); those rows are
//     complete when done[i] reaches async_gemm_done_count(args, i). done_rows is chunk_rows
//     unless given (pieces of a chunk). Needs chunk_rows % 128 == 0;
//   - sum (optional, MM+RS): the own chunk's tiles add the peers' landed partials to their
//     accumulators and store the reduced chunk instead (see sum_chunk below).
struct AsyncGemmArgs {
  const void* a = nullptr;  // [M, K], row stride lda (elements), unit column stride
  int64_t lda = 0;
  const void* b = nullptr;  // b_k_major ? [N, K] (row stride ldb) : [K, N] (row stride ldb)
  int64_t ldb = 0;
  bool b_k_major = false;
  void* c = nullptr;  // [M, N], row stride ldc
  int64_t ldc = 0;
  DType in_dtype = DType::kBF16;  // A and B: bf16 or f16
  DType c_dtype = DType::kBF16;   // f32, bf16 or f16
  int64_t m = 0, n = 0, k = 0;
  int64_t chunk_rows = 0;  // 0: one chunk of M rows
  int first_chunk = 0;
  const uint32_t* ready = nullptr;
  uint32_t ready_value = 1;
  int64_t ready_rows = 0;    // rows per ready flag; 0: chunk_rows (one flag per chunk)
  int64_t ready_stride = 0;  // flags between piece j and j+1 of a chunk (>= the chunk count)
  uint32_t* done = nullptr;
  uint64_t timeout_ns = 0;
  DeviceErrorSlot* slot = nullptr;
  int rank = 0;
  int max_ctas = 0;  // 0: one per SM
  // SMs left free for kernels of other streams (a barrier beside the GEMM): the grid is
  // max_ctas (or the SM count) minus this.
  int reserve_sms = 0;
  // The rows of chunk own_chunk as the caller holds them ([chunk rows, K], row stride own_lda):
  // tiles wholly inside that chunk read them from here without waiting (the AG+MM own shard,
  // used while its copy into the gathered buffer is still in flight).
  const void* own_a = nullptr;
  int64_t own_lda = 0;
  int own_chunk = -1;
  // Shared-memory descriptor offsets of an N-major B (bytes; 0: the canonical values).
  uint32_t b_mn_lbo = 0, b_mn_sbo = 0;
  // Store C from registers even where the TMA store could be used (tests and measurements).
  bool force_register_store = false;
  // CTAs per cluster: 1 (0: the default, 1), or 2 (pairs sharing each B tile through TMA
  // multicast; only with the TMA store, no tail split). Correct, but no faster than single CTAs,
  // so not the default (see docs/DECISIONS.md D17).
  int cluster = 0;
  // The tail split: when the tiles leave the last wave mostly idle (tiles % CTAs small), each
  // tile of that wave is cut into up to 4 K-ranges computed by otherwise idle CTAs, the last
  // one adding the others' f32 partials in a fixed order (same bits every run). Needs a
  // workspace of async_gemm_split_workspace_bytes() (zeroed once when allocated; kept at 0
  // between launches; one launch at a time may use it) and single CTAs (cluster 1).
  // tail_split: 0 chosen here, 1 off, n >= 2 at most n parts (never more than 4).
  void* split_workspace = nullptr;
  int tail_split = 0;
  // Rows counted by one done counter: done[r / done_rows] counts the stored 64-row halves of
  // tiles in rows [r, r + done_rows). 0: chunk_rows (one counter per chunk). A multiple of 128
  // that divides chunk_rows.
  int64_t done_rows = 0;
  // And columns per done counter: 0, all of n; else a multiple of 256, and done[] holds
  // ceil(n / done_cols) counters per done_rows rows: tile (r, c) counts in
  // done[(r / done_rows) * ceil(n / done_cols) + c / done_cols].
  int64_t done_cols = 0;
  // The reduce-scatter epilogue (the native matmul_reduce_scatter, whose own chunk comes last):
  // the tiles of chunk sum_chunk are not stored into C and not counted in done. Each of their
  // elements (chunk row i, column j) becomes
  //   x = acc(i, j) + part_s(i, j) for s = 0, 1, ..., sum_count - 1 except sum_self, in that
  //   order, in f32 (times 1 / sum_count if sum_avg), rounded once into sum_out[i, j]
  // where part_s = sum_parts + s * sum_part_stride elements, [chunk rows, n] with row stride
  // sum_ld, and sum_out [chunk rows, n] with row stride sum_ldo, all of C's dtype. Before a tile
  // reads the parts it waits (bounded by timeout_ns) until sum_flags[q * sum_flag_stride + s] is
  // up for op sum_value (see ready_value) for every s but sum_self, q = the tile's piece (see
  // sum_cols); a timeout is reported with peer s and channel sum_channel + q.
  // Needs chunk_rows and sum_rows multiples of 128, a 16-bit C, an even n, and parts the TMA
  // can load (16-byte aligned, row and part strides multiples of 8 elements). Runs on single
  // CTAs (cluster is ignored).
  int sum_chunk = -1;
  const void* sum_parts = nullptr;
  int64_t sum_part_stride = 0;
  int64_t sum_ld = 0;
  void* sum_out = nullptr;
  int64_t sum_ldo = 0;
  int sum_count = 0;
  int sum_self = -1;
  bool sum_avg = false;
  const uint32_t* sum_flags = nullptr;
  uint32_t sum_value = 1;
  int64_t sum_rows = 0;
  // Columns per piece of the sum flags (0: all of n; else a multiple of 256): piece q =
  // (chunk row / sum_rows) * ceil(n / sum_cols) + column / sum_cols.
  int64_t sum_cols = 0;
  int64_t sum_flag_stride = 0;
  int sum_channel = 0;
};

// Why the kernel cannot run these arguments (dtype, alignment, strides), or nullptr.
const char* async_gemm_unsupported(const AsyncGemmArgs& args);
cudaError_t async_gemm(const AsyncGemmArgs& args, cudaStream_t stream);
// The value done[i] reaches once every tile of rows [i * done_rows, (i + 1) * done_rows) is
// stored.
uint32_t async_gemm_done_count(const AsyncGemmArgs& args, int index);
// The done counters' indices in walk order (of each, the position of its last tile in the
// walk): the order to wait for them in. CTAs run side by side and the tail split reorders the
// last wave, so counters may complete a little out of this order; nothing depends on it but
// the pace of the waits. Where the walk's groups divide every piece and chunk (single CTAs, the
// native MM+RS) it is chunk by chunk from first_chunk on, each chunk's pieces in row order, then
// column order.
std::vector<int> async_gemm_done_order(const AsyncGemmArgs& args);
// Bytes of the tail-split workspace for the current device.
size_t async_gemm_split_workspace_bytes();
// The walk's group height in m-tiles for these arguments (see async_gemm.cu): up to 16, and
// where rows wait for flags or are counted in done, a divisor of every piece and chunk.
int async_gemm_group_m(const AsyncGemmArgs& args);
// The number of K-ranges each tile of the last wave is cut into for these arguments (1: none).
int async_gemm_tail_split(const AsyncGemmArgs& args);
// With own_a given, the rows of own_chunk that tiles still read from `a` (tiles that straddle
// the chunk's first or last row: chunk edges off the 128-row tile grid): the chunk's first
// `head` and last `tail` rows (both 0: none; they may cover the whole chunk). Those tiles wait
// for ready[own_chunk] (its pieces) and need those rows in `a`; no tile reads the others there.
struct AsyncGemmOwnEdges {
  int64_t head = 0, tail = 0;
};
AsyncGemmOwnEdges async_gemm_own_edge_rows(const AsyncGemmArgs& args);
// The obviously-correct reference for the tests: one thread per output, f32 accumulation.
cudaError_t reference_gemm(const AsyncGemmArgs& args, cudaStream_t stream);

}  // namespace asynctp::kernels
