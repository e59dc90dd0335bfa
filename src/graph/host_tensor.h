// Host tensors of the executor: a view that shares its storage, so that view ops (permute,
// reshape, split, getitem, expand) return views of the same memory exactly as PyTorch does, plus
// the f32 load/store helpers the host kernels are written with.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include <asynctp/tensor.h>
#include "core/buffer.h"
#include "core/dtype.h"

namespace asynctp::graph {

struct HostTensor {
  std::shared_ptr<Buffer> storage;
  Tensor t;

  bool defined() const { return t.defined(); }
  HostTensor view_as(Tensor view) const { return {storage, view}; }
};

// Whether `strides` lay out `shape` densely (a permutation of a contiguous layout, no gaps, no
// overlap): the only recorded strides the executor allocates with.
bool is_dense_layout(const Dims& shape, const Dims& strides);

// Uninitialised host memory of `shape`; laid out with `strides` when given and dense, else
// contiguous.
HostTensor host_empty(const Dims& shape, DType dtype, const std::optional<Dims>& strides = {});
// A contiguous copy (t itself when already contiguous).
HostTensor host_contiguous(const HostTensor& t);

// Element values in row-major (logical) order, as f32. With `shape`, t is broadcast to it first
// (PyTorch's rules: trailing dims aligned, size-1 dims repeat); throws when it does not broadcast.
// bool loads as 0 or 1; int64 and uint64 load exactly, and throw for a value beyond +-2^24 (f32's
// exact integers): the host kernels' integer arithmetic is exact or an error.
std::vector<float> load_f32(const Tensor& t);
std::vector<float> load_f32(const Tensor& t, const Dims& shape);
// Writes values (row-major order of t's shape) into t, rounding to t's dtype: bool is value != 0
// (NaN is true, as in PyTorch); int64 and uint64 truncate toward zero and throw for a value that
// is not finite or lies beyond +-2^24 (or is negative, for uint64).
void store_f32(const Tensor& t, const std::vector<float>& values);
// Copies src's elements into dst (same shape and dtype, any layouts), bit for bit.
void copy_elements(const Tensor& dst, const Tensor& src);

// The broadcast shape of a and b (throws naming both shapes when they do not broadcast).
Dims broadcast_shapes(const Dims& a, const Dims& b);
// t's view expanded to `shape` (stride 0 in repeated dims).
Tensor expand_view(const Tensor& t, const Dims& shape);

}  // namespace asynctp::graph
