// The native GEMM's consumer part (warpgroups 1 and 2, 64 rows of the tile each): the main loop
// of a unit, per k-block wait full[s] -> 4 x wgmma m64n256k16 -> (previous k-block done)
// release empty[s-1]. A part of async_gemm.cu (included only there).
#pragma once

#include "kernels/native/epilogue.cuh"
#include "kernels/native/layout.cuh"

namespace asynctp::kernels {
namespace {

// Accumulates unit w's k-blocks [w.kb0, w.kb1) into acc (the first one overwrites it); `it`
// counts the stage ring's iterations. With kTmaStore the leader counts the previous tile's rows
// in done after the unit's second k-block.
template <bool kF16, bool kBKMajor, bool kTmaStore, int kCluster>
__device__ __forceinline__ void mainloop(const KernelParams& p, const Stages& st, const Unit& w,
                                         float (&acc)[128], int consumer, bool leader, int& it,
                                         Pending& pending) {
  int prev_stage = -1;
  for (int kb = w.kb0; kb < w.kb1; ++kb, ++it) {
    const int s = it % kStages;
    mbar_wait(&st.full[s], (it / kStages) & 1);
    const uint32_t a_addr = smem_u32(st.a + s * kStageABytes + consumer * (64 * 128));
    const uint32_t b_addr = smem_u32(st.b + s * kStageBBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      const uint64_t da = smem_desc(a_addr + kk * 32, 16, 1024);
      if constexpr (kBKMajor) {
        wgmma<kF16, 0>(acc, da, smem_desc(b_addr + kk * 32, 16, 1024), kb > w.kb0 || kk > 0);
      } else {
        wgmma<kF16, 1>(acc, da, smem_desc(b_addr + kk * 2048, p.b_mn_lbo, p.b_mn_sbo),
                       kb > w.kb0 || kk > 0);
      }
    }
    wgmma_commit();
    // Keep one k-block in flight: the previous one is done, its stage can be refilled.
    wgmma_wait<1>();
    if (leader && prev_stage >= 0) release<kCluster>(st, prev_stage);
    prev_stage = s;
    if constexpr (kTmaStore) {
      // The previous tile's TMA stores have had a k-block to finish: its rows are counted now
      // rather than at this tile's epilogue, a whole tile later (the copy engine waits for
      // the count to push those rows).
      if (leader && kb == w.kb0 + 1) count_pending(p, pending);
    }
  }
  wgmma_wait<0>();
  if (leader && prev_stage >= 0) release<kCluster>(st, prev_stage);
}

}  // namespace
}  // namespace asynctp::kernels
