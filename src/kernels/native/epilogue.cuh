// The native GEMM's epilogue parts (the consumers, after a tile's main loop): the tail split's
// partial sums, the reduce-scatter epilogue's sum of the peers' parts, the stores of C (from
// registers, or staged for TMA stores), the SwiGLU epilogue's stores and the done counters'
// publication. A part of async_gemm.cu (included only there).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels/activation.h"
#include "kernels/native/layout.cuh"

namespace asynctp::kernels {
namespace {

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

// This thread's place in one consumer's accumulator block of rows [r0, r0 + 64). Fragment of
// m64nNk16 (f32): thread t = 32 w + l holds, for each 8-column group j, d[4j + {0,1}] at
// (16 w + l/4, 8 j + 2 (l%4) + {0,1}) and d[4j + {2,3}] 8 rows below.
struct FragmentPlace {
  int64_t row;           // r0 + 16 w + l/4 (the second row is 8 below)
  int col;               // 2 (l%4): the first column within each 8-column group
  bool row_ok, row8_ok;  // whether row and row + 8 lie before `rows`
};
__device__ __forceinline__ FragmentPlace fragment_place(int64_t r0, int64_t rows) {
  const int t = threadIdx.x % 128;
  FragmentPlace f;
  f.row = r0 + 16 * (t / 32) + (t % 32) / 4;
  f.col = 2 * (t % 4);
  f.row_ok = f.row < rows;
  f.row8_ok = f.row + 8 < rows;
  return f;
}

// The scaled GEMM's epilogue (float8; params.h): acc(i, j) * sa(i) * sb(j), left to right (the
// CPU backend's scaled GEMM and emulation round alike), for this thread's elements of one
// consumer's 64 x 256 block at rows [r0, r0 + 64), columns [n0, n0 + 256). Rows from m and
// columns from n on keep what they hold (never stored). A's row-wise scales may have been written
// by a peer's copy during this kernel (the gathered chunks'): read through L2 (ld.global.cg),
// never a line this SM's L1 could hold from before; the tile's rows waited for their chunk's flag
// before their k-blocks were loaded, so the scales have landed too. (Loading them beside the last
// k-block's MMAs instead measures the same on 2 x H200: docs/PERFORMANCE.md, float8.)
__device__ __forceinline__ void scale_block(const KernelParams& p, float (&d)[128], int64_t r0,
                                            int n0) {
  const FragmentPlace f = fragment_place(r0, p.m);
  const float* sa = f.row_ok ? a_scale_at(p, f.row) : nullptr;
  const float* sa8 = f.row8_ok ? a_scale_at(p, f.row + 8) : nullptr;
  const float s = sa != nullptr ? __ldcg(sa) : 1.f;
  const float s8 = sa8 != nullptr ? __ldcg(sa8) : 1.f;
  const float sb_all = p.b_scale != nullptr && p.b_scale_stride == 0 ? __ldg(p.b_scale) : 1.f;
  // Column-wise: this thread's columns n0 + f.col + 8 j + {0, 1} as immediate offsets from one
  // base, bounded by one count, so that the 64 loads hold no address registers beside the 128
  // accumulators (an address per column spills them).
  const bool by_col = p.b_scale != nullptr && p.b_scale_stride != 0;
  const float* sb = by_col ? p.b_scale + n0 + f.col : nullptr;
  const int64_t cols = p.n - n0 - f.col;  // of this thread's columns from sb on, those in B
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    float x = sb_all, y = sb_all;
    if (by_col) {
      if (8 * j < cols) x = __ldg(sb + 8 * j);
      if (8 * j + 1 < cols) y = __ldg(sb + 8 * j + 1);
    }
    d[4 * j] = d[4 * j] * s * x;
    d[4 * j + 1] = d[4 * j + 1] * s * y;
    d[4 * j + 2] = d[4 * j + 2] * s8 * x;
    d[4 * j + 3] = d[4 * j + 3] * s8 * y;
  }
}

// The thread's two pairs of one 8-column group: (x, y) at (f.row, col), (x8, y8) 8 rows below,
// columns from `end` on left out.
template <typename Out>
__device__ __forceinline__ void store_pairs(Out* base, int64_t ld, const FragmentPlace& f,
                                            int64_t col, int64_t end, float x, float y, float x8,
                                            float y8) {
  if (f.row_ok) store_pair(base + f.row * ld, col, end, x, y);
  if (f.row8_ok) store_pair(base + (f.row + 8) * ld, col, end, x8, y8);
}

// Stores one consumer's 64 x 256 accumulator block at rows [r0, r0 + 64), columns [n0, n0 + 256)
// of `base` (row stride ld; rows from `rows` on and columns from n on are left out).
template <typename Out>
__device__ __forceinline__ void store_block(Out* base, int64_t ld, int64_t rows, int64_t n,
                                            const float (&d)[128], int64_t r0, int n0) {
  const FragmentPlace f = fragment_place(r0, rows);
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    store_pairs(base, ld, f, n0 + f.col + 8 * j, n, d[4 * j], d[4 * j + 1], d[4 * j + 2],
                d[4 * j + 3]);
  }
}

// Byte offset of (row, column `col` < 64) in a box of 16-bit elements with 128-byte rows and
// the 128-byte swizzle (as TMA writes and reads it): row r at 128 r, 16-byte chunk q of the row
// at position q ^ (r % 8). In the accumulator's fragment layout a warp's 4-byte accesses to one
// 8-column group hit 8 different chunks of 8 rows: no bank conflicts.
__device__ __forceinline__ int swizzled(int row, int col) {
  return row * 128 + (((col / 8) ^ (row % 8)) * 16) + (col % 8) * 2;
}

// Writes columns [128 half, 128 half + 128) of one consumer's 64 x 256 block of values
// (value(i): the value at accumulator index i, 16-bit once written) into its staging area as two
// 64 x 64 boxes laid out as the 128-byte-swizzled TMA store expects (box j: columns 64j..64j+63 of
// the half, 8 KiB apart). stmatrix takes the accumulator's fragment layout as it is (each
// thread's pair of adjacent columns, see add_part_half's ldmatrix): one x4 per two 8-column
// groups, 8 per thread and half, where 4-byte stores took 32. Lane l gives the address of row
// l % 8 of matrix l / 8, the matrices being (warp rows 0-7, group j), (rows 8-15, j), (0-7,
// j + 1), (8-15, j + 1): 16 contiguous bytes, one swizzle chunk, so the 8 rows of a matrix land
// in 8 different chunks (no bank conflicts).
template <typename Out, int kHalf, typename Value>
__device__ __forceinline__ void stage_values(uint8_t* staging, Value&& value) {
  const int lane = threadIdx.x % 32;
  const int row = 16 * (threadIdx.x % 128 / 32) + 8 * (lane / 8 % 2) + lane % 8;
  const uint32_t base = smem_u32(staging);
#pragma unroll
  for (int j = 16 * kHalf; j < 16 * kHalf + 16; j += 2) {
    const int col = 8 * (j + lane / 16) - 128 * kHalf;  // of the half
    uint32_t v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int x = 4 * (j + i / 2) + 2 * (i % 2);
      if constexpr (std::is_same_v<Out, __nv_bfloat16>) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(value(x), value(x + 1));
        v[i] = *reinterpret_cast<const uint32_t*>(&h);
      } else {
        const __half2 h = __floats2half2_rn(value(x), value(x + 1));
        v[i] = *reinterpret_cast<const uint32_t*>(&h);
      }
    }
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                     base + (col / 64) * 8192 + swizzled(row, col % 64)),
                 "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
                 : "memory");
  }
}

// The accumulators themselves (stage_values).
template <typename Out, int kHalf>
__device__ __forceinline__ void stage_block(uint8_t* staging, const float (&d)[128]) {
  stage_values<Out, kHalf>(staging, [&](int i) { return d[i]; });
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
//
// With the kernel's own pushes (push_chunks > 0) the rows went to their owner over NVLink, and
// the owner's reduction waits on a flag that this kernel raises. Each half tile's stores
// (complete: wait_group 0) are ordered before its count by a release at GPU scope, which is all
// the CTAs that count need; the CTA whose count completes the piece acquires every other count,
// and so every store of the piece, at system scope, sets the counter back to 0 for the next
// launch (no other CTA touches it again in this one) and raises the flag on the owner (release,
// system scope): the owner's acquire of the flag follows every store by causality order, whose
// links need only include the two threads they join. A system-scope release on every count
// instead measured 0.4-5% slower on the four scatter anchors (docs/DECISIONS.md D32).
__device__ __forceinline__ void publish_done(const KernelParams& p, int r0, int n0) {
  const int64_t index = done_index(p, p, r0, n0);
  uint32_t* counter = p.done + index;
  if (p.push_chunks <= 0) {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
    return;
  }
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
  uint32_t before;
  asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], 1;"
               : "=r"(before)
               : "l"(counter)
               : "memory");
  if (before + 1 != done_count(p, index)) return;
  asm volatile("fence.acq_rel.sys;" ::: "memory");
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(counter), "r"(0u) : "memory");
  // Counter index = chunk * per_chunk + the piece within the chunk (done_index; the sum flags'
  // piece numbering where sum_rows and sum_cols are done_rows and done_cols).
  const int64_t per_chunk = p.chunk_rows / p.done_rows * p.done_col_pieces;
  const int64_t chunk = index / per_chunk;
  uint32_t* flag = p.push_flags[chunk] + (index - chunk * per_chunk) * p.push_flag_stride;
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(flag), "r"(p.push_value) : "memory");
}

// The TMA maps of the kernel's own pushes: map[c] addresses push_c[c] ([chunk rows, n], 64 x 64
// boxes, as C's); unused entries zero.
struct PushMaps {
  CUtensorMap map[NativeGemmParams::kMaxPushChunks];
};

// The leader's record of the tile whose TMA stores are in flight (kTmaStore): its rows are
// counted in done once those stores are complete.
struct Pending {
  int row = -1;  // rows of the tile whose stores are in flight (-1: none)
  int col = 0;   // and its first column
};

// The leader counts the pending tile's rows in done once its TMA stores are complete.
__device__ __forceinline__ void count_pending(const KernelParams& p, Pending& pending) {
  if (p.done != nullptr && pending.row >= 0) {
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    publish_done(p, pending.row, pending.col);
    pending.row = -1;
  }
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
//
// The parts are not prefetched into L2 during the tile's main loop: every SM of a wave reaches
// its sum tile's end together, so the prefetches (192 KiB per SM at ws 4, ~25 MB a wave) would
// come as one burst from HBM that slows the main loop by more than it takes off the epilogue
// (see docs/DECISIONS.md D15).
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

// The last part of a tail tile waits for the others (slots of this launch, all resident: the
// tail units fit in one wave, at most one per slot). Bounded all the same: a timeout is recorded
// as what = 4 and the tile is finished with what has arrived.
__device__ void wait_split_parts(const KernelParams& p, const uint32_t* flag, uint32_t parts) {
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

// A tail tile's K-range (w.part >= 0). Parts but the last leave their f32 accumulator in the
// workspace and count it; the last one waits for them and adds them in part order (the same
// bits on every run), then stores the tile as usual.
__device__ __forceinline__ void save_split_part(const KernelParams& p, const Unit& w, int slot,
                                                const float (&acc)[128], int consumer,
                                                bool leader) {
  const int tid = threadIdx.x % 128;
  uint32_t* flag = p.split_flags + split_flag_index(slot, consumer);
  float4* dst =
      reinterpret_cast<float4*>(p.partials) + split_partial_index(p, slot, w.part, consumer) + tid;
#pragma unroll
  for (int i = 0; i < 32; ++i)
    __stcg(dst + i * 128, make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
  asm volatile("bar.sync %0, 128;" ::"r"(1 + consumer) : "memory");
  if (leader) {
    __threadfence();
    atomicAdd(flag, 1u);
  }
}

__device__ __forceinline__ void add_split_parts(const KernelParams& p, int slot, float (&acc)[128],
                                                int consumer, bool leader) {
  const int tid = threadIdx.x % 128;
  uint32_t* flag = p.split_flags + split_flag_index(slot, consumer);
  if (leader) wait_split_parts(p, flag, static_cast<uint32_t>(p.split - 1));
  asm volatile("bar.sync %0, 128;" ::"r"(1 + consumer) : "memory");
  for (int part = 0; part < p.split - 1; ++part) {
    const float4* src = reinterpret_cast<const float4*>(p.partials) +
                        split_partial_index(p, slot, part, consumer) + tid;
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

// The own chunk of a reduce-scatter (last in the walk): the peers' parts, from the sum stages in
// rank order, added to the accumulators (times 1 / count for avg); the caller then stores the
// reduced rows into sum_out; nothing goes to C or to done. The previous tile's rows are counted
// first: the peers' own chunks wait for them (through our pushes) as this tile's parts wait for
// theirs, so no count may stay pending behind these stages.
template <bool kTmaStore, int kCluster>
__device__ __forceinline__ void add_sum_parts(const KernelParams& p, const Stages& st,
                                              float (&acc)[128], int consumer, bool leader, int& it,
                                              Pending& pending) {
  if constexpr (kTmaStore) {
    if (leader) count_pending(p, pending);
  }
  for (int s = 0; s < p.sum_count; ++s) {
    if (s == p.sum_self) continue;
    auto add_half = [&](auto half) {
      constexpr int kHalf = decltype(half)::value;
      const int stage_idx = it % kStages;
      mbar_wait(&st.full[stage_idx], (it / kStages) & 1);
      const uint8_t* stage = st.b + stage_idx * kStageBBytes;
      if (p.c_dtype == DType::kBF16) {
        add_part_half<__nv_bfloat16, kHalf>(stage, acc, consumer);
      } else {
        add_part_half<__half, kHalf>(stage, acc, consumer);
      }
      // Every thread's reads are done (and ordered before the TMA that refills the stage)
      // before the leader releases it.
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      asm volatile("bar.sync %0, 128;" ::"r"(1 + consumer) : "memory");
      if (leader) release<kCluster>(st, stage_idx);
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

// The reduced rows from registers (no TMA store for sum_out); its rows all lie in the chunk.
__device__ __forceinline__ void store_sum_registers(const KernelParams& p, const float (&acc)[128],
                                                    int64_t sum_row, int n0) {
  if (p.c_dtype == DType::kBF16) {
    store_block(static_cast<__nv_bfloat16*>(p.sum_out), p.sum_ldo, p.chunk_rows, p.n, acc, sum_row,
                n0);
  } else {
    store_block(static_cast<__half*>(p.sum_out), p.sum_ldo, p.chunk_rows, p.n, acc, sum_row, n0);
  }
}

// 16-bit C (or the reduced rows: sums) through the staging area and TMA stores. Schedule per
// tile and half (leader = thread 0 of this consumer), twice:
//   leader: earlier stores have read the staging area (before the first half: the previous tile's
//   stores done and its chunk published) | bar | all: registers -> staging | proxy fence | bar |
//   leader: 2 TMA stores, commit (the last ones run during the next tile)
// A tile of the sum chunk goes to sum_out (map_sum, chunk rows) and is not counted; with the
// kernel's own pushes, a tile of another chunk to its owner's slot (push.map[chunk], chunk rows).
__device__ __forceinline__ void store_tile_tma(const KernelParams& p, const Stages& st,
                                               const CUtensorMap& map_c, const CUtensorMap& map_sum,
                                               const PushMaps& push, const float (&acc)[128],
                                               int consumer, bool leader, bool sums, int r0,
                                               int64_t sum_row, int n0, Pending& pending) {
  uint8_t* staging = st.c + consumer * (kCBytes / 2);
  const CUtensorMap* map = sums ? &map_sum : &map_c;
  int row = sums ? static_cast<int>(sum_row) : r0;
  if (!sums && p.push_chunks > 0) {  // the kernel's own pushes: into the chunk owner's slot
    const int chunk = static_cast<int>(r0 / p.chunk_rows);
    map = &push.map[chunk];
    row = r0 - static_cast<int>(chunk * p.chunk_rows);
  }
  const bool row_ok = sums || r0 < p.m;
  auto store_half = [&](auto half) {
    constexpr int kHalf = decltype(half)::value;
    if (leader) {
      if (kHalf == 0 && p.done != nullptr) {
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
        if (pending.row >= 0) publish_done(p, pending.row, pending.col);
      } else {
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
      }
    }
    asm volatile("bar.sync %0, 128;" ::"r"(1 + consumer) : "memory");
    if (p.c_dtype == DType::kBF16) {
      stage_block<__nv_bfloat16, kHalf>(staging, acc);
    } else {
      stage_block<__half, kHalf>(staging, acc);
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("bar.sync %0, 128;" ::"r"(1 + consumer) : "memory");
    if (leader) {
      if (row_ok) {
        tma_store_2d(map, staging, n0 + 128 * kHalf, row);
        tma_store_2d(map, staging + 8192, n0 + 128 * kHalf + 64, row);
      }
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
  };
  store_half(std::integral_constant<int, 0>{});
  store_half(std::integral_constant<int, 1>{});
  if (leader) {
    pending.row = !sums && r0 < p.m ? r0 : -1;
    pending.col = n0;
  }
}

// Calls fn(static_cast<Out*>(ptr)) for a pointer to f32, bf16 or f16 elements.
template <typename Fn>
__device__ __forceinline__ void with_out_type(DType dtype, void* ptr, Fn&& fn) {
  switch (dtype) {
    case DType::kF32:
      fn(static_cast<float*>(ptr));
      break;
    case DType::kBF16:
      fn(static_cast<__nv_bfloat16*>(ptr));
      break;
    default:
      fn(static_cast<__half*>(ptr));
      break;
  }
}

// C from registers (f32 C, or a C TMA cannot address), then the rows counted in done.
__device__ __forceinline__ void store_tile_registers(const KernelParams& p, const float (&acc)[128],
                                                     int consumer, bool leader, int r0, int n0) {
  with_out_type(p.c_dtype, p.c, [&](auto* c) { store_block(c, p.ldc, p.m, p.n, acc, r0, n0); });
  if (p.done != nullptr && r0 < p.m) {
    // Publish: every thread of this consumer has stored, then one release increment.
    asm volatile("bar.sync %0, 128;" ::"r"(1 + consumer) : "memory");
    if (leader) publish_done(p, r0, n0);
  }
}

// The SwiGLU epilogue (p.swiglu; single CTAs, no done counters): the B tile held the gate's
// columns in its first half and the up projection's in its second (b_col_of), so the accumulator
// of output column n0 + c (c < 128, 8-column groups j < 16) holds g and the one 16 groups on holds
// u: each thread has both of its pairs. C [M, N] gets silu(g) * u (swiglu_epilogue_f32) over
// columns [n0, n0 + 128), rounded once.
template <typename Out>
__device__ __forceinline__ void store_swiglu_block(Out* base, int64_t ld, int64_t rows, int64_t n,
                                                   const float (&d)[128], int64_t r0, int n0) {
  const FragmentPlace f = fragment_place(r0, rows);
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float* g = d + 4 * j;
    const float* u = d + 4 * (j + 16);
    store_pairs(base, ld, f, n0 + f.col + 8 * j, n, swiglu_epilogue_f32(g[0], u[0]),
                swiglu_epilogue_f32(g[1], u[1]), swiglu_epilogue_f32(g[2], u[2]),
                swiglu_epilogue_f32(g[3], u[3]));
  }
}

// The products themselves into pre [M, 2N]: the gate's at columns n0 + c, the up projection's at
// N + n0 + c, each half bounded by its own N columns (N is even: pairs stay aligned).
template <typename Out>
__device__ __forceinline__ void store_pre_block(Out* base, int64_t ld, int64_t rows, int64_t n,
                                                const float (&d)[128], int64_t r0, int n0) {
  const FragmentPlace f = fragment_place(r0, rows);
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int64_t half = j / 16;
    store_pairs(base, ld, f, half * n + n0 + 8 * (j % 16) + f.col, half * n + n, d[4 * j],
                d[4 * j + 1], d[4 * j + 2], d[4 * j + 3]);
  }
}

// One consumer's 64 rows of a SwiGLU tile at (r0, n0): [the products into pre] then C.
__device__ __forceinline__ void store_swiglu_registers(const KernelParams& p,
                                                       const float (&acc)[128], int r0, int n0) {
  if (p.pre != nullptr) {
    with_out_type(p.pre_dtype, p.pre,
                  [&](auto* pre) { store_pre_block(pre, p.pre_ld, p.m, p.n, acc, r0, n0); });
  }
  with_out_type(p.c_dtype, p.c,
                [&](auto* c) { store_swiglu_block(c, p.ldc, p.m, p.n, acc, r0, n0); });
}

// The SwiGLU epilogue through the staging area (uses_tma_store: 16-bit C and pre), in rounds of
// one consumer's 64 rows x 128 columns (two 64 x 64 boxes), each as a half of store_tile_tma:
//   leader: earlier stores have read the staging area | bar | all: values -> staging | proxy
//   fence | bar | leader: 2 TMA stores, commit
// [pre's gate columns (accumulator half 0) to map_pre_gate, pre's up columns (half 1) to
// map_pre_up,] then silu(g) * u to map_c. The maps clip at N and M: the tile's columns past N and
// rows past M are not stored. The last round's stores run during the next tile's main loop.
__device__ __forceinline__ void store_swiglu_tma(const KernelParams& p, const Stages& st,
                                                 const CUtensorMap& map_c,
                                                 const CUtensorMap& map_pre_gate,
                                                 const CUtensorMap& map_pre_up,
                                                 const float (&acc)[128], int consumer, bool leader,
                                                 int r0, int n0) {
  uint8_t* staging = st.c + consumer * (kCBytes / 2);
  const bool row_ok = r0 < p.m;
  auto store_round = [&](const CUtensorMap* map, DType dtype, auto stage) {
    if (leader) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    asm volatile("bar.sync %0, 128;" ::"r"(1 + consumer) : "memory");
    if (dtype == DType::kBF16) {
      stage(static_cast<__nv_bfloat16*>(nullptr));
    } else {
      stage(static_cast<__half*>(nullptr));
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("bar.sync %0, 128;" ::"r"(1 + consumer) : "memory");
    if (leader) {
      if (row_ok) {
        tma_store_2d(map, staging, n0, r0);
        tma_store_2d(map, staging + 8192, n0 + 64, r0);
      }
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
  };
  if (p.pre != nullptr) {
    store_round(&map_pre_gate, p.pre_dtype, [&](auto* out) {
      stage_block<std::remove_pointer_t<decltype(out)>, 0>(staging, acc);
    });
    store_round(&map_pre_up, p.pre_dtype, [&](auto* out) {
      stage_block<std::remove_pointer_t<decltype(out)>, 1>(staging, acc);
    });
  }
  // Output column n0 + c (c < 128) from the gate at accumulator index i and the up projection
  // 16 groups (64 indices) further on (store_swiglu_block).
  store_round(&map_c, p.c_dtype, [&](auto* out) {
    stage_values<std::remove_pointer_t<decltype(out)>, 0>(
        staging, [&](int i) { return swiglu_epilogue_f32(acc[i], acc[i + 64]); });
  });
}

}  // namespace
}  // namespace asynctp::kernels
