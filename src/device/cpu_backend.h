// The CPU backend: host memory, eager "streams", a reference GEMM that accumulates in f32 in
// plain k order. It is the ground truth the CUDA backend is tested against, and with the CPU
// symmetric memory it runs the fused ops' real schedules across processes in CI.
#pragma once

#include "device/backend.h"

namespace asynctp {

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace asynctp
