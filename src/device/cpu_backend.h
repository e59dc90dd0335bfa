// The CPU backend: host memory, asynchronous streams (worker threads, NOTE [cpu streams] in
// device/cpu_streams.h), a reference GEMM that accumulates in f32 in
// plain k order. It is the ground truth the CUDA backend is tested against, and with the CPU
// symmetric memory it runs the fused ops' real schedules across processes in CI.
#pragma once

#include "device/backend.h"

namespace asynctp {

// rank: this process's rank on its node, which seeds its streams' jitter.
std::unique_ptr<Backend> make_cpu_backend(int rank = 0);

}  // namespace asynctp
