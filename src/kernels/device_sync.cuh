// Device-side helpers for bounded waits on flags, shared by the kernels that wait: the clock every
// timeout is measured with, system-scope acquire loads of flags raised by a peer GPU (a stream
// memory write after a copy-engine push, over NVLink), and the record of a timeout in the
// host-mapped error slot (see kernels.h: DeviceErrorSlot), which the host turns into a
// TimeoutError naming rank, peer and channel.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace asynctp::kernels::detail {

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Whether a flag raised to op numbers is up for op `value`: it holds that number or the next one
// (the rule of flag_raised in device/backend.h).
__device__ __forceinline__ bool flag_raised(uint32_t flag, uint32_t value) {
  return flag - value <= 1u;
}

// The first timeout of a launch (or of several) wins the slot (see DeviceErrorSlot): a
// device-scope atomic on device memory, then plain stores to the host-mapped record.
__device__ __forceinline__ void report_timeout(DeviceErrorSlot* slot, int rank, int peer,
                                               int channel, int what, uint64_t timeout_ns) {
  if (slot == nullptr) return;
  if (atomicCAS(slot->claim, 0, 1) == 0) {
    slot->rank = rank;
    slot->peer = peer;
    slot->channel = channel;
    slot->what = what;
    slot->timeout_ns = timeout_ns;
    __threadfence_system();
    slot->flagged = 1;
    __threadfence_system();
  }
}

}  // namespace asynctp::kernels::detail
