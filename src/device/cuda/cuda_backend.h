// The CUDA backend: device memory from cudaMalloc, non-blocking streams, copies on the copy
// engine (cudaMemcpy/cudaMemcpy2D, peer memory included) or a kernel where strides require it,
// cuBLASLt GEMMs (heuristics tuned once per problem and cached), and the project's kernels for
// the reduction, conversion and elementwise work.
#pragma once

#include <memory>

#include "device/backend.h"
#include "kernels/kernels.h"

namespace asynctp {

// Number of visible GPUs (0 when there is no driver or no device).
int cuda_device_count();

// The GPU device_index where it is >= 0, else local_rank modulo the visible devices.
std::unique_ptr<Backend> make_cuda_backend(int local_rank, int device_index = -1);

// How many ranks may share one GPU: ASYNCTP_SHARED_GPUS (default 1, at most 8). Above 1, for
// testing the multi-rank schedules on fewer GPUs than ranks (correctness only, not speed):
// the ranks are processes on one GPU (each native GEMM on its share of the SMs, see
// cuda_backend.cpp), symmetric memory maps a GPU's own memory as its "peer's",
// and there is no NCCL communicator (NCCL refuses two ranks on one GPU): the unfused paths'
// collectives go through symmetric memory.
int cuda_ranks_per_gpu();

// What only CUDA-specific layers (symm/cuda, the NCCL communicator) need from the backend.
class CudaBackendInternals {
 public:
  virtual ~CudaBackendInternals() = default;
  virtual int device_index() const = 0;
  // Host-mapped slot where timed-out device waits report (device pointer for kernels).
  virtual kernels::DeviceErrorSlot* device_error_slot() = 0;
  // Throws TimeoutError if a device wait has reported a timeout since the last check.
  virtual void check_device_errors() = 0;
  // A stream of this backend is going away: what the backend keeps per stream goes with it.
  virtual void forget_stream(cudaStream_t stream) = 0;
  static CudaBackendInternals& of(Backend& backend);
};

}  // namespace asynctp
