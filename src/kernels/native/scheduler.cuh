// The native GEMM's scheduler part: which units a CTA (a cluster) takes, in which order, and the
// tile of each (the walk of schedule.h, with the launch's plan). A part of async_gemm.cu
// (included only there).
#pragma once

#include "kernels/native/layout.cuh"

namespace asynctp::kernels {
namespace {

// The CTA's share of the work: units cluster_id, cluster_id + clusters, ... < num_units; `cta`
// is its rank in the cluster (its 128 rows of a cluster tile).
struct CtaSchedule {
  Walk walk;
  int num_units;
  int cluster_id, clusters;
  uint32_t cta;
};

template <int kCluster>
__device__ __forceinline__ CtaSchedule cta_schedule(const KernelParams& p) {
  CtaSchedule s;
  s.cta = kCluster == 2 ? cluster_cta_rank() : 0;
  s.cluster_id = blockIdx.x / kCluster;
  s.clusters = gridDim.x / kCluster;
  s.walk = walk_of(p, kBM * kCluster, p.group_m);
  s.num_units = num_units(p, s.walk.num_tiles);
  return s;
}

// Unit u: a whole (cluster) tile, or a K-range of a tail tile (both CTAs of a pair take the same).
__device__ __forceinline__ Unit unit_of(int u, const KernelParams& p, const Walk& walk) {
  return unit_at(u, p, walk.num_tiles, walk.k_blocks);
}

}  // namespace
}  // namespace asynctp::kernels
