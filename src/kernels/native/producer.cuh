// The native GEMM's producer part (warpgroup 0, one thread): for each unit, [wait for the ready
// flags of its rows] then per k-block wait empty[s] -> expect_tx(full[s]) -> TMA A, TMA B (with
// the SwiGLU epilogue B's gate and up columns of the tile as its two halves); for
// a tile of the reduce-scatter epilogue, then [wait for the peers' parts] and TMA them into sum
// stages. A part of async_gemm.cu (included only there).
#pragma once

#include "kernels/native/layout.cuh"
#include "kernels/native/scheduler.cuh"

namespace asynctp::kernels {
namespace {

// Waits (acquire, system scope: a peer's stream write raised it) until *flag is up for op `value`
// (wrap-safe: op numbers count up through 2^32). False after p.timeout_ns, reported in the error
// slot as (peer, channel, what).
__device__ __forceinline__ bool wait_raised(const KernelParams& p, const uint32_t* flag,
                                            uint32_t value, int peer, int channel, int what) {
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
__device__ bool wait_chunks_ready(const KernelParams& p, int m0) {
  const int64_t end_row = p.m < m0 + kBM ? p.m : m0 + kBM;
  for (int64_t row = m0; row < end_row;) {
    const ReadyPiece r = ready_piece_at(p, row);
    row = r.end;
    if (!wait_raised(p, p.ready + ready_index(p, r), p.ready_value, static_cast<int>(r.chunk),
                     static_cast<int>(r.piece), 3)) {
      return false;
    }
  }
  // The chunk was written by a copy (a copy engine's or a copy kernel's); the TMA loads that
  // follow read through the async proxy, ordered after this thread's acquire by the proxy fence.
  asm volatile("fence.proxy.async.global;" ::: "memory");
  return true;
}

// Waits until every peer's partial of the piece holding chunk row `row` has landed (the
// producer thread, before it loads them; acquire, system scope: the copy engines of the peers
// wrote the parts, then their stream writes raised the flags). False on timeout (reported as a
// reduction's wait, what = 5, naming the peer and the piece's channel).
__device__ __forceinline__ bool wait_sum_parts(const KernelParams& p, int64_t row, int col) {
  const int64_t q = sum_piece(p, p, row, col);
  for (int s = 0; s < p.sum_count; ++s) {
    if (s == p.sum_self) continue;
    if (!wait_raised(p, p.sum_flags + q * p.sum_flag_stride + s, p.sum_value, s,
                     p.sum_channel + static_cast<int>(q), 5)) {
      return false;
    }
  }
  return true;
}

// The producer thread's loop over the CTA's units (see the file comment).
template <bool kBKMajor, int kCluster>
__device__ __forceinline__ void produce(const KernelParams& p, const Stages& st,
                                        const CtaSchedule& sched, const CUtensorMap& map_a,
                                        const CUtensorMap& map_b, const CUtensorMap& map_a_own,
                                        const CUtensorMap& map_parts) {
  const uint32_t cta = sched.cta;
  bool waiting = p.ready != nullptr;
  // After a timeout (reported) the parts are loaded without waiting: the op has failed, and
  // the consumers must not hang on their stages.
  bool sum_waiting = p.sum_count > 1;
  int it = 0;
  const int kblk = k_block_of(p);  // elements of k per k-block (128 bytes of a row)
  for (int u = sched.cluster_id; u < sched.num_units; u += sched.clusters) {
    const Unit w = unit_of(u, p, sched.walk);
    const Tile tile = sched.walk.tile(w.t);
    const int m0 = tile.m0 + kBM * static_cast<int>(cta);
    // A tile wholly inside the own chunk is read from the caller's A (always there);
    // any other waits for its chunks to land.
    const bool own = reads_own(p, m0);
    if (waiting && !own) waiting = wait_chunks_ready(p, m0);
    const CUtensorMap* a_map = own ? &map_a_own : &map_a;
    const int a_row = own ? static_cast<int>(m0 - own_first_row(p)) : m0;
    for (int kb = w.kb0; kb < w.kb1; ++kb, ++it) {
      const int s = it % kStages;
      mbar_wait(&st.empty[s], ((it / kStages) & 1) ^ 1);
      mbar_expect_tx(&st.full[s], kStageABytes + kStageBBytes);
      tma_load_2d(st.a + s * kStageABytes, a_map, &st.full[s], kb * kblk, a_row);
      uint8_t* b = st.b + s * kStageBBytes;
      if constexpr (kCluster == 2) {
        // This CTA's half of B, into both CTAs.
        if constexpr (kBKMajor) {
          tma_load_2d_multicast(b + cta * (kStageBBytes / 2), &map_b, &st.full[s], kb * kblk,
                                tile.n0 + (kBN / 2) * static_cast<int>(cta), 0x3);
        } else {
#pragma unroll
          for (int j = 2 * cta; j < 2 * cta + 2; ++j)
            tma_load_2d_multicast(b + j * 8192, &map_b, &st.full[s], tile.n0 + 64 * j, kb * kblk,
                                  0x3);
        }
      } else if constexpr (kBKMajor) {
        if (p.swiglu) {
          // Two boxes of kBN / 2 rows (the map's box with the SwiGLU epilogue): the gate's, then
          // the up projection's (b_col_of), 16 KiB apart as one kBN-row box would lay them.
          tma_load_2d(b, &map_b, &st.full[s], kb * kblk, static_cast<int>(b_col_of(p, tile.n0, 0)));
          tma_load_2d(b + kStageBBytes / 2, &map_b, &st.full[s], kb * kblk,
                      static_cast<int>(b_col_of(p, tile.n0, kBN / 2)));
        } else {
          tma_load_2d(b, &map_b, &st.full[s], kb * kblk, tile.n0);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kBN / 64; ++j) {
          tma_load_2d(b + j * 8192, &map_b, &st.full[s],
                      static_cast<int>(b_col_of(p, tile.n0, 64 * j)), kb * kblk);
        }
      }
    }
    if (sums_tile(p, p, w, m0)) {
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
          const int stage_idx = it % kStages;
          mbar_wait(&st.empty[stage_idx], ((it / kStages) & 1) ^ 1);
          mbar_expect_tx(&st.full[stage_idx], kSumStageBytes);
          uint8_t* dst = st.b + stage_idx * kStageBBytes;
          const int col = tile.n0 + 128 * half;
          tma_load_3d(dst, &map_parts, &st.full[stage_idx], col, static_cast<int>(row), s);
          tma_load_3d(dst + kSumBoxBytes, &map_parts, &st.full[stage_idx], col + 64,
                      static_cast<int>(row), s);
        }
      }
    }
  }
}

}  // namespace
}  // namespace asynctp::kernels
