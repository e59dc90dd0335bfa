// asynctp's dtype conversions against PyTorch's own, bit for bit. The tables in
// dtype_golden_data.h were recorded from torch (golden/generate_dtype_golden.py); this test
// does not need torch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <tuple>

#include "core/dtype.h"
#include "dtype_golden_data.h"

namespace asynctp {
namespace {

uint64_t fnv1a(uint64_t h, uint32_t word) {
  for (int i = 0; i < 4; ++i) {
    h ^= (word >> (8 * i)) & 0xFFu;
    h *= 0x100000001B3ull;
  }
  return h;
}

// NaN payloads are where torch disagrees with itself, so only they are compared loosely: its
// vectorised CPU bf16 cast gives 0xFFFF for every NaN (c10::BFloat16 gives 0x7FC0, CUDA
// 0x7FFF), its f16 cast keeps payload bits as F16C does (CUDA gives 0x7FFF), and it decodes the
// e4m3fn NaN to 0x7FF00000. Where torch gives a NaN, asynctp must give its one canonical NaN
// (with torch's sign where torch keeps the sign); every other value must match bit for bit.
bool f32_is_nan(uint32_t bits) {
  return (bits & 0x7FFFFFFFu) > 0x7F800000u;
}

// Decoded NaNs: NaN, same sign, quiet.
bool same_decoded_nan(uint32_t ours, uint32_t torch) {
  return f32_is_nan(ours) && (ours >> 31) == (torch >> 31) && (ours & 0x00400000u) != 0;
}

TEST(DTypeGolden, Float8DecodingMatchesTorch) {
  for (int b = 0; b < 256; ++b) {
    const auto bits = static_cast<uint8_t>(b);
    for (const auto& [name, ours, torch] :
         {std::tuple{"e4m3", float_to_bits(f8e4m3_bits_to_float(bits)), golden::kE4M3ToF32[b]},
          std::tuple{"e5m2", float_to_bits(f8e5m2_bits_to_float(bits)), golden::kE5M2ToF32[b]}}) {
      if (f32_is_nan(torch)) {
        EXPECT_TRUE(same_decoded_nan(ours, torch))
            << name << " 0x" << std::hex << b << ": asynctp 0x" << ours << ", torch 0x" << torch;
      } else {
        EXPECT_EQ(ours, torch) << name << " 0x" << std::hex << b << " (torch "
                               << golden::kTorchVersion << ")";
      }
    }
  }
}

TEST(DTypeGolden, SixteenBitDecodingMatchesTorch) {
  uint64_t f16_hash = 0xCBF29CE484222325ull;
  uint64_t bf16_hash = 0xCBF29CE484222325ull;
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    f16_hash = fnv1a(f16_hash, float_to_bits(f16_bits_to_float(static_cast<uint16_t>(b))));
    bf16_hash = fnv1a(bf16_hash, float_to_bits(bf16_bits_to_float(static_cast<uint16_t>(b))));
  }
  // Bit for bit, NaN payloads included (both decode NaNs as F16C does). A mismatch means some
  // pattern decodes differently; dtype_test.cpp's exhaustive tests say which.
  EXPECT_EQ(f16_hash, golden::kF16ToF32Hash);
  EXPECT_EQ(bf16_hash, golden::kBF16ToF32Hash);
}

// Every case, every cast; all mismatches of a cast are reported (up to a limit) so that a
// rounding bug shows its pattern.
TEST(DTypeGolden, EncodingMatchesTorch) {
  int mismatches = 0;
  auto report = [&](const char* cast, uint32_t input, uint32_t ours, uint32_t torch) {
    if (++mismatches <= 40) {
      ADD_FAILURE() << cast << " of f32 0x" << std::hex << input << " (" << bits_to_float(input)
                    << "): asynctp 0x" << ours << ", torch 0x" << torch;
    }
  };
  auto check = [&](const char* cast, uint32_t input, uint32_t ours, uint32_t torch) {
    if (ours != torch) report(cast, input, ours, torch);
  };
  for (const golden::EncodeCase& c : golden::kEncodeCases) {
    const float x = bits_to_float(c.f32);
    // bf16: torch's 0xFFFF carries no sign information; asynctp gives 0x7FC0 for every NaN.
    const bool bf16_nan = (c.bf16 & 0x7FFF) > 0x7F80;
    check("bf16", c.f32, float_to_bf16_bits(x), bf16_nan ? 0x7FC0 : c.bf16);
    // f16: torch keeps payload bits; asynctp keeps only the sign.
    const bool f16_nan = (c.f16 & 0x7FFF) > 0x7C00;
    check("f16", c.f32, float_to_f16_bits(x), f16_nan ? (c.f16 & 0x8000) | 0x7E00 : c.f16);
    // f8: one NaN per sign in e4m3fn, and torch's e5m2 cast gives 0x7F/0xFF: exact everywhere.
    check("e4m3", c.f32, float_to_f8e4m3_bits(x), c.e4m3);
    check("e5m2", c.f32, float_to_f8e5m2_bits(x), c.e5m2);
    check("e4m3 saturated", c.f32, float_to_f8e4m3_bits(x, Saturate::kFinite), c.e4m3_saturated);
    check("e5m2 saturated", c.f32, float_to_f8e5m2_bits(x, Saturate::kFinite), c.e5m2_saturated);
    // The comparison above must not hide a NaN where torch gave a number, or the reverse.
    EXPECT_EQ(bf16_nan, std::isnan(x)) << std::hex << c.f32;
    EXPECT_EQ(f16_nan, std::isnan(x)) << std::hex << c.f32;
  }
  EXPECT_EQ(mismatches, 0) << "casts that differ from torch " << golden::kTorchVersion;
  EXPECT_GT(std::size(golden::kEncodeCases), 1000u);
}

}  // namespace
}  // namespace asynctp
