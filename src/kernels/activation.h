// The activations the elementwise kernels and the GEMM epilogues share, as host and device
// functions of f32 values, so that every backend and path computes them with the same formula
// (on the CPU backend: the same bits on every path). The one exception is the CUDA native GEMM's
// SwiGLU epilogue (swiglu_epilogue_f32 below).
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
// The CUDA native GEMM's SwiGLU epilogue. Its consumers compute it while the tensor cores wait
// (each tile's main loop and epilogue take turns), 64 values a thread a tile; with expf and an
// IEEE division the gate/up GEMM of the 8B layer ran ~6% longer than with these (2 x H200;
// docs/PERFORMANCE.md). The SFU's approximations: __expf's error is 2 + floor(1.173 |g|) ulp
// (~6e-6 relative at |g| = 80), __fdividef's 2 ulp, so the result is within ~1e-5 relative of
// swiglu_f32's (the elementwise kernels' and the CPU emulation's), except for g in about
// (-88.7, -87.3), where 1 + exp(-g) lies in [2^126, 2^128) and __fdividef returns 0 instead of
// silu(g) ~ -5e-37 (an absolute error under 1e-36 |u|; f16 rounds both to 0). inf and NaN
// propagate as in swiglu_f32.
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
