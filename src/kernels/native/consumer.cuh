// The native GEMM's consumer part (warpgroups 1 and 2, 64 rows of the tile each): the main loop
// of a unit, per k-block wait full[s] -> [TMA store of its A rows] -> 4 x wgmma m64n256k16
// (float8: m64n256k32; either way 32 bytes of k each) -> (previous k-block done) release
// empty[s-1]. A part of async_gemm.cu (included only there).
#pragma once

#include "kernels/native/epilogue.cuh"
#include "kernels/native/layout.cuh"

namespace asynctp::kernels {
namespace {

// Accumulates unit w's k-blocks [w.kb0, w.kb1) into acc (the first one overwrites it); `it`
// counts the stage ring's iterations. With kTmaStore the leader counts the previous tile's rows
// in done after the unit's second k-block.
//
// a_out_row >= 0 (a tile of the first column, with a copy of A asked for): the leader also
// stores this consumer's 64 rows of each A stage from shared memory to a_out (map_a_out) as the
// stage arrives, and releases a stage only once that store has read it:
//   per k-block: wait full[s] -> TMA store A rows of s, commit -> MMAs -> wait until all but
//   the newest store have read shared memory -> release s-1
template <int kIn, bool kBKMajor, bool kTmaStore, int kCluster>
__device__ __forceinline__ void mainloop(const KernelParams& p, const Stages& st, const Unit& w,
                                         float (&acc)[128], int consumer, bool leader, int& it,
                                         Pending& pending, const CUtensorMap& map_a_out,
                                         int a_out_row) {
  const bool store_a = leader && a_out_row >= 0;
  int prev_stage = -1;
  for (int kb = w.kb0; kb < w.kb1; ++kb, ++it) {
    const int s = it % kStages;
    mbar_wait(&st.full[s], (it / kStages) & 1);
    const uint8_t* a_rows = st.a + s * kStageABytes + consumer * (64 * 128);
    if (store_a) {
      // The stage was written by TMA (the async proxy) and is read by TMA: the full barrier
      // orders the two, no proxy fence needed.
      tma_store_2d(&map_a_out, a_rows, kb * k_block_of(p), a_out_row);
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
    const uint32_t a_addr = smem_u32(a_rows);
    const uint32_t b_addr = smem_u32(st.b + s * kStageBBytes);
    wgmma_fence();
    // 128-byte rows of k: 4 steps of 32 bytes (k16 of 16-bit inputs, k32 of float8).
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t da = smem_desc(a_addr + kk * 32, 16, 1024);
      if constexpr (kBKMajor) {
        wgmma<kIn, 0>(acc, da, smem_desc(b_addr + kk * 32, 16, 1024), kb > w.kb0 || kk > 0);
      } else {
        wgmma<kIn, 1>(acc, da, smem_desc(b_addr + kk * 2048, p.b_mn_lbo, p.b_mn_sbo),
                      kb > w.kb0 || kk > 0);
      }
    }
    wgmma_commit();
    // Keep one k-block in flight: the previous one is done, its stage can be refilled.
    wgmma_wait<1>();
    if (store_a && prev_stage >= 0) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
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
  if (store_a) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  if (leader && prev_stage >= 0) release<kCluster>(st, prev_stage);
}

}  // namespace
}  // namespace asynctp::kernels
