// The native async-input GEMM's parameters: one struct that the caller (ops, through
// Backend::native_gemm), the host launcher and the kernel all read. Plain C++ and CUDA alike:
// trivially copyable fields only, no library headers, so that it travels to the kernel as its
// parameter and a CPU emulation can follow the same schedule (kernels/native/schedule.h).
//
// C[M, N] = A[M, K] @ B, f32 accumulation (or, with the SwiGLU epilogue, C[M, N] = SwiGLU of A @ B
// where B is [K, 2N]: NativeGemmSchedule::swiglu). A's rows form chunks of `chunk_rows` rows (the
// last may be shorter); the tiles are walked chunk by chunk starting at `first_chunk`, and
//   - ready (optional, AG+MM): before loading A rows of chunk c the producer waits until ready[c]
//     is up for op ready_value: ready[c] - ready_value is 0 or 1 (mod 2^32), so 0/1 flags
//     (ready_value 1) and flags that carry op numbers (this op's or the next) both work (acquire,
//     bounded by timeout_ns; a timeout is recorded in `slot` with peer = c, channel = the piece
//     (below), what = 3 and the kernel finishes with garbage rather than hang). With ready_rows <
//     chunk_rows a chunk lands in pieces of ready_rows rows (the last may be shorter), piece j of
//     chunk c flagged by ready[j * ready_stride + c], and a tile waits only for the pieces its
//     rows overlap;
//   - done (optional, MM+RS): after the stores of each 64-row half tile in rows
//     [i * done_rows, (i + 1) * done_rows), done[i] is incremented (release at GPU scope: for
//     this GPU's stream waits and copy engines, not for the host or a peer; with the kernel's
//     own pushes, a peer is told by push_flags instead); those rows are complete when done[i]
//     reaches done_count(params, i). Needs chunk_rows % 128 == 0;
//   - sum (optional, MM+RS): the own chunk's tiles add the peers' landed partials to their
//     accumulators and store the reduced chunk instead (NativeGemmSchedule::sum_chunk).
#pragma once

#include <cstdint>

#include <asynctp/dtype.h>

// Functions of the schedule that both the host and the kernel call.
#if defined(__CUDACC__)
#define ASYNCTP_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define ASYNCTP_HOST_DEVICE inline
#endif

namespace asynctp::kernels {

struct DeviceErrorSlot;  // kernels/kernels.h

// The operands as the kernel addresses them: pointers, row strides in elements, dtypes, sizes.
// The CUDA backend fills them from ChunkedGemmArgs' tensors.
struct NativeGemmOperands {
  const void* a = nullptr;  // [M, K], row stride lda, unit column stride
  int64_t lda = 0;
  const void* b = nullptr;  // b_k_major ? [N, K] (row stride ldb) : [K, N] (row stride ldb)
  int64_t ldb = 0;
  bool b_k_major = false;
  void* c = nullptr;  // [M, N], row stride ldc
  int64_t ldc = 0;
  DType in_dtype = DType::kBF16;  // A and B: bf16, f16 or float8 e4m3 (then B k-major)
  DType c_dtype = DType::kBF16;   // f32, bf16 or f16
  int64_t m = 0, n = 0, k = 0;
  // The rows of chunk own_chunk as the caller holds them ([chunk rows, K], row stride own_lda):
  // tiles wholly inside that chunk read them from here without waiting (the AG+MM own shard,
  // used while its copy into the gathered buffer is still in flight).
  const void* own_a = nullptr;
  int64_t own_lda = 0;
  // The reduce-scatter epilogue's inputs and output (see NativeGemmSchedule::sum_chunk): part s
  // at sum_parts + s * sum_part_stride elements, [chunk rows, n] with row stride sum_ld, s <
  // sum_count; sum_out [chunk rows, n] with row stride sum_ldo; all of C's dtype.
  const void* sum_parts = nullptr;
  int64_t sum_part_stride = 0;
  int64_t sum_ld = 0;
  int sum_count = 0;
  void* sum_out = nullptr;
  int64_t sum_ldo = 0;
  // A copy of A as the kernel loads it (null: none): [M, K] with row stride a_out_ld, A's dtype.
  // The tiles of the first column (n0 = 0) store the A tiles they load (the own chunk's from
  // own_a) with TMA stores from shared memory, so that every row is written once, beside the
  // main loop: the AG+MM's returned A without a copy of the gathered slots after the GEMM.
  void* a_out = nullptr;
  int64_t a_out_ld = 0;
  // The SwiGLU epilogue's pre-activation output (NativeGemmSchedule::swiglu; null: none):
  // [M, 2N] with row stride pre_ld, dtype pre_dtype (f32, bf16 or f16).
  void* pre = nullptr;
  int64_t pre_ld = 0;
  DType pre_dtype = DType::kBF16;
  // The scaled (float8 e4m3) GEMM: C[i, j] = acc(i, j) * sa(i) * sb(j) in f32, rounded once, where
  // acc accumulates as the tensor cores' fast float8 mode does (PyTorch's use_fast_accum; no
  // promotion into separate f32 registers) and
  //   sa(i) = a_scale[i * a_scale_stride], or own_a_scale[(i - the own chunk's first row) *
  //           a_scale_stride] for the own chunk's rows where own_a_scale is given (own_a's
  //           scales, wherever the tile read the row from);
  //   sb(j) = b_scale[j * b_scale_stride].
  // Stride 1: one f32 per row of A ([M]) or column of C ([N]), row-wise; 0: one value,
  // tensor-wise. Null a_scale / b_scale: 1. 16-bit inputs take no scales. With the reduce-scatter
  // epilogue the scales apply to acc before the parts are added (the parts are scaled already).
  const float* a_scale = nullptr;
  int64_t a_scale_stride = 0;
  const float* own_a_scale = nullptr;
  const float* b_scale = nullptr;
  int64_t b_scale_stride = 0;
};

// The schedule and the protocol with the other streams and ranks: what the op chooses
// (ChunkedGemmArgs derives from it).
struct NativeGemmSchedule {
  int64_t chunk_rows = 0;  // 0: one chunk of M rows
  int first_chunk = 0;
  const uint32_t* ready = nullptr;
  uint32_t ready_value = 1;
  int64_t ready_rows = 0;    // rows per ready flag; 0: chunk_rows (one flag per chunk)
  int64_t ready_stride = 0;  // flags between piece j and j+1 of a chunk (>= the chunk count)
  uint32_t* done = nullptr;
  // Rows counted by one done counter: done[r / done_rows] counts the stored 64-row halves of
  // tiles in rows [r, r + done_rows). 0: chunk_rows (one counter per chunk). A multiple of 128
  // that divides chunk_rows.
  int64_t done_rows = 0;
  // And columns per done counter: 0, all of n; else a multiple of 256, and done[] holds
  // ceil(n / done_cols) counters per done_rows rows: tile (r, c) counts in
  // done[(r / done_rows) * ceil(n / done_cols) + c / done_cols].
  int64_t done_cols = 0;
  int rank = 0;  // named in the timeouts' reports
  // The chunk whose rows NativeGemmOperands::own_a holds (-1: none).
  int own_chunk = -1;
  // SMs left free for kernels of other streams (a barrier beside the GEMM): the grid is
  // max_ctas (or the SM count) minus this.
  int reserve_sms = 0;
  // The tail split: when the tiles leave the last wave mostly idle (tiles % CTAs small), each
  // tile of that wave is cut into up to 4 K-ranges computed by otherwise idle CTAs, the last
  // one adding the others' f32 partials in a fixed order (same bits every run). Needs a
  // workspace (NativeGemmLaunch::split_workspace); on pairs both CTAs take the same K-ranges.
  // 0 chosen by the kernel's host side, 1 off, n >= 2 at most n parts (never more than 4).
  int tail_split = 0;
  // The reduce-scatter epilogue (the native matmul_reduce_scatter, whose own chunk comes last):
  // the tiles of chunk sum_chunk are not stored into C and not counted in done. Each of their
  // elements (chunk row i, column j) becomes
  //   x = acc(i, j) + part_s(i, j) for s = 0, 1, ..., sum_count - 1 except sum_self, in that
  //   order, in f32 (times 1 / sum_count if sum_avg), rounded once into sum_out[i, j]
  // (NativeGemmOperands). Before a tile reads the parts it waits (bounded by timeout_ns) until
  // sum_flags[q * sum_flag_stride + s] is up for op sum_value (see ready_value) for every s but
  // sum_self, q = the tile's piece (see sum_cols); a timeout is reported with peer s and
  // channel sum_channel + q. Needs chunk_rows and sum_rows multiples of 128, a 16-bit C, an
  // even n, and parts the TMA can load (16-byte aligned, row and part strides multiples of 8
  // elements). Runs on pairs (cluster) only where chunk_rows, and done_rows and ready_rows where
  // used, are multiples of 256 (schedule.h, pairs_can_sum); else on single CTAs.
  int sum_chunk = -1;
  int sum_self = -1;
  bool sum_avg = false;
  const uint32_t* sum_flags = nullptr;
  uint32_t sum_value = 1;
  int64_t sum_rows = 0;  // rows per piece of the sum flags; 0: chunk_rows
  // Columns per piece of the sum flags (0: all of n; else a multiple of 256): piece q =
  // (chunk row / sum_rows) * ceil(n / sum_cols) + column / sum_cols.
  int64_t sum_cols = 0;
  int64_t sum_flag_stride = 0;
  int sum_channel = 0;
  // The kernel's own pushes (the native matmul_reduce_scatter; push_chunks > 0, with done
  // counters and the reduce-scatter epilogue): a tile of chunk c != sum_chunk (c < push_chunks)
  // is stored into push_c[c] instead of C: [chunk rows, n], row stride push_ld, C's dtype (the
  // slot for this rank in chunk c's owner's memory, mapped here, which the TMA stores write over
  // NVLink). done counts the pieces as without; the CTA whose count completes piece q of chunk c
  // sets that counter back to 0 and raises push_flags[c][q * push_flag_stride] to push_value,
  // release at system scope behind every store of the piece (the owner's sum waits on it). No
  // copy, flag write or stream wait on the host's side: the op is one launch. Nothing is stored
  // into C then (its address is never dereferenced; its shape and strides are checked as ever).
  static constexpr int kMaxPushChunks = 8;
  int push_chunks = 0;
  void* push_c[kMaxPushChunks] = {};
  int64_t push_ld = 0;
  uint32_t* push_flags[kMaxPushChunks] = {};
  int64_t push_flag_stride = 0;
  uint32_t push_value = 1;
  // The SwiGLU epilogue (the gate/up projection of a SwiGLU MLP): B holds 2N columns, the gate's
  // [0, N) then the up projection's [N, 2N), and C is [M, N] with
  //   C[i, j] = silu(g) * u,  g = acc(i, j), u = acc(i, N + j)
  // in f32 from the accumulators, rounded once (the CUDA kernel: swiglu_epilogue_f32, the SFU's
  // exp and division; the CPU emulation: swiglu_f32; kernels/activation.h bounds the difference);
  // with `pre` (NativeGemmOperands) also
  // pre[i, j] = g and pre[i, N + j] = u, each rounded once to pre_dtype. A tile covers tile_width
  // (schedule.h) output columns j0.. and the gate and up columns j0.. and N + j0.. of B. n is N
  // (the output's columns). Not with done counters or the reduce-scatter epilogue.
  bool swiglu = false;
};

// What the backend adds for one launch.
struct NativeGemmLaunch {
  uint64_t timeout_ns = 0;  // the bound of every wait (%globaltimer ns); 0: no flag waits
  DeviceErrorSlot* slot = nullptr;
  int max_ctas = 0;  // 0: one per SM
  // The tail split's workspace of async_gemm_split_workspace_bytes() (zeroed once when
  // allocated; kept at 0 between launches; one launch at a time may use it). Null: no split.
  void* split_workspace = nullptr;
  // Shared-memory descriptor offsets of an N-major B (bytes; 0: the canonical values).
  uint32_t b_mn_lbo = 0, b_mn_sbo = 0;
  // Store C (and the SwiGLU epilogue's pre) from registers even where the TMA store could be
  // used (tests and measurements).
  bool force_register_store = false;
  // CTAs per cluster: 1, or 2 (pairs sharing each B tile through TMA multicast; only with the TMA
  // store, no SwiGLU epilogue, the reduce-scatter epilogue only on whole 256-row chunks and
  // pieces: see sum_chunk); 0: the default (cluster_of in schedule.h), 2 for float8 inputs, else
  // 1 (pairs are no faster with 16-bit inputs, see docs/DECISIONS.md D17).
  int cluster = 0;
};

// The whole contract. The kernel receives it resolved (resolved() in schedule.h: every 0 that
// means "the default" replaced by its value), beside the launch's NativeGemmPlan.
struct NativeGemmParams : NativeGemmOperands, NativeGemmSchedule, NativeGemmLaunch {};

// What the host derives once per launch from the params and the grid (plan_of in schedule.h);
// the kernel reads it as it is.
struct NativeGemmPlan {
  int group_m = 1;          // m-tiles per group of the walk (group_m_of)
  int done_col_pieces = 1;  // done counters per done_rows rows: ceil(n / done_cols)
  int sum_col_pieces = 1;   // sum-flag pieces per sum_rows rows: ceil(n / sum_cols)
  // The tail split: tiles [0, full_tiles) are computed whole, each of the others in `split`
  // K-ranges by different slots (CTAs, or pairs). partials: f32 accumulators of the parts but the
  // last, [tail CTA (split_slot)][part < split - 1][consumer][32 float4][128 threads];
  // split_flags: [tail CTA][consumer] counters of published parts, 0 between launches.
  int full_tiles = 0;
  int split = 1;
  float* partials = nullptr;
  uint32_t* split_flags = nullptr;
  bool sum_tma_store = false;  // kTmaStore kernels: sum_out through the staging area (map_sum)
};

}  // namespace asynctp::kernels
