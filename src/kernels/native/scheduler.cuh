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
  // Clusters never split tiles (the host turns the tail split off for them).
  s.num_units = kCluster == 1 ? num_units(p, s.walk.num_tiles) : s.walk.num_tiles;
  return s;
}

template <int kCluster>
__device__ __forceinline__ Unit unit_of(int u, const KernelParams& p, const Walk& walk) {
  return kCluster == 1 ? unit_at(u, p, walk.num_tiles, walk.k_blocks)
                       : Unit{u, 0, walk.k_blocks, -1, 0};
}

}  // namespace
}  // namespace asynctp::kernels
