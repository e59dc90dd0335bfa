// The CPU kernels' loops: N-d iteration (every position of a shape, handing out the element
// offset of each of several strided tensors; the innermost dim is left to the caller's loop so
// that the common contiguous case runs as a tight inner loop), strided rows loaded as f32 and
// stored rounded once, and the one GEMM row kernel that every CPU GEMM (the reference and the
// native GEMM's emulation) accumulates with, so that they give the same f32 bits.
#pragma once

#include <array>
#include <cstdint>

#include <asynctp/dims.h>

#include "core/dtype.h"

namespace asynctp::cpu {

// Calls fn(offsets) for every index of shape[0..rank-1) (all dims but the last), where
// offsets[t] is the element offset of that row in tensor t. A 0-d shape gives one call.
template <size_t N, typename Fn>
void for_each_row(const Dims& shape, const std::array<const Dims*, N>& strides, Fn&& fn) {
  const int outer = shape.size() - 1;
  for (int d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return;
  }
  std::array<int64_t, kMaxDims> index{};
  std::array<int64_t, N> offsets{};
  while (true) {
    fn(offsets);
    int d = outer - 1;
    for (; d >= 0; --d) {
      ++index[d];
      for (size_t t = 0; t < N; ++t)
        offsets[t] += (*strides[t])[d];
      if (index[d] < shape[d]) break;
      for (size_t t = 0; t < N; ++t)
        offsets[t] -= (*strides[t])[d] * shape[d];
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

// Loads n elements of a strided row (from element `offset` of base, `stride` apart) as f32.
inline void load_row(DType dtype, const void* base, int64_t offset, int64_t stride, int64_t n,
                     float* out) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(base) + offset;
    for (int64_t j = 0; j < n; ++j)
      out[j] = to_float(p[j * stride]);
  });
}

// Stores n f32 values into a strided row, each rounded once to the dtype.
inline void store_row(DType dtype, void* base, int64_t offset, int64_t stride, int64_t n,
                      const float* in) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(base) + offset;
    for (int64_t j = 0; j < n; ++j)
      p[j * stride] = from_float<T>(in[j]);
  });
}

// acc[j] += a_row[kk] * b[kk * ldb + j] for j < n, in increasing kk: the order every CPU GEMM
// uses. Its callers are compiled without fused multiply-add contraction (device/CMakeLists.txt),
// so that each product is rounded before it is added, the same on every path and rank.
inline void accumulate_row(const float* a_row, int64_t k, const float* b, int64_t ldb, int64_t n,
                           float* acc) {
  for (int64_t kk = 0; kk < k; ++kk) {
    const float av = a_row[kk];
    const float* brow = b + kk * ldb;
    for (int64_t j = 0; j < n; ++j)
      acc[j] += av * brow[j];
  }
}

}  // namespace asynctp::cpu
