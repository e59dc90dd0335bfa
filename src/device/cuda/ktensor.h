// Tensor -> kernels::KTensor, for the host code that launches the project's kernels.
#pragma once

#include <asynctp/tensor.h>
#include "core/dtype.h"
#include "kernels/kernels.h"

namespace asynctp::cuda {

inline kernels::KTensor to_kernel(const Tensor& t) {
  kernels::KTensor k;
  k.data = t.data();
  k.dtype = t.dtype();
  k.ndim = t.dim();
  for (int i = 0; i < t.dim(); ++i) {
    k.shape[i] = t.shape()[i];
    k.strides[i] = t.strides()[i];
  }
  return k;
}

}  // namespace asynctp::cuda
