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

#if defined(__CUDACC__)
// The native GEMM's SwiGLU epilogue: its consumers compute it while the tensor cores wait (they
// run the epilogue and the main loop in turn), and expf's and the division's IEEE sequences took
// ~15% of the gate/up GEMM's time (8B layer, 2 x H200). The SFU's approximations instead
// (ex2.approx, rcp.approx: a few ulp, ~1e-6 relative): the epilogue's result differs from
// swiglu_f32's in the last bits, never more than one rounding of a 16-bit output.
__device__ __forceinline__ float swiglu_epilogue_f32(float gate, float up) {
  return __fdividef(gate, 1.0f + __expf(-gate)) * up;
}
#endif

// SwiGLU's gradients for one (gate, up) pair, given the output's gradient d, with
// s = sigmoid(gate) and silu'(gate) = s (1 + gate (1 - s)):
//   d_gate = d * up * silu'(gate)
//   d_up   = d * silu(gate)
ASYNCTP_HOST_DEVICE void swiglu_backward_f32(float gate, float up, float d, float* d_gate,
                                             float* d_up) {
  const float s = 1.0f / (1.0f + expf(-gate));
  *d_gate = d * up * (s * (1.0f + gate * (1.0f - s)));
  *d_up = d * silu_f32(gate);
}

}  // namespace asynctp::kernels
