// The bit-level float conversions behind core/dtype.h, written once for host and device code
// (nvcc compiles this header into the CUDA kernels, so both backends round identically).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ASYNCTP_HD __host__ __device__ __forceinline__
#else
#define ASYNCTP_HD inline
#endif

namespace asynctp::bits {

ASYNCTP_HD uint32_t f32_bits(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}
ASYNCTP_HD float f32_from(uint32_t u) {
  float v;
  memcpy(&v, &u, 4);
  return v;
}

// Rounds |x| (finite, as f32 bits without the sign) to a format with `man_bits` mantissa bits
// and exponent bias `bias`, ties to even. Returns the target's magnitude bit pattern (exponent
// field << man_bits | mantissa); a result past the format's largest pattern is returned as is,
// and the caller decides between inf, NaN and saturation.
ASYNCTP_HD uint32_t round_shift(uint32_t value, int shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rem = value & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((rem > half || (rem == half && (kept & 1u))) ? 1u : 0u);
}

ASYNCTP_HD uint32_t round_magnitude(uint32_t abs_bits, int man_bits, int bias) {
  const int f_exp = static_cast<int>(abs_bits >> 23);
  const uint32_t f_man = abs_bits & 0x7FFFFFu;
  if (f_exp == 0) return 0;  // f32 subnormals are far below every target's smallest subnormal
  const int e = f_exp - 127;
  const int emin = 1 - bias;
  if (e >= emin) {
    // Normal in the target: rebias the exponent and drop the low mantissa bits; a carry out of
    // the mantissa correctly bumps the exponent.
    const uint32_t value = (static_cast<uint32_t>(e + bias) << 23) | f_man;
    return round_shift(value, 23 - man_bits);
  }
  // Subnormal in the target: the significand in units of the smallest subnormal.
  const uint32_t sig = f_man | 0x800000u;
  const int shift = 23 + emin - man_bits - e;
  if (shift > 24) return 0;  // below half the smallest subnormal
  return round_shift(sig, shift);
}

ASYNCTP_HD uint16_t float_to_bf16(float value) {
  uint32_t u = f32_bits(value);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;  // canonical quiet NaN, like torch
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

ASYNCTP_HD float bf16_to_float(uint16_t b) {
  return f32_from(static_cast<uint32_t>(b) << 16);
}

ASYNCTP_HD uint16_t float_to_f16(float value) {
  const uint32_t u = f32_bits(value);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7E00u;
  if (a == 0x7F800000u) return sign | 0x7C00u;
  const uint32_t mag = round_magnitude(a, 10, 15);
  return sign | static_cast<uint16_t>(mag >= 0x7C00u ? 0x7C00u : mag);
}

ASYNCTP_HD float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  if (e == 0) {
    // m * 2^-24, exact: scale by 2^-24 through the exponent of an exact integer float.
    const float mag = static_cast<float>(m) * f32_from(0x33800000u);
    return f32_from(sign | f32_bits(mag));
  }
  // inf, or NaN with its payload kept and the quiet bit set, as F16C, CUDA and torch convert:
  // a signalling f16 NaN must not come out as a signalling f32 NaN.
  if (e == 31) return f32_from(sign | 0x7F800000u | (m << 13) | (m != 0 ? 0x400000u : 0u));
  return f32_from(sign | ((e + 112u) << 23) | (m << 13));
}

// e4m3fn has no inf: overflow and inf saturate to +-448 whatever `saturate` says, as torch's
// cast does (since PyTorch PR 178817); only NaN gives NaN.
ASYNCTP_HD uint8_t float_to_f8e4m3(float value, bool /*saturate*/) {
  const uint32_t u = f32_bits(value);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7Fu;  // NaN
  if (a == 0x7F800000u) return sign | 0x7Eu;
  const uint32_t mag = round_magnitude(a, 3, 7);
  if (mag > 0x7Eu) return sign | 0x7Eu;
  return sign | static_cast<uint8_t>(mag);
}

ASYNCTP_HD float f8e4m3_to_float(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t e = (b >> 3) & 0xFu;
  const uint32_t m = b & 0x7u;
  if ((b & 0x7Fu) == 0x7Fu) return f32_from(sign | 0x7FC00000u);
  if (e == 0) {
    const float mag = static_cast<float>(m) * f32_from(0x3B000000u);  // m * 2^-9, exact
    return f32_from(sign | f32_bits(mag));
  }
  return f32_from(sign | ((e + 120u) << 23) | (m << 20));
}

// saturate: clamp to the largest finite value instead of inf.
ASYNCTP_HD uint8_t float_to_f8e5m2(float value, bool saturate) {
  const uint32_t u = f32_bits(value);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7Fu;  // NaN
  const uint8_t overflow = saturate ? 0x7Bu : 0x7Cu;
  if (a == 0x7F800000u) return sign | overflow;
  const uint32_t mag = round_magnitude(a, 2, 15);
  if (mag >= 0x7Cu) return sign | overflow;
  return sign | static_cast<uint8_t>(mag);
}

ASYNCTP_HD float f8e5m2_to_float(uint8_t b) {
  return f16_to_float(static_cast<uint16_t>(static_cast<uint16_t>(b) << 8));
}

}  // namespace asynctp::bits
