// The CUDA backend's float8 GEMM on one GPU (label gpu): cuBLASLt's float8 kernels with
// tensor-, row- and column-wise scales, one product and batches, every output dtype and both
// float8 formats, against the CPU backend (the reference) on the same operands. Single-process,
// so that compute-sanitizer's initcheck, which runs kernels one at a time, can check this path
// (the multi-rank float8 op tests can only time out under it). Skips, saying why, without a GPU.
//
//   d [batch, m, n] = ((a [batch, m, k] @ b [k, n]) * a_scale[row]) * b_scale[col]
#include <gtest/gtest.h>

#include <cmath>

#include "device/backend.h"
#include "device/cpu_backend.h"
#include "device/cuda/one_gpu.h"
#include "ops/cuda/gpu_testing.h"
#include "support/scaled_operands.h"
#include "support/tensor_testing.h"

namespace asynctp::testing {
namespace {

// The host operand's bytes on the GPU, viewed in the same strides (b is a column-major view of
// contiguous [n, k] storage): copied as the contiguous storage, since a strided copy from host
// memory would need a kernel.
OwnedTensor to_gpu(Gpu& gpu, const OwnedTensor& host, Dims storage) {
  OwnedTensor dev = gpu.empty(storage, host->dtype());
  gpu.be().copy(dev, Tensor(host->data(), host->dtype(), storage, host->device()), gpu.stream());
  dev.tensor = Tensor(dev->data(), host->dtype(), host->shape(), host->strides(), dev->device());
  return dev;
}

class ScaledGemmGpu : public ::testing::TestWithParam<Float8Case> {};

// Products of quarters are exact, and so are their f32 sums in any order: the two backends agree
// up to the scales' rounding, which cuBLASLt may apply as one product (a_scale * b_scale) where
// the reference multiplies twice; that is one f32 rounding, then one into the output dtype.
TEST_P(ScaledGemmGpu, MatchesTheCpuBackend) {
  SKIP_UNLESS_GPUS(1);
  const Float8Case c = GetParam();
  // k a multiple of 16 and n of 16 bytes' worth: cuBLASLt's float8 layout rules; m off the tiles.
  const int64_t batch = c.batched ? 3 : 1, m = 200, k = 96, n = 144;
  const ScaledOperands in(c, batch, m, k, n, Values::kQuarters, 31);

  std::unique_ptr<Backend> cpu = make_cpu_backend();
  OwnedTensor expected = empty_host(in.d_shape, c.out);
  cpu->gemm(in.args(expected), cpu->compute_stream());
  cpu->compute_stream().synchronize();

  Gpu gpu;
  OwnedTensor da = to_gpu(gpu, in.a, in.a->shape());
  OwnedTensor db = to_gpu(gpu, in.b, {n, k});
  OwnedTensor dsa = to_gpu(gpu, in.sa, in.sa->shape());
  OwnedTensor dsb = to_gpu(gpu, in.sb, in.sb->shape());
  // Twice, the second time from cached plans and staging: both must match.
  for (int call = 0; call < 2; ++call) {
    SCOPED_TRACE(fmt::format("call {}", call));
    OwnedTensor d = gpu.empty(in.d_shape, c.out);  // NaN: an element left unwritten shows
    GemmArgs args{da, db, d};
    args.a_scale = dsa;
    args.b_scale = dsb;
    gpu.be().gemm(args, gpu.stream());
    OwnedTensor got = gpu.download(d);
    // One ulp of the output, relative: the two sides round into it from f32 values that may
    // differ by the scales' rounding, and so may land one ulp apart.
    const double ulp = c.out == DType::kF32 ? 0x1p-22 : c.out == DType::kBF16 ? 0x1p-7 : 0x1p-10;
    int64_t bad = 0;
    for (int64_t i = 0; i < got->numel(); ++i) {
      const double e = get(expected, i), g = get(got, i);
      if (!(std::abs(g - e) <= (ulp + 0x1p-21) * std::abs(e))) {
        if (++bad <= 5) ADD_FAILURE() << "element " << i << ": got " << g << ", expected " << e;
      }
    }
    EXPECT_EQ(bad, 0) << "of " << got->numel() << " elements";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Float8, ScaledGemmGpu,
    ::testing::Values(Float8Case{DType::kF8E4M3, DType::kF8E4M3, DType::kF32, false, false, false},
                      Float8Case{DType::kF8E4M3, DType::kF8E4M3, DType::kBF16, true, false, false},
                      Float8Case{DType::kF8E4M3, DType::kF8E4M3, DType::kBF16, true, true, false},
                      Float8Case{DType::kF8E4M3, DType::kF8E4M3, DType::kF16, false, true, false},
                      Float8Case{DType::kF8E4M3, DType::kF8E4M3, DType::kBF16, true, true, true},
                      Float8Case{DType::kF8E5M2, DType::kF8E4M3, DType::kF32, true, true, false},
                      Float8Case{DType::kF8E4M3, DType::kF8E5M2, DType::kBF16, false, false,
                                 true}));

}  // namespace
}  // namespace asynctp::testing
