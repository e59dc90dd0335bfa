// Element types: DType, their sizes and names, and the rank limit of a tensor. Standard headers
// only (C++17), so nvcc compiles it into the kernels too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace asynctp {

inline constexpr int kMaxDims = 8;

// The float dtypes the ops compute with: f32, bf16, f16, and float8 e4m3fn / e5m2 (PyTorch's
// float8_e4m3fn and float8_e5m2). Then int64, uint64 and bool (PyTorch's), which only the graph
// executor's host kernels hold (comparison masks, `where` conditions, RNG seeds and offsets of
// attention ops); no op, GEMM, collective or C ABI call takes them.
enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kF8E5M2, kI64, kU64, kBool };

inline constexpr DType kFloatDTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3,
                                         DType::kF8E5M2};

constexpr size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kBool:
      return 1;
    case DType::kI64:
    case DType::kU64:
      return 8;
  }
  return 0;
}

constexpr bool is_floating_point(DType dtype) {
  return dtype != DType::kI64 && dtype != DType::kU64 && dtype != DType::kBool;
}

constexpr bool is_float8(DType dtype) {
  return dtype == DType::kF8E4M3 || dtype == DType::kF8E5M2;
}

// Short name used in messages and on the command line: f32, bf16, f16, f8e4m3, f8e5m2, i64, u64,
// bool. Inline: the kernels' checks name dtypes too (kernels/native/validate.h).
constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kF8E4M3:
      return "f8e4m3";
    case DType::kF8E5M2:
      return "f8e5m2";
    case DType::kI64:
      return "i64";
    case DType::kU64:
      return "u64";
    case DType::kBool:
      return "bool";
  }
  return "unknown";
}
// PyTorch's name: float32, bfloat16, float16, float8_e4m3fn, float8_e5m2, int64, uint64,
// bool.
std::string_view torch_dtype_name(DType dtype);
// A float dtype (the command line's --dtype): accepts both spellings (and "float", "half");
// throws asynctp::Error naming the text otherwise.
DType parse_dtype(std::string_view text);

}  // namespace asynctp
