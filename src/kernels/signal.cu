// Signal-pad kernels: put_signal, wait_signal and barrier on the GPU (see NOTE [signal pads and
// channels] in src/symm/symmetric_memory.h). Every spin is bounded by a timeout measured with
// %globaltimer; on timeout the kernel records rank, peer and channel in the host-mapped error
// slot and returns, so the stream keeps draining (every later wait is bounded too) and the host
// turns the record into a TimeoutError at its next check. No trap: the CUDA context stays usable.
#include "kernels/device_sync.cuh"
#include "kernels/kernels.h"

namespace asynctp::kernels {

namespace {

using detail::global_timer_ns;

__device__ void report_timeout(DeviceErrorSlot* slot, SignalSite site, int what,
                               uint64_t timeout_ns) {
  detail::report_timeout(slot, site.rank, site.peer, site.channel, what, timeout_ns);
}

// Moves *flag from `from` to `to`; false after timeout_ns.
__device__ bool transition(uint32_t* flag, uint32_t from, uint32_t to, uint64_t timeout_ns) {
  const uint64_t start = global_timer_ns();
  unsigned backoff = 32;
  while (atomicCAS_system(flag, from, to) != from) {
    if (global_timer_ns() - start > timeout_ns) return false;
    __nanosleep(backoff);
    backoff = backoff < 1024 ? backoff * 2 : 1024;
  }
  return true;
}

__global__ void put_signal_kernel(uint32_t* flag, SignalSite site, uint64_t timeout_ns,
                                  DeviceErrorSlot* slot) {
  __threadfence_system();  // release: everything this rank wrote before is visible to the peer
  if (!transition(flag, 0, 1, timeout_ns)) report_timeout(slot, site, 0, timeout_ns);
}

__global__ void wait_signal_kernel(uint32_t* flag, SignalSite site, uint64_t timeout_ns,
                                   DeviceErrorSlot* slot) {
  if (!transition(flag, 1, 0, timeout_ns)) report_timeout(slot, site, 1, timeout_ns);
  __threadfence_system();  // acquire
}

// First the flags to reset (every thread), then one thread per peer: signal it, then wait for its
// signal. The CTA barrier orders the resets before every thread's release fence.
__global__ void barrier_kernel(uint32_t* const* pads, int rank, int world_size, int channel,
                               uint64_t timeout_ns, DeviceErrorSlot* slot, uint32_t* reset,
                               int reset_count) {
  for (int i = threadIdx.x; i < reset_count; i += blockDim.x)
    reset[i] = 0;
  __syncthreads();
  const int peer = threadIdx.x;
  if (peer >= world_size || peer == rank) return;
  __threadfence_system();
  const SignalSite site{rank, peer, channel};
  if (!transition(pads[peer] + channel * world_size + rank, 0, 1, timeout_ns)) {
    report_timeout(slot, site, 2, timeout_ns);
    return;
  }
  if (!transition(pads[rank] + channel * world_size + peer, 1, 0, timeout_ns)) {
    report_timeout(slot, site, 2, timeout_ns);
  }
  __threadfence_system();
}

__global__ void spin_kernel(int64_t cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

cudaError_t spin(int64_t cycles, cudaStream_t stream) {
  if (cycles < 0) return cudaErrorInvalidValue;
  spin_kernel<<<1, 1, 0, stream>>>(cycles);
  return cudaGetLastError();
}

cudaError_t put_signal(uint32_t* flag, SignalSite site, uint64_t timeout_ns, DeviceErrorSlot* slot,
                       cudaStream_t stream) {
  put_signal_kernel<<<1, 1, 0, stream>>>(flag, site, timeout_ns, slot);
  return cudaGetLastError();
}

cudaError_t wait_signal(uint32_t* flag, SignalSite site, uint64_t timeout_ns, DeviceErrorSlot* slot,
                        cudaStream_t stream) {
  wait_signal_kernel<<<1, 1, 0, stream>>>(flag, site, timeout_ns, slot);
  return cudaGetLastError();
}

cudaError_t barrier(uint32_t* const* pads, int rank, int world_size, int channel,
                    uint64_t timeout_ns, DeviceErrorSlot* slot, cudaStream_t stream,
                    uint32_t* reset, int reset_count) {
  if (world_size > 1024 || reset_count < 0 || (reset_count > 0 && reset == nullptr))
    return cudaErrorInvalidValue;
  barrier_kernel<<<1, ((world_size + 31) / 32) * 32, 0, stream>>>(
      pads, rank, world_size, channel, timeout_ns, slot, reset, reset_count);
  return cudaGetLastError();
}

}  // namespace asynctp::kernels
