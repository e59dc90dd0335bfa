// What the native GEMM cannot run: the contract's preconditions (params.h), as plain C++ so that
// every implementation of the contract checks the same. Each answer names the bad argument and
// its value; "" where the params are usable.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "kernels/native/schedule.h"

namespace asynctp::kernels {

namespace validate_detail {
// One value a reason is about: a number, or text (a dtype's name, whether a pointer is set).
struct Value {
  const char* name;
  int64_t number;
  const char* text = nullptr;
};

// "reason; got name = value, ..."; the success path never calls it, so it allocates nothing.
inline std::string why(const char* reason, std::initializer_list<Value> values = {}) {
  std::string out = reason;
  const char* sep = "; got ";
  for (const Value& v : values) {
    out += sep;
    out += v.name;
    out += " = ";
    out += v.text != nullptr ? std::string(v.text) : std::to_string(v.number);
    sep = ", ";
  }
  return out;
}

inline Value dtype_value(const char* name, DType dtype) {
  return {name, 0, dtype_name(dtype).data()};
}

// Whether a pointer argument is given: "set" or "null".
inline Value set_value(const char* name, const void* ptr) {
  return {name, 0, ptr != nullptr ? "set" : "null"};
}

// A pointer's offset from the last `bytes` boundary (0: aligned).
inline int64_t offset(const void* ptr, uintptr_t bytes) {
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(ptr) % bytes);
}
}  // namespace validate_detail

// Why the reduce-scatter epilogue's arguments are unusable, or "".
inline std::string sum_unsupported(const NativeGemmParams& a) {
  using validate_detail::offset;
  using validate_detail::why;
  const int64_t rows = chunk_rows_of(a);
  if (rows % kBM != 0)
    return why("the reduce-scatter epilogue needs chunk_rows % 128 == 0", {{"chunk_rows", rows}});
  if (a.sum_chunk < 0 || (a.sum_chunk + 1) * rows > a.m)
    return why("sum_chunk is out of range",
               {{"sum_chunk", a.sum_chunk}, {"chunk_rows", rows}, {"m", a.m}});
  if (a.sum_count < 1 || a.sum_count > 64)
    return why("sum_count is out of range (1 to 64)", {{"sum_count", a.sum_count}});
  if (a.sum_self < 0 || a.sum_self >= a.sum_count)
    return why("sum_self is out of range", {{"sum_self", a.sum_self}, {"sum_count", a.sum_count}});
  if (a.sum_count > 1 && (a.sum_parts == nullptr || a.sum_flags == nullptr))
    return why("the reduce-scatter epilogue needs its parts and their flags",
               {{"sum_count", a.sum_count},
                validate_detail::set_value("sum_parts", a.sum_parts),
                validate_detail::set_value("sum_flags", a.sum_flags)});
  if (a.sum_out == nullptr) return why("the reduce-scatter epilogue needs an output");
  if (a.n % 2 != 0) return why("the reduce-scatter epilogue needs an even n", {{"n", a.n}});
  if (a.sum_count > 1 && a.timeout_ns == 0) return why("waiting for the parts needs a timeout");
  const int64_t q = sum_rows_of(a);
  if (q % kBM != 0 || q > rows)
    return why("sum_rows is not a multiple of 128 up to chunk_rows",
               {{"sum_rows", q}, {"chunk_rows", rows}});
  if (a.sum_cols < 0 || a.sum_cols % kBN != 0)
    return why("sum_cols is not a multiple of 256", {{"sum_cols", a.sum_cols}});
  if (a.sum_count > 1 && a.sum_flag_stride < a.sum_count &&
      (rows + q - 1) / q * col_pieces(a, a.sum_cols) > 1)
    return why("sum_flag_stride is smaller than sum_count (pieces' flags would overlap)",
               {{"sum_flag_stride", a.sum_flag_stride}, {"sum_count", a.sum_count}});
  if (a.c_dtype == DType::kF32)
    return why("the reduce-scatter epilogue needs a 16-bit C",
               {validate_detail::dtype_value("c", a.c_dtype)});
  if (offset(a.sum_out, 4) != 0 || a.sum_ldo % 2 != 0 || a.sum_ldo < a.n)
    return why(
        "the reduced output is not aligned to two elements or its row stride is odd or "
        "short",
        {{"sum_out % 4", offset(a.sum_out, 4)}, {"sum_ldo", a.sum_ldo}, {"n", a.n}});
  // The parts are TMA-loaded (a 3-D map: column, chunk row, rank).
  if (a.sum_count > 1 && (offset(a.sum_parts, 16) != 0 || a.sum_ld % 8 != 0 || a.sum_ld < a.n ||
                          a.sum_part_stride % 8 != 0 || a.sum_part_stride < rows * a.sum_ld)) {
    return why(
        "the parts are not 16-byte aligned, or their row stride or part stride is not a "
        "multiple of 16 bytes or is short (TMA)",
        {{"sum_parts % 16", offset(a.sum_parts, 16)},
         {"sum_ld", a.sum_ld},
         {"sum_part_stride", a.sum_part_stride},
         {"n", a.n},
         {"chunk_rows", rows}});
  }
  return "";
}

// Why the kernel's own pushes (push_chunks > 0) are unusable, or "".
inline std::string push_unsupported(const NativeGemmParams& a) {
  using validate_detail::offset;
  using validate_detail::why;
  const int64_t rows = chunk_rows_of(a);
  if (a.push_chunks > NativeGemmParams::kMaxPushChunks || a.push_chunks != num_chunks(a))
    return why("push_chunks is not the number of chunks, or is over kMaxPushChunks",
               {{"push_chunks", a.push_chunks},
                {"chunks", num_chunks(a)},
                {"kMaxPushChunks", NativeGemmParams::kMaxPushChunks}});
  // Every push map spans a whole chunk of rows.
  if (a.m % rows != 0)
    return why("the kernel's pushes need whole chunks (m % chunk_rows == 0)",
               {{"m", a.m}, {"chunk_rows", rows}});
  if (a.done == nullptr || a.sum_chunk < 0)
    return why("the kernel's pushes need done counters and the reduce-scatter epilogue",
               {validate_detail::set_value("done", a.done), {"sum_chunk", a.sum_chunk}});
  // A completed counter raises the owner's flag of the same piece: the done counters' pieces
  // are the sum flags'.
  if (done_rows_of(a) != sum_rows_of(a) || piece_cols(a, a.done_cols) != piece_cols(a, a.sum_cols))
    return why("the kernel's pushes need the done counters' pieces to be the sum flags'",
               {{"done_rows", done_rows_of(a)},
                {"sum_rows", sum_rows_of(a)},
                {"done_cols", piece_cols(a, a.done_cols)},
                {"sum_cols", piece_cols(a, a.sum_cols)}});
  // The pushed rows go through the staging area and TMA stores, as C's would.
  if (!uses_tma_store(a))
    return why("the kernel's pushes need the TMA store (a 16-bit C TMA can store)",
               {validate_detail::dtype_value("c", a.c_dtype), {"ldc", a.ldc}});
  if (a.push_ld < a.n || a.push_ld % 8 != 0)
    return why("the pushed rows' row stride is shorter than n or not a multiple of 16 bytes",
               {{"push_ld", a.push_ld}, {"n", a.n}});
  const int64_t pieces = rows / done_rows_of(a) * col_pieces(a, a.done_cols);
  if (a.push_flag_stride < 0 || (pieces > 1 && a.push_flag_stride == 0))
    return why("push_flag_stride is negative, or 0 with several pieces a chunk",
               {{"push_flag_stride", a.push_flag_stride}, {"pieces a chunk", pieces}});
  for (int c = 0; c < a.push_chunks; ++c) {
    if (c == a.sum_chunk) continue;
    if (a.push_c[c] == nullptr || a.push_flags[c] == nullptr || offset(a.push_c[c], 16) != 0)
      return why("a pushed chunk's destination or flags are missing, or it is not 16-byte aligned",
                 {{"chunk", c},
                  validate_detail::set_value("push_c", a.push_c[c]),
                  validate_detail::set_value("push_flags", a.push_flags[c]),
                  {"push_c % 16", offset(a.push_c[c], 16)},
                  {"chunk_rows", rows}});
  }
  return "";
}

// Why the SwiGLU epilogue's arguments are unusable, or "".
inline std::string swiglu_unsupported(const NativeGemmParams& a) {
  using validate_detail::offset;
  using validate_detail::why;
  if (a.done != nullptr || a.sum_chunk >= 0)
    return why("the SwiGLU epilogue does not count done rows or reduce (MM+RS only)");
  // Pairs of columns are stored together, the up half's from column N on.
  if (a.n % 2 != 0) return why("the SwiGLU epilogue needs an even N", {{"n", a.n}});
  // A row-major B's up half is TMA-loaded from column N on: a box must start on a 16-byte
  // boundary (an unaligned start is an illegal instruction on the GPU).
  if (!a.b_k_major && a.n % 8 != 0)
    return why(
        "the SwiGLU epilogue with a row-major B needs N % 8 == 0 (TMA loads the up half "
        "from column N, a 16-byte boundary)",
        {{"n", a.n}});
  if (2 * a.n > (1ll << 31) - kBN)
    return why("the SwiGLU epilogue's 2N is over 2^31", {{"n", a.n}});
  if (a.pre != nullptr) {
    if (a.pre_dtype != DType::kF32 && a.pre_dtype != DType::kBF16 && a.pre_dtype != DType::kF16)
      return why("the pre-activation output is not f32, bf16 or f16",
                 {validate_detail::dtype_value("pre", a.pre_dtype)});
    if (a.pre_ld < 2 * a.n || a.pre_ld % 2 != 0 || offset(a.pre, 8) != 0)
      return why(
          "the pre-activation output's row stride is odd or shorter than 2N, or it is not "
          "8-byte aligned",
          {{"pre_ld", a.pre_ld}, {"n", a.n}, {"pre % 8", offset(a.pre, 8)}});
  }
  return "";
}

// Why the scaled (float8) GEMM's arguments are unusable, or "".
inline std::string float8_unsupported(const NativeGemmParams& a) {
  using validate_detail::offset;
  using validate_detail::why;
  // wgmma reads 8-bit operands K-major only.
  if (!a.b_k_major)
    return why("float8 inputs need a k-major B ([N, K] row-major, a transposed weight)");
  if (a.swiglu) return why("the SwiGLU epilogue takes bf16 or f16 inputs, not float8");
  if ((a.a_scale == nullptr && a.own_a_scale != nullptr) ||
      (a.a_scale != nullptr && a.a_scale_stride != 0 && a.a_scale_stride != 1) ||
      (a.b_scale != nullptr && a.b_scale_stride != 0 && a.b_scale_stride != 1))
    return why(
        "a scale's stride is not 0 (tensor-wise) or 1 (row-wise), or own_a_scale comes "
        "without a_scale",
        {{"a_scale_stride", a.a_scale_stride},
         {"b_scale_stride", a.b_scale_stride},
         validate_detail::set_value("a_scale", a.a_scale),
         validate_detail::set_value("own_a_scale", a.own_a_scale)});
  if (a.own_a_scale != nullptr && a.own_a == nullptr)
    return why("own_a_scale needs own_a (the own chunk's rows)");
  if (offset(a.a_scale, 4) != 0 || offset(a.own_a_scale, 4) != 0 || offset(a.b_scale, 4) != 0)
    return why("a scale is not 4-byte aligned", {{"a_scale % 4", offset(a.a_scale, 4)},
                                                 {"own_a_scale % 4", offset(a.own_a_scale, 4)},
                                                 {"b_scale % 4", offset(a.b_scale, 4)}});
  return "";
}

// Why the native GEMM cannot run these params (dtype, alignment, strides, pieces), or "".
inline std::string native_gemm_unsupported(const NativeGemmParams& a) {
  using validate_detail::dtype_value;
  using validate_detail::offset;
  using validate_detail::why;
  if (a.in_dtype != DType::kBF16 && a.in_dtype != DType::kF16 && a.in_dtype != DType::kF8E4M3)
    return why("inputs are not bf16, f16 or float8 e4m3", {dtype_value("inputs", a.in_dtype)});
  if (float8_inputs(a)) {
    if (std::string w = float8_unsupported(a); !w.empty()) return w;
  } else if (a.a_scale != nullptr || a.own_a_scale != nullptr || a.b_scale != nullptr) {
    return why("scales are for float8 inputs; bf16 and f16 take none",
               {dtype_value("inputs", a.in_dtype)});
  }
  // TMA's 16-byte rules, in elements of A's and B's dtype.
  const int64_t align = float8_inputs(a) ? 16 : 8;
  if (a.c_dtype != DType::kF32 && a.c_dtype != DType::kBF16 && a.c_dtype != DType::kF16)
    return why("the output is not f32, bf16 or f16", {dtype_value("c", a.c_dtype)});
  if (a.m <= 0 || a.n <= 0 || a.k <= 0)
    return why("an empty problem", {{"m", a.m}, {"n", a.n}, {"k", a.k}});
  if (a.m > (1ll << 31) - kBM || a.n > (1ll << 31) - kBN || a.k > (1ll << 31))
    return why("a dimension over 2^31", {{"m", a.m}, {"n", a.n}, {"k", a.k}});
  if (offset(a.a, 16) != 0 || offset(a.b, 16) != 0)
    return why("A or B is not 16-byte aligned (TMA)",
               {{"a % 16", offset(a.a, 16)}, {"b % 16", offset(a.b, 16)}});
  if (a.lda % align != 0 || a.ldb % align != 0)
    return why("a row stride of A or B is not a multiple of 16 bytes (TMA)",
               {{"lda", a.lda}, {"ldb", a.ldb}, {"elements per 16 bytes", align}});
  if (a.lda < a.k || a.ldb < (a.b_k_major ? a.k : b_cols(a)))
    return why(
        "a row stride shorter than its row",
        {{"lda", a.lda}, {"ldb", a.ldb}, {"k", a.k}, {"b's row", a.b_k_major ? a.k : b_cols(a)}});
  if (a.ldc < a.n || a.ldc % 2 != 0 || offset(a.c, 8) != 0)
    return why("C's row stride is odd or shorter than n, or C is not 8-byte aligned",
               {{"ldc", a.ldc}, {"n", a.n}, {"c % 8", offset(a.c, 8)}});
  const int64_t rows = chunk_rows_of(a);
  if (rows <= 0 || (a.m + rows - 1) / rows > 1 << 20)
    return why("chunk_rows is out of range (at most 2^20 chunks)",
               {{"chunk_rows", a.chunk_rows}, {"m", a.m}});
  if (a.first_chunk < 0 || a.first_chunk * rows >= a.m)
    return why("first_chunk is out of range",
               {{"first_chunk", a.first_chunk}, {"chunk_rows", rows}, {"m", a.m}});
  if (a.done != nullptr && rows % kBM != 0)
    return why("publishing per-chunk completion needs chunk_rows % 128 == 0",
               {{"chunk_rows", rows}});
  if (a.done != nullptr &&
      (a.done_rows < 0 || done_rows_of(a) % kBM != 0 || rows % done_rows_of(a) != 0))
    return why("done_rows is not a multiple of 128 that divides chunk_rows",
               {{"done_rows", a.done_rows}, {"chunk_rows", rows}});
  if (a.done != nullptr && (a.done_cols < 0 || a.done_cols % kBN != 0))
    return why("done_cols is not a multiple of 256", {{"done_cols", a.done_cols}});
  if (a.sum_chunk >= 0) {
    if (std::string w = sum_unsupported(a); !w.empty()) return w;
  }
  if (a.swiglu) {
    if (std::string w = swiglu_unsupported(a); !w.empty()) return w;
  }
  if (a.push_chunks < 0) return why("push_chunks is negative", {{"push_chunks", a.push_chunks}});
  if (a.push_chunks > 0) {
    if (std::string w = push_unsupported(a); !w.empty()) return w;
  }
  if (a.ready != nullptr && a.timeout_ns == 0) return why("waiting for chunks needs a timeout");
  if (a.ready_rows < 0 || a.ready_rows > rows)
    return why("ready_rows is out of range (0 to chunk_rows)",
               {{"ready_rows", a.ready_rows}, {"chunk_rows", rows}});
  if (ready_rows_of(a) < rows && a.ready_stride < (a.m + rows - 1) / rows)
    return why("ready_stride is smaller than the number of chunks (pieces' flags would overlap)",
               {{"ready_stride", a.ready_stride}, {"chunks", (a.m + rows - 1) / rows}});
  if (a.own_a != nullptr) {
    if (a.own_chunk < 0 || a.own_chunk * rows >= a.m)
      return why("own_chunk is out of range",
                 {{"own_chunk", a.own_chunk}, {"chunk_rows", rows}, {"m", a.m}});
    if (offset(a.own_a, 16) != 0 || a.own_lda % align != 0 || a.own_lda < a.k) {
      return why(
          "the own chunk's A is not 16-byte aligned or its row stride is not a multiple "
          "of 16 bytes or is shorter than K (TMA)",
          {{"own_a % 16", offset(a.own_a, 16)}, {"own_lda", a.own_lda}, {"k", a.k}});
    }
  }
  if (a.a_out != nullptr &&
      (offset(a.a_out, 16) != 0 || a.a_out_ld % align != 0 || a.a_out_ld < a.k)) {
    return why(
        "the copy of A is not 16-byte aligned, or its row stride is not a multiple of 16 "
        "bytes or is shorter than K (TMA)",
        {{"a_out % 16", offset(a.a_out, 16)}, {"a_out_ld", a.a_out_ld}, {"k", a.k}});
  }
  if (a.reserve_sms < 0 || a.reserve_sms > 8)
    return why("reserve_sms is out of range (0 to 8)", {{"reserve_sms", a.reserve_sms}});
  return "";
}

}  // namespace asynctp::kernels
