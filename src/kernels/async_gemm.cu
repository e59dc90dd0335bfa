// The async-input GEMM: C = A @ B in one persistent, warp-specialized Hopper kernel whose tile
// scheduler follows A's row chunks as they land (see kernels.h for the contract).
//
// One CTA per SM, 384 threads = 3 warpgroups:
//
//   warpgroup 0 (producer, one thread):  for each tile: [wait ready[chunk]] then per k-block
//                                         wait empty[s] -> expect_tx(full[s]) -> TMA A, TMA B
//   warpgroups 1, 2 (consumers):          per k-block wait full[s] -> 4 x wgmma m64n256k16 ->
//                                         (previous k-block done) arrive empty[s-1]; per tile the
//                                         epilogue stores 64 x 256 from registers [and bumps done]
//
// Tile 128 x 256 (each consumer owns 64 rows), k-block 64, 4 stages of shared memory
// (16 KiB of A + 32 KiB of B each, 128-byte swizzle written by TMA and read by wgmma).
//
// Tile order (the async part): tiles are numbered so that all tiles of the m-tile group holding
// `first_chunk`'s first row come first, then the following rows, wrapping around; within a group
// of kGroupM m-tiles the m index runs fastest (B panels stay in L2). CTA i takes tiles i, i+grid,
// ...: all SMs work on the chunk that landed first while the copy engine brings the next ones.
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
#include <mutex>
#include <type_traits>

#include "kernels/kernels.h"
#include "kernels/wgmma_regs.cuh"

namespace asynctp::kernels {

namespace {

constexpr int kBM = 128;
constexpr int kBN = 256;
constexpr int kBK = 64;
constexpr int kGroupM = 8;
constexpr int kThreads = 384;
constexpr int kStageABytes = kBM * kBK * 2;
constexpr int kStageBBytes = kBN * kBK * 2;
constexpr int kCBytes = kBM * kBN * 2;  // 16-bit C tile staged for the TMA store

// Stages that fit beside the C staging area (227 KiB of shared memory per block).
template <bool kTmaStore>
constexpr int stages() {
  return kTmaStore ? 3 : 4;
}
template <bool kTmaStore>
constexpr int smem_bytes() {
  return stages<kTmaStore>() * (kStageABytes + kStageBBytes) + (kTmaStore ? kCBytes : 0) +
         2 * stages<kTmaStore>() * 8 + 1024;
}

struct Params {
  int64_t m, n, k;
  void* c;
  int64_t ldc;
  int c_dtype;  // 0 f32, 1 bf16, 2 f16
  int64_t chunk_rows;
  int num_chunks;
  int first_chunk;
  const uint32_t* ready;
  uint32_t* done;
  uint64_t timeout_ns;
  DeviceErrorSlot* slot;
  int rank;
  uint32_t b_lbo, b_sbo;
};

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

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

struct Tile {
  int m0, n0;
};

// Tile t of the walk described in the file comment.
__device__ __forceinline__ Tile tile_at(int t, int tiles_m, int tiles_n, int pivot_m) {
  const int group = t / (kGroupM * tiles_n);
  const int first = group * kGroupM;
  const int rows = min(kGroupM, tiles_m - first);
  const int local = t - group * kGroupM * tiles_n;
  const int mi = (first + local % rows + pivot_m) % tiles_m;
  return {mi * kBM, (local / rows) * kBN};
}

// Waits until every chunk overlapping rows [m0, m0 + kBM) is ready. False on timeout (reported).
__device__ bool wait_chunks_ready(const Params& p, int m0) {
  const int64_t last_row = (p.m < m0 + kBM ? p.m : m0 + kBM) - 1;
  for (int64_t c = m0 / p.chunk_rows; c <= last_row / p.chunk_rows; ++c) {
    if (load_acquire(p.ready + c) != 0) continue;
    const uint64_t start = global_timer_ns();
    while (load_acquire(p.ready + c) == 0) {
      if (global_timer_ns() - start > p.timeout_ns) {
        if (p.slot != nullptr && atomicCAS_system(const_cast<int*>(&p.slot->flagged), 0, 1) == 0) {
          p.slot->rank = p.rank;
          p.slot->peer = static_cast<int>(c);
          p.slot->channel = -1;
          p.slot->what = 3;
          p.slot->timeout_ns = p.timeout_ns;
          __threadfence_system();
        }
        return false;
      }
      __nanosleep(64);
    }
  }
  // The chunk was written by the copy engine; the TMA loads that follow read through the async
  // proxy, ordered after this thread's acquire by the proxy fence.
  asm volatile("fence.proxy.async.global;" ::: "memory");
  return true;
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

// Stores one consumer's 64 x 256 accumulator block at rows [r0, r0 + 64), columns [n0, n0 + 256).
// Fragment of m64nNk16 (f32): thread t = 32 w + l holds, for each 8-column group j,
// d[4j + {0,1}] at (16 w + l/4, 8 j + 2 (l%4) + {0,1}) and d[4j + {2,3}] 8 rows below.
template <typename Out>
__device__ __forceinline__ void store_block(const Params& p, const float (&d)[128], int64_t r0,
                                            int n0) {
  const int t = threadIdx.x % 128;
  const int64_t row = r0 + 16 * (t / 32) + (t % 32) / 4;
  const int64_t col0 = n0 + 2 * (t % 4);
  Out* base = static_cast<Out*>(p.c);
  const bool row_ok = row < p.m, row8_ok = row + 8 < p.m;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int64_t col = col0 + 8 * j;
    if (row_ok) store_pair(base + row * p.ldc, col, p.n, d[4 * j], d[4 * j + 1]);
    if (row8_ok) store_pair(base + (row + 8) * p.ldc, col, p.n, d[4 * j + 2], d[4 * j + 3]);
  }
}

// Writes one consumer's 64 x 256 accumulator block (16-bit) into its staging area as four
// 64 x 64 boxes laid out as the 128-byte-swizzled TMA store expects: box j holds columns
// 64j..64j+63, row r at 128 r bytes, 16-byte chunk q of the row at position q ^ (r % 8). A warp's
// stores for one 8-column group hit 8 different chunks of 8 rows: no bank conflicts.
template <typename Out>
__device__ __forceinline__ void stage_block(uint8_t* staging, const float (&d)[128]) {
  const int t = threadIdx.x % 128;
  const int row = 16 * (t / 32) + (t % 32) / 4;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int col = 8 * j + 2 * (t % 4);
    uint8_t* box = staging + (col / 64) * 8192;
    const int chunk = (col % 64) / 8;
    const int within = (col % 8) * 2;
    Out lo[2], hi[2];
    if constexpr (std::is_same_v<Out, __nv_bfloat16>) {
      *reinterpret_cast<__nv_bfloat162*>(lo) = __floats2bfloat162_rn(d[4 * j], d[4 * j + 1]);
      *reinterpret_cast<__nv_bfloat162*>(hi) = __floats2bfloat162_rn(d[4 * j + 2], d[4 * j + 3]);
    } else {
      *reinterpret_cast<__half2*>(lo) = __floats2half2_rn(d[4 * j], d[4 * j + 1]);
      *reinterpret_cast<__half2*>(hi) = __floats2half2_rn(d[4 * j + 2], d[4 * j + 3]);
    }
    *reinterpret_cast<uint32_t*>(box + row * 128 + ((chunk ^ (row % 8)) * 16) + within) =
        *reinterpret_cast<uint32_t*>(lo);
    *reinterpret_cast<uint32_t*>(box + (row + 8) * 128 + ((chunk ^ ((row + 8) % 8)) * 16) +
                                 within) = *reinterpret_cast<uint32_t*>(hi);
  }
}

__device__ __forceinline__ void publish_done(const Params& p, int r0) {
  __threadfence_system();
  atomicAdd_system(p.done + r0 / p.chunk_rows, 1u);
}

// kTmaStore: 16-bit C staged in shared memory and written by TMA stores that overlap the next
// tile's main loop (3 stages fit beside it); otherwise (f32 C, or a C TMA cannot address) the
// consumers store from registers (4 stages).
template <bool kF16, bool kBKMajor, bool kTmaStore>
__global__ void __launch_bounds__(kThreads, 1)
    async_gemm_kernel(const __grid_constant__ CUtensorMap map_a,
                      const __grid_constant__ CUtensorMap map_b,
                      const __grid_constant__ CUtensorMap map_c, const Params p) {
  constexpr int kStages = stages<kTmaStore>();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* smem_a = smem;
  uint8_t* smem_b = smem + kStages * kStageABytes;
  uint8_t* smem_c = smem_b + kStages * kStageBBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem_c + (kTmaStore ? kCBytes : 0));
  uint64_t* empty = full + kStages;

  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 2);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  const int tiles_m = static_cast<int>((p.m + kBM - 1) / kBM);
  const int tiles_n = static_cast<int>((p.n + kBN - 1) / kBN);
  const int num_tiles = tiles_m * tiles_n;
  const int k_blocks = static_cast<int>((p.k + kBK - 1) / kBK);
  const int pivot_m = static_cast<int>(p.first_chunk * p.chunk_rows / kBM);

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x != 0) return;
    bool waiting = p.ready != nullptr;
    int it = 0;
    for (int t = blockIdx.x; t < num_tiles; t += gridDim.x) {
      const Tile tile = tile_at(t, tiles_m, tiles_n, pivot_m);
      if (waiting) waiting = wait_chunks_ready(p, tile.m0);
      for (int kb = 0; kb < k_blocks; ++kb, ++it) {
        const int s = it % kStages;
        mbar_wait(&empty[s], ((it / kStages) & 1) ^ 1);
        mbar_expect_tx(&full[s], kStageABytes + kStageBBytes);
        tma_load_2d(smem_a + s * kStageABytes, &map_a, &full[s], kb * kBK, tile.m0);
        uint8_t* b = smem_b + s * kStageBBytes;
        if constexpr (kBKMajor) {
          tma_load_2d(b, &map_b, &full[s], kb * kBK, tile.n0);
        } else {
#pragma unroll
          for (int j = 0; j < kBN / 64; ++j)
            tma_load_2d(b + j * 8192, &map_b, &full[s], tile.n0 + 64 * j, kb * kBK);
        }
      }
    }
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
  for (int t = blockIdx.x; t < num_tiles; t += gridDim.x) {
    const Tile tile = tile_at(t, tiles_m, tiles_n, pivot_m);
    int prev_stage = -1;
    for (int kb = 0; kb < k_blocks; ++kb, ++it) {
      const int s = it % kStages;
      mbar_wait(&full[s], (it / kStages) & 1);
      const uint32_t a_addr = smem_u32(smem_a + s * kStageABytes + consumer * (64 * 128));
      const uint32_t b_addr = smem_u32(smem_b + s * kStageBBytes);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        const uint64_t da = smem_desc(a_addr + kk * 32, 16, 1024);
        if constexpr (kBKMajor) {
          wgmma<kF16, 0>(acc, da, smem_desc(b_addr + kk * 32, 16, 1024), kb > 0 || kk > 0);
        } else {
          wgmma<kF16, 1>(acc, da, smem_desc(b_addr + kk * 2048, p.b_lbo, p.b_sbo),
                         kb > 0 || kk > 0);
        }
      }
      wgmma_commit();
      // Keep one k-block in flight: the previous one is done, its stage can be refilled.
      wgmma_wait<1>();
      if (leader && prev_stage >= 0) mbar_arrive(&empty[prev_stage]);
      prev_stage = s;
    }
    wgmma_wait<0>();
    if (leader && prev_stage >= 0) mbar_arrive(&empty[prev_stage]);

    const int r0 = tile.m0 + 64 * consumer;
    if constexpr (kTmaStore) {
      // Schedule per tile (leader = thread 0 of this consumer):
      //   leader: previous tile's stores done (and its chunk published) | bar | all: registers ->
      //   staging | proxy fence | bar | leader: 4 TMA stores, commit (they run during the next
      //   tile)
      uint8_t* staging = smem_c + consumer * (kCBytes / 2);
      if (leader) {
        if (p.done != nullptr) {
          asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
          if (pending_row >= 0) publish_done(p, pending_row);
        } else {
          asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
        }
      }
      asm volatile("bar.sync %0, 128;" ::"r"(1 + consumer) : "memory");
      if (p.c_dtype == 1) {
        stage_block<__nv_bfloat16>(staging, acc);
      } else {
        stage_block<__half>(staging, acc);
      }
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      asm volatile("bar.sync %0, 128;" ::"r"(1 + consumer) : "memory");
      if (leader) {
        if (r0 < p.m) {
#pragma unroll
          for (int j = 0; j < kBN / 64; ++j) {
            tma_store_2d(&map_c, staging + j * 8192, tile.n0 + 64 * j, r0);
          }
        }
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        pending_row = r0 < p.m ? r0 : -1;
      }
    } else {
      switch (p.c_dtype) {
        case 0:
          store_block<float>(p, acc, r0, tile.n0);
          break;
        case 1:
          store_block<__nv_bfloat16>(p, acc, r0, tile.n0);
          break;
        default:
          store_block<__half>(p, acc, r0, tile.n0);
          break;
      }
      if (p.done != nullptr && r0 < p.m) {
        // Publish: every thread of this consumer has stored, then one release increment.
        asm volatile("bar.sync %0, 128;" ::"r"(1 + consumer) : "memory");
        if (leader) publish_done(p, r0);
      }
    }
  }
  if constexpr (kTmaStore) {
    if (leader) {
      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
      if (p.done != nullptr && pending_row >= 0) publish_done(p, pending_row);
    }
  }
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

// A 2-D tensor map: inner dim `inner` (contiguous), outer dim `outer` with row stride `ld`
// elements, box inner x outer, 128-byte swizzle, zero fill out of bounds.
bool make_map(CUtensorMap* map, const void* base, CUtensorMapDataType type, int64_t inner,
              int64_t outer, int64_t ld, uint32_t box_inner, uint32_t box_outer) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld * 2)};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t elem_strides[2] = {1, 1};
  return encode_tiled()(map, type, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

int sm_count() {
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 0;
  return count;
}

template <bool kF16, bool kBKMajor, bool kTmaStore>
cudaError_t launch(const CUtensorMap& map_a, const CUtensorMap& map_b, const CUtensorMap& map_c,
                   const Params& p, int ctas, cudaStream_t stream) {
  // The attribute is per function; one process drives one device, so once is enough.
  static std::once_flag once;
  static cudaError_t attr_status = cudaSuccess;
  std::call_once(once, [] {
    attr_status =
        cudaFuncSetAttribute(async_gemm_kernel<kF16, kBKMajor, kTmaStore>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<kTmaStore>());
  });
  if (attr_status != cudaSuccess) return attr_status;
  async_gemm_kernel<kF16, kBKMajor, kTmaStore>
      <<<ctas, kThreads, smem_bytes<kTmaStore>(), stream>>>(map_a, map_b, map_c, p);
  return cudaGetLastError();
}

template <bool kF16>
cudaError_t launch_layout(bool b_k_major, bool tma_store, const CUtensorMap& map_a,
                          const CUtensorMap& map_b, const CUtensorMap& map_c, const Params& p,
                          int ctas, cudaStream_t stream) {
  if (b_k_major) {
    return tma_store ? launch<kF16, true, true>(map_a, map_b, map_c, p, ctas, stream)
                     : launch<kF16, true, false>(map_a, map_b, map_c, p, ctas, stream);
  }
  return tma_store ? launch<kF16, false, true>(map_a, map_b, map_c, p, ctas, stream)
                   : launch<kF16, false, false>(map_a, map_b, map_c, p, ctas, stream);
}

int64_t chunk_rows_of(const AsyncGemmArgs& a) {
  return a.chunk_rows > 0 ? a.chunk_rows : a.m;
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
  if (a.ready != nullptr && a.timeout_ns == 0) return "waiting for chunks needs a timeout";
  if (encode_tiled() == nullptr) return "the driver has no cuTensorMapEncodeTiled";
  return nullptr;
}

uint32_t async_gemm_done_count(const AsyncGemmArgs& a, int chunk) {
  const int64_t rows = chunk_rows_of(a);
  const int64_t first = chunk * rows;
  const int64_t last = std::min(a.m, first + rows);
  const int64_t halves = (last - first + 63) / 64;
  return static_cast<uint32_t>(halves * ((a.n + kBN - 1) / kBN));
}

cudaError_t async_gemm(const AsyncGemmArgs& a, cudaStream_t stream) {
  if (async_gemm_unsupported(a) != nullptr) return cudaErrorInvalidValue;
  const CUtensorMapDataType type = a.in_dtype == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                              : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUtensorMap map_a{}, map_b{};
  if (!make_map(&map_a, a.a, type, a.k, a.m, a.lda, kBK, kBM)) return cudaErrorInvalidValue;
  const bool ok_b = a.b_k_major ? make_map(&map_b, a.b, type, a.k, a.n, a.ldb, kBK, kBN)
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
  p.num_chunks = static_cast<int>((a.m + p.chunk_rows - 1) / p.chunk_rows);
  p.first_chunk = a.first_chunk;
  p.ready = a.ready;
  p.done = a.done;
  p.timeout_ns = a.timeout_ns;
  p.slot = a.slot;
  p.rank = a.rank;
  p.b_lbo = a.b_mn_lbo != 0 ? a.b_mn_lbo : 8192;
  p.b_sbo = a.b_mn_sbo != 0 ? a.b_mn_sbo : 1024;
  const int64_t tiles = ((a.m + kBM - 1) / kBM) * ((a.n + kBN - 1) / kBN);
  int ctas = a.max_ctas > 0 ? a.max_ctas : sm_count();
  if (ctas <= 0) return cudaErrorNoDevice;
  ctas = static_cast<int>(std::min<int64_t>(ctas, tiles));
  // The TMA store needs a 16-bit C with a 16-byte aligned base and row stride.
  const bool tma_store = a.c_dtype != DType::kF32 && reinterpret_cast<uintptr_t>(a.c) % 16 == 0 &&
                         a.ldc % 8 == 0 && !a.force_register_store;
  CUtensorMap map_c{};
  if (tma_store) {
    const CUtensorMapDataType c_type = a.c_dtype == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    if (!make_map(&map_c, a.c, c_type, a.n, a.m, a.ldc, 64, 64)) return cudaErrorInvalidValue;
  }
  if (a.in_dtype == DType::kF16) {
    return launch_layout<true>(a.b_k_major, tma_store, map_a, map_b, map_c, p, ctas, stream);
  }
  return launch_layout<false>(a.b_k_major, tma_store, map_a, map_b, map_c, p, ctas, stream);
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
