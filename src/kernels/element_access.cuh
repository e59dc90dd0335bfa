// Device-side element access for KTensor: load any dtype as f32, store f32 into any dtype, with
// the same rounding as the CPU backend (core/float_bits.h), and N-d offset computation.
#pragma once

#include <cstdint>

#include "core/float_bits.h"
#include "kernels/kernels.h"

namespace asynctp::kernels::detail {

__device__ __forceinline__ float load_f32(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kBF16:
      return bits::bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kF16:
      return bits::f16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kF8E4M3:
      return bits::f8e4m3_to_float(static_cast<const uint8_t*>(base)[i]);
    case DType::kF8E5M2:
      return bits::f8e5m2_to_float(static_cast<const uint8_t*>(base)[i]);
    case DType::kI64:
      return static_cast<float>(static_cast<const int64_t*>(base)[i]);
    case DType::kU64:
      return static_cast<float>(static_cast<const uint64_t*>(base)[i]);
    case DType::kBool:
      return static_cast<const uint8_t*>(base)[i] != 0 ? 1.0f : 0.0f;
  }
  return 0.0f;
}

__device__ __forceinline__ void store_f32(void* base, DType dtype, int64_t i, float v) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(base)[i] = v;
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(base)[i] = bits::float_to_bf16(v);
      return;
    case DType::kF16:
      static_cast<uint16_t*>(base)[i] = bits::float_to_f16(v);
      return;
    case DType::kF8E4M3:
      static_cast<uint8_t*>(base)[i] = bits::float_to_f8e4m3(v, false);
      return;
    case DType::kF8E5M2:
      static_cast<uint8_t*>(base)[i] = bits::float_to_f8e5m2(v, false);
      return;
    case DType::kI64:  // as PyTorch's float -> int64 cast: toward zero
      static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v);
      return;
    case DType::kU64:
      static_cast<uint64_t*>(base)[i] = static_cast<uint64_t>(v);
      return;
    case DType::kBool:
      static_cast<uint8_t*>(base)[i] = v != 0.0f ? 1 : 0;
      return;
  }
}

// Element offset (in elements) of linear index `linear` (row-major over shape) in t.
__device__ __forceinline__ int64_t offset_of(const KTensor& t, int64_t linear) {
  int64_t offset = 0;
  for (int d = t.ndim - 1; d >= 0; --d) {
    const int64_t size = t.shape[d];
    offset += (linear % size) * t.strides[d];
    linear /= size;
  }
  return offset;
}

inline int grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

}  // namespace asynctp::kernels::detail
