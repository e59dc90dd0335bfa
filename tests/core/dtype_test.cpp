// DType names and conversions, checked on hand-picked bit patterns and exhaustively against
// independent references (every bit pattern round-trips; f8 rounding agrees with a brute-force
// search for the nearest value). dtype_golden_test.cpp checks the same casts against PyTorch.
#include "core/dtype.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace asynctp {
namespace {

using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();

float f(uint32_t bits) {
  return bits_to_float(bits);
}
float next_up(float x) {
  return std::nextafter(x, kInf);
}
float next_down(float x) {
  return std::nextafter(x, -kInf);
}
uint32_t sign_bit(float x) {
  return float_to_bits(x) >> 31;
}

// ---------------------------------------------------------------------------------------------
// Names and parsing

TEST(DTypeNames, ShortAndTorchNames) {
  EXPECT_EQ(dtype_name(DType::kF32), "f32");
  EXPECT_EQ(dtype_name(DType::kBF16), "bf16");
  EXPECT_EQ(dtype_name(DType::kF16), "f16");
  EXPECT_EQ(dtype_name(DType::kF8E4M3), "f8e4m3");
  EXPECT_EQ(dtype_name(DType::kF8E5M2), "f8e5m2");
  EXPECT_EQ(torch_dtype_name(DType::kF32), "float32");
  EXPECT_EQ(torch_dtype_name(DType::kBF16), "bfloat16");
  EXPECT_EQ(torch_dtype_name(DType::kF16), "float16");
  EXPECT_EQ(torch_dtype_name(DType::kF8E4M3), "float8_e4m3fn");
  EXPECT_EQ(torch_dtype_name(DType::kF8E5M2), "float8_e5m2");
  EXPECT_EQ(fmt::format("{}", DType::kBF16), "bf16");
}

TEST(DTypeNames, EveryNameParsesBack) {
  for (DType d : kFloatDTypes) {
    EXPECT_EQ(parse_dtype(dtype_name(d)), d) << dtype_name(d);
    EXPECT_EQ(parse_dtype(torch_dtype_name(d)), d) << torch_dtype_name(d);
  }
  EXPECT_EQ(parse_dtype("float"), DType::kF32);
  EXPECT_EQ(parse_dtype("fp32"), DType::kF32);
  EXPECT_EQ(parse_dtype("half"), DType::kF16);
  EXPECT_EQ(parse_dtype("fp16"), DType::kF16);
  EXPECT_EQ(parse_dtype("e4m3"), DType::kF8E4M3);
  EXPECT_EQ(parse_dtype("f8e4m3fn"), DType::kF8E4M3);
  EXPECT_EQ(parse_dtype("e5m2"), DType::kF8E5M2);
}

TEST(DTypeNames, UnknownNameIsNamedInTheError) {
  EXPECT_THAT([] { parse_dtype("float64"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("unknown dtype 'float64'")));
  EXPECT_THAT([] { parse_dtype(""); }, ::testing::ThrowsMessage<Error>(HasSubstr("''")));
  // Names are case-sensitive, like torch's.
  EXPECT_THROW(parse_dtype("BF16"), Error);
}

TEST(DTypeNames, SizesAndKinds) {
  EXPECT_EQ(element_size(DType::kF32), 4u);
  EXPECT_EQ(element_size(DType::kBF16), 2u);
  EXPECT_EQ(element_size(DType::kF16), 2u);
  EXPECT_EQ(element_size(DType::kF8E4M3), 1u);
  EXPECT_EQ(element_size(DType::kF8E5M2), 1u);
  EXPECT_FALSE(is_float8(DType::kF32));
  EXPECT_FALSE(is_float8(DType::kBF16));
  EXPECT_FALSE(is_float8(DType::kF16));
  EXPECT_TRUE(is_float8(DType::kF8E4M3));
  EXPECT_TRUE(is_float8(DType::kF8E5M2));
}

TEST(DTypeNames, DispatchPicksTheStorageType) {
  for (DType d : kFloatDTypes) {
    const size_t size = dispatch_dtype(d, [](auto v) { return sizeof(v); });
    EXPECT_EQ(size, element_size(d)) << dtype_name(d);
  }
  EXPECT_TRUE((std::is_same_v<StorageOf<DType::kBF16>::type, BFloat16>));
  EXPECT_TRUE((std::is_same_v<StorageOf<DType::kF8E5M2>::type, Float8E5M2>));
  EXPECT_THAT([] { dispatch_dtype(static_cast<DType>(42), [](auto) { return 0; }); },
              ::testing::ThrowsMessage<Error>(HasSubstr("unknown dtype 42")));
}

TEST(DTypeNames, FromFloatAndToFloatUseTheNonSaturatingCasts) {
  EXPECT_EQ(from_float<float>(1.5f), 1.5f);
  EXPECT_EQ(from_float<BFloat16>(1.5f).bits, 0x3FC0);
  EXPECT_EQ(from_float<Float16>(1.5f).bits, 0x3E00);
  EXPECT_EQ(from_float<Float8E4M3>(1.5f).bits, 0x3C);
  EXPECT_EQ(from_float<Float8E5M2>(1.5f).bits, 0x3E);
  EXPECT_EQ(from_float<Float8E4M3>(1000.0f).bits, 0x7E);  // e4m3fn saturates, as torch does
  EXPECT_EQ(from_float<Float8E5M2>(1e6f).bits, 0x7C);     // e5m2 overflows to inf
  EXPECT_EQ(to_float(BFloat16{0x3FC0}), 1.5f);
  EXPECT_EQ(to_float(Float16{0x3E00}), 1.5f);
  EXPECT_EQ(to_float(Float8E4M3{0x3C}), 1.5f);
  EXPECT_EQ(to_float(Float8E5M2{0x3E}), 1.5f);
  EXPECT_EQ(to_float(2.5f), 2.5f);
}

// ---------------------------------------------------------------------------------------------
// bf16

TEST(BFloat16, KnownValues) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16_bits(-2.0f), 0xC000);
  EXPECT_EQ(float_to_bf16_bits(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16_bits(kInf), 0x7F80);
  EXPECT_EQ(float_to_bf16_bits(-kInf), 0xFF80);
  EXPECT_EQ(bf16_bits_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bf16_bits_to_float(0x7F7F), f(0x7F7F0000));  // max finite
  EXPECT_EQ(bf16_bits_to_float(0xFF80), -kInf);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(0x7FC0)));
}

TEST(BFloat16, RoundsToNearestTiesToEven) {
  // 1 + 2^-8 lies halfway between 0x3F80 (even) and 0x3F81.
  EXPECT_EQ(float_to_bf16_bits(f(0x3F808000)), 0x3F80);
  EXPECT_EQ(float_to_bf16_bits(f(0x3F808001)), 0x3F81);
  EXPECT_EQ(float_to_bf16_bits(f(0x3F807FFF)), 0x3F80);
  // Halfway between 0x3F81 (odd) and 0x3F82: up to even.
  EXPECT_EQ(float_to_bf16_bits(f(0x3F818000)), 0x3F82);
  EXPECT_EQ(float_to_bf16_bits(f(0xBF818000)), 0xBF82);
  // A carry out of the mantissa bumps the exponent.
  EXPECT_EQ(float_to_bf16_bits(f(0x3FFF8000)), 0x4000);
}

TEST(BFloat16, OverflowAndSubnormals) {
  // Largest finite f32 rounds past bf16's max finite (0x7F7F) to inf, as in torch.
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(float_to_bf16_bits(f(0x7F7F7FFF)), 0x7F7F);
  EXPECT_EQ(float_to_bf16_bits(f(0x7F7F8000)), 0x7F80);  // tie, 0x7F7F odd: up to inf
  EXPECT_EQ(float_to_bf16_bits(f(0xFF7F8000)), 0xFF80);
  // bf16 has f32's exponent range: f32 subnormals round on the same grid.
  EXPECT_EQ(float_to_bf16_bits(f(0x00000001)), 0x0000);
  EXPECT_EQ(float_to_bf16_bits(f(0x00008000)), 0x0000);  // tie to even 0
  EXPECT_EQ(float_to_bf16_bits(f(0x00008001)), 0x0001);
  EXPECT_EQ(float_to_bf16_bits(f(0x00018000)), 0x0002);  // tie to even 2
  EXPECT_EQ(float_to_bf16_bits(f(0x007FFFFF)), 0x0080);  // largest subnormal -> min normal
  EXPECT_EQ(bf16_bits_to_float(0x0001), f(0x00010000));
}

TEST(BFloat16, NaNBecomesTheCanonicalNaN) {
  for (uint32_t bits : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu,
                        0xFFFFFFFFu, 0x7FBFFFFFu}) {
    // Without the check, rounding 0x7FFFFFFF would carry into the sign bit, and a signalling
    // NaN with only low payload bits would truncate to inf.
    EXPECT_EQ(float_to_bf16_bits(f(bits)), 0x7FC0) << std::hex << bits;
  }
}

TEST(BFloat16, EveryBitPatternRoundTrips) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const float value = bf16_bits_to_float(bits);
    EXPECT_EQ(float_to_bits(value), b << 16);  // decoding is exact, NaN payloads included
    const bool is_nan = (b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0;
    ASSERT_EQ(float_to_bf16_bits(value), is_nan ? 0x7FC0 : bits) << std::hex << b;
  }
}

// ---------------------------------------------------------------------------------------------
// f16

TEST(Float16, KnownValues) {
  EXPECT_EQ(float_to_f16_bits(1.0f), 0x3C00);
  EXPECT_EQ(float_to_f16_bits(-2.0f), 0xC000);
  EXPECT_EQ(float_to_f16_bits(0.5f), 0x3800);
  EXPECT_EQ(float_to_f16_bits(0.0f), 0x0000);
  EXPECT_EQ(float_to_f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_f16_bits(kInf), 0x7C00);
  EXPECT_EQ(float_to_f16_bits(-kInf), 0xFC00);
  EXPECT_EQ(f16_bits_to_float(0x3C00), 1.0f);
  EXPECT_EQ(f16_bits_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_bits_to_float(0xFBFF), -65504.0f);
  EXPECT_EQ(f16_bits_to_float(0x7C00), kInf);
  EXPECT_EQ(f16_bits_to_float(0xFC00), -kInf);
  EXPECT_EQ(float_to_bits(f16_bits_to_float(0x8000)), 0x80000000u);
}

TEST(Float16, OverflowThreshold) {
  EXPECT_EQ(float_to_f16_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_f16_bits(65519.99f), 0x7BFF);
  EXPECT_EQ(float_to_f16_bits(next_down(65520.0f)), 0x7BFF);
  // 65520 is halfway between 65504 (mantissa odd) and 65536: rounds up, to inf.
  EXPECT_EQ(float_to_f16_bits(65520.0f), 0x7C00);
  EXPECT_EQ(float_to_f16_bits(-65520.0f), 0xFC00);
  EXPECT_EQ(float_to_f16_bits(65536.0f), 0x7C00);
  EXPECT_EQ(float_to_f16_bits(1e30f), 0x7C00);
  EXPECT_EQ(float_to_f16_bits(std::numeric_limits<float>::max()), 0x7C00);
  EXPECT_EQ(float_to_f16_bits(-std::numeric_limits<float>::max()), 0xFC00);
}

TEST(Float16, RoundsToNearestTiesToEven) {
  const float ulp = std::ldexp(1.0f, -10);               // f16 spacing in [1, 2)
  EXPECT_EQ(float_to_f16_bits(1.0f + ulp / 2), 0x3C00);  // tie, even below
  EXPECT_EQ(float_to_f16_bits(next_up(1.0f + ulp / 2)), 0x3C01);
  EXPECT_EQ(float_to_f16_bits(1.0f + 3 * ulp / 2), 0x3C02);  // tie, even above
  EXPECT_EQ(float_to_f16_bits(next_down(1.0f + 3 * ulp / 2)), 0x3C01);
  EXPECT_EQ(float_to_f16_bits(2.0f - ulp / 2), 0x4000);  // tie, carries into the exponent
}

TEST(Float16, Subnormals) {
  const float smallest = std::ldexp(1.0f, -24);
  EXPECT_EQ(float_to_f16_bits(smallest), 0x0001);
  EXPECT_EQ(float_to_f16_bits(-smallest), 0x8001);
  EXPECT_EQ(f16_bits_to_float(0x0001), smallest);
  EXPECT_EQ(float_to_f16_bits(smallest / 2), 0x0000);  // tie to even 0
  EXPECT_EQ(float_to_bits(f16_bits_to_float(float_to_f16_bits(-smallest / 2))), 0x80000000u);
  EXPECT_EQ(float_to_f16_bits(next_up(smallest / 2)), 0x0001);
  EXPECT_EQ(float_to_f16_bits(next_down(smallest / 2)), 0x0000);
  EXPECT_EQ(float_to_f16_bits(smallest / 4), 0x0000);
  EXPECT_EQ(float_to_f16_bits(1.5f * smallest), 0x0002);  // tie between 1 and 2: even
  EXPECT_EQ(float_to_f16_bits(2.5f * smallest), 0x0002);  // tie between 2 and 3: even
  EXPECT_EQ(float_to_f16_bits(f(0x00000001)), 0x0000);    // f32 subnormals vanish
  EXPECT_EQ(float_to_f16_bits(f(0x807FFFFF)), 0x8000);
  // Largest subnormal, smallest normal, and the tie between them (rounds up to the normal).
  EXPECT_EQ(float_to_f16_bits(1023 * smallest), 0x03FF);
  EXPECT_EQ(f16_bits_to_float(0x03FF), 1023 * smallest);
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(float_to_f16_bits(1023.5f * smallest), 0x0400);
  EXPECT_EQ(float_to_f16_bits(next_down(1023.5f * smallest)), 0x03FF);
  EXPECT_EQ(float_to_f16_bits(1022.5f * smallest), 0x03FE);
}

TEST(Float16, NaNKeepsItsSign) {
  EXPECT_EQ(float_to_f16_bits(f(0x7FC00000)), 0x7E00);
  EXPECT_EQ(float_to_f16_bits(f(0xFFC00000)), 0xFE00);
  EXPECT_EQ(float_to_f16_bits(f(0x7F800001)), 0x7E00);  // signalling, low payload: still NaN
  EXPECT_EQ(float_to_f16_bits(f(0xFFFFFFFF)), 0xFE00);
}

TEST(Float16, DecodedNaNsAreQuiet) {
  for (uint32_t b : {0x7C01u, 0x7D00u, 0x7E00u, 0x7FFFu, 0xFC01u, 0xFE00u}) {
    const float v = f16_bits_to_float(static_cast<uint16_t>(b));
    ASSERT_TRUE(std::isnan(v)) << std::hex << b;
    EXPECT_EQ(sign_bit(v), b >> 15) << std::hex << b;
    // As F16C, CUDA and torch convert: a signalling f16 NaN becomes a quiet f32 NaN.
    EXPECT_NE(float_to_bits(v) & 0x00400000u, 0u) << std::hex << b;
  }
}

TEST(Float16, EveryBitPatternDecodesExactlyAndRoundTrips) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const uint32_t exp = (b >> 10) & 0x1F;
    const uint32_t man = b & 0x3FF;
    const float value = f16_bits_to_float(bits);
    const bool is_nan = exp == 31 && man != 0;
    if (!is_nan) {
      // Independent reference: (-1)^s * m * 2^(e - 25) for normals, m * 2^-24 for subnormals.
      const float magnitude = exp == 31  ? kInf
                              : exp == 0 ? std::ldexp(static_cast<float>(man), -24)
                                         : std::ldexp(static_cast<float>(man | 0x400), exp - 25);
      ASSERT_EQ(float_to_bits(value), float_to_bits((b & 0x8000) ? -magnitude : magnitude))
          << std::hex << b;
    }
    ASSERT_EQ(float_to_f16_bits(value), is_nan ? (b & 0x8000) | 0x7E00 : b) << std::hex << b;
  }
}

// ---------------------------------------------------------------------------------------------
// f8 e4m3fn: bias 7, no inf, NaN = S.1111.111, max finite 448 = 0x7E.

TEST(Float8E4M3, KnownValues) {
  EXPECT_EQ(float_to_f8e4m3_bits(1.0f), 0x38);
  EXPECT_EQ(float_to_f8e4m3_bits(-1.0f), 0xB8);
  EXPECT_EQ(float_to_f8e4m3_bits(0.0f), 0x00);
  EXPECT_EQ(float_to_f8e4m3_bits(-0.0f), 0x80);
  EXPECT_EQ(float_to_f8e4m3_bits(448.0f), 0x7E);
  EXPECT_EQ(float_to_f8e4m3_bits(-448.0f), 0xFE);
  EXPECT_EQ(float_to_f8e4m3_bits(240.0f), 0x77);
  EXPECT_EQ(f8e4m3_bits_to_float(0x38), 1.0f);
  EXPECT_EQ(f8e4m3_bits_to_float(0x7E), 448.0f);
  EXPECT_EQ(f8e4m3_bits_to_float(0xFE), -448.0f);
  EXPECT_EQ(f8e4m3_bits_to_float(0x78), 256.0f);  // exponent 15 is an ordinary exponent
  EXPECT_EQ(float_to_bits(f8e4m3_bits_to_float(0x80)), 0x80000000u);
  EXPECT_EQ(kF8E4M3Max, 448.0f);
}

// torch's float8_e4m3fn cast saturates what does not fit (since PyTorch PR 178817; before it,
// |x| > 464 and inf became NaN): only NaN gives NaN.
TEST(Float8E4M3, OverflowSaturatesLikeTorch) {
  EXPECT_EQ(float_to_f8e4m3_bits(next_down(464.0f)), 0x7E);
  // 464 is halfway between 448 (mantissa 110, even) and 480 (the NaN pattern): ties to 448.
  EXPECT_EQ(float_to_f8e4m3_bits(464.0f), 0x7E);
  EXPECT_EQ(float_to_f8e4m3_bits(-464.0f), 0xFE);
  // Past the tie the rounding would land on the NaN pattern; torch saturates instead.
  EXPECT_EQ(float_to_f8e4m3_bits(464.0001f), 0x7E);
  EXPECT_EQ(float_to_f8e4m3_bits(next_up(464.0f)), 0x7E);
  EXPECT_EQ(float_to_f8e4m3_bits(-next_up(464.0f)), 0xFE);
  EXPECT_EQ(float_to_f8e4m3_bits(480.0f), 0x7E);
  EXPECT_EQ(float_to_f8e4m3_bits(1e10f), 0x7E);
  EXPECT_EQ(float_to_f8e4m3_bits(std::numeric_limits<float>::max()), 0x7E);
  EXPECT_EQ(float_to_f8e4m3_bits(kInf), 0x7E);
  EXPECT_EQ(float_to_f8e4m3_bits(-kInf), 0xFE);
}

TEST(Float8E4M3, SaturateGivesTheSameResults) {
  constexpr auto kSat = Saturate::kFinite;
  EXPECT_EQ(float_to_f8e4m3_bits(448.0f, kSat), 0x7E);
  EXPECT_EQ(float_to_f8e4m3_bits(464.0f, kSat), 0x7E);
  EXPECT_EQ(float_to_f8e4m3_bits(next_up(464.0f), kSat), 0x7E);
  EXPECT_EQ(float_to_f8e4m3_bits(480.0f, kSat), 0x7E);
  EXPECT_EQ(float_to_f8e4m3_bits(-480.0f, kSat), 0xFE);
  EXPECT_EQ(float_to_f8e4m3_bits(1e30f, kSat), 0x7E);
  EXPECT_EQ(float_to_f8e4m3_bits(kInf, kSat), 0x7E);
  EXPECT_EQ(float_to_f8e4m3_bits(-kInf, kSat), 0xFE);
  // NaN stays NaN; in-range values round exactly as without saturation.
  EXPECT_EQ(float_to_f8e4m3_bits(f(0x7FC00000), kSat), 0x7F);
  EXPECT_EQ(float_to_f8e4m3_bits(f(0xFFC00000), kSat), 0xFF);
  EXPECT_EQ(float_to_f8e4m3_bits(1.0625f, kSat), 0x38);
  EXPECT_EQ(float_to_f8e4m3_bits(std::ldexp(1.0f, -10), kSat), 0x00);
}

TEST(Float8E4M3, RoundsToNearestTiesToEven) {
  EXPECT_EQ(float_to_f8e4m3_bits(1.0625f), 0x38);  // halfway 1 (even) .. 1.125
  EXPECT_EQ(float_to_f8e4m3_bits(next_up(1.0625f)), 0x39);
  EXPECT_EQ(float_to_f8e4m3_bits(1.1875f), 0x3A);  // halfway 1.125 .. 1.25 (even)
  EXPECT_EQ(float_to_f8e4m3_bits(1.9375f), 0x40);  // halfway 1.875 .. 2: carries to 2
  EXPECT_EQ(float_to_f8e4m3_bits(-1.1875f), 0xBA);
}

TEST(Float8E4M3, Subnormals) {
  const float smallest = std::ldexp(1.0f, -9);
  EXPECT_EQ(float_to_f8e4m3_bits(smallest), 0x01);
  EXPECT_EQ(f8e4m3_bits_to_float(0x01), smallest);
  EXPECT_EQ(f8e4m3_bits_to_float(0x81), -smallest);
  EXPECT_EQ(float_to_f8e4m3_bits(smallest / 2), 0x00);  // tie to even 0
  EXPECT_EQ(float_to_f8e4m3_bits(-smallest / 2), 0x80);
  EXPECT_EQ(float_to_f8e4m3_bits(next_up(smallest / 2)), 0x01);
  EXPECT_EQ(float_to_f8e4m3_bits(1.5f * smallest), 0x02);
  EXPECT_EQ(float_to_f8e4m3_bits(2.5f * smallest), 0x02);
  EXPECT_EQ(float_to_f8e4m3_bits(7 * smallest), 0x07);  // largest subnormal
  EXPECT_EQ(f8e4m3_bits_to_float(0x07), 7 * smallest);
  EXPECT_EQ(float_to_f8e4m3_bits(std::ldexp(1.0f, -6)), 0x08);  // smallest normal
  EXPECT_EQ(float_to_f8e4m3_bits(7.5f * smallest), 0x08);       // tie, 7 odd: up
  EXPECT_EQ(float_to_f8e4m3_bits(next_down(7.5f * smallest)), 0x07);
  EXPECT_EQ(float_to_f8e4m3_bits(f(0x00000001)), 0x00);
  EXPECT_EQ(float_to_f8e4m3_bits(f(0x80000001)), 0x80);
}

TEST(Float8E4M3, NaN) {
  EXPECT_EQ(float_to_f8e4m3_bits(f(0x7FC00000)), 0x7F);
  EXPECT_EQ(float_to_f8e4m3_bits(f(0xFFC00000)), 0xFF);
  EXPECT_EQ(float_to_f8e4m3_bits(f(0x7F800001)), 0x7F);
  EXPECT_TRUE(std::isnan(f8e4m3_bits_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(f8e4m3_bits_to_float(0xFF)));
  EXPECT_EQ(sign_bit(f8e4m3_bits_to_float(0x7F)), 0u);
  EXPECT_EQ(sign_bit(f8e4m3_bits_to_float(0xFF)), 1u);
}

// ---------------------------------------------------------------------------------------------
// f8 e5m2: bias 15, IEEE-like (inf 0x7C, NaN 0x7D-0x7F), max finite 57344 = 0x7B.

TEST(Float8E5M2, KnownValues) {
  EXPECT_EQ(float_to_f8e5m2_bits(1.0f), 0x3C);
  EXPECT_EQ(float_to_f8e5m2_bits(-1.0f), 0xBC);
  EXPECT_EQ(float_to_f8e5m2_bits(-0.0f), 0x80);
  EXPECT_EQ(float_to_f8e5m2_bits(kInf), 0x7C);
  EXPECT_EQ(float_to_f8e5m2_bits(-kInf), 0xFC);
  EXPECT_EQ(f8e5m2_bits_to_float(0x3C), 1.0f);
  EXPECT_EQ(f8e5m2_bits_to_float(0x7B), 57344.0f);
  EXPECT_EQ(f8e5m2_bits_to_float(0x7C), kInf);
  EXPECT_EQ(f8e5m2_bits_to_float(0xFC), -kInf);
  EXPECT_EQ(kF8E5M2Max, 57344.0f);
  for (uint8_t b : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}) {
    const float v = f8e5m2_bits_to_float(b);
    EXPECT_TRUE(std::isnan(v)) << int{b};
    EXPECT_EQ(sign_bit(v), b >> 7u) << int{b};
  }
}

TEST(Float8E5M2, OverflowBecomesInf) {
  EXPECT_EQ(float_to_f8e5m2_bits(57344.0f), 0x7B);
  EXPECT_EQ(float_to_f8e5m2_bits(61439.0f), 0x7B);
  EXPECT_EQ(float_to_f8e5m2_bits(next_down(61440.0f)), 0x7B);
  // 61440 is halfway between 57344 (mantissa 11, odd) and 65536: rounds up, to inf.
  EXPECT_EQ(float_to_f8e5m2_bits(61440.0f), 0x7C);
  EXPECT_EQ(float_to_f8e5m2_bits(-61440.0f), 0xFC);
  EXPECT_EQ(float_to_f8e5m2_bits(65536.0f), 0x7C);
  EXPECT_EQ(float_to_f8e5m2_bits(std::numeric_limits<float>::max()), 0x7C);
}

TEST(Float8E5M2, SaturateClampsToMaxFinite) {
  constexpr auto kSat = Saturate::kFinite;
  EXPECT_EQ(float_to_f8e5m2_bits(57344.0f, kSat), 0x7B);
  EXPECT_EQ(float_to_f8e5m2_bits(61440.0f, kSat), 0x7B);
  EXPECT_EQ(float_to_f8e5m2_bits(65536.0f, kSat), 0x7B);
  EXPECT_EQ(float_to_f8e5m2_bits(-1e20f, kSat), 0xFB);
  EXPECT_EQ(float_to_f8e5m2_bits(kInf, kSat), 0x7B);
  EXPECT_EQ(float_to_f8e5m2_bits(-kInf, kSat), 0xFB);
  EXPECT_EQ(float_to_f8e5m2_bits(f(0x7FC00000), kSat), 0x7F);
  EXPECT_EQ(float_to_f8e5m2_bits(f(0xFFC00000), kSat), 0xFF);
  EXPECT_EQ(float_to_f8e5m2_bits(1.125f, kSat), 0x3C);
}

TEST(Float8E5M2, RoundsToNearestTiesToEven) {
  EXPECT_EQ(float_to_f8e5m2_bits(1.125f), 0x3C);  // halfway 1 (even) .. 1.25
  EXPECT_EQ(float_to_f8e5m2_bits(next_up(1.125f)), 0x3D);
  EXPECT_EQ(float_to_f8e5m2_bits(1.375f), 0x3E);  // halfway 1.25 .. 1.5 (even)
  EXPECT_EQ(float_to_f8e5m2_bits(1.875f), 0x40);  // carries to 2
}

TEST(Float8E5M2, Subnormals) {
  const float smallest = std::ldexp(1.0f, -16);
  EXPECT_EQ(float_to_f8e5m2_bits(smallest), 0x01);
  EXPECT_EQ(f8e5m2_bits_to_float(0x01), smallest);
  EXPECT_EQ(float_to_f8e5m2_bits(smallest / 2), 0x00);
  EXPECT_EQ(float_to_f8e5m2_bits(-smallest / 2), 0x80);
  EXPECT_EQ(float_to_f8e5m2_bits(next_up(smallest / 2)), 0x01);
  EXPECT_EQ(float_to_f8e5m2_bits(1.5f * smallest), 0x02);
  EXPECT_EQ(float_to_f8e5m2_bits(3 * smallest), 0x03);     // largest subnormal
  EXPECT_EQ(float_to_f8e5m2_bits(3.5f * smallest), 0x04);  // tie, 3 odd: up to min normal
  EXPECT_EQ(float_to_f8e5m2_bits(std::ldexp(1.0f, -14)), 0x04);
}

TEST(Float8E5M2, NaNKeepsItsSign) {
  EXPECT_EQ(float_to_f8e5m2_bits(f(0x7FC00000)), 0x7F);
  EXPECT_EQ(float_to_f8e5m2_bits(f(0xFFC00000)), 0xFF);
  EXPECT_EQ(float_to_f8e5m2_bits(f(0x7F800001)), 0x7F);
}

// ---------------------------------------------------------------------------------------------
// Exhaustive checks over the 256 patterns of each f8 format.

struct F8Format {
  const char* name;
  uint8_t (*encode)(float, Saturate);
  float (*decode)(uint8_t);
  bool (*is_nan)(uint8_t);
  uint8_t nan_pattern;       // what a NaN encodes to (positive)
  uint8_t overflow_slot;     // the pattern past max finite: NaN (e4m3) or inf (e5m2)
  float overflow_value;      // where that pattern would sit if the format went on
  uint8_t overflow_result;   // what a too-large value encodes to: 448 (e4m3) or inf (e5m2)
  uint8_t saturated_result;  // the same with Saturate::kFinite: max finite
};

const F8Format kE4M3{"e4m3",
                     float_to_f8e4m3_bits,
                     f8e4m3_bits_to_float,
                     [](uint8_t b) { return (b & 0x7F) == 0x7F; },
                     0x7F,
                     0x7F,
                     480.0f,
                     0x7E,
                     0x7E};
const F8Format kE5M2{"e5m2",
                     float_to_f8e5m2_bits,
                     f8e5m2_bits_to_float,
                     [](uint8_t b) { return (b & 0x7F) > 0x7C; },
                     0x7F,
                     0x7C,
                     65536.0f,
                     0x7C,
                     0x7B};

class Float8Exhaustive : public ::testing::TestWithParam<F8Format> {};

TEST_P(Float8Exhaustive, EveryBitPatternRoundTrips) {
  const F8Format& fmt = GetParam();
  for (int b = 0; b < 256; ++b) {
    const auto bits = static_cast<uint8_t>(b);
    const float v = fmt.decode(bits);
    ASSERT_EQ(std::isnan(v), fmt.is_nan(bits)) << fmt.name << " " << b;
    EXPECT_EQ(sign_bit(v), static_cast<uint32_t>(b >> 7)) << fmt.name << " " << b;
    const uint8_t expected = fmt.is_nan(bits) ? (bits & 0x80) | fmt.nan_pattern : bits;
    EXPECT_EQ(fmt.encode(v, Saturate::kNone), expected) << fmt.name << " " << b;
    // Saturation only changes what would overflow (e5m2's inf); NaN stays NaN.
    const bool is_inf = std::isinf(v);
    EXPECT_EQ(fmt.encode(v, Saturate::kFinite),
              is_inf ? (bits & 0x80) | fmt.saturated_result : expected)
        << fmt.name << " " << b;
  }
}

TEST_P(Float8Exhaustive, DecodedValuesIncreaseWithTheBitPattern) {
  const F8Format& fmt = GetParam();
  float previous = -1;
  for (int b = 0; b < 128; ++b) {
    const float v = fmt.decode(static_cast<uint8_t>(b));
    if (std::isnan(v)) continue;
    EXPECT_GT(v, previous) << fmt.name << " " << b;
    EXPECT_EQ(fmt.decode(static_cast<uint8_t>(b | 0x80)), -v) << fmt.name << " " << b;
    previous = v;
  }
}

// Brute force: the nearest of the 256 values, ties to the even pattern. The pattern past max
// finite takes part as if it were the next value of the format (480 for e4m3, 65536 for e5m2),
// which is what makes 464 tie down to 448 (e4m3) and 61440 tie up to inf (e5m2); what lands on
// it becomes the format's overflow result.
TEST_P(Float8Exhaustive, EncodingPicksTheNearestValue) {
  const F8Format& fmt = GetParam();
  std::vector<std::pair<double, int>> candidates;  // positive values and their patterns
  for (int b = 0; b < 128; ++b) {
    const float v = fmt.decode(static_cast<uint8_t>(b));
    if (b == fmt.overflow_slot) {
      candidates.emplace_back(fmt.overflow_value, b);
    } else if (std::isfinite(v)) {
      candidates.emplace_back(v, b);
    }
  }
  ASSERT_EQ(candidates.back().second, fmt.overflow_slot);

  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> log2_magnitude(-20.0f, 18.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::exp2(log2_magnitude(rng)) * (i % 2 ? -1.0f : 1.0f);
    const double ax = std::fabs(static_cast<double>(x));
    int expected = 0;
    double best = ax;
    for (const auto& [value, pattern] : candidates) {
      const double d = std::fabs(value - ax);
      if (d < best || (d == best && (pattern & 1) == 0)) {
        best = d;
        expected = pattern;
      }
    }
    if (ax > fmt.overflow_value) expected = fmt.overflow_slot;
    const bool overflows = expected == fmt.overflow_slot;
    const int unsaturated = overflows ? fmt.overflow_result : expected;
    const int saturated = overflows ? fmt.saturated_result : expected;
    const int sign = x < 0 ? 0x80 : 0;
    ASSERT_EQ(fmt.encode(x, Saturate::kNone), unsaturated | sign) << fmt.name << " x=" << x;
    ASSERT_EQ(fmt.encode(x, Saturate::kFinite), saturated | sign) << fmt.name << " x=" << x;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Float8Exhaustive, ::testing::Values(kE4M3, kE5M2),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace asynctp
