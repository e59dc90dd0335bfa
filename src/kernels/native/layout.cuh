// The native GEMM kernel's shared memory and parameters: a part of async_gemm.cu (included only
// there).
//
// One CTA per SM, 384 threads = 3 warpgroups: the producer (warpgroup 0, one thread; producer.cuh)
// and two consumers (warpgroups 1, 2, 64 rows of the tile each; consumer.cuh, epilogue.cuh).
// Tile 128 x 256, k-block 64 (float8: 128), 4 stages of shared memory (16 KiB of A + 32 KiB of B
// each, 128-byte swizzle written by TMA and read by wgmma) and a 32 KiB staging area for C: 225 KiB
// of the 227 a block may have.
//
// Shared-memory layouts, as TMA writes them and wgmma reads them (128-byte rows: 64 k of bf16/f16,
// 128 k of float8, whose stages hold the same bytes):
//   A stage:            128 rows (m) x 64 k               K-major, 8-row groups 1024 B apart
//   B stage, K-major:   256 rows (n) x 64 k               same
//   B stage, N-major:   4 boxes of 64 rows (k) x 64 n     box j = n 64j..64j+63, 8 KiB apart;
//                       wgmma's N-major operand: 64-n swizzle atoms LBO = 8 KiB apart, 8-k groups
//                       SBO = 1 KiB apart; k step of 16 = 2 KiB.
//   [A stages | B stages | C staging (kTmaStore) | full barriers | empty barriers]
#pragma once

#include <cstdint>

#include "kernels/native/ptx.cuh"
#include "kernels/native/schedule.h"

namespace asynctp::kernels {
namespace {

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

// The reduce-scatter epilogue's parts come through the B stages (epilogue.cuh): a sum stage is
// two boxes of 128 rows x 64 columns of one peer's part.
constexpr int kSumBoxBytes = kBM * 64 * 2;
constexpr int kSumStageBytes = 2 * kSumBoxBytes;
static_assert(kSumStageBytes <= kStageBBytes);

// The kernel's parameter: the contract, resolved, and the launch's plan (schedule.h).
struct KernelParams : NativeGemmParams, NativeGemmPlan {};

// The CTA's shared memory, carved as drawn above.
struct Stages {
  uint8_t* a;
  uint8_t* b;
  uint8_t* c;
  uint64_t* full;
  uint64_t* empty;
};

// Releases stage s to the producers of every CTA that writes into it (a consumer's leader,
// once its warpgroup has finished reading the stage).
template <int kCluster>
__device__ __forceinline__ void release(const Stages& st, int s) {
  if constexpr (kCluster == 2) {
    mbar_arrive_cluster(&st.empty[s], 0);
    mbar_arrive_cluster(&st.empty[s], 1);
  } else {
    mbar_arrive(&st.empty[s]);
  }
}

}  // namespace
}  // namespace asynctp::kernels
