// One GPU's backend for the device-level GPU tests: seeded uploads, empty device tensors and
// downloads on its compute stream.
#pragma once

#include <cmath>
#include <memory>

#include "device/backend.h"
#include "support/tensor_testing.h"

namespace asynctp::testing {

struct Gpu {
  std::unique_ptr<Backend> backend = make_backend("cuda", 0);
  Backend& be() { return *backend; }
  Stream& stream() { return backend->compute_stream(); }

  OwnedTensor upload(Dims shape, DType dtype, uint64_t seed, Values kind = Values::kRandom) {
    OwnedTensor host = empty_host(shape, dtype);
    fill_seeded(host, seed, kind);
    OwnedTensor dev = empty(shape, dtype);
    be().copy(dev, host, stream());
    return dev;
  }
  // Filled with NaN: an element a kernel should have written and did not shows in the result;
  // and compute-sanitizer's initcheck, which does not see the native GEMM's TMA stores, sees
  // the memory written.
  OwnedTensor empty(Dims shape, DType dtype) {
    Buffer buf = be().allocate(static_cast<size_t>(shape.product()) * element_size(dtype));
    Tensor view = buf.view(shape, dtype);
    be().fill(view, std::nanf(""), stream());
    return {std::move(buf), view};
  }
  OwnedTensor download(const Tensor& t) {
    OwnedTensor host = empty_host(t.shape(), t.dtype());
    be().copy(host, t, stream());
    be().synchronize();
    return host;
  }
  // [n, k] storage viewed as the column-major [k, n] B.
  OwnedTensor upload_b(int64_t k, int64_t n, bool k_major, DType dtype, uint64_t seed) {
    if (!k_major) return upload({k, n}, dtype, seed);
    OwnedTensor t = upload({n, k}, dtype, seed);
    t.tensor = t.tensor.t();
    return t;
  }
};

}  // namespace asynctp::testing
