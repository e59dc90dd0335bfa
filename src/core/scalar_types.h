// The smallest vocabulary shared with device code: element types and the rank limit. No library
// headers here, so nvcc can compile it into the kernels.
#pragma once

#include <cstddef>
#include <cstdint>

namespace asynctp {

inline constexpr int kMaxDims = 8;

enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kF8E5M2 };

constexpr size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return 1;
  }
  return 0;
}

constexpr bool is_float8(DType dtype) {
  return dtype == DType::kF8E4M3 || dtype == DType::kF8E5M2;
}

}  // namespace asynctp
