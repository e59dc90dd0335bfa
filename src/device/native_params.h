// The native GEMM's contract (kernels/native/params.h) filled from the ops' ChunkedGemmArgs:
// one conversion that every backend of the native GEMM reads (the CUDA kernel's launcher and the
// CPU emulation), so that both see the same pointers, strides, dtypes and schedule.
#pragma once

#include <string>

#include "device/backend.h"
#include "kernels/native/params.h"

namespace asynctp {

// *params <- args: the schedule fields as they are, the operands from the tensors, the wait bound
// from args.timeout. "" or why `args` cannot be expressed (shapes, strides, dtypes); what the
// contract itself cannot run is kernels::native_gemm_unsupported's (kernels/native/validate.h).
std::string to_native_params(const ChunkedGemmArgs& args, kernels::NativeGemmParams* params);

}  // namespace asynctp
