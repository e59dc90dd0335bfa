// One GPU's backend for the device-level GPU tests: seeded uploads, empty device tensors and
// downloads on its compute stream; the reference kernel's product and a relative difference.
#pragma once

#include <cmath>
#include <memory>

#include <gtest/gtest.h>

#include "device/backend.h"
#include "kernels/kernels.h"
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

// The reference kernel's result (f32) for d = a @ b (a [m, k] with unit column stride, b [k, n]
// row- or column-major; bf16 or f16).
inline OwnedTensor reference_product(Gpu& gpu, const Tensor& a, const Tensor& b) {
  OwnedTensor d = gpu.empty({a.size(0), b.size(1)}, DType::kF32);
  kernels::NativeGemmParams k;
  k.a = a.data();
  k.lda = a.stride(0);
  k.b = b.data();
  k.b_k_major = b.stride(0) == 1 && b.size(1) > 1;
  k.ldb = k.b_k_major ? b.stride(1) : b.stride(0);
  k.c = d->data();
  k.ldc = d->stride(0);
  k.in_dtype = a.dtype();
  k.c_dtype = DType::kF32;
  k.m = a.size(0);
  k.n = b.size(1);
  k.k = a.size(1);
  EXPECT_EQ(kernels::reference_gemm(k, static_cast<cudaStream_t>(gpu.stream().native_handle())),
            cudaSuccess);
  return d;
}

// ||actual - expected|| / ||expected|| over two host tensors of one shape.
inline double rel_diff(const Tensor& actual_host, const Tensor& expected_host) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < actual_host.numel(); ++i) {
    const double e = get(expected_host, i);
    const double d = get(actual_host, i) - e;
    num += d * d;
    den += e * e;
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

}  // namespace asynctp::testing
