// Conversions of the element types (asynctp/dtype.h) to and from f32, and their storage types.
//
// Every narrowing conversion rounds to nearest, ties to even, and gives the same bits as
// PyTorch's tensor.to(dtype) (torch 2.15) for every value but NaN, whose payload torch does not
// keep consistently (tests/core/dtype_golden_test.cpp checks this against tables from torch):
//   bf16: NaN becomes the canonical quiet NaN 0x7FC0 (c10::BFloat16's); overflow rounds to inf.
//   f16:  NaN becomes 0x7E00 (sign kept); values >= 65520 become inf; subnormals are exact.
//   f8 e4m3fn (no inf, one NaN pattern per sign, max finite 448): like torch's float8_e4m3fn
//         cast (since PyTorch PR 178817), |x| > 464 and inf saturate to +-448; NaN stays NaN.
//         Saturate::kFinite therefore changes nothing for e4m3fn.
//   f8 e5m2 (IEEE-like, max finite 57344): like torch's float8_e5m2 cast, |x| >= 61440 becomes
//         inf. Saturate::kFinite clamps to +-57344 (inf included), the behaviour float8 training
//         recipes want (NaN stays NaN).
// Decoding is exact; a NaN decodes to a quiet f32 NaN of the same sign.
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

#include <asynctp/dtype.h>

#include "core/error.h"

namespace asynctp {

enum class Saturate : uint8_t { kNone, kFinite };

// Storage types: a bit pattern with a name. Arithmetic always happens in f32.
struct BFloat16 {
  uint16_t bits;
};
struct Float16 {
  uint16_t bits;
};
struct Float8E4M3 {
  uint8_t bits;
};
struct Float8E5M2 {
  uint8_t bits;
};

inline float bits_to_float(uint32_t bits) {
  return std::bit_cast<float>(bits);
}
inline uint32_t float_to_bits(float value) {
  return std::bit_cast<uint32_t>(value);
}

uint16_t float_to_bf16_bits(float value);
float bf16_bits_to_float(uint16_t bits);
uint16_t float_to_f16_bits(float value);
float f16_bits_to_float(uint16_t bits);
uint8_t float_to_f8e4m3_bits(float value, Saturate saturate = Saturate::kNone);
float f8e4m3_bits_to_float(uint8_t bits);
uint8_t float_to_f8e5m2_bits(float value, Saturate saturate = Saturate::kNone);
float f8e5m2_bits_to_float(uint8_t bits);

inline constexpr float kF8E4M3Max = 448.0f;
inline constexpr float kF8E5M2Max = 57344.0f;

// to_float / from_float over the storage types, for templated CPU loops.
inline float to_float(float v) {
  return v;
}
inline float to_float(BFloat16 v) {
  return bf16_bits_to_float(v.bits);
}
inline float to_float(Float16 v) {
  return f16_bits_to_float(v.bits);
}
inline float to_float(Float8E4M3 v) {
  return f8e4m3_bits_to_float(v.bits);
}
inline float to_float(Float8E5M2 v) {
  return f8e5m2_bits_to_float(v.bits);
}

template <typename T>
T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16{float_to_bf16_bits(v)};
  } else if constexpr (std::is_same_v<T, Float16>) {
    return Float16{float_to_f16_bits(v)};
  } else if constexpr (std::is_same_v<T, Float8E4M3>) {
    return Float8E4M3{float_to_f8e4m3_bits(v)};
  } else {
    static_assert(std::is_same_v<T, Float8E5M2>);
    return Float8E5M2{float_to_f8e5m2_bits(v)};
  }
}

template <DType D>
struct StorageOf;
template <>
struct StorageOf<DType::kF32> {
  using type = float;
};
template <>
struct StorageOf<DType::kBF16> {
  using type = BFloat16;
};
template <>
struct StorageOf<DType::kF16> {
  using type = Float16;
};
template <>
struct StorageOf<DType::kF8E4M3> {
  using type = Float8E4M3;
};
template <>
struct StorageOf<DType::kF8E5M2> {
  using type = Float8E5M2;
};

// Calls fn(T{}) with T the storage type of dtype (a value of T, used only for its type). Float
// dtypes only: int64, uint64 and bool tensors are the graph executor's, which handles them itself.
template <typename Fn>
decltype(auto) dispatch_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32:
      return fn(float{});
    case DType::kBF16:
      return fn(BFloat16{});
    case DType::kF16:
      return fn(Float16{});
    case DType::kF8E4M3:
      return fn(Float8E4M3{});
    case DType::kF8E5M2:
      return fn(Float8E5M2{});
    case DType::kI64:
    case DType::kU64:
    case DType::kBool:
      ASYNCTP_FAIL(
          "{} tensors are not supported here (only float dtypes: f32, bf16, f16, f8e4m3, "
          "f8e5m2)",
          dtype_name(dtype));
  }
  ASYNCTP_FAIL("unknown dtype {}", static_cast<int>(dtype));
}

}  // namespace asynctp
