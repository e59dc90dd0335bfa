// The PTX the native GEMM's parts are written with: shared-memory addresses, mbarriers, TMA loads
// and stores (multicast to a cluster too), wgmma and its fences, cluster barriers, acquire loads.
// A part of async_gemm.cu (included only there).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/device_sync.cuh"
#include "kernels/wgmma_regs.cuh"

namespace asynctp::kernels {
namespace {

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

// The inputs a kernel is built for (its kIn parameter).
enum InKind : int { kInBF16 = 0, kInF16 = 1, kInE4M3 = 2 };

// One m64n256 wgmma step over 32 bytes of k: k16 of bf16 / f16, or k32 of float8 e4m3 (which
// reads both operands K-major: kTransB 0 only, no transpose operands in its form).
template <int kIn, int kTransB>
__device__ __forceinline__ void wgmma(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                      int scale_d) {
  if constexpr (kIn == kInE4M3) {
    static_assert(kTransB == 0, "float8 wgmma reads B K-major");
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {" ASYNCTP_WGMMA_ACC_REGS
        "}, %128, %129, p, 1, 1;\n}\n"
        : ASYNCTP_WGMMA_ACC_OPERANDS(d)
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
  } else if constexpr (kIn == kInF16) {
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
// wgmma.wait_group already guarantees, and the peer refills it with TMA, also the async proxy. A
// sum stage of the reduce-scatter epilogue is read by ldmatrix instead: every thread has used
// the values it loaded, and fenced towards the async proxy, before the bar.sync that precedes
// the arrive (add_sum_parts), so no read is outstanding when the peer's multicast may refill it.
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

}  // namespace
}  // namespace asynctp::kernels
