// N-d iteration for the CPU kernels: walks every position of a shape, handing out the element
// offset of each of several strided tensors. The innermost dim is left to the caller's loop so
// that the common contiguous case runs as a tight inner loop.
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

}  // namespace asynctp::cpu
