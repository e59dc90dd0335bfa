#include "core/dtype.h"

#include "core/float_bits.h"

#include <array>
#include <utility>

namespace asynctp {

std::string_view torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kF8E4M3:
      return "float8_e4m3fn";
    case DType::kF8E5M2:
      return "float8_e5m2";
    case DType::kI64:
      return "int64";
    case DType::kU64:
      return "uint64";
    case DType::kBool:
      return "bool";
  }
  return "unknown";
}

DType parse_dtype(std::string_view text) {
  static constexpr std::array<std::pair<std::string_view, DType>, 17> kNames{{
      {"f32", DType::kF32},
      {"float32", DType::kF32},
      {"float", DType::kF32},
      {"fp32", DType::kF32},
      {"bf16", DType::kBF16},
      {"bfloat16", DType::kBF16},
      {"f16", DType::kF16},
      {"float16", DType::kF16},
      {"half", DType::kF16},
      {"fp16", DType::kF16},
      {"f8e4m3", DType::kF8E4M3},
      {"e4m3", DType::kF8E4M3},
      {"float8_e4m3fn", DType::kF8E4M3},
      {"f8e4m3fn", DType::kF8E4M3},
      {"f8e5m2", DType::kF8E5M2},
      {"e5m2", DType::kF8E5M2},
      {"float8_e5m2", DType::kF8E5M2},
  }};
  for (const auto& [name, dtype] : kNames) {
    if (name == text) return dtype;
  }
  ASYNCTP_FAIL("unknown dtype '{}' (expected f32, bf16, f16, f8e4m3 or f8e5m2)", text);
}

uint16_t float_to_bf16_bits(float value) {
  return bits::float_to_bf16(value);
}
float bf16_bits_to_float(uint16_t b) {
  return bits::bf16_to_float(b);
}
uint16_t float_to_f16_bits(float value) {
  return bits::float_to_f16(value);
}
float f16_bits_to_float(uint16_t b) {
  return bits::f16_to_float(b);
}
uint8_t float_to_f8e4m3_bits(float value, Saturate saturate) {
  return bits::float_to_f8e4m3(value, saturate == Saturate::kFinite);
}
float f8e4m3_bits_to_float(uint8_t b) {
  return bits::f8e4m3_to_float(b);
}
uint8_t float_to_f8e5m2_bits(float value, Saturate saturate) {
  return bits::float_to_f8e5m2(value, saturate == Saturate::kFinite);
}
float f8e5m2_bits_to_float(uint8_t b) {
  return bits::f8e5m2_to_float(b);
}

}  // namespace asynctp
