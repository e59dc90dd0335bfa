// What the native GEMM cannot run: the contract's preconditions (params.h), as plain C++ so that
// every implementation of the contract checks the same. Each answer names the bad argument.
#pragma once

#include <cstdint>

#include "kernels/native/schedule.h"

namespace asynctp::kernels {

// Why the reduce-scatter epilogue's arguments are unusable, or nullptr.
inline const char* sum_unsupported(const NativeGemmParams& a) {
  const int64_t rows = chunk_rows_of(a);
  if (rows % kBM != 0) return "the reduce-scatter epilogue needs chunk_rows % 128 == 0";
  if (a.sum_chunk < 0 || (a.sum_chunk + 1) * rows > a.m) return "sum_chunk is out of range";
  if (a.sum_count < 1 || a.sum_count > 64) return "sum_count is out of range (1 to 64)";
  if (a.sum_self < 0 || a.sum_self >= a.sum_count) return "sum_self is out of range";
  if (a.sum_count > 1 && (a.sum_parts == nullptr || a.sum_flags == nullptr))
    return "the reduce-scatter epilogue needs its parts and their flags";
  if (a.sum_out == nullptr) return "the reduce-scatter epilogue needs an output";
  if (a.n % 2 != 0) return "the reduce-scatter epilogue needs an even n";
  if (a.sum_count > 1 && a.timeout_ns == 0) return "waiting for the parts needs a timeout";
  const int64_t q = sum_rows_of(a);
  if (q % kBM != 0 || q > rows) return "sum_rows is not a multiple of 128 up to chunk_rows";
  if (a.sum_cols < 0 || a.sum_cols % kBN != 0) return "sum_cols is not a multiple of 256";
  if (a.sum_count > 1 && a.sum_flag_stride < a.sum_count &&
      (rows + q - 1) / q * col_pieces(a, a.sum_cols) > 1)
    return "sum_flag_stride is smaller than sum_count (pieces' flags would overlap)";
  if (a.c_dtype == DType::kF32) return "the reduce-scatter epilogue needs a 16-bit C";
  const auto misaligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 4; };
  if (misaligned(a.sum_out) || a.sum_ldo % 2 != 0 || a.sum_ldo < a.n)
    return "the reduced output is not aligned to two elements or its row stride is odd or short";
  // The parts are TMA-loaded (a 3-D map: column, chunk row, rank).
  if (a.sum_count > 1 &&
      (reinterpret_cast<uintptr_t>(a.sum_parts) % 16 != 0 || a.sum_ld % 8 != 0 || a.sum_ld < a.n ||
       a.sum_part_stride % 8 != 0 || a.sum_part_stride < rows * a.sum_ld)) {
    return "the parts are not 16-byte aligned, or their row stride or part stride is not a "
           "multiple of 16 bytes or is short (TMA)";
  }
  return nullptr;
}

// Why the SwiGLU epilogue's arguments are unusable, or nullptr.
inline const char* swiglu_unsupported(const NativeGemmParams& a) {
  if (a.done != nullptr || a.sum_chunk >= 0)
    return "the SwiGLU epilogue does not count done rows or reduce (MM+RS only)";
  // Pairs of columns are stored together, the up half's from column N on.
  if (a.n % 2 != 0) return "the SwiGLU epilogue needs an even N";
  // A row-major B's up half is TMA-loaded from column N on: a box must start on a 16-byte
  // boundary (an unaligned start is an illegal instruction on the GPU).
  if (!a.b_k_major && a.n % 8 != 0)
    return "the SwiGLU epilogue with a row-major B needs N % 8 == 0 (TMA loads the up half from "
           "column N, a 16-byte boundary)";
  if (2 * a.n > (1ll << 31) - kBN) return "the SwiGLU epilogue's 2N is over 2^31";
  if (a.pre != nullptr) {
    if (a.pre_dtype != DType::kF32 && a.pre_dtype != DType::kBF16 && a.pre_dtype != DType::kF16)
      return "the pre-activation output is not f32, bf16 or f16";
    if (a.pre_ld < 2 * a.n || a.pre_ld % 2 != 0 || reinterpret_cast<uintptr_t>(a.pre) % 8 != 0)
      return "the pre-activation output's row stride is odd or shorter than 2N, or it is not "
             "8-byte aligned";
  }
  return nullptr;
}

// Why the scaled (float8) GEMM's arguments are unusable, or nullptr.
inline const char* float8_unsupported(const NativeGemmParams& a) {
  // wgmma reads 8-bit operands K-major only.
  if (!a.b_k_major) return "float8 inputs need a k-major B ([N, K] row-major, a transposed weight)";
  if (a.swiglu) return "the SwiGLU epilogue takes bf16 or f16 inputs, not float8";
  if ((a.a_scale == nullptr && a.own_a_scale != nullptr) ||
      (a.a_scale != nullptr && a.a_scale_stride != 0 && a.a_scale_stride != 1) ||
      (a.b_scale != nullptr && a.b_scale_stride != 0 && a.b_scale_stride != 1))
    return "a scale's stride is not 0 (tensor-wise) or 1 (row-wise), or own_a_scale comes "
           "without a_scale";
  if (a.own_a_scale != nullptr && a.own_a == nullptr)
    return "own_a_scale needs own_a (the own chunk's rows)";
  const auto misaligned = [](const float* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 4; };
  if (misaligned(a.a_scale) || misaligned(a.own_a_scale) || misaligned(a.b_scale))
    return "a scale is not 4-byte aligned";
  return nullptr;
}

// Why the native GEMM cannot run these params (dtype, alignment, strides, pieces), or nullptr.
inline const char* native_gemm_unsupported(const NativeGemmParams& a) {
  if (a.in_dtype != DType::kBF16 && a.in_dtype != DType::kF16 && a.in_dtype != DType::kF8E4M3)
    return "inputs are not bf16, f16 or float8 e4m3";
  if (float8_inputs(a)) {
    if (const char* why = float8_unsupported(a)) return why;
  } else if (a.a_scale != nullptr || a.own_a_scale != nullptr || a.b_scale != nullptr) {
    return "scales are for float8 inputs; bf16 and f16 take none";
  }
  // TMA's 16-byte rules, in elements of A's and B's dtype.
  const int64_t align = float8_inputs(a) ? 16 : 8;
  if (a.c_dtype != DType::kF32 && a.c_dtype != DType::kBF16 && a.c_dtype != DType::kF16) {
    return "the output is not f32, bf16 or f16";
  }
  if (a.m <= 0 || a.n <= 0 || a.k <= 0) return "an empty problem";
  if (a.m > (1ll << 31) - kBM || a.n > (1ll << 31) - kBN || a.k > (1ll << 31))
    return "a dimension over 2^31";
  const auto misaligned = [](const void* ptr, uintptr_t bytes) {
    return reinterpret_cast<uintptr_t>(ptr) % bytes != 0;
  };
  if (misaligned(a.a, 16) || misaligned(a.b, 16)) return "A or B is not 16-byte aligned (TMA)";
  if (a.lda % align != 0 || a.ldb % align != 0)
    return "a row stride of A or B is not a multiple of 16 bytes (TMA)";
  if (a.lda < a.k || a.ldb < (a.b_k_major ? a.k : b_cols(a)))
    return "a row stride shorter than its row";
  if (a.ldc < a.n || a.ldc % 2 != 0 || misaligned(a.c, 8))
    return "C's row stride is odd or C is not 8-byte aligned";
  const int64_t rows = chunk_rows_of(a);
  if (rows <= 0 || (a.m + rows - 1) / rows > 1 << 20) return "chunk_rows is out of range";
  if (a.first_chunk < 0 || a.first_chunk * rows >= a.m) return "first_chunk is out of range";
  if (a.done != nullptr && rows % kBM != 0)
    return "publishing per-chunk completion needs chunk_rows % 128 == 0";
  if (a.done != nullptr &&
      (a.done_rows < 0 || done_rows_of(a) % kBM != 0 || rows % done_rows_of(a) != 0))
    return "done_rows is not a multiple of 128 that divides chunk_rows";
  if (a.done != nullptr && (a.done_cols < 0 || a.done_cols % kBN != 0))
    return "done_cols is not a multiple of 256";
  if (a.sum_chunk >= 0) {
    if (const char* why = sum_unsupported(a)) return why;
  }
  if (a.swiglu) {
    if (const char* why = swiglu_unsupported(a)) return why;
  }
  if (a.ready != nullptr && a.timeout_ns == 0) return "waiting for chunks needs a timeout";
  if (a.ready_rows < 0 || a.ready_rows > rows)
    return "ready_rows is out of range (0 to chunk_rows)";
  if (ready_rows_of(a) < rows && a.ready_stride < (a.m + rows - 1) / rows)
    return "ready_stride is smaller than the number of chunks (pieces' flags would overlap)";
  if (a.own_a != nullptr) {
    if (a.own_chunk < 0 || a.own_chunk * rows >= a.m) return "own_chunk is out of range";
    if (misaligned(a.own_a, 16) || a.own_lda % align != 0 || a.own_lda < a.k) {
      return "the own chunk's A is not 16-byte aligned or its row stride is not a multiple of 16 "
             "bytes (TMA)";
    }
  }
  if (a.a_out != nullptr &&
      (misaligned(a.a_out, 16) || a.a_out_ld % align != 0 || a.a_out_ld < a.k)) {
    return "the copy of A is not 16-byte aligned, or its row stride is not a multiple of 16 bytes "
           "or is shorter than K (TMA)";
  }
  if (a.reserve_sms < 0 || a.reserve_sms > 8) return "reserve_sms is out of range (0 to 8)";
  return nullptr;
}

}  // namespace asynctp::kernels
