// The CUDA elementwise kernels (label gpu): the vector paths (contiguous, 16-byte aligned, one
// dtype) against the generic ones bit for bit, over lengths with and without a tail, and both
// against the CPU backend. A view shifted by one element is never 16-byte aligned, so it takes
// the generic kernel on the same values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "device/cuda/one_gpu.h"
#include "ops/cuda/gpu_testing.h"

namespace asynctp::testing {
namespace {

struct Pair {
  OwnedTensor storage;  // [n + 1]
  Tensor aligned;       // [0, n): vector path
  Tensor shifted;       // [1, n + 1): generic path
};

Pair pair(Gpu& gpu, int64_t n, DType dtype) {
  Pair p{gpu.empty({n + 1}, dtype), {}, {}};
  p.aligned = p.storage.tensor.narrow(0, 0, n);
  p.shifted = p.storage.tensor.narrow(0, 1, n);
  return p;
}

void expect_same_bits(Gpu& gpu, const Tensor& a, const Tensor& b, const std::string& what) {
  const OwnedTensor ha = gpu.download(a);
  const OwnedTensor hb = gpu.download(b);
  ASSERT_EQ(ha->nbytes(), hb->nbytes());
  EXPECT_EQ(std::memcmp(ha->data(), hb->data(), ha->nbytes()), 0) << what;
}

// spin holds the stream for at least its cycles at the SM clock's highest rate (H100: under
// 2 GHz), and refuses a negative count.
TEST(CudaSpin, HoldsTheStream) {
  SKIP_UNLESS_GPUS(1);
  Gpu gpu;
  auto start = gpu.be().create_event(true), stop = gpu.be().create_event(true);
  start->record(gpu.stream());
  gpu.be().spin(40'000'000, gpu.stream());
  stop->record(gpu.stream());
  stop->synchronize();
  EXPECT_GE(stop->elapsed_ms(*start), 40e6 / 2.5e9 * 1e3);
  EXPECT_THROW(gpu.be().spin(-1, gpu.stream()), Error);
}

class CudaElementwiseTest : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(CudaElementwiseTest, VectorPathsMatchTheGenericOnesAndTheCpuBackend) {
  SKIP_UNLESS_GPUS(1);
  const auto [dtype, n] = GetParam();
  Gpu gpu;
  std::unique_ptr<Backend> cpu = make_backend("cpu", 0);
  OwnedTensor host = empty_host({n}, dtype);
  fill_seeded(host, 900 + n, Values::kRandom);
  Pair in_a = pair(gpu, n, dtype), in_s = pair(gpu, n, dtype);
  gpu.be().copy(in_a.aligned, host, gpu.stream());
  gpu.be().copy(in_s.shifted, host, gpu.stream());
  expect_same_bits(gpu, in_a.aligned, in_s.shifted, "copy in");

  for (UnaryOp op : {UnaryOp::kSilu, UnaryOp::kRelu, UnaryOp::kGelu}) {
    const std::string what =
        fmt::format("unary {} {} n={}", static_cast<int>(op), dtype_name(dtype), n);
    Pair out_a = pair(gpu, n, dtype), out_s = pair(gpu, n, dtype);
    gpu.be().unary(op, out_a.aligned, in_a.aligned, gpu.stream());
    gpu.be().unary(op, out_s.shifted, in_s.shifted, gpu.stream());
    expect_same_bits(gpu, out_a.aligned, out_s.shifted, what);
    // In place takes the vector path too.
    Pair inplace = pair(gpu, n, dtype);
    gpu.be().copy(inplace.aligned, in_a.aligned, gpu.stream());
    gpu.be().unary(op, inplace.aligned, inplace.aligned, gpu.stream());
    expect_same_bits(gpu, inplace.aligned, out_a.aligned, what + " in place");
    // The CPU backend's libm and CUDA's expf/erff may differ in the last f32 bit, which can move
    // a rounded bf16/f16 value by one unit.
    OwnedTensor want = empty_host({n}, dtype);
    cpu->unary(op, want, host, cpu->compute_stream());
    cpu->synchronize();
    const OwnedTensor got = gpu.download(out_a.aligned);
    const double tol = dtype == DType::kF32 ? 1e-6 : (dtype == DType::kBF16 ? 8e-3 : 1e-3);
    for (int64_t i = 0; i < n; ++i) {
      const double w = get(want, i), g = get(got, i);
      ASSERT_LE(std::abs(g - w), tol * (1.0 + std::abs(w))) << what << " at " << i;
    }
  }

  Pair fill_a = pair(gpu, n, dtype), fill_s = pair(gpu, n, dtype);
  gpu.be().fill(fill_a.aligned, 0.3f, gpu.stream());
  gpu.be().fill(fill_s.shifted, 0.3f, gpu.stream());
  expect_same_bits(gpu, fill_a.aligned, fill_s.shifted, "fill");

  Pair copy_a = pair(gpu, n, dtype);
  gpu.be().copy(copy_a.aligned, in_a.aligned, gpu.stream());
  expect_same_bits(gpu, copy_a.aligned, in_s.shifted, "copy");
}

// Lengths: shorter than one 16-byte lane, exactly lanes, lanes plus a tail, and large enough for a
// grid-stride loop.
INSTANTIATE_TEST_SUITE_P(
    DtypesAndLengths, CudaElementwiseTest,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                       ::testing::Values(int64_t{1}, int64_t{7}, int64_t{64}, int64_t{4099},
                                         int64_t{(1 << 22) + 3})));

}  // namespace
}  // namespace asynctp::testing
