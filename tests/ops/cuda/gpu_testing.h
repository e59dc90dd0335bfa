// What the GPU tests share: how many ranks the GPUs take (asked in a child process, so that the
// test process itself never initialises CUDA before it forks its ranks), moving seeded host tensors
// to and from the device, and an f64 host reference GEMM.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "device/cuda/cuda_backend.h"
#include "ops/context.h"
#include "support/tensor_testing.h"

namespace asynctp::testing {

// How many ranks the GPU tests may run: one per visible GPU, or ASYNCTP_SHARED_GPUS per GPU
// (device/cuda/cuda_backend.h), which runs the multi-rank tests on fewer GPUs than ranks.
inline int gpu_rank_slots() {
  static int cached = -1;
  if (cached >= 0) return cached;
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(std::min(cuda_device_count(), 100));
  int status = 0;
  ::waitpid(pid, &status, 0);
  cached = (WIFEXITED(status) ? WEXITSTATUS(status) : 0) * cuda_ranks_per_gpu();
  return cached;
}

#define SKIP_UNLESS_GPUS(n)                                                                    \
  do {                                                                                         \
    const int have_ = ::asynctp::testing::gpu_rank_slots();                                    \
    if (have_ < (n))                                                                           \
      GTEST_SKIP() << "needs " << (n) << " GPUs (or ASYNCTP_SHARED_GPUS ranks per GPU), room " \
                   << "for " << have_ << " ranks";                                             \
  } while (0)

// A device tensor plus the host copy it was made from.
struct DeviceTensor {
  OwnedTensor host;
  OwnedTensor device;
  const Tensor& operator*() const { return device.tensor; }
};

inline DeviceTensor upload_seeded(OpContext& ctx, Dims shape, DType dtype, uint64_t seed,
                                  Values kind) {
  DeviceTensor t;
  t.host = empty_host(shape, dtype);
  fill_seeded(t.host, seed, kind);
  Buffer buf = ctx.backend().allocate(t.host->nbytes());
  Tensor view = buf.view(shape, dtype);
  t.device = {std::move(buf), view};
  ctx.backend().copy(t.device, t.host, ctx.stream());
  return t;
}

inline OwnedTensor device_empty(OpContext& ctx, Dims shape, DType dtype) {
  Buffer buf = ctx.backend().allocate(static_cast<size_t>(shape.product()) * element_size(dtype));
  Tensor view = buf.view(shape, dtype);
  return {std::move(buf), view};
}

inline OwnedTensor download(OpContext& ctx, const Tensor& device) {
  OwnedTensor host = empty_host(device.shape(), device.dtype());
  ctx.backend().copy(host, device, ctx.stream());
  ctx.backend().synchronize();
  return host;
}

// ||actual - expected|| / ||expected|| (expected in f64).
inline double rel_error(const Tensor& actual_host, const std::vector<double>& expected) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < actual_host.numel(); ++i) {
    const double d = static_cast<double>(get(actual_host, i)) - expected[i];
    num += d * d;
    den += expected[i] * expected[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// f64 C[m, n] += A[m, k] @ B[k, n] over row-major value vectors.
inline void host_gemm_add(const std::vector<float>& a, const std::vector<float>& b,
                          std::vector<double>& c, int64_t m, int64_t k, int64_t n,
                          double scale = 1.0) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t kk = 0; kk < k; ++kk) {
      const double av = a[i * k + kk] * scale;
      for (int64_t j = 0; j < n; ++j)
        c[i * n + j] += av * b[kk * n + j];
    }
  }
}

}  // namespace asynctp::testing
