// The native GEMM's preconditions (kernels/native/validate.h) on CPU: usable params give "", and
// each unusable one gives its reason followed by the values it is about.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "kernels/native/validate.h"

namespace asynctp::kernels {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

alignas(16) char g_memory[4096];  // pointers the checks only test for alignment
uint32_t g_flags[8] = {};

// A usable bf16 problem: [m, k] by [k, n] into a bf16 [m, n], every pointer 16-byte aligned.
NativeGemmParams usable(int64_t m = 512, int64_t n = 512, int64_t k = 256) {
  NativeGemmParams p;
  p.a = g_memory;
  p.b = g_memory;
  p.c = g_memory;
  p.m = m;
  p.n = n;
  p.k = k;
  p.lda = k;
  p.ldb = n;
  p.ldc = n;
  return p;
}

// Chunk 1 of 2 (256 rows each) reduced with one peer's part.
NativeGemmParams usable_sum() {
  NativeGemmParams p = usable();
  p.chunk_rows = 256;
  p.done = g_flags;
  p.sum_chunk = 1;
  p.sum_count = 2;
  p.sum_self = 1;
  p.sum_parts = g_memory;
  p.sum_ld = p.n;
  p.sum_part_stride = 256 * p.n;
  p.sum_flags = g_flags;
  p.sum_flag_stride = 2;
  p.sum_out = g_memory;
  p.sum_ldo = p.n;
  p.timeout_ns = 1'000'000'000;
  return p;
}

TEST(NativeValidate, UsableParamsGiveNoReason) {
  EXPECT_EQ(native_gemm_unsupported(usable()), "");
  EXPECT_EQ(native_gemm_unsupported(usable_sum()), "");
  NativeGemmParams f8 = usable();
  f8.in_dtype = DType::kF8E4M3;
  f8.b_k_major = true;
  f8.ldb = f8.k;
  EXPECT_EQ(native_gemm_unsupported(f8), "");
}

TEST(NativeValidate, EachReasonNamesTheValuesItIsAbout) {
  NativeGemmParams p = usable();
  p.in_dtype = DType::kF32;
  EXPECT_EQ(native_gemm_unsupported(p),
            "inputs are not bf16, f16 or float8 e4m3; got inputs = f32");

  p = usable(512, 0);
  EXPECT_EQ(native_gemm_unsupported(p), "an empty problem; got m = 512, n = 0, k = 256");

  p = usable();
  p.b = g_memory + 2;
  EXPECT_EQ(native_gemm_unsupported(p),
            "A or B is not 16-byte aligned (TMA); got a % 16 = 0, b % 16 = 2");

  p = usable();
  p.lda = 260;  // 520 bytes: not a multiple of 16
  EXPECT_THAT(native_gemm_unsupported(p),
              AllOf(StartsWith("a row stride of A or B is not a multiple of 16 bytes (TMA)"),
                    HasSubstr("lda = 260, ldb = 512")));

  p = usable();
  p.chunk_rows = 200;
  p.done = g_flags;
  EXPECT_EQ(native_gemm_unsupported(p),
            "publishing per-chunk completion needs chunk_rows % 128 == 0; got chunk_rows = 200");

  p = usable();
  p.reserve_sms = 9;
  EXPECT_EQ(native_gemm_unsupported(p),
            "reserve_sms is out of range (0 to 8); got reserve_sms = 9");
}

TEST(NativeValidate, EpiloguesNameTheirValues) {
  NativeGemmParams p = usable_sum();
  p.sum_self = 2;
  EXPECT_EQ(native_gemm_unsupported(p),
            "sum_self is out of range; got sum_self = 2, sum_count = 2");

  p = usable_sum();
  p.c_dtype = DType::kF32;
  EXPECT_EQ(native_gemm_unsupported(p),
            "the reduce-scatter epilogue needs a 16-bit C; got c = f32");

  p = usable_sum();
  p.sum_part_stride = 100;
  EXPECT_THAT(native_gemm_unsupported(p),
              AllOf(StartsWith("the parts are not 16-byte aligned"),
                    HasSubstr("sum_part_stride = 100"), HasSubstr("chunk_rows = 256")));

  p = usable_sum();
  p.sum_flags = nullptr;
  EXPECT_EQ(native_gemm_unsupported(p),
            "the reduce-scatter epilogue needs its parts and their flags; got sum_count = 2, "
            "sum_parts = set, sum_flags = null");

  p = usable(512, 12);
  p.ldb = 24;  // B holds gate and up: 2N columns
  p.ldc = 16;
  p.swiglu = true;
  EXPECT_THAT(native_gemm_unsupported(p),
              AllOf(HasSubstr("N % 8 == 0"), HasSubstr("; got n = 12")));

  p = usable();
  p.in_dtype = DType::kF8E4M3;
  p.b_k_major = true;
  p.ldb = p.k;
  float scales[4] = {};
  p.a_scale = scales;
  p.a_scale_stride = 3;
  EXPECT_THAT(native_gemm_unsupported(p),
              AllOf(StartsWith("a scale's stride is not 0 (tensor-wise) or 1 (row-wise)"),
                    HasSubstr("a_scale_stride = 3, b_scale_stride = 0, a_scale = set, "
                              "own_a_scale = null")));
}

}  // namespace
}  // namespace asynctp::kernels
