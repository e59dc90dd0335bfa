#include "core/dtype.h"

#include <array>
#include <cmath>
#include <utility>

namespace asynctp {

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kF8E4M3: return "f8e4m3";
    case DType::kF8E5M2: return "f8e5m2";
  }
  return "unknown";
}

std::string_view torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "float32";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    case DType::kF8E4M3: return "float8_e4m3fn";
    case DType::kF8E5M2: return "float8_e5m2";
  }
  return "unknown";
}

DType parse_dtype(std::string_view text) {
  static constexpr std::array<std::pair<std::string_view, DType>, 17> kNames{{
      {"f32", DType::kF32},           {"float32", DType::kF32},     {"float", DType::kF32},
      {"fp32", DType::kF32},          {"bf16", DType::kBF16},       {"bfloat16", DType::kBF16},
      {"f16", DType::kF16},           {"float16", DType::kF16},     {"half", DType::kF16},
      {"fp16", DType::kF16},          {"f8e4m3", DType::kF8E4M3},   {"e4m3", DType::kF8E4M3},
      {"float8_e4m3fn", DType::kF8E4M3}, {"f8e4m3fn", DType::kF8E4M3}, {"f8e5m2", DType::kF8E5M2},
      {"e5m2", DType::kF8E5M2},       {"float8_e5m2", DType::kF8E5M2},
  }};
  for (const auto& [name, dtype] : kNames) {
    if (name == text) return dtype;
  }
  ASYNCTP_FAIL("unknown dtype '{}' (expected f32, bf16, f16, f8e4m3 or f8e5m2)", text);
}

namespace {

// Rounds |x| (finite, given as f32 bits without the sign) to a binary format with `man_bits`
// mantissa bits and minimum normal exponent `emin` (unbiased), ties to even. Returns the target's
// magnitude bit pattern (exponent field << man_bits | mantissa); a result past the format's
// largest pattern is returned as is, and the caller decides between inf, NaN and saturation.
uint32_t round_magnitude(uint32_t abs_bits, int man_bits, int bias) {
  const int f_exp = static_cast<int>(abs_bits >> 23);
  const uint32_t f_man = abs_bits & 0x7FFFFFu;
  if (f_exp == 0) return 0;  // f32 subnormals are far below every target's smallest subnormal
  const int e = f_exp - 127;
  const int emin = 1 - bias;
  auto round_shift = [](uint32_t value, int shift) -> uint32_t {
    const uint32_t kept = value >> shift;
    const uint32_t rem = value & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    return kept + ((rem > half || (rem == half && (kept & 1u))) ? 1u : 0u);
  };
  if (e >= emin) {
    // Normal in the target: rebias the exponent, drop the low mantissa bits. A carry out of the
    // mantissa correctly bumps the exponent.
    const uint32_t value = (static_cast<uint32_t>(e + bias) << 23) | f_man;
    return round_shift(value, 23 - man_bits);
  }
  // Subnormal in the target: significand (with the implicit bit) in units of the smallest
  // subnormal, 2^(emin - man_bits).
  const uint32_t sig = f_man | 0x800000u;
  const int shift = 23 + emin - man_bits - e;
  if (shift > 24) return 0;  // below half the smallest subnormal
  return round_shift(sig, shift);
}

}  // namespace

uint16_t float_to_bf16_bits(float value) {
  uint32_t u = float_to_bits(value);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;  // canonical quiet NaN, like torch
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_bits_to_float(uint16_t bits) { return bits_to_float(static_cast<uint32_t>(bits) << 16); }

uint16_t float_to_f16_bits(float value) {
  const uint32_t u = float_to_bits(value);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7E00u;
  if (a == 0x7F800000u) return sign | 0x7C00u;
  const uint32_t mag = round_magnitude(a, 10, 15);
  return sign | static_cast<uint16_t>(mag >= 0x7C00u ? 0x7C00u : mag);
}

float f16_bits_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t e = (bits >> 10) & 0x1Fu;
  const uint32_t m = bits & 0x3FFu;
  if (e == 0) {
    const float mag = std::ldexp(static_cast<float>(m), -24);  // exact
    return bits_to_float(sign | float_to_bits(mag));
  }
  if (e == 31) return bits_to_float(sign | 0x7F800000u | (m << 13));
  return bits_to_float(sign | ((e + 112u) << 23) | (m << 13));
}

uint8_t float_to_f8e4m3_bits(float value, Saturate saturate) {
  const uint32_t u = float_to_bits(value);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7Fu;  // NaN
  if (a == 0x7F800000u) return sign | (saturate == Saturate::kFinite ? 0x7Eu : 0x7Fu);
  const uint32_t mag = round_magnitude(a, 3, 7);
  if (mag > 0x7Eu) return sign | (saturate == Saturate::kFinite ? 0x7Eu : 0x7Fu);
  return sign | static_cast<uint8_t>(mag);
}

float f8e4m3_bits_to_float(uint8_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x80u) << 24;
  const uint32_t e = (bits >> 3) & 0xFu;
  const uint32_t m = bits & 0x7u;
  if ((bits & 0x7Fu) == 0x7Fu) return bits_to_float(sign | 0x7FC00000u);
  if (e == 0) {
    const float mag = std::ldexp(static_cast<float>(m), -9);  // exact
    return bits_to_float(sign | float_to_bits(mag));
  }
  return bits_to_float(sign | ((e + 120u) << 23) | (m << 20));
}

uint8_t float_to_f8e5m2_bits(float value, Saturate saturate) {
  const uint32_t u = float_to_bits(value);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7Fu;  // NaN
  const uint8_t overflow = saturate == Saturate::kFinite ? 0x7Bu : 0x7Cu;
  if (a == 0x7F800000u) return sign | overflow;
  const uint32_t mag = round_magnitude(a, 2, 15);
  if (mag >= 0x7Cu) return sign | overflow;
  return sign | static_cast<uint8_t>(mag);
}

float f8e5m2_bits_to_float(uint8_t bits) {
  return f16_bits_to_float(static_cast<uint16_t>(static_cast<uint16_t>(bits) << 8));
}

}  // namespace asynctp
