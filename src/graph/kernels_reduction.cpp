// Reductions over dims (sum, mean, amax, amin): what RMSNorm, its backward and float8 scaling
// lower to. Sums accumulate in double and round once into the result dtype.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "graph/kernel.h"

namespace asynctp::graph {

namespace {

using Table = std::vector<std::pair<std::string, Kernel>>;

enum class Reduce : uint8_t { kSum, kMean, kMax, kMin };

RtValue reduce(Call& call, Reduce kind, std::vector<int64_t> dims, bool keepdim,
               std::optional<DType> dtype) {
  const HostTensor& x = call.tensor(0, "self");
  const int rank = x.t.dim();
  std::array<bool, kMaxDims> reduced{};
  if (dims.empty()) {  // PyTorch: an empty dim list reduces every dim
    for (int i = 0; i < rank; ++i)
      reduced[i] = true;
  }
  for (int64_t d : dims) {
    ASYNCTP_CHECK(d >= -std::max(rank, 1) && d < std::max(rank, 1),
                  "{}: dim {} out of range for {}", call.where(), d, x.t.describe());
    if (rank > 0) reduced[d < 0 ? d + rank : d] = true;
  }
  Dims out_shape, kept_shape;  // kept_shape: x's rank, reduced dims of size 1
  for (int i = 0; i < rank; ++i) {
    kept_shape.push_back(reduced[i] ? 1 : x.t.size(i));
    if (!reduced[i])
      out_shape.push_back(x.t.size(i));
    else if (keepdim)
      out_shape.push_back(1);
  }
  const std::vector<float> in = load_f32(x.t);
  const size_t n_out = static_cast<size_t>(kept_shape.product());
  const double init = kind == Reduce::kMax   ? -std::numeric_limits<double>::infinity()
                      : kind == Reduce::kMin ? std::numeric_limits<double>::infinity()
                                             : 0.0;
  std::vector<double> acc(n_out, init);
  std::vector<bool> nan(n_out, false);
  const Dims out_strides = contiguous_strides(kept_shape);
  std::array<int64_t, kMaxDims> index{};
  for (size_t i = 0; i < in.size(); ++i) {
    int64_t o = 0;
    for (int k = 0; k < rank; ++k)
      o += reduced[k] ? 0 : index[k] * out_strides[k];
    const double v = in[i];
    double& a = acc[static_cast<size_t>(o)];
    switch (kind) {
      case Reduce::kSum:
      case Reduce::kMean:
        a += v;
        break;
      case Reduce::kMax:
        a = std::max(a, v);
        nan[o] = nan[o] || std::isnan(v);
        break;
      case Reduce::kMin:
        a = std::min(a, v);
        nan[o] = nan[o] || std::isnan(v);
        break;
    }
    for (int k = rank - 1; k >= 0; --k) {
      if (++index[k] < x.t.size(k)) break;
      index[k] = 0;
    }
  }
  const double count =
      static_cast<double>(x.t.numel()) / static_cast<double>(std::max<size_t>(n_out, 1));
  std::vector<float> out(n_out);
  for (size_t i = 0; i < n_out; ++i) {
    double v = kind == Reduce::kMean ? acc[i] / count : acc[i];
    if (nan[i]) v = std::numeric_limits<double>::quiet_NaN();
    out[i] = static_cast<float>(v);
  }
  // A sum of integers or bools is int64 in PyTorch; max and min keep the dtype.
  const DType fallback =
      kind == Reduce::kSum && !is_floating_point(x.t.dtype()) ? DType::kI64 : x.t.dtype();
  HostTensor result = call.alloc(out_shape, dtype.value_or(fallback));
  store_f32(result.t, out);
  return RtValue::of(result);
}

}  // namespace

void register_reduction_kernels(Table& t) {
  t.emplace_back("aten.sum.dim_IntList", [](Call& c) {
    std::vector<int64_t> dims = c.has(1, "dim") ? c.int_list(1, "dim") : std::vector<int64_t>{};
    return reduce(c, Reduce::kSum, dims, c.boolean_or(2, "keepdim", false), c.dtype_or(3, "dtype"));
  });
  t.emplace_back("aten.sum.default", [](Call& c) {
    return reduce(c, Reduce::kSum, {}, false, c.dtype_or(1, "dtype"));
  });
  t.emplace_back("aten.mean.dim", [](Call& c) {
    std::vector<int64_t> dims = c.has(1, "dim") ? c.int_list(1, "dim") : std::vector<int64_t>{};
    return reduce(c, Reduce::kMean, dims, c.boolean_or(2, "keepdim", false),
                  c.dtype_or(3, "dtype"));
  });
  t.emplace_back("aten.amax.default", [](Call& c) {
    std::vector<int64_t> dims = c.has(1, "dim") ? c.int_list(1, "dim") : std::vector<int64_t>{};
    return reduce(c, Reduce::kMax, dims, c.boolean_or(2, "keepdim", false), std::nullopt);
  });
  t.emplace_back("aten.amin.default", [](Call& c) {
    std::vector<int64_t> dims = c.has(1, "dim") ? c.int_list(1, "dim") : std::vector<int64_t>{};
    return reduce(c, Reduce::kMin, dims, c.boolean_or(2, "keepdim", false), std::nullopt);
  });
}

}  // namespace asynctp::graph
