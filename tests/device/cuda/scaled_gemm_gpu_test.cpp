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
#include "support/tensor_testing.h"

namespace asynctp::testing {
namespace {

struct ScaledCase {
  DType a_dtype, b_dtype, out;
  bool rowwise, colwise, batched;
};

void PrintTo(const ScaledCase& c, std::ostream* os) {
  *os << fmt::format("{} x {} -> {}, a_scale {}, b_scale {}{}", c.a_dtype, c.b_dtype, c.out,
                     c.rowwise ? "row-wise" : "tensor-wise",
                     c.colwise ? "column-wise" : "tensor-wise", c.batched ? ", batched" : "");
}

// The host operand's bytes on the GPU, viewed in the same strides (b is a column-major view of
// contiguous [n, k] storage): copied as the contiguous storage, since a strided copy from host
// memory would need a kernel.
OwnedTensor to_gpu(Gpu& gpu, const OwnedTensor& host, Dims storage) {
  OwnedTensor dev = gpu.empty(storage, host->dtype());
  gpu.be().copy(dev, Tensor(host->data(), host->dtype(), storage, host->device()), gpu.stream());
  dev.tensor = Tensor(dev->data(), host->dtype(), host->shape(), host->strides(), dev->device());
  return dev;
}

class ScaledGemmGpu : public ::testing::TestWithParam<ScaledCase> {};

// Products of quarters are exact, and so are their f32 sums in any order: the two backends agree
// up to the scales' rounding, which cuBLASLt may apply as one product (a_scale * b_scale) where
// the reference multiplies twice; that is one f32 rounding, then one into the output dtype.
TEST_P(ScaledGemmGpu, MatchesTheCpuBackend) {
  SKIP_UNLESS_GPUS(1);
  const ScaledCase c = GetParam();
  // k a multiple of 16 and n of 16 bytes' worth: cuBLASLt's float8 layout rules; m off the tiles.
  const int64_t batch = c.batched ? 3 : 1, m = 200, k = 96, n = 144;
  const Dims a_shape = c.batched ? Dims{batch, m, k} : Dims{m, k};
  const Dims d_shape = c.batched ? Dims{batch, m, n} : Dims{m, n};
  OwnedTensor a = empty_host(a_shape, c.a_dtype);
  OwnedTensor b = empty_transposed({k, n}, c.b_dtype);
  Dims sa_shape = a_shape;
  sa_shape[sa_shape.size() - 1] = 1;
  OwnedTensor sa = empty_host(c.rowwise ? sa_shape : Dims{1}, DType::kF32);
  OwnedTensor sb = empty_host(c.colwise ? Dims{1, n} : Dims{}, DType::kF32);
  fill_seeded(a, seed_of({31}), Values::kQuarters);
  fill_seeded(b, seed_of({32}), Values::kQuarters);
  fill_seeded(sa, seed_of({33}), Values::kPositive);
  fill_seeded(sb, seed_of({34}), Values::kPositive);

  std::unique_ptr<Backend> cpu = make_cpu_backend();
  OwnedTensor expected = empty_host(d_shape, c.out);
  GemmArgs ref{a, b, expected};
  ref.a_scale = sa;
  ref.b_scale = sb;
  cpu->gemm(ref, cpu->compute_stream());
  cpu->compute_stream().synchronize();

  Gpu gpu;
  OwnedTensor da = to_gpu(gpu, a, a_shape);
  OwnedTensor db = to_gpu(gpu, b, {n, k});
  OwnedTensor dsa = to_gpu(gpu, sa, sa->shape());
  OwnedTensor dsb = to_gpu(gpu, sb, sb->shape());
  // Twice, the second time from cached plans and staging: both must match.
  for (int call = 0; call < 2; ++call) {
    SCOPED_TRACE(fmt::format("call {}", call));
    OwnedTensor d = gpu.empty(d_shape, c.out);  // NaN: an element left unwritten shows
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
    ::testing::Values(ScaledCase{DType::kF8E4M3, DType::kF8E4M3, DType::kF32, false, false, false},
                      ScaledCase{DType::kF8E4M3, DType::kF8E4M3, DType::kBF16, true, false, false},
                      ScaledCase{DType::kF8E4M3, DType::kF8E4M3, DType::kBF16, true, true, false},
                      ScaledCase{DType::kF8E4M3, DType::kF8E4M3, DType::kF16, false, true, false},
                      ScaledCase{DType::kF8E4M3, DType::kF8E4M3, DType::kBF16, true, true, true},
                      ScaledCase{DType::kF8E5M2, DType::kF8E4M3, DType::kF32, true, true, false},
                      ScaledCase{DType::kF8E4M3, DType::kF8E5M2, DType::kBF16, false, false,
                                 true}));

}  // namespace
}  // namespace asynctp::testing
