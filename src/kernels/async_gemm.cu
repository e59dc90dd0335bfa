// The async-input GEMM: C = A @ B in one persistent, warp-specialized Hopper kernel whose tile
// scheduler follows A's row chunks as they land (see kernels.h for the contract).
//
// One CTA per SM, 384 threads = 3 warpgroups:
//
//   warpgroup 0 (producer, one thread):  for each tile: [wait ready[chunk]] then per k-block
//                                         wait empty[s] -> expect_tx(full[s]) -> TMA A, TMA B
//   warpgroups 1, 2 (consumers):          per k-block wait full[s] -> 4 x wgmma m64n256k16 ->
//                                         (previous k-block done) arrive empty[s-1]; per tile the
//                                         epilogue: 16-bit C through shared memory and TMA
//                                         stores (in two column halves), f32 C from registers;
//                                         then [done[chunk] += 1]
//
// Tile 128 x 256 (each consumer owns 64 rows), k-block 64, 4 stages of shared memory
// (16 KiB of A + 32 KiB of B each, 128-byte swizzle written by TMA and read by wgmma) and a
// 32 KiB staging area for C: 225 KiB of the 227 a block may have.
//
// Tile order (the async part): tiles are numbered so that all tiles of the m-tile group starting
// at `first_chunk`'s first whole m-tile come first, then the following rows, wrapping around (a
// tile over the chunk's first row, off the tile grid, comes last); within a group
// of group_m m-tiles the m index runs fastest (B panels stay in L2). CTA i takes tiles i, i+grid,
// ...: all SMs work on the chunk that landed first while the copy engine brings the next ones.
// group_m is kGroupM (16), or where rows wait for flags, are counted in done or are reduced
// (sum_chunk) the largest height up to 16 that divides every piece and chunk (on the tile
// grid): a group then never spans two pieces or chunks, so the tiles of the first wave that are
// not the own chunk's wait for the piece that lands first, not for the whole next chunk (or the
// one after), counted pieces finish in walk order, and the native MM+RS's own chunk comes last.
// Pieces off the tile grid (AG+MM chunks of any rows): a piece's whole m-tiles, up to 16, so that
// a group spans few pieces.
//
// Why 16: a wave of 132 CTAs spans about 16 m-tiles x 8 n-tiles, and per k-block its tiles then
// read 16 of A's 16 KiB blocks and 8 of B's 32 KiB ones: the fewest bytes for 132 tiles (height
// 32 reads 32 x 16 + 4 x 32 KiB, height 8 about 8 x 16 + 17 x 32); see docs/DECISIONS.md D10.
//
// Tail split: with T tiles on G CTAs, the last wave holds T mod G tiles; where that is at most
// half of G, each of its tiles is cut into s <= 4 K-ranges (s = G / tail, at least 4 k-blocks
// each), one per otherwise idle CTA. Work units in loop order, for CTA i: units i, i+G, ...
//
//   units [0, T - tail):        whole tiles, as without the split
//   units [T - tail, T + (s-1) tail): part p = v / tail of tail tile v mod tail
//
//   parts 0 .. s-2: main loop over their K-range | f32 accumulators -> workspace | count++
//   part s-1:       main loop over its K-range   | wait count = s-1 | += parts 0 .. s-2 in order
//                   | epilogue (store, done counter) | count = 0 for the next launch
//
// All tail units fit in one wave, at most one per CTA, so a last part never waits for a CTA
// that is not running; the sum order is fixed, so the result is the same on every run.
// Not stream-K, nor several rounds of parts: with every CTA at its own k offset, A and B are no
// longer shared in L2 by the CTAs running together (see docs/DECISIONS.md D13).
//
// The reduce-scatter epilogue (sum_chunk, single CTAs): the tiles of the own chunk, last in the
// walk, add the peers' parts of their rows to the accumulators. The parts come through the
// same stage ring as the k-blocks, so their loads run behind the tile's last MMAs:
//
//   producer:  k-blocks of the tile | wait the piece's landed flags | per peer s (rank order),
//              per column half h: wait empty -> TMA part s, rows of the tile, columns of h
//   consumers: k-blocks | [count the previous tile's rows] | per (s, h): wait full -> ldmatrix
//              + add into acc -> release | x 1/count (avg) | store into sum_out, rounded once
//
// Shared-memory layouts, as TMA writes them and wgmma reads them (bf16/f16, 128-byte rows):
//   A stage:            128 rows (m) x 64 k               K-major, 8-row groups 1024 B apart
//   B stage, K-major:   256 rows (n) x 64 k               same
//   B stage, N-major:   4 boxes of 64 rows (k) x 64 n     box j = n 64j..64j+63, 8 KiB apart;
//                       wgmma's N-major operand: 64-n swizzle atoms LBO = 8 KiB apart, 8-k groups
//                       SBO = 1 KiB apart; k step of 16 = 2 KiB.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <numeric>
#include <type_traits>
#include <vector>

#include "kernels/device_sync.cuh"
#include "kernels/kernels.h"
#include "kernels/wgmma_regs.cuh"

namespace asynctp::kernels {

namespace {

constexpr int kBM = 128;
constexpr int kBN = 256;
constexpr int kBK = 64;
constexpr int kGroupM = 16;
constexpr int kThreads = 384;
constexpr int kStageABytes = kBM * kBK * 2;
constexpr int kStageBBytes = kBN * kBK * 2;
// 16-bit C staged for the TMA store: half a tile's columns at a time (each consumer 64 x 128).
constexpr int kCBytes = kBM * (kBN / 2) * 2;

// Four stages fit beside the staging area (227 KiB of shared memory per block): stages, the
// staging area of the TMA-store epilogue, the full/empty barriers, 1 KiB for the alignment.
constexpr int kStages = 4;
template <bool kTmaStore>
constexpr int smem_bytes() {
  return kStages * (kStageABytes + kStageBBytes) + (kTmaStore ? kCBytes : 0) + 2 * kStages * 8 +
         1024;
}
static_assert(smem_bytes<true>() <= 227 * 1024);

struct Params {
  int64_t m, n, k;
  void* c;
  int64_t ldc;
  int c_dtype;  // 0 f32, 1 bf16, 2 f16
  int64_t chunk_rows;
  int first_chunk;
  const uint32_t* ready;
  uint32_t ready_value;  // a flag is up when flag - ready_value is 0 or 1 (detail::flag_raised)
  int64_t ready_rows;    // rows per ready flag (<= chunk_rows)
  int64_t ready_stride;  // piece j of chunk c: ready[j * ready_stride + c]
  int group_m;           // m-tiles per group of the walk (see the file comment)
  uint32_t* done;
  int64_t done_rows;    // rows per done counter
  int done_cols;        // columns per done counter (a multiple of kBN)
  int done_col_pieces;  // counters per done_rows rows: ceil(n / done_cols)
  uint64_t timeout_ns;
  DeviceErrorSlot* slot;
  int rank;
  uint32_t b_lbo, b_sbo;
  int own_chunk;  // chunk whose whole tiles come from map_a_own (no wait), or -1
  // The tail split (see the file comment): tiles [0, full_tiles) are computed whole, each of the
  // others in `split` K-ranges by different CTAs. partials: f32 accumulators of the parts but
  // the last, [tail tile][part < split - 1][consumer][32 float4][128 threads]; split_flags:
  // [tail tile][consumer] counters of published parts, 0 between launches.
  int full_tiles;
  int split;
  float* partials;
  uint32_t* split_flags;
  // The reduce-scatter epilogue (kernels.h, AsyncGemmArgs::sum_chunk): sum_chunk -1 when off.
  int sum_chunk;
  const void* sum_parts;
  int64_t sum_part_stride, sum_ld;
  void* sum_out;
  int64_t sum_ldo;
  int sum_count, sum_self;
  bool sum_avg;
  const uint32_t* sum_flags;
  uint32_t sum_value;
  int64_t sum_rows, sum_flag_stride;
  int sum_cols, sum_col_pieces;  // as done_cols, done_col_pieces
  int sum_channel;
  bool sum_tma_store;  // kTmaStore kernels: sum_out through the staging area (map_sum)
};

// Work unit u of the persistent loop: a whole tile, or one K-range (part) of a tail tile.
struct Unit {
  int t;         // tile number in the walk
  int kb0, kb1;  // k-blocks [kb0, kb1)
  int part;      // -1: whole tile; else 0 .. split-1 (the last one finishes the tile)
  int tail;      // index of the tail tile (t - full_tiles)
};

__device__ __forceinline__ Unit unit_at(int u, const Params& p, int num_tiles, int k_blocks) {
  if (u < p.full_tiles) return {u, 0, k_blocks, -1, 0};
  const int tails = num_tiles - p.full_tiles;
  const int v = u - p.full_tiles;
  const int tail = v % tails;
  const int part = v / tails;
  return {p.full_tiles + tail, part * k_blocks / p.split, (part + 1) * k_blocks / p.split, part,
          tail};
}

__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int c0,
                                             int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(static_cast<uint32_t>(__cvta_generic_to_shared(src))), "r"(c0), "r"(c1)
               : "memory");
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}

__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t ok = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, "
        "0, p;\n}\n"
        : "=r"(ok)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!ok);
}

__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, "
      "%4}], [%2];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}

// A 3-D box (the reduce-scatter epilogue's parts: column, chunk row, rank).
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, "
      "%4, %5}], [%2];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// wgmma shared-memory descriptor, 128-byte swizzle.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

template <bool kF16, int kTransB>
__device__ __forceinline__ void wgmma(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                      int scale_d) {
  if constexpr (kF16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {" ASYNCTP_WGMMA_ACC_REGS
        "}, %128, %129, p, 1, 1, 0, %131;\n}\n"
        : ASYNCTP_WGMMA_ACC_OPERANDS(d)
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" ASYNCTP_WGMMA_ACC_REGS
        "}, %128, %129, p, 1, 1, 0, %131;\n}\n"
        : ASYNCTP_WGMMA_ACC_OPERANDS(d)
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB));
  }
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

using detail::global_timer_ns;
using detail::load_acquire_sys;

// Acquire loads of flags: gpu scope for the tail split's counters (written by CTAs of this
// launch); the ready flags (raised by a peer GPU's stream write) use detail::load_acquire_sys.
__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

struct Tile {
  int m0, n0;
};

// The walk's first m-tile: the first one wholly inside first_chunk's rows. Where the chunks are
// off the tile grid, the tile over that chunk's first row also holds rows of the chunk before,
// which (AG+MM) lands last: it comes last in the walk instead of holding a CTA of the first wave
// until then (see docs/DECISIONS.md D12).
__host__ __device__ __forceinline__ int64_t walk_pivot(int64_t first_row, int64_t height) {
  return (first_row + height - 1) / height;
}

// Tile t of the walk described in the file comment; tiles are `height` rows (a cluster's).
__device__ __forceinline__ Tile tile_at(int t, int tiles_m, int tiles_n, int pivot_m, int height,
                                        int group_m) {
  const int group = t / (group_m * tiles_n);
  const int first = group * group_m;
  const int rows = min(group_m, tiles_m - first);
  const int local = t - group * group_m * tiles_n;
  const int mi = (first + local % rows + pivot_m) % tiles_m;
  return {mi * height, (local / rows) * kBN};
}

__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map,
                                                      uint64_t* bar, int c0, int c1,
                                                      uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
      "cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
}

// Arrives on the mbarrier at the same shared-memory offset in CTA `cta` of this cluster.
// Release at CTA scope (the default), not .release.cluster: ptxas makes the cluster-scope
// release a full fence (MEMBAR.ALL.CTA + MEMBAR.ALL.GPU before the arrive), which the consumers
// paid twice per k-block (see docs/DECISIONS.md D17). It orders nothing that is needed here:
// what the arrive hands over is a stage that wgmma (the async proxy) has finished reading, which
// wgmma.wait_group already guarantees, and the peer refills it with TMA, also the async proxy.
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_u32(bar)),
      "r"(cta)
      : "memory");
}

__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every thread of both CTAs (divergent warps allowed: not .aligned).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

// Waits (acquire, system scope: a peer's stream write raised it) until *flag is up for op `value`
// (wrap-safe: op numbers count up through 2^32). False after p.timeout_ns, reported in the error
// slot as (peer, channel, what).
__device__ __forceinline__ bool wait_raised(const Params& p, const uint32_t* flag, uint32_t value,
                                            int peer, int channel, int what) {
  auto raised = [&] { return detail::flag_raised(load_acquire_sys(flag), value); };
  if (raised()) return true;
  const uint64_t start = global_timer_ns();
  while (!raised()) {
    if (global_timer_ns() - start > p.timeout_ns) {
      detail::report_timeout(p.slot, p.rank, peer, channel, what, p.timeout_ns);
      return false;
    }
    __nanosleep(64);
  }
  return true;
}

// Waits until every piece of a chunk overlapping rows [m0, m0 + kBM) is ready. False on timeout
// (reported).
__device__ bool wait_chunks_ready(const Params& p, int m0) {
  const int64_t end_row = p.m < m0 + kBM ? p.m : m0 + kBM;
  for (int64_t row = m0; row < end_row;) {
    const int64_t c = row / p.chunk_rows;
    const int64_t j = (row - c * p.chunk_rows) / p.ready_rows;
    const int64_t piece_end = (j + 1) * p.ready_rows;
    row = c * p.chunk_rows + (piece_end < p.chunk_rows ? piece_end : p.chunk_rows);
    if (!wait_raised(p, p.ready + j * p.ready_stride + c, p.ready_value, static_cast<int>(c),
                     static_cast<int>(j), 3)) {
      return false;
    }
  }
  // The chunk was written by a copy (a copy engine's or a copy kernel's); the TMA loads that
  // follow read through the async proxy, ordered after this thread's acquire by the proxy fence.
  asm volatile("fence.proxy.async.global;" ::: "memory");
  return true;
}

// The last part of a tail tile waits for the others (CTAs of this launch, all resident: the
// tail units fit in one wave, at most one per CTA). Bounded all the same: a timeout is recorded
// as what = 4 and the tile is finished with what has arrived.
__device__ void wait_split_parts(const Params& p, const uint32_t* flag, uint32_t parts) {
  if (load_acquire(flag) >= parts) return;
  const uint64_t start = global_timer_ns();
  const uint64_t limit = p.timeout_ns != 0 ? p.timeout_ns : 10'000'000'000ull;
  while (load_acquire(flag) < parts) {
    if (global_timer_ns() - start > limit) {
      detail::report_timeout(p.slot, p.rank, -1, -1, 4, limit);
      return;
    }
    __nanosleep(32);
  }
}

template <typename Out>
__device__ __forceinline__ void store_pair(Out* row, int64_t col, int64_t n, float x, float y) {
  if constexpr (sizeof(Out) == 4) {
    if (col + 1 < n) {
      *reinterpret_cast<float2*>(row + col) = make_float2(x, y);
    } else if (col < n) {
      row[col] = x;
    }
  } else if constexpr (sizeof(Out) == 2 && std::is_same_v<Out, __nv_bfloat16>) {
    if (col + 1 < n) {
      *reinterpret_cast<__nv_bfloat162*>(row + col) = __floats2bfloat162_rn(x, y);
    } else if (col < n) {
      row[col] = __float2bfloat16_rn(x);
    }
  } else {
    if (col + 1 < n) {
      *reinterpret_cast<__half2*>(row + col) = __floats2half2_rn(x, y);
    } else if (col < n) {
      row[col] = __float2half_rn(x);
    }
  }
}

// Stores one consumer's 64 x 256 accumulator block at rows [r0, r0 + 64), columns [n0, n0 + 256)
// of `base` (row stride ld; rows from `rows` on and columns from n on are left out).
// Fragment of m64nNk16 (f32): thread t = 32 w + l holds, for each 8-column group j,
// d[4j + {0,1}] at (16 w + l/4, 8 j + 2 (l%4) + {0,1}) and d[4j + {2,3}] 8 rows below.
template <typename Out>
__device__ __forceinline__ void store_block(Out* base, int64_t ld, int64_t rows, int64_t n,
                                            const float (&d)[128], int64_t r0, int n0) {
  const int t = threadIdx.x % 128;
  const int64_t row = r0 + 16 * (t / 32) + (t % 32) / 4;
  const int64_t col0 = n0 + 2 * (t % 4);
  const bool row_ok = row < rows, row8_ok = row + 8 < rows;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int64_t col = col0 + 8 * j;
    if (row_ok) store_pair(base + row * ld, col, n, d[4 * j], d[4 * j + 1]);
    if (row8_ok) store_pair(base + (row + 8) * ld, col, n, d[4 * j + 2], d[4 * j + 3]);
  }
}

// Byte offset of (row, column `col` < 64) in a box of 16-bit elements with 128-byte rows and
// the 128-byte swizzle (as TMA writes and reads it): row r at 128 r, 16-byte chunk q of the row
// at position q ^ (r % 8). In the accumulator's fragment layout a warp's 4-byte accesses to one
// 8-column group hit 8 different chunks of 8 rows: no bank conflicts.
__device__ __forceinline__ int swizzled(int row, int col) {
  return row * 128 + (((col / 8) ^ (row % 8)) * 16) + (col % 8) * 2;
}

// Writes columns [128 half, 128 half + 128) of one consumer's 64 x 256 accumulator block
// (16-bit) into its staging area as two 64 x 64 boxes laid out as the 128-byte-swizzled TMA
// store expects (box j: columns 64j..64j+63 of the half, 8 KiB apart). stmatrix takes the
// accumulator's fragment layout as it is (each thread's pair of adjacent columns, see
// add_part_half's ldmatrix): one x4 per two 8-column groups, 8 per thread and half, where 4-byte
// stores took 32. Lane l gives the address of row l % 8 of matrix l / 8, the matrices being
// (warp rows 0-7, group j), (rows 8-15, j), (0-7, j + 1), (8-15, j + 1): 16 contiguous bytes,
// one swizzle chunk, so the 8 rows of a matrix land in 8 different chunks (no bank conflicts).
template <typename Out, int kHalf>
__device__ __forceinline__ void stage_block(uint8_t* staging, const float (&d)[128]) {
  const int lane = threadIdx.x % 32;
  const int row = 16 * (threadIdx.x % 128 / 32) + 8 * (lane / 8 % 2) + lane % 8;
  const uint32_t base = smem_u32(staging);
#pragma unroll
  for (int j = 16 * kHalf; j < 16 * kHalf + 16; j += 2) {
    const int col = 8 * (j + lane / 16) - 128 * kHalf;  // of the half
    uint32_t v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float* x = d + 4 * (j + i / 2) + 2 * (i % 2);
      if constexpr (std::is_same_v<Out, __nv_bfloat16>) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(x[0], x[1]);
        v[i] = *reinterpret_cast<const uint32_t*>(&h);
      } else {
        const __half2 h = __floats2half2_rn(x[0], x[1]);
        v[i] = *reinterpret_cast<const uint32_t*>(&h);
      }
    }
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                     base + (col / 64) * 8192 + swizzled(row, col % 64)),
                 "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
                 : "memory");
  }
}

// Counts the stored 64-row half of a tile at (r0, n0) in its piece's counter: row piece
// r0 / done_rows, column piece n0 / done_cols (a tile lies in one piece: kBN divides done_cols).
// A release at GPU scope: the counters (this GPU's memory, mapped by no peer) are read by this
// GPU's own stream front end (cuStreamWaitValue32), and the rows they cover by its own copy
// engine. Neither agent is a thread of the PTX memory model, at either scope: what this rests
// on is that both reach this GPU's memory through its L2, the point of coherence of every local
// access (the GPU tests push and check every counted piece). System scope would pay for
// ordering towards observers (the host, the peers) that never read these counters while the
// kernel runs (see docs/DECISIONS.md D14). (The TMA stores were waited for with wait_group 0, whose
// completion includes the async-to-generic proxy ordering.)
__device__ __forceinline__ void publish_done(const Params& p, int r0, int n0) {
  uint32_t* counter = p.done + (r0 / p.done_rows) * p.done_col_pieces + n0 / p.done_cols;
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
}

// Whether the tile starting at row m0 belongs to the chunk whose tiles are reduced (sum_chunk:
// chunk_rows is a multiple of 128, so a tile lies in one chunk).
__device__ __forceinline__ bool in_sum_chunk(const Params& p, int64_t m0) {
  return p.sum_chunk >= 0 && m0 / p.chunk_rows == p.sum_chunk;
}

// Row r of the product as a row of the sum chunk (of the parts and of sum_out).
__device__ __forceinline__ int64_t sum_row_of(const Params& p, int64_t r) {
  return r - static_cast<int64_t>(p.sum_chunk) * p.chunk_rows;
}

// Whether unit w (its tile at row m0) ends in the reduce-scatter epilogue: a whole tile of the
// sum chunk, or the last K-range of one.
__device__ __forceinline__ bool sums_tile(const Params& p, const Unit& w, int64_t m0) {
  return in_sum_chunk(p, m0) && (w.part < 0 || w.part == p.split - 1);
}

// Waits until every peer's partial of the piece holding chunk row `row` has landed (the
// producer thread, before it loads them; acquire, system scope: the copy engines of the peers
// wrote the parts, then their stream writes raised the flags). False on timeout (reported as a
// reduction's wait, what = 5, naming the peer and the piece's channel).
__device__ __forceinline__ bool wait_sum_parts(const Params& p, int64_t row, int col) {
  const int64_t q = (row / p.sum_rows) * p.sum_col_pieces + col / p.sum_cols;
  for (int s = 0; s < p.sum_count; ++s) {
    if (s == p.sum_self) continue;
    if (!wait_raised(p, p.sum_flags + q * p.sum_flag_stride + s, p.sum_value, s,
                     p.sum_channel + static_cast<int>(q), 5)) {
      return false;
    }
  }
  return true;
}

template <typename Out>
struct PairOf;
template <>
struct PairOf<__nv_bfloat16> {
  using T = __nv_bfloat162;
  static __device__ __forceinline__ float2 get(T v) { return __bfloat1622float2(v); }
};
template <>
struct PairOf<__half> {
  using T = __half2;
  static __device__ __forceinline__ float2 get(T v) { return __half22float2(v); }
};

// The reduce-scatter epilogue: the parts reach shared memory through the main loop's stage ring
// (the producer TMA-loads them behind the tile's last k-blocks, so their latency hides behind
// those k-blocks' MMAs). A sum stage holds one peer's part, columns [128 half, 128 half + 128)
// of the CTA's 128 x 256 tile, as two boxes of 128 rows x 64 columns (16 KiB apart, 128-byte
// swizzle; columns past n are zeros). This adds one consumer's 64 rows of it to the
// accumulators (fragment layout as in store_block).
constexpr int kSumBoxBytes = kBM * 64 * 2;
// The parts are not prefetched into L2 during the tile's main loop: every SM of a wave reaches
// its sum tile's end together, so the prefetches (192 KiB per SM at ws 4, ~25 MB a wave) would
// come as one burst from HBM that slows the main loop by more than it takes off the epilogue
// (see docs/DECISIONS.md D15).
constexpr int kSumStageBytes = 2 * kSumBoxBytes;
static_assert(kSumStageBytes <= kStageBBytes);

template <typename Out, int kHalf>
__device__ __forceinline__ void add_part_half(const uint8_t* stage, float (&d)[128], int consumer) {
  using T = typename PairOf<Out>::T;
  // ldmatrix gives every thread of a warp, for each 8 x 8 matrix, the pair at (lane / 4,
  // 2 (lane % 4)): the accumulator's fragment layout. One x4 load per two 8-column groups: the
  // matrices (warp rows 0-7, group j), (rows 8-15, j), (0-7, j + 1), (8-15, j + 1); lane l gives
  // the address of row l % 8 of matrix l / 8 (16 contiguous bytes: one swizzle chunk).
  const int lane = threadIdx.x % 32;
  const int row = 64 * consumer + 16 * (threadIdx.x % 128 / 32) + 8 * (lane / 8 % 2) + lane % 8;
  const uint32_t base = smem_u32(stage);
#pragma unroll
  for (int j = 16 * kHalf; j < 16 * kHalf + 16; j += 2) {
    const int col = 8 * (j + lane / 16) - 128 * kHalf;  // of the half
    uint32_t v[4];
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                 : "r"(base + (col / 64) * kSumBoxBytes + swizzled(row, col % 64)));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 x = PairOf<Out>::get(*reinterpret_cast<const T*>(&v[i]));
      float* acc = d + 4 * (j + i / 2) + 2 * (i % 2);
      acc[0] += x.x;
      acc[1] += x.y;
    }
  }
}

// kTmaStore: 16-bit C staged in shared memory and written by TMA stores that overlap the next
// tile's main loop; otherwise (f32 C, or a C TMA cannot address) the consumers store from
// registers.
//
// kCluster = 2: the two CTAs of a cluster take the two 128-row halves of a 256 x 256 tile and
// share its B tile: each loads one half of B and multicasts it into both CTAs' shared memory
// (half the L2 -> SM traffic for B). A stage is refilled only after the consumers of both CTAs
// released it (empty barriers count 4 arrivals: 2 consumers x 2 CTAs).
template <bool kF16, bool kBKMajor, bool kTmaStore, int kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    async_gemm_kernel(const __grid_constant__ CUtensorMap map_a,
                      const __grid_constant__ CUtensorMap map_b,
                      const __grid_constant__ CUtensorMap map_c,
                      const __grid_constant__ CUtensorMap map_a_own,
                      const __grid_constant__ CUtensorMap map_parts,
                      const __grid_constant__ CUtensorMap map_sum, const Params p) {
  extern __shared__ uint8_t smem_raw[];
  // 1024-byte aligned (the 128-byte swizzle's atom) by an offset from smem_raw rather than by
  // masking its generic address: a pointer rebuilt from an integer loses its address space, so
  // the staging stores compiled to generic 64-bit ST.E and every k-block read the shared window
  // (S2UR SR_SWINHI) to convert its stage addresses back (see docs/DECISIONS.md D18).
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint8_t* smem_a = smem;
  uint8_t* smem_b = smem + kStages * kStageABytes;
  uint8_t* smem_c = smem_b + kStages * kStageBBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem_c + (kTmaStore ? kCBytes : 0));
  uint64_t* empty = full + kStages;

  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 2 * kCluster);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // The peer's barriers must be initialised before anyone multicasts into them or arrives there.
  if constexpr (kCluster == 2) {
    cluster_sync();
  } else {
    __syncthreads();
  }

  const uint32_t cta = kCluster == 2 ? cluster_cta_rank() : 0;
  const int cluster_id = blockIdx.x / kCluster;
  const int clusters = gridDim.x / kCluster;
  const int height = kBM * kCluster;
  const int tiles_m = static_cast<int>((p.m + height - 1) / height);
  const int tiles_n = static_cast<int>((p.n + kBN - 1) / kBN);
  const int num_tiles = tiles_m * tiles_n;
  const int k_blocks = static_cast<int>((p.k + kBK - 1) / kBK);
  const int pivot_m = static_cast<int>(walk_pivot(p.first_chunk * p.chunk_rows, height));
  // Clusters never split tiles (the host turns the tail split off for them).
  const int num_units =
      kCluster == 1 ? p.full_tiles + (num_tiles - p.full_tiles) * p.split : num_tiles;
  auto unit = [&](int u) {
    return kCluster == 1 ? unit_at(u, p, num_tiles, k_blocks) : Unit{u, 0, k_blocks, -1, 0};
  };

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == 0) {
      bool waiting = p.ready != nullptr;
      // After a timeout (reported) the parts are loaded without waiting: the op has failed, and
      // the consumers must not hang on their stages.
      bool sum_waiting = p.sum_count > 1;
      int it = 0;
      for (int u = cluster_id; u < num_units; u += clusters) {
        const Unit w = unit(u);
        const Tile tile = tile_at(w.t, tiles_m, tiles_n, pivot_m, height, p.group_m);
        const int m0 = tile.m0 + kBM * static_cast<int>(cta);
        // A tile wholly inside the own chunk is read from the caller's A (always there);
        // any other waits for its chunks to land.
        const int64_t own_first = static_cast<int64_t>(p.own_chunk) * p.chunk_rows;
        const bool own =
            p.own_chunk >= 0 && m0 >= own_first && m0 + kBM <= own_first + p.chunk_rows;
        if (waiting && !own) waiting = wait_chunks_ready(p, m0);
        const CUtensorMap* a_map = own ? &map_a_own : &map_a;
        const int a_row = own ? static_cast<int>(m0 - own_first) : m0;
        for (int kb = w.kb0; kb < w.kb1; ++kb, ++it) {
          const int s = it % kStages;
          mbar_wait(&empty[s], ((it / kStages) & 1) ^ 1);
          mbar_expect_tx(&full[s], kStageABytes + kStageBBytes);
          tma_load_2d(smem_a + s * kStageABytes, a_map, &full[s], kb * kBK, a_row);
          uint8_t* b = smem_b + s * kStageBBytes;
          if constexpr (kCluster == 2) {
            // This CTA's half of B, into both CTAs.
            if constexpr (kBKMajor) {
              tma_load_2d_multicast(b + cta * (kStageBBytes / 2), &map_b, &full[s], kb * kBK,
                                    tile.n0 + (kBN / 2) * static_cast<int>(cta), 0x3);
            } else {
#pragma unroll
              for (int j = 2 * cta; j < 2 * cta + 2; ++j)
                tma_load_2d_multicast(b + j * 8192, &map_b, &full[s], tile.n0 + 64 * j, kb * kBK,
                                      0x3);
            }
          } else if constexpr (kBKMajor) {
            tma_load_2d(b, &map_b, &full[s], kb * kBK, tile.n0);
          } else {
#pragma unroll
            for (int j = 0; j < kBN / 64; ++j)
              tma_load_2d(b + j * 8192, &map_b, &full[s], tile.n0 + 64 * j, kb * kBK);
          }
        }
        if (kCluster == 1 && sums_tile(p, w, m0)) {
          // The peers' parts of this tile, once landed, into sum stages behind its k-blocks:
          // per peer (rank order) two column halves. The wait comes after this tile's k-blocks
          // are issued, so the consumers can reach their count of the previous tile's pending
          // rows (the peers' own chunks wait for it through our pushes) while this thread
          // waits.
          const int64_t row = sum_row_of(p, m0);
          if (sum_waiting) sum_waiting = wait_sum_parts(p, row, tile.n0);
          asm volatile("fence.proxy.async.global;" ::: "memory");
          for (int s = 0; s < p.sum_count; ++s) {
            if (s == p.sum_self) continue;
            for (int half = 0; half < 2; ++half, ++it) {
              const int st = it % kStages;
              mbar_wait(&empty[st], ((it / kStages) & 1) ^ 1);
              mbar_expect_tx(&full[st], kSumStageBytes);
              uint8_t* dst = smem_b + st * kStageBBytes;
              const int col = tile.n0 + 128 * half;
              tma_load_3d(dst, &map_parts, &full[st], col, static_cast<int>(row), s);
              tma_load_3d(dst + kSumBoxBytes, &map_parts, &full[st], col + 64,
                          static_cast<int>(row), s);
            }
          }
        }
      }
    }
    if constexpr (kCluster == 2) cluster_sync();
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int consumer = wg - 1;
  const bool leader = threadIdx.x % 128 == 0;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i)
    acc[i] = 0.f;
  int it = 0;
  int pending_row = -1;  // kTmaStore: rows of the tile whose stores are in flight
  int pending_col = 0;   // and its first column
  // The leader counts the pending tile's rows in done once its TMA stores are complete.
  auto count_pending = [&] {
    if (p.done != nullptr && pending_row >= 0) {
      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
      publish_done(p, pending_row, pending_col);
      pending_row = -1;
    }
  };
  // Releases stage s to the producers of every CTA that writes into it.
  auto release = [&](int s) {
    if constexpr (kCluster == 2) {
      mbar_arrive_cluster(&empty[s], 0);
      mbar_arrive_cluster(&empty[s], 1);
    } else {
      mbar_arrive(&empty[s]);
    }
  };
  for (int u = cluster_id; u < num_units; u += clusters) {
    const Unit w = unit(u);
    Tile tile = tile_at(w.t, tiles_m, tiles_n, pivot_m, height, p.group_m);
    tile.m0 += kBM * static_cast<int>(cta);
    const bool sums = kCluster == 1 && sums_tile(p, w, tile.m0);  // (host: single CTAs)
    int prev_stage = -1;
    for (int kb = w.kb0; kb < w.kb1; ++kb, ++it) {
      const int s = it % kStages;
      mbar_wait(&full[s], (it / kStages) & 1);
      const uint32_t a_addr = smem_u32(smem_a + s * kStageABytes + consumer * (64 * 128));
      const uint32_t b_addr = smem_u32(smem_b + s * kStageBBytes);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        const uint64_t da = smem_desc(a_addr + kk * 32, 16, 1024);
        if constexpr (kBKMajor) {
          wgmma<kF16, 0>(acc, da, smem_desc(b_addr + kk * 32, 16, 1024), kb > w.kb0 || kk > 0);
        } else {
          wgmma<kF16, 1>(acc, da, smem_desc(b_addr + kk * 2048, p.b_lbo, p.b_sbo),
                         kb > w.kb0 || kk > 0);
        }
      }
      wgmma_commit();
      // Keep one k-block in flight: the previous one is done, its stage can be refilled.
      wgmma_wait<1>();
      if (leader && prev_stage >= 0) release(prev_stage);
      prev_stage = s;
      if constexpr (kTmaStore) {
        // The previous tile's TMA stores have had a k-block to finish: its rows are counted now
        // rather than at this tile's epilogue, a whole tile later (the copy engine waits for
        // the count to push those rows).
        if (leader && kb == w.kb0 + 1) count_pending();
      }
    }
    wgmma_wait<0>();
    if (leader && prev_stage >= 0) release(prev_stage);
    if (w.part >= 0) {
      // A tail tile's K-range. Parts but the last leave their f32 accumulator in the workspace
      // and count it; the last one waits for them and adds them in part order (the same bits on
      // every run), then stores the tile as usual.
      const int tid = threadIdx.x % 128;
      uint32_t* flag = p.split_flags + 2 * w.tail + consumer;
      auto partial = [&](int part) {
        return reinterpret_cast<float4*>(p.partials) +
               ((static_cast<int64_t>(w.tail) * (p.split - 1) + part) * 2 + consumer) * (32 * 128) +
               tid;
      };
      if (w.part < p.split - 1) {
        float4* dst = partial(w.part);
#pragma unroll
        for (int i = 0; i < 32; ++i)
          __stcg(dst + i * 128,
                 make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
        asm volatile("bar.sync %0, 128;" ::"r"(1 + consumer) : "memory");
        if (leader) {
          __threadfence();
          atomicAdd(flag, 1u);
        }
        continue;
      }
      if (leader) wait_split_parts(p, flag, static_cast<uint32_t>(p.split - 1));
      asm volatile("bar.sync %0, 128;" ::"r"(1 + consumer) : "memory");
      for (int part = 0; part < p.split - 1; ++part) {
        const float4* src = partial(part);
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const float4 v = __ldcg(src + i * 128);
          acc[4 * i] += v.x;
          acc[4 * i + 1] += v.y;
          acc[4 * i + 2] += v.z;
          acc[4 * i + 3] += v.w;
        }
      }
      if (leader) *flag = 0;  // every part of this launch has been counted; 0 for the next one
    }

    const int r0 = tile.m0 + 64 * consumer;
    if (sums) {
      // The own chunk of a reduce-scatter (last in the walk): the peers' parts, from the sum
      // stages in rank order, added to the accumulators, then the reduced rows stored into
      // sum_out; nothing goes to C or to done. The previous tile's rows are counted first: the
      // peers' own chunks wait for them (through our pushes) as this tile's parts wait for
      // theirs, so no count may stay pending behind these stages.
      if constexpr (kTmaStore) {
        if (leader) count_pending();
      }
      for (int s = 0; s < p.sum_count; ++s) {
        if (s == p.sum_self) continue;
        auto add_half = [&](auto half) {
          constexpr int kHalf = decltype(half)::value;
          const int st = it % kStages;
          mbar_wait(&full[st], (it / kStages) & 1);
          const uint8_t* stage = smem_b + st * kStageBBytes;
          if (p.c_dtype == 1) {
            add_part_half<__nv_bfloat16, kHalf>(stage, acc, consumer);
          } else {
            add_part_half<__half, kHalf>(stage, acc, consumer);
          }
          // Every thread's reads are done (and ordered before the TMA that refills the stage)
          // before the leader releases it.
          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
          asm volatile("bar.sync %0, 128;" ::"r"(1 + consumer) : "memory");
          if (leader) release(st);
          ++it;
        };
        add_half(std::integral_constant<int, 0>{});
        add_half(std::integral_constant<int, 1>{});
      }
      if (p.sum_avg) {
        // Times 1 / count: exact for a power-of-two count (else within an ulp of the division).
        const float inv = 1.0f / static_cast<float>(p.sum_count);
#pragma unroll
        for (int i = 0; i < 128; ++i)
          acc[i] *= inv;
      }
    }
    const int64_t sum_row = sum_row_of(p, r0);
    if (sums && !(kTmaStore && p.sum_tma_store)) {
      // From registers (no TMA store for sum_out); its rows all lie in the chunk.
      if (p.c_dtype == 1) {
        store_block(static_cast<__nv_bfloat16*>(p.sum_out), p.sum_ldo, p.chunk_rows, p.n, acc,
                    sum_row, tile.n0);
      } else {
        store_block(static_cast<__half*>(p.sum_out), p.sum_ldo, p.chunk_rows, p.n, acc, sum_row,
                    tile.n0);
      }
      continue;
    }
    if constexpr (kTmaStore) {
      // Schedule per tile and half (leader = thread 0 of this consumer), twice:
      //   leader: earlier stores have read the staging area (before the first half: the previous
      //   tile's stores done and its chunk published) | bar | all: registers -> staging | proxy
      //   fence | bar | leader: 2 TMA stores, commit (the last ones run during the next tile)
      // A tile of the sum chunk goes to sum_out (map_sum, chunk rows) and is not counted.
      uint8_t* staging = smem_c + consumer * (kCBytes / 2);
      const CUtensorMap* map = sums ? &map_sum : &map_c;
      const int row = sums ? static_cast<int>(sum_row) : r0;
      const bool row_ok = sums || r0 < p.m;
      auto store_half = [&](auto half) {
        constexpr int kHalf = decltype(half)::value;
        if (leader) {
          if (kHalf == 0 && p.done != nullptr) {
            asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
            if (pending_row >= 0) publish_done(p, pending_row, pending_col);
          } else {
            asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
          }
        }
        asm volatile("bar.sync %0, 128;" ::"r"(1 + consumer) : "memory");
        if (p.c_dtype == 1) {
          stage_block<__nv_bfloat16, kHalf>(staging, acc);
        } else {
          stage_block<__half, kHalf>(staging, acc);
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("bar.sync %0, 128;" ::"r"(1 + consumer) : "memory");
        if (leader) {
          if (row_ok) {
            tma_store_2d(map, staging, tile.n0 + 128 * kHalf, row);
            tma_store_2d(map, staging + 8192, tile.n0 + 128 * kHalf + 64, row);
          }
          asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        }
      };
      store_half(std::integral_constant<int, 0>{});
      store_half(std::integral_constant<int, 1>{});
      if (leader) {
        pending_row = !sums && r0 < p.m ? r0 : -1;
        pending_col = tile.n0;
      }
    } else {
      switch (p.c_dtype) {
        case 0:
          store_block(static_cast<float*>(p.c), p.ldc, p.m, p.n, acc, r0, tile.n0);
          break;
        case 1:
          store_block(static_cast<__nv_bfloat16*>(p.c), p.ldc, p.m, p.n, acc, r0, tile.n0);
          break;
        default:
          store_block(static_cast<__half*>(p.c), p.ldc, p.m, p.n, acc, r0, tile.n0);
          break;
      }
      if (p.done != nullptr && r0 < p.m) {
        // Publish: every thread of this consumer has stored, then one release increment.
        asm volatile("bar.sync %0, 128;" ::"r"(1 + consumer) : "memory");
        if (leader) publish_done(p, r0, tile.n0);
      }
    }
  }
  if constexpr (kTmaStore) {
    if (leader) {
      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
      if (p.done != nullptr && pending_row >= 0) publish_done(p, pending_row, pending_col);
    }
  }
  // No CTA leaves while its peer may still arrive on its barriers.
  if constexpr (kCluster == 2) cluster_sync();
}

// Host side.

using EncodeTiled = decltype(&cuTensorMapEncodeTiled);

EncodeTiled encode_tiled() {
  static EncodeTiled fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault,
                                         &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      return static_cast<EncodeTiled>(nullptr);
    }
    return reinterpret_cast<EncodeTiled>(ptr);
  }();
  return fn;
}

// A tiled map of `rank` dims (dims[0] contiguous; strides in bytes for dims 1..), 128-byte
// swizzle, zero fill out of bounds.
bool encode_map(CUtensorMap* map, const void* base, CUtensorMapDataType type, int rank,
                const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box) {
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  return encode_tiled()(map, type, rank, const_cast<void*>(base), dims, strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The map's element type for a 16-bit dtype.
CUtensorMapDataType map_type(DType d) {
  return d == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

// A 2-D map of 16-bit elements: inner dim `inner` (contiguous), outer dim `outer` with row
// stride `ld` elements, box inner x outer.
bool make_map(CUtensorMap* map, const void* base, CUtensorMapDataType type, int64_t inner,
              int64_t outer, int64_t ld, uint32_t box_inner, uint32_t box_outer) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld * 2)};
  const cuuint32_t box[2] = {box_inner, box_outer};
  return encode_map(map, base, type, 2, dims, strides, box);
}

// The reduce-scatter epilogue's parts, [count, rows, n] (row stride ld, part stride `stride`
// elements) as a 3-D map: boxes of 64 columns x 128 rows of one part, 128-byte swizzle, zeros
// past n.
bool make_parts_map(CUtensorMap* map, const void* base, CUtensorMapDataType type, int64_t n,
                    int64_t rows, int64_t count, int64_t ld, int64_t stride) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(n), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(count)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(ld * 2),
                                 static_cast<cuuint64_t>(stride * 2)};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(kBM), 1};
  return encode_map(map, base, type, 3, dims, strides, box);
}

// SMs of the current device, asked once per device (several calls per launch need it).
int sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> counts[kMaxDevices] = {};
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (device >= 0 && device < kMaxDevices && (count = counts[device].load()) > 0) return count;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 0;
  if (device >= 0 && device < kMaxDevices) counts[device].store(count);
  return count;
}

template <bool kF16, bool kBKMajor, bool kTmaStore, int kCluster>
cudaError_t launch(const CUtensorMap& map_a, const CUtensorMap& map_b, const CUtensorMap& map_c,
                   const CUtensorMap& map_a_own, const CUtensorMap& map_parts,
                   const CUtensorMap& map_sum, const Params& p, int max_ctas, cudaStream_t stream) {
  auto* kernel = async_gemm_kernel<kF16, kBKMajor, kTmaStore, kCluster>;
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem_bytes<kTmaStore>();
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  // Per function (one process drives one device): the shared-memory opt-in, and how many
  // clusters fit at once (a GPC may not hold an even number of busy SMs).
  static std::once_flag once;
  static cudaError_t attr_status = cudaSuccess;
  static int max_clusters = 0;
  std::call_once(once, [&] {
    attr_status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       smem_bytes<kTmaStore>());
    if (attr_status != cudaSuccess) return;
    config.gridDim = dim3(kCluster * 256);
    attr_status = cudaOccupancyMaxActiveClusters(&max_clusters, kernel, &config);
  });
  if (attr_status != cudaSuccess) return attr_status;
  if (max_clusters <= 0) return cudaErrorInvalidConfiguration;
  const int64_t height = int64_t{kBM} * kCluster;
  const int64_t tiles = ((p.m + height - 1) / height) * ((p.n + kBN - 1) / kBN);
  // One CTA per work unit at most: a tile, or one part of a split tile (split tiles exist only
  // with single CTAs; with fewer tiles than SMs every part gets its own CTA).
  const int64_t units = p.full_tiles + (tiles - p.full_tiles) * p.split;
  const int64_t clusters = std::min<int64_t>({max_clusters, max_ctas / kCluster, units});
  if (clusters <= 0) return cudaErrorInvalidConfiguration;
  config.gridDim = dim3(static_cast<unsigned>(clusters * kCluster));
  // Single CTAs launch without the cluster attribute (the driver's plain launch path).
  if constexpr (kCluster == 1) config.numAttrs = 0;
  return cudaLaunchKernelEx(&config, kernel, map_a, map_b, map_c, map_a_own, map_parts, map_sum, p);
}

// The kernel for (dtype, B layout, epilogue, cluster), with the launch arguments.
struct Launch {
  const CUtensorMap &map_a, &map_b, &map_c, &map_a_own, &map_parts, &map_sum;
  const Params& p;
  int max_ctas;
  cudaStream_t stream;
  template <bool kF16, bool kBKMajor, bool kTmaStore, int kCluster>
  cudaError_t run() const {
    return launch<kF16, kBKMajor, kTmaStore, kCluster>(map_a, map_b, map_c, map_a_own, map_parts,
                                                       map_sum, p, max_ctas, stream);
  }
};

template <bool kF16>
cudaError_t launch_layout(bool b_k_major, bool tma_store, int cluster, const Launch& l) {
  if (b_k_major) {
    if (!tma_store) return l.run<kF16, true, false, 1>();
    return cluster == 2 ? l.run<kF16, true, true, 2>() : l.run<kF16, true, true, 1>();
  }
  if (!tma_store) return l.run<kF16, false, false, 1>();
  return cluster == 2 ? l.run<kF16, false, true, 2>() : l.run<kF16, false, true, 1>();
}

int64_t chunk_rows_of(const AsyncGemmArgs& a) {
  return a.chunk_rows > 0 ? a.chunk_rows : a.m;
}

int64_t ready_rows_of(const AsyncGemmArgs& a) {
  return a.ready_rows > 0 ? a.ready_rows : chunk_rows_of(a);
}

int64_t done_rows_of(const AsyncGemmArgs& a) {
  return a.done_rows > 0 ? a.done_rows : chunk_rows_of(a);
}

int64_t sum_rows_of(const AsyncGemmArgs& a) {
  return a.sum_rows > 0 ? a.sum_rows : chunk_rows_of(a);
}

// Columns per piece of the done counters or the sum flags (0, or more than n: all of n), and
// the pieces per row range. A column piece is a multiple of kBN wide, so a tile lies in one.
int64_t piece_cols(const AsyncGemmArgs& a, int64_t cols) {
  const int64_t all = (a.n + kBN - 1) / kBN * kBN;
  return cols > 0 && cols < all ? cols : all;
}

int col_pieces(const AsyncGemmArgs& a, int64_t cols) {
  return static_cast<int>((a.n + piece_cols(a, cols) - 1) / piece_cols(a, cols));
}

// Why the reduce-scatter epilogue's arguments are unusable, or nullptr.
const char* sum_unsupported(const AsyncGemmArgs& a) {
  const int64_t rows = chunk_rows_of(a);
  if (rows % kBM != 0) return "the reduce-scatter epilogue needs chunk_rows % 128 == 0";
  if (a.sum_chunk < 0 || (a.sum_chunk + 1) * rows > a.m) return "sum_chunk is out of range";
  if (a.sum_count < 1 || a.sum_count > 64) return "sum_count is out of range (1 to 64)";
  if (a.sum_self < 0 || a.sum_self >= a.sum_count) return "sum_self is out of range";
  if (a.sum_count > 1 && (a.sum_parts == nullptr || a.sum_flags == nullptr))
    return "the reduce-scatter epilogue needs its parts and their flags";
  if (a.sum_out == nullptr) return "the reduce-scatter epilogue needs an output";
  if (a.n % 2 != 0) return "the reduce-scatter epilogue needs an even n";
  if (a.sum_count > 1 && a.timeout_ns == 0) return "waiting for the parts needs a timeout";
  const int64_t q = sum_rows_of(a);
  if (q % kBM != 0 || q > rows) return "sum_rows is not a multiple of 128 up to chunk_rows";
  if (a.sum_cols < 0 || a.sum_cols % kBN != 0) return "sum_cols is not a multiple of 256";
  if (a.sum_count > 1 && a.sum_flag_stride < a.sum_count &&
      (rows + q - 1) / q * col_pieces(a, a.sum_cols) > 1)
    return "sum_flag_stride is smaller than sum_count (pieces' flags would overlap)";
  if (a.c_dtype == DType::kF32) return "the reduce-scatter epilogue needs a 16-bit C";
  const auto misaligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 4; };
  if (misaligned(a.sum_out) || a.sum_ldo % 2 != 0 || a.sum_ldo < a.n)
    return "the reduced output is not aligned to two elements or its row stride is odd or short";
  // The parts are TMA-loaded (a 3-D map: column, chunk row, rank).
  if (a.sum_count > 1 &&
      (reinterpret_cast<uintptr_t>(a.sum_parts) % 16 != 0 || a.sum_ld % 8 != 0 || a.sum_ld < a.n ||
       a.sum_part_stride % 8 != 0 || a.sum_part_stride < rows * a.sum_ld)) {
    return "the parts are not 16-byte aligned, or their row stride or part stride is not a "
           "multiple of 16 bytes or is short (TMA)";
  }
  return nullptr;
}

// The largest height up to kGroupM that divides `tiles` m-tiles (1 if none above 1 does).
int largest_group_dividing(int64_t tiles) {
  for (int64_t g = std::min<int64_t>(kGroupM, tiles); g > 1; --g) {
    if (tiles % g == 0) return static_cast<int>(g);
  }
  return 1;
}

// The walk's group height (see the file comment): kGroupM, or where rows become ready together
// (pieces of ready_rows), are counted together (pieces of done_rows) or are reduced (sum_chunk:
// the native MM+RS) and
// the chunks and pieces start on the tile grid, the largest height up to kGroupM that divides
// every piece and chunk: groups are laid from the first chunk's first m-tile on, so a group
// never spans two pieces or two chunks. The native MM+RS depends on it: its own chunk must come
// last in the walk, or two ranks can each hold the tile the other waits for (until the
// timeout), and its pushes want the peers' chunks finished one after the other: groups that
// span the peers' chunks would finish them together, late, so that their pushes no longer
// overlap the GEMM (see docs/DECISIONS.md D11).
int group_m_of(const AsyncGemmArgs& a, int64_t height) {
  if (a.ready == nullptr && a.done == nullptr && a.sum_chunk < 0) return kGroupM;
  int64_t rows = chunk_rows_of(a);
  if (a.ready != nullptr) rows = std::gcd(rows, ready_rows_of(a));
  if (a.done != nullptr) rows = std::gcd(rows, done_rows_of(a));
  // Off the tile grid (AG+MM chunks of any rows; the counted and reduced ones are on it): tiles
  // straddle pieces anyway, but groups of at most a piece's whole m-tiles span few pieces, so the
  // walk follows the pieces as they land (see docs/DECISIONS.md D11).
  if (rows % height != 0) {
    if (a.ready == nullptr) return kGroupM;
    // A piece's rows (the op's push pieces are whole tiles, but a chunk's last may be shorter:
    // sized by it, the groups of 1000-row chunks in pieces of 896 and 104 would be 1 m-tile).
    const int64_t piece = std::min(ready_rows_of(a), chunk_rows_of(a));
    return static_cast<int>(std::clamp<int64_t>(piece / height, 1, kGroupM));
  }
  return largest_group_dividing(rows / height);
}

int out_code(DType d) {
  return d == DType::kF32 ? 0 : d == DType::kBF16 ? 1 : 2;
}

template <typename In>
__global__ void reference_gemm_kernel(const In* a, int64_t lda, const In* b, int64_t ldb,
                                      bool b_k_major, void* c, int64_t ldc, int c_dtype, int64_t m,
                                      int64_t n, int64_t k) {
  const int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t row = blockIdx.y;
  if (col >= n || row >= m) return;
  float acc = 0.f;
  for (int64_t i = 0; i < k; ++i) {
    const In bv = b_k_major ? b[col * ldb + i] : b[i * ldb + col];
    acc += static_cast<float>(a[row * lda + i]) * static_cast<float>(bv);
  }
  if (c_dtype == 0) {
    static_cast<float*>(c)[row * ldc + col] = acc;
  } else if (c_dtype == 1) {
    static_cast<__nv_bfloat16*>(c)[row * ldc + col] = __float2bfloat16_rn(acc);
  } else {
    static_cast<__half*>(c)[row * ldc + col] = __float2half_rn(acc);
  }
}

}  // namespace

const char* async_gemm_unsupported(const AsyncGemmArgs& a) {
  if (a.in_dtype != DType::kBF16 && a.in_dtype != DType::kF16) return "inputs are not bf16 or f16";
  if (a.c_dtype != DType::kF32 && a.c_dtype != DType::kBF16 && a.c_dtype != DType::kF16) {
    return "the output is not f32, bf16 or f16";
  }
  if (a.m <= 0 || a.n <= 0 || a.k <= 0) return "an empty problem";
  if (a.m > (1ll << 31) - kBM || a.n > (1ll << 31) - kBN || a.k > (1ll << 31))
    return "a dimension over 2^31";
  const auto misaligned = [](const void* ptr, uintptr_t bytes) {
    return reinterpret_cast<uintptr_t>(ptr) % bytes != 0;
  };
  if (misaligned(a.a, 16) || misaligned(a.b, 16)) return "A or B is not 16-byte aligned (TMA)";
  if (a.lda % 8 != 0 || a.ldb % 8 != 0)
    return "a row stride of A or B is not a multiple of 16 bytes (TMA)";
  if (a.lda < a.k || a.ldb < (a.b_k_major ? a.k : a.n)) return "a row stride shorter than its row";
  if (a.ldc < a.n || a.ldc % 2 != 0 || misaligned(a.c, 8))
    return "C's row stride is odd or C is not 8-byte aligned";
  const int64_t rows = chunk_rows_of(a);
  if (rows <= 0 || (a.m + rows - 1) / rows > 1 << 20) return "chunk_rows is out of range";
  if (a.first_chunk < 0 || a.first_chunk * rows >= a.m) return "first_chunk is out of range";
  if (a.done != nullptr && rows % kBM != 0)
    return "publishing per-chunk completion needs chunk_rows % 128 == 0";
  if (a.done != nullptr &&
      (a.done_rows < 0 || done_rows_of(a) % kBM != 0 || rows % done_rows_of(a) != 0))
    return "done_rows is not a multiple of 128 that divides chunk_rows";
  if (a.done != nullptr && (a.done_cols < 0 || a.done_cols % kBN != 0))
    return "done_cols is not a multiple of 256";
  if (a.sum_chunk >= 0) {
    if (const char* why = sum_unsupported(a)) return why;
  }
  if (a.ready != nullptr && a.timeout_ns == 0) return "waiting for chunks needs a timeout";
  if (a.ready_rows < 0 || a.ready_rows > rows)
    return "ready_rows is out of range (0 to chunk_rows)";
  if (ready_rows_of(a) < rows && a.ready_stride < (a.m + rows - 1) / rows)
    return "ready_stride is smaller than the number of chunks (pieces' flags would overlap)";
  if (a.own_a != nullptr) {
    if (a.own_chunk < 0 || a.own_chunk * rows >= a.m) return "own_chunk is out of range";
    if (misaligned(a.own_a, 16) || a.own_lda % 8 != 0 || a.own_lda < a.k) {
      return "the own chunk's A is not 16-byte aligned or its row stride is not a multiple of 16 "
             "bytes (TMA)";
    }
  }
  if (a.reserve_sms < 0 || a.reserve_sms > 8) return "reserve_sms is out of range (0 to 8)";
  if (encode_tiled() == nullptr) return "the driver has no cuTensorMapEncodeTiled";
  return nullptr;
}

uint32_t async_gemm_done_count(const AsyncGemmArgs& a, int index) {
  const int64_t rows = done_rows_of(a), cols = piece_cols(a, a.done_cols);
  const int pieces = col_pieces(a, a.done_cols);
  const int64_t first = index / pieces * rows;
  const int64_t last = std::min(a.m, first + rows);
  const int64_t halves = (last - first + 63) / 64;
  const int64_t first_col = index % pieces * cols;
  const int64_t width = std::min(a.n, first_col + cols) - first_col;
  return static_cast<uint32_t>(halves * ((width + kBN - 1) / kBN));
}

namespace {

constexpr int kMaxSplit = 4;
constexpr int kMinSplitKBlocks = 4;  // k-blocks per part at least (the pipeline must fill)
constexpr size_t kPartialBytes = 2 * 32 * 128 * sizeof(float4);  // one tile's f32 accumulators

size_t split_flag_bytes(int ctas) {
  return (static_cast<size_t>(ctas) * 2 * sizeof(uint32_t) + 255) / 256 * 256;
}

int ctas_of(const AsyncGemmArgs& a) {
  return (a.max_ctas > 0 ? a.max_ctas : sm_count()) - a.reserve_sms;
}

// Parts per tail tile: as many as the idle CTAs of the last wave can take, each part at least
// kMinSplitKBlocks deep. The tail units then fit in one wave, at most one per CTA, so the last
// part of a tile never waits for a CTA that is not running.
int tail_split_of(const AsyncGemmArgs& a, int ctas, bool clustered) {
  // More CTAs than SMs could leave a part's CTA waiting for an SM that its partner holds.
  if (a.split_workspace == nullptr || a.tail_split == 1 || clustered || ctas <= 0 ||
      ctas > sm_count()) {
    return 1;
  }
  const int64_t tiles = ((a.m + kBM - 1) / kBM) * ((a.n + kBN - 1) / kBN);
  const int tail = static_cast<int>(tiles % ctas);
  if (tail == 0) return 1;
  const int64_t k_blocks = (a.k + kBK - 1) / kBK;
  int split = static_cast<int>(std::min<int64_t>(ctas / tail, k_blocks / kMinSplitKBlocks));
  split = std::min(split, a.tail_split >= 2 ? std::min(a.tail_split, kMaxSplit) : kMaxSplit);
  return split >= 2 ? split : 1;
}

// The TMA store needs a 16-bit C with a 16-byte aligned base and row stride; clusters of two
// (B multicast) only come with it, and only when asked for: they are no faster than single CTAs
// (see docs/DECISIONS.md D17).
bool uses_tma_store(const AsyncGemmArgs& a) {
  return a.c_dtype != DType::kF32 && reinterpret_cast<uintptr_t>(a.c) % 16 == 0 && a.ldc % 8 == 0 &&
         !a.force_register_store;
}

// The reduce-scatter epilogue runs on single CTAs: its sum stages are per CTA, while a
// cluster's rings go in step.
bool uses_cluster(const AsyncGemmArgs& a) {
  return a.cluster == 2 && uses_tma_store(a) && a.sum_chunk < 0;
}

}  // namespace

std::vector<int> async_gemm_done_order(const AsyncGemmArgs& a) {
  // Each counter's last tile in the walk (tile_at inverted): an m-tile at walk row rel lies in
  // group rel / g, whose h m-tiles run fastest, so tile (rel, ni) is number
  // group * g * tiles_n + ni * h + rel % g; a counter's last one is in its last column.
  const int64_t height = int64_t{kBM} * (uses_cluster(a) ? 2 : 1);
  const int64_t g = group_m_of(a, height);
  const int64_t tiles_m = (a.m + height - 1) / height, tiles_n = (a.n + kBN - 1) / kBN;
  const int64_t pivot = walk_pivot(a.first_chunk * chunk_rows_of(a), height);
  const int64_t rows = done_rows_of(a), cols = piece_cols(a, a.done_cols);
  const int pieces = col_pieces(a, a.done_cols);
  const int64_t counters = (a.m + rows - 1) / rows * pieces;
  std::vector<int64_t> last(static_cast<size_t>(counters), -1);
  for (int64_t r0 = 0; r0 < a.m; r0 += kBM) {  // each CTA's rows of a (cluster) tile
    const int64_t rel = (r0 / height - pivot + tiles_m) % tiles_m;
    const int64_t first = rel / g * g;
    const int64_t h = std::min(g, tiles_m - first);
    for (int q = 0; q < pieces; ++q) {
      const int64_t ni = std::min(tiles_n, ((q + 1) * cols + kBN - 1) / kBN) - 1;
      int64_t& t = last[static_cast<size_t>(r0 / rows * pieces + q)];
      t = std::max(t, first * tiles_n + ni * h + (rel - first));
    }
  }
  std::vector<int> order(static_cast<size_t>(counters));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return last[x] < last[y]; });
  return order;
}

size_t async_gemm_split_workspace_bytes() {
  const int ctas = sm_count();
  return split_flag_bytes(ctas) + static_cast<size_t>(ctas) * kPartialBytes;
}

int async_gemm_group_m(const AsyncGemmArgs& a) {
  return group_m_of(a, int64_t{kBM} * (uses_cluster(a) ? 2 : 1));
}

int async_gemm_tail_split(const AsyncGemmArgs& a) {
  return tail_split_of(a, ctas_of(a), uses_cluster(a));
}

AsyncGemmOwnEdges async_gemm_own_edge_rows(const AsyncGemmArgs& a) {
  if (a.own_a == nullptr || a.own_chunk < 0) return {};
  // As the producer decides (own: m0 >= own_first && m0 + kBM <= own_first + chunk_rows; with
  // clusters each CTA loads its own 128 rows), for the tiles that overlap [first, last).
  const int64_t rows = chunk_rows_of(a);
  const int64_t first = a.own_chunk * rows;
  const int64_t last = std::min(a.m, first + rows);
  if (last <= first) return {};
  const int64_t head = first % kBM == 0 ? 0 : std::min(last, (first / kBM + 1) * kBM) - first;
  const int64_t m0 = (last - 1) / kBM * kBM;  // the tile holding the chunk's last row
  const int64_t tail = m0 + kBM > first + rows && m0 >= first + head ? last - m0 : 0;
  return {head, tail};
}

cudaError_t async_gemm(const AsyncGemmArgs& a, cudaStream_t stream) {
  if (async_gemm_unsupported(a) != nullptr) return cudaErrorInvalidValue;
  const CUtensorMapDataType type = map_type(a.in_dtype);
  const CUtensorMapDataType c_type = map_type(a.c_dtype);  // 16-bit C only: TMA store, sums
  const bool tma_store = uses_tma_store(a);
  const int cluster = uses_cluster(a) ? 2 : 1;
  CUtensorMap map_a{}, map_b{};
  if (!make_map(&map_a, a.a, type, a.k, a.m, a.lda, kBK, kBM)) return cudaErrorInvalidValue;
  // K-major B: one box of the CTA's share of the tile's rows; N-major: 64 x 64 boxes.
  const bool ok_b = a.b_k_major ? make_map(&map_b, a.b, type, a.k, a.n, a.ldb, kBK, kBN / cluster)
                                : make_map(&map_b, a.b, type, a.n, a.k, a.ldb, 64, kBK);
  if (!ok_b) return cudaErrorInvalidValue;
  Params p{};
  p.m = a.m;
  p.n = a.n;
  p.k = a.k;
  p.c = a.c;
  p.ldc = a.ldc;
  p.c_dtype = out_code(a.c_dtype);
  p.chunk_rows = chunk_rows_of(a);
  p.first_chunk = a.first_chunk;
  p.ready = a.ready;
  p.ready_value = a.ready_value;
  p.ready_rows = ready_rows_of(a);
  p.ready_stride = a.ready_stride;
  p.group_m = group_m_of(a, kBM * cluster);
  p.done = a.done;
  p.done_rows = done_rows_of(a);
  p.done_cols = static_cast<int>(piece_cols(a, a.done_cols));
  p.done_col_pieces = col_pieces(a, a.done_cols);
  p.sum_chunk = a.sum_chunk;
  if (a.sum_chunk >= 0) {
    p.sum_parts = a.sum_parts;
    p.sum_part_stride = a.sum_part_stride;
    p.sum_ld = a.sum_ld;
    p.sum_out = a.sum_out;
    p.sum_ldo = a.sum_ldo;
    p.sum_count = a.sum_count;
    p.sum_self = a.sum_self;
    p.sum_avg = a.sum_avg;
    p.sum_flags = a.sum_flags;
    p.sum_value = a.sum_value;
    p.sum_rows = sum_rows_of(a);
    p.sum_cols = static_cast<int>(piece_cols(a, a.sum_cols));
    p.sum_col_pieces = col_pieces(a, a.sum_cols);
    p.sum_flag_stride = a.sum_flag_stride;
    p.sum_channel = a.sum_channel;
  }
  p.timeout_ns = a.timeout_ns;
  p.slot = a.slot;
  p.rank = a.rank;
  p.b_lbo = a.b_mn_lbo != 0 ? a.b_mn_lbo : 8192;
  p.b_sbo = a.b_mn_sbo != 0 ? a.b_mn_sbo : 1024;
  const int ctas = ctas_of(a);
  if (ctas <= 0) return cudaErrorNoDevice;
  const int64_t tiles = ((a.m + kBM * cluster - 1) / (kBM * cluster)) * ((a.n + kBN - 1) / kBN);
  p.split = tail_split_of(a, ctas, cluster == 2);
  p.full_tiles = static_cast<int>(p.split > 1 ? tiles - tiles % ctas : tiles);
  if (p.split > 1) {
    p.split_flags = static_cast<uint32_t*>(a.split_workspace);
    p.partials = reinterpret_cast<float*>(static_cast<uint8_t*>(a.split_workspace) +
                                          split_flag_bytes(sm_count()));
  }
  CUtensorMap map_c{};
  if (tma_store) {
    if (!make_map(&map_c, a.c, c_type, a.n, a.m, a.ldc, 64, 64)) return cudaErrorInvalidValue;
  }
  // The own chunk's rows straight from the caller's A: [chunk rows, K] with row stride own_lda.
  CUtensorMap map_a_own{};
  p.own_chunk = -1;
  if (a.own_a != nullptr && a.own_chunk >= 0) {
    const int64_t rows = std::min(p.chunk_rows, a.m - a.own_chunk * p.chunk_rows);
    if (!make_map(&map_a_own, a.own_a, type, a.k, rows, a.own_lda, kBK, kBM))
      return cudaErrorInvalidValue;
    p.own_chunk = a.own_chunk;
  }
  // The reduce-scatter epilogue: the peers' parts (TMA-loaded into sum stages) and, where the
  // TMA can address it, the reduced output (stored like C, through the staging area).
  CUtensorMap map_parts{}, map_sum{};
  if (a.sum_chunk >= 0) {
    if (a.sum_count > 1 && !make_parts_map(&map_parts, a.sum_parts, c_type, a.n, p.chunk_rows,
                                           a.sum_count, a.sum_ld, a.sum_part_stride)) {
      return cudaErrorInvalidValue;
    }
    p.sum_tma_store =
        tma_store && reinterpret_cast<uintptr_t>(a.sum_out) % 16 == 0 && a.sum_ldo % 8 == 0;
    if (p.sum_tma_store &&
        !make_map(&map_sum, a.sum_out, c_type, a.n, p.chunk_rows, a.sum_ldo, 64, 64)) {
      return cudaErrorInvalidValue;
    }
  }
  const Launch l{map_a, map_b, map_c, map_a_own, map_parts, map_sum, p, ctas, stream};
  if (a.in_dtype == DType::kF16) return launch_layout<true>(a.b_k_major, tma_store, cluster, l);
  return launch_layout<false>(a.b_k_major, tma_store, cluster, l);
}

cudaError_t reference_gemm(const AsyncGemmArgs& a, cudaStream_t stream) {
  if (a.m <= 0 || a.n <= 0 || a.k <= 0 || a.m > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((a.n + 127) / 128), static_cast<unsigned>(a.m));
  if (a.in_dtype == DType::kBF16) {
    reference_gemm_kernel<__nv_bfloat16><<<grid, 128, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(a.a), a.lda, static_cast<const __nv_bfloat16*>(a.b),
        a.ldb, a.b_k_major, a.c, a.ldc, out_code(a.c_dtype), a.m, a.n, a.k);
  } else if (a.in_dtype == DType::kF16) {
    reference_gemm_kernel<__half><<<grid, 128, 0, stream>>>(
        static_cast<const __half*>(a.a), a.lda, static_cast<const __half*>(a.b), a.ldb, a.b_k_major,
        a.c, a.ldc, out_code(a.c_dtype), a.m, a.n, a.k);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace asynctp::kernels
