// The native GEMM's SwiGLU epilogue and the SwiGLU elementwise kernel on one GPU (label gpu).
//
//   native GEMM, swiglu: B [K, 2N] (gate | up), C [M, N] = silu(A @ B[:, :N]) * (A @ B[:, N:]),
//                        pre [M, 2N] = A @ B  (optional)
//   against: the reference kernel's f32 [M, 2N], then Backend::swiglu (the elementwise kernel).
//
// Shapes on and off the 128 x 128 SwiGLU tile grid (N not a multiple of 128: the last tile's
// gate half reads up columns, which no output takes), both B layouts, every output dtype, the
// products returned in f32 and bf16, the tail split on. Skips, saying why, without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "device/backend.h"
#include "device/cuda/one_gpu.h"
#include "kernels/kernels.h"
#include "kernels/native/schedule.h"
#include "ops/cuda/gpu_testing.h"
#include "support/tensor_testing.h"

namespace asynctp::testing {
namespace {

struct Shape {
  int64_t m, n, k;  // n: the output's columns (B has 2n)
};

class NativeSwigluTest : public ::testing::TestWithParam<std::tuple<Shape, DType, bool>> {};

TEST_P(NativeSwigluTest, MatchesTheReferenceProductsThenTheSwigluKernel) {
  SKIP_UNLESS_GPUS(1);
  const auto [shape, in_dtype, k_major] = GetParam();
  Gpu gpu;
  const uint64_t seed = seed_of({static_cast<uint64_t>(shape.m), static_cast<uint64_t>(shape.n),
                                 static_cast<uint64_t>(shape.k), static_cast<uint64_t>(k_major)});
  OwnedTensor a = gpu.upload({shape.m, shape.k}, in_dtype, seed);
  OwnedTensor b = gpu.upload_b(shape.k, 2 * shape.n, k_major, in_dtype, seed + 1);
  OwnedTensor products = reference_product(gpu, a, b);
  OwnedTensor swiglu = gpu.empty({shape.m, shape.n}, DType::kF32);
  gpu.be().swiglu(swiglu, products, gpu.stream());
  const OwnedTensor expected = gpu.download(swiglu);
  const OwnedTensor expected_pre = gpu.download(products);
  for (DType out : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (DType pre_dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(fmt::format("{}x{}x{} {} B {} out {} pre {}", shape.m, shape.n, shape.k,
                               in_dtype, k_major ? "column-major" : "row-major", out, pre_dtype));
      OwnedTensor d = gpu.empty({shape.m, shape.n}, out);
      OwnedTensor pre = gpu.empty({shape.m, 2 * shape.n}, pre_dtype);
      ChunkedGemmArgs args;
      args.a = a;
      args.b = b;
      args.d = d;
      args.swiglu = true;
      args.pre_out = pre;
      if (!k_major && shape.n % 8 != 0) {
        // A row-major B's up half starts at column N: TMA needs it on a 16-byte boundary.
        EXPECT_NE(gpu.be().native_gemm_unsupported(args).find("N % 8 == 0"), std::string::npos);
        return;
      }
      ASSERT_EQ(gpu.be().native_gemm_unsupported(args), "");
      gpu.be().native_gemm(args, gpu.stream());
      // f32 accumulators in another order than the reference's: f32 results agree to rounding
      // noise (the SwiGLU amplifies none: silu' is bounded), 16-bit ones to one rounding.
      const double tolerance = out == DType::kF32 ? 1e-5 : 4e-3;
      EXPECT_LT(rel_diff(gpu.download(d), expected), tolerance) << "C";
      EXPECT_LT(rel_diff(gpu.download(pre), expected_pre), pre_dtype == DType::kF32 ? 1e-5 : 4e-3)
          << "pre";
      // Without the products: the same C, bit for bit (the same accumulators).
      OwnedTensor d2 = gpu.empty({shape.m, shape.n}, out);
      args.d = d2;
      args.pre_out = Tensor();
      gpu.be().native_gemm(args, gpu.stream());
      const OwnedTensor h1 = gpu.download(d), h2 = gpu.download(d2);
      EXPECT_EQ(std::memcmp(h1->data(), h2->data(), h1->nbytes()), 0) << "C without pre";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, NativeSwigluTest,
    ::testing::Combine(::testing::Values(Shape{128, 128, 64}, Shape{1, 8, 8}, Shape{200, 156, 72},
                                         Shape{1000, 1000, 1000}, Shape{333, 520, 4104},
                                         Shape{2048, 1408, 512}),
                       ::testing::Values(DType::kBF16, DType::kF16), ::testing::Bool()));

// The epilogue through the staging area (TMA stores of C and of pre's two halves) and from
// registers compute the same accumulators and round them once: the same bits, C and pre, off the
// tile grid in M and N (the maps clip the last tiles' rows and columns), for C and pre of one
// dtype and of two, with and without the tail split (its last part stores the tile).
TEST(NativeSwiglu, TmaStoreMatchesRegisterStore) {
  SKIP_UNLESS_GPUS(1);
  Gpu gpu;
  const auto stream = static_cast<cudaStream_t>(gpu.stream().native_handle());
  const int64_t m = 300, n = 200, k = 264;
  OwnedTensor a = gpu.upload({m, k}, DType::kBF16, 11);
  OwnedTensor b = gpu.upload({k, 2 * n}, DType::kBF16, 12);
  Buffer workspace = gpu.be().allocate(kernels::async_gemm_split_workspace_bytes());
  ASSERT_EQ(cudaMemset(workspace.data(), 0, workspace.size()), cudaSuccess);
  for (DType c_dtype : {DType::kBF16, DType::kF16}) {
    for (bool split : {false, true}) {
      SCOPED_TRACE(fmt::format("C {} pre bf16, tail split {}", c_dtype, split));
      OwnedTensor c[2] = {gpu.empty({m, n}, c_dtype), gpu.empty({m, n}, c_dtype)};
      OwnedTensor pre[2] = {gpu.empty({m, 2 * n}, DType::kBF16),
                            gpu.empty({m, 2 * n}, DType::kBF16)};
      for (int registers = 0; registers < 2; ++registers) {
        gpu.be().fill(c[registers], std::nanf(""), gpu.stream());
        gpu.be().fill(pre[registers], std::nanf(""), gpu.stream());
        kernels::NativeGemmParams p;
        p.a = a->data();
        p.lda = k;
        p.b = b->data();
        p.ldb = 2 * n;
        p.c = c[registers]->data();
        p.ldc = n;
        p.c_dtype = c_dtype;
        p.m = m;
        p.n = n;
        p.k = k;
        p.swiglu = true;
        p.pre = pre[registers]->data();
        p.pre_ld = 2 * n;
        p.split_workspace = split ? workspace.data() : nullptr;
        p.force_register_store = registers == 1;
        ASSERT_EQ(kernels::uses_tma_store(p), registers == 0);
        ASSERT_EQ(kernels::async_gemm(p, stream), cudaSuccess);
      }
      EXPECT_TRUE(same_bits(gpu.download(c[0]), gpu.download(c[1]))) << "C";
      EXPECT_TRUE(same_bits(gpu.download(pre[0]), gpu.download(pre[1]))) << "pre";
    }
  }
}

// What the epilogue does not take: an odd N, done counters.
TEST(NativeSwiglu, RejectsWhatTheEpilogueCannotRun) {
  SKIP_UNLESS_GPUS(1);
  Gpu gpu;
  OwnedTensor a = gpu.upload({128, 64}, DType::kBF16, 1);
  OwnedTensor b = gpu.upload_b(64, 2 * 7, /*k_major=*/true, DType::kBF16, 2);
  OwnedTensor d = gpu.empty({128, 8}, DType::kBF16);
  ChunkedGemmArgs args;
  args.a = a;
  args.b = b;
  args.d = d.tensor.narrow(1, 0, 7);
  args.swiglu = true;
  EXPECT_NE(gpu.be().native_gemm_unsupported(args), "");
  OwnedTensor b8 = gpu.upload({64, 16}, DType::kBF16, 3);
  args.b = b8;
  args.d = d;
  ASSERT_EQ(gpu.be().native_gemm_unsupported(args), "");
  uint32_t* done = nullptr;
  Buffer flags = gpu.be().allocate(64);
  done = static_cast<uint32_t*>(flags.data());
  args.done = done;
  EXPECT_NE(gpu.be().native_gemm_unsupported(args).find("SwiGLU"), std::string::npos);
}

// The SwiGLU elementwise kernel: its vector path (contiguous, 16-byte aligned, one dtype, N a
// multiple of 16 bytes) against the generic one on the same values, bit for bit, and both against
// the CPU backend to rounding (expf on the GPU and the host may differ in the last bit).
class CudaSwigluKernelTest : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(CudaSwigluKernelTest, VectorPathMatchesTheGenericOneAndTheCpuBackend) {
  SKIP_UNLESS_GPUS(1);
  const auto [dtype, n] = GetParam();
  Gpu gpu;
  std::unique_ptr<Backend> cpu = make_backend("cpu", 0);
  const int64_t rows = 37;
  OwnedTensor host = empty_host({rows, 2 * n}, dtype);
  fill_seeded(host, seed_of({950, static_cast<uint64_t>(n)}), Values::kRandom);
  OwnedTensor in = gpu.empty({rows, 2 * n}, dtype);
  gpu.be().copy(in, host, gpu.stream());
  // The generic path: the same values, the output a column-strided view (never vectorized).
  OwnedTensor out_vec = gpu.empty({rows, n}, dtype);
  OwnedTensor out_wide = gpu.empty({rows, n + 1}, dtype);
  const Tensor out_generic = out_wide.tensor.narrow(1, 1, n);
  gpu.be().swiglu(out_vec, in, gpu.stream());
  gpu.be().swiglu(out_generic, in, gpu.stream());
  const OwnedTensor v = gpu.download(out_vec);
  const OwnedTensor g = gpu.download(out_generic);
  EXPECT_TRUE(same_bits(v, g));
  OwnedTensor on_cpu = empty_host({rows, n}, dtype);
  cpu->swiglu(on_cpu, host, cpu->compute_stream());
  cpu->compute_stream().synchronize();
  EXPECT_LT(rel_diff(v, on_cpu), dtype == DType::kF32 ? 1e-6 : 4e-3);
}

INSTANTIATE_TEST_SUITE_P(Lengths, CudaSwigluKernelTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16,
                                                              DType::kF16),
                                            ::testing::Values(8, 64, 1000, 4096)));

// The SwiGLU's backward kernel likewise: the vector path (the three operands contiguous, aligned,
// of one dtype, N a multiple of 16 bytes) against the generic one (a column-strided grad_out
// view; a P contiguous but one element off 16-byte alignment) bit for bit, and against the CPU
// backend to rounding, also with a grad_out of another dtype and N off the 16-byte lanes; an
// element left unwritten would stay NaN (Gpu::empty).
class CudaSwigluBackwardKernelTest : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(CudaSwigluBackwardKernelTest, VectorPathMatchesTheGenericOneAndTheCpuBackend) {
  SKIP_UNLESS_GPUS(1);
  const auto [dtype, n] = GetParam();
  Gpu gpu;
  std::unique_ptr<Backend> cpu = make_backend("cpu", 0);
  const int64_t rows = 37;
  OwnedTensor host_p = empty_host({rows, 2 * n}, dtype);
  OwnedTensor host_d = empty_host({rows, n}, dtype);
  fill_seeded(host_p, seed_of({960, static_cast<uint64_t>(n)}), Values::kRandom);
  fill_seeded(host_d, seed_of({961, static_cast<uint64_t>(n)}), Values::kRandom);
  OwnedTensor p = gpu.empty({rows, 2 * n}, dtype);
  OwnedTensor d = gpu.empty({rows, n}, dtype);
  OwnedTensor d_wide = gpu.empty({rows, n + 1}, dtype);
  const Tensor d_strided = d_wide.tensor.narrow(1, 1, n);
  gpu.be().copy(p, host_p, gpu.stream());
  gpu.be().copy(d, host_d, gpu.stream());
  gpu.be().copy(d_strided, d, gpu.stream());
  OwnedTensor out_vec = gpu.empty({rows, 2 * n}, dtype);
  OwnedTensor out_generic = gpu.empty({rows, 2 * n}, dtype);
  gpu.be().swiglu_backward(out_vec, d, p, gpu.stream());
  gpu.be().swiglu_backward(out_generic, d_strided, p, gpu.stream());
  const OwnedTensor v = gpu.download(out_vec);
  EXPECT_TRUE(same_bits(v, gpu.download(out_generic)));
  OwnedTensor on_cpu = empty_host({rows, 2 * n}, dtype);
  cpu->swiglu_backward(on_cpu, host_d, host_p, cpu->compute_stream());
  cpu->compute_stream().synchronize();
  const double tolerance = dtype == DType::kF32 ? 1e-6 : 4e-3;
  EXPECT_LT(rel_diff(v, on_cpu), tolerance);
  // P contiguous but one element past 16-byte alignment: the generic kernel, the same bits.
  OwnedTensor p_buf = gpu.empty({rows * 2 * n + 1}, dtype);
  const Tensor p_off(static_cast<char*>(p_buf->data()) + element_size(dtype), dtype, {rows, 2 * n},
                     p_buf->device());
  gpu.be().copy(p_off, p, gpu.stream());
  OwnedTensor out_off = gpu.empty({rows, 2 * n}, dtype);
  gpu.be().swiglu_backward(out_off, d, p_off, gpu.stream());
  EXPECT_TRUE(same_bits(gpu.download(out_off), v));
  // grad_out of another dtype, every operand contiguous and aligned: the generic kernel.
  const DType other = dtype == DType::kF32 ? DType::kBF16 : DType::kF32;
  OwnedTensor d_other = gpu.empty({rows, n}, other);
  gpu.be().copy(d_other, d, gpu.stream());
  OwnedTensor out_mixed = gpu.empty({rows, 2 * n}, dtype);
  gpu.be().swiglu_backward(out_mixed, d_other, p, gpu.stream());
  OwnedTensor host_d_other = empty_host({rows, n}, other);
  cpu->copy(host_d_other, host_d, cpu->compute_stream());
  OwnedTensor on_cpu_mixed = empty_host({rows, 2 * n}, dtype);
  cpu->swiglu_backward(on_cpu_mixed, host_d_other, host_p, cpu->compute_stream());
  cpu->compute_stream().synchronize();
  EXPECT_LT(rel_diff(gpu.download(out_mixed), on_cpu_mixed), tolerance);
}

// N: multiples of every dtype's 16-byte lane count (the vector kernel), and 12 and 1001 (off the
// lanes of bf16 and f16, or of all three: the generic kernel throughout).
INSTANTIATE_TEST_SUITE_P(Lengths, CudaSwigluBackwardKernelTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16,
                                                              DType::kF16),
                                            ::testing::Values(8, 12, 64, 1001, 4096)));

}  // namespace
}  // namespace asynctp::testing
