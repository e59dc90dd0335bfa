// The activations the elementwise kernels and the GEMM epilogues share, as host and device
// functions of f32 values, so that every backend and path computes them with the same formula
// (on the CPU backend: the same bits on every path).
#pragma once

#include <math.h>

#include "kernels/native/params.h"  // ASYNCTP_HOST_DEVICE

namespace asynctp::kernels {

ASYNCTP_HOST_DEVICE float silu_f32(float v) {
  return v / (1.0f + expf(-v));
}

// SwiGLU of one gate value and one up-projection value: silu(gate) * up.
ASYNCTP_HOST_DEVICE float swiglu_f32(float gate, float up) {
  return silu_f32(gate) * up;
}

}  // namespace asynctp::kernels
