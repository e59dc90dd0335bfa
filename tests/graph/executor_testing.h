// Host tensors from values and back, for the executor's tests.
#pragma once

#include <vector>

#include "graph/executor.h"

namespace asynctp::testing {

inline graph::HostTensor from_values(Dims shape, const std::vector<float>& v,
                                     DType dtype = DType::kF32) {
  graph::HostTensor t = graph::host_empty(shape, dtype);
  graph::store_f32(t.t, v);
  return t;
}

inline std::vector<float> values(const graph::RtValue& v) {
  return graph::load_f32(v.tensor.t);
}

}  // namespace asynctp::testing
