#include "graph/compare.h"

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace asynctp::graph {

double default_tolerance(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 1e-4;
    case DType::kF16:
      return 5e-3;
    case DType::kBF16:
      return 3e-2;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return 1.5e-1;
    case DType::kI64:
    case DType::kU64:
    case DType::kBool:
      return 0;  // exact
  }
  return 0;
}

std::vector<OutputDiff> compare_outputs(const std::vector<RtValue>& got,
                                        const std::vector<RtValue>& ref, double tolerance) {
  ASYNCTP_CHECK(got.size() == ref.size(), "the runs have {} and {} outputs", got.size(),
                ref.size());
  std::vector<OutputDiff> out;
  for (size_t i = 0; i < got.size(); ++i) {
    OutputDiff d;
    d.index = i;
    if (got[i].is_tensor() != ref[i].is_tensor()) {
      d.ok = false;
      d.note = fmt::format("{} vs {}", got[i].describe(), ref[i].describe());
    } else if (got[i].is_tensor()) {
      const Tensor &a = got[i].tensor.t, &b = ref[i].tensor.t;
      d.dtype = std::string(dtype_name(b.dtype()));
      d.tolerance = tolerance >= 0 ? tolerance : default_tolerance(b.dtype());
      if (a.shape() != b.shape() || a.dtype() != b.dtype()) {
        d.ok = false;
        d.note = fmt::format("{} vs {}", a.describe(), b.describe());
      } else if (!is_floating_point(b.dtype())) {
        // int64, uint64 and bool compare exactly: the error is the fraction of elements that
        // differ.
        const HostTensor ca = host_contiguous(got[i].tensor), cb = host_contiguous(ref[i].tensor);
        const size_t size = element_size(b.dtype());
        const auto* pa = static_cast<const uint8_t*>(ca.t.data());
        const auto* pb = static_cast<const uint8_t*>(cb.t.data());
        int64_t differ = 0;
        for (int64_t k = 0; k < b.numel(); ++k)
          differ += std::memcmp(pa + k * size, pb + k * size, size) != 0;
        d.rel_error = b.numel() == 0 ? 0.0 : static_cast<double>(differ) / b.numel();
        d.ok = d.rel_error <= d.tolerance;
      } else {
        const std::vector<float> va = load_f32(a), vb = load_f32(b);
        double num = 0, den = 0;
        bool nan_mismatch = false;
        for (size_t k = 0; k < va.size(); ++k) {
          if (std::isnan(va[k]) || std::isnan(vb[k])) {
            nan_mismatch = nan_mismatch || std::isnan(va[k]) != std::isnan(vb[k]);
            continue;
          }
          const double e = static_cast<double>(va[k]) - vb[k];
          num += e * e;
          den += static_cast<double>(vb[k]) * vb[k];
        }
        d.rel_error = nan_mismatch ? INFINITY
                      : den == 0   ? (num == 0 ? 0.0 : INFINITY)
                                   : std::sqrt(num / den);
        d.ok = d.rel_error <= d.tolerance;
      }
    }
    out.push_back(d);
  }
  return out;
}

}  // namespace asynctp::graph
