// The native async-input GEMM kernel: C = A @ B in one persistent, warp-specialized Hopper kernel
// whose tile scheduler follows A's row chunks as they land (contract: params.h; schedule:
// schedule.h). A part of async_gemm.cu (included only there).
//
// One CTA per SM, 384 threads = 3 warpgroups:
//
//   warpgroup 0 (producer, one thread):  for each tile: [wait ready[chunk]] then per k-block
//                                         wait empty[s] -> expect_tx(full[s]) -> TMA A, TMA B
//                                         (producer.cuh)
//   warpgroups 1, 2 (consumers):          per k-block wait full[s] -> [TMA store of its A
//                                         rows: the copy of A, tiles of the first column] ->
//                                         4 x wgmma m64n256k16 (float8: k32) ->
//                                         (previous k-block done) arrive empty[s-1]
//                                         (consumer.cuh); per tile the epilogue (epilogue.cuh):
//                                         [tail split parts] [float8 scales]
//                                         [reduce-scatter sum], 16-bit C
//                                         through shared memory and TMA stores (in two column
//                                         halves), f32 C from registers, or the SwiGLU of the
//                                         gate and up halves (staged as C, or from
//                                         registers); then
//                                         [done[chunk] += 1]
//
// The reduce-scatter epilogue (sum_chunk): the tiles of the own chunk, last in the walk, add the
// peers' parts of their rows to the accumulators. The parts come through the same stage ring as
// the k-blocks, so their loads run behind the tile's last MMAs (in a pair, each CTA loads the
// parts of its own 128 rows; both CTAs take the same stages: pairs_can_sum):
//
//   producer:  k-blocks of the tile | wait the piece's landed flags | per peer s (rank order),
//              per column half h: wait empty -> TMA part s, rows of the tile, columns of h
//   consumers: k-blocks | [count the previous tile's rows] | per (s, h): wait full -> ldmatrix
//              + add into acc -> release | x 1/count (avg) | store into sum_out, rounded once
#pragma once

#include "kernels/native/consumer.cuh"
#include "kernels/native/epilogue.cuh"
#include "kernels/native/layout.cuh"
#include "kernels/native/producer.cuh"
#include "kernels/native/scheduler.cuh"

namespace asynctp::kernels {
namespace {

// kTmaStore: 16-bit C staged in shared memory and written by TMA stores that overlap the next
// tile's main loop; otherwise (f32 C, or a C TMA cannot address) the consumers store from
// registers. The SwiGLU epilogue (no reduce-scatter sum there) takes map_parts and map_sum for
// the gate's and the up projection's halves of pre; a pre TMA cannot store (f32, misaligned, or
// N % 8 != 0) sends the whole SwiGLU epilogue to the register stores (uses_tma_store).
//
// kCluster = 2: the two CTAs of a cluster take the two 128-row halves of a 256 x 256 tile and
// share its B tile: each loads one half of B and multicasts it into both CTAs' shared memory
// (half the L2 -> SM traffic for B). A stage is refilled only after the consumers of both CTAs
// released it (empty barriers count 4 arrivals: 2 consumers x 2 CTAs).
template <int kIn, bool kBKMajor, bool kTmaStore, int kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    async_gemm_kernel(const __grid_constant__ CUtensorMap map_a,
                      const __grid_constant__ CUtensorMap map_b,
                      const __grid_constant__ CUtensorMap map_c,
                      const __grid_constant__ CUtensorMap map_a_own,
                      const __grid_constant__ CUtensorMap map_parts,
                      const __grid_constant__ CUtensorMap map_sum,
                      const __grid_constant__ CUtensorMap map_a_out,
                      const __grid_constant__ PushMaps push_maps, const KernelParams p) {
  extern __shared__ uint8_t smem_raw[];
  // 1024-byte aligned (the 128-byte swizzle's atom) by an offset from smem_raw rather than by
  // masking its generic address: a pointer rebuilt from an integer loses its address space, so
  // the staging stores compiled to generic 64-bit ST.E and every k-block read the shared window
  // (S2UR SR_SWINHI) to convert its stage addresses back (see docs/DECISIONS.md D18).
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  Stages st;
  st.a = smem;
  st.b = smem + kStages * kStageABytes;
  st.c = st.b + kStages * kStageBBytes;
  st.full = reinterpret_cast<uint64_t*>(st.c + (kTmaStore ? kCBytes : 0));
  st.empty = st.full + kStages;

  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&st.full[s], 1);
      mbar_init(&st.empty[s], 2 * kCluster);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // The peer's barriers must be initialised before anyone multicasts into them or arrives there.
  if constexpr (kCluster == 2) {
    cluster_sync();
  } else {
    __syncthreads();
  }

  const CtaSchedule sched = cta_schedule<kCluster>(p);

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == 0)
      produce<kBKMajor, kCluster>(p, st, sched, map_a, map_b, map_a_own, map_parts);
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
  Pending pending;  // kTmaStore: the tile whose stores are in flight (the leader's)
  for (int u = sched.cluster_id; u < sched.num_units; u += sched.clusters) {
    const Unit w = unit_of(u, p, sched.walk);
    Tile tile = sched.walk.tile(w.t);
    tile.m0 += kBM * static_cast<int>(sched.cta);
    const bool sums = sums_tile(p, p, w, tile.m0);
    const int r0 = tile.m0 + 64 * consumer;
    // The copy of A: the first column's tiles store the rows they load (each row once).
    const int a_out_row = p.a_out != nullptr && tile.n0 == 0 && r0 < p.m ? r0 : -1;
    mainloop<kIn, kBKMajor, kTmaStore, kCluster>(p, st, w, acc, consumer, leader, it, pending,
                                                 map_a_out, a_out_row);
    if (w.part >= 0) {
      const int slot = split_slot(w.tail, kCluster, static_cast<int>(sched.cta));
      if (w.part < p.split - 1) {
        save_split_part(p, w, slot, acc, consumer, leader);
        continue;
      }
      add_split_parts(p, slot, acc, consumer, leader);
    }

    // float8: the scales, on the whole accumulator (before the peers' parts, which are scaled).
    if constexpr (kIn == kInE4M3) scale_block(p, acc, r0, tile.n0);
    if (sums) add_sum_parts<kTmaStore, kCluster>(p, st, acc, consumer, leader, it, pending);
    const int64_t sum_row = sum_row_of(p, r0);
    if (sums && !(kTmaStore && p.sum_tma_store)) {
      store_sum_registers(p, acc, sum_row, tile.n0);
      continue;
    }
    if constexpr (kTmaStore) {
      if (p.swiglu) {
        store_swiglu_tma(p, st, map_c, map_parts, map_sum, acc, consumer, leader, r0, tile.n0);
      } else {
        store_tile_tma(p, st, map_c, map_sum, push_maps, acc, consumer, leader, sums, r0, sum_row,
                       tile.n0, pending);
      }
    } else if (p.swiglu) {
      store_swiglu_registers(p, acc, r0, tile.n0);
    } else {
      store_tile_registers(p, acc, consumer, leader, r0, tile.n0);
    }
  }
  if constexpr (kTmaStore) {
    if (leader) {
      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
      if (p.done != nullptr && pending.row >= 0) publish_done(p, pending.row, pending.col);
    }
  } else if (leader && p.a_out != nullptr) {
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");  // the copy of A's stores
  }
  // No CTA leaves while its peer may still arrive on its barriers.
  if constexpr (kCluster == 2) cluster_sync();
}

}  // namespace
}  // namespace asynctp::kernels
