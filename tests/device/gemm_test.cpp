// The CPU backend's GEMM against a plain double-precision reference: layouts (row- and
// column-major operands through strided views), batching, accumulation over K slices, float8 with
// scales, and every output dtype; then validate_gemm's errors, each naming the bad argument.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "device/backend.h"
#include "device/cpu_backend.h"
#include "support/scaled_operands.h"
#include "support/tensor_testing.h"

namespace asynctp {
namespace {

using testing::error_of;
using testing::fill_seeded;
using testing::Float8Case;
using testing::get;
using ::testing::HasSubstr;
using testing::same_bits;
using testing::ScaledOperands;
using testing::seed_of;
using testing::Values;

enum class Layout { kRowMajor, kColMajor };

OwnedTensor make(Dims shape, DType dtype, Layout layout) {
  return layout == Layout::kRowMajor ? empty_host(shape, dtype)
                                     : testing::empty_transposed(shape, dtype);
}

// Element [bi, i, j] of a 2-D or 3-D operand (a 2-D one is shared by every batch entry).
float at(const Tensor& t, int64_t bi, int64_t i, int64_t j) {
  const int64_t cols = t.size(-1), rows = t.size(-2);
  const int64_t batch_index = t.dim() == 3 ? bi : 0;
  return get(t, (batch_index * rows + i) * cols + j);
}

// sum_k a[bi, i, k] * b[bi, k, j] in double.
double dot(const Tensor& a, const Tensor& b, int64_t bi, int64_t i, int64_t j) {
  double acc = 0;
  for (int64_t k = 0; k < a.size(-1); ++k)
    acc += double(at(a, bi, i, k)) * double(at(b, bi, k, j));
  return acc;
}

// The rounding of an f32 value into the output dtype, read back.
float round_to(DType dtype, float value) {
  OwnedTensor one = empty_host({1}, dtype);
  testing::set(one, 0, value);
  return get(one, 0);
}

class CpuGemmTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend_ = make_cpu_backend();

  // Runs the GEMM and waits for it: the tests read d next, and their operands often go with the
  // statement.
  void gemm(const GemmArgs& args) {
    backend_->gemm(args, backend_->compute_stream());
    backend_->compute_stream().synchronize();
  }

  // Integer inputs: every partial sum is exact, so the result must be the exact product rounded
  // once into d's dtype.
  void expect_exact(const Tensor& a, const Tensor& b, const Tensor& d) {
    const int64_t batch = d.dim() == 3 ? d.size(0) : 1;
    for (int64_t bi = 0; bi < batch; ++bi) {
      for (int64_t i = 0; i < d.size(-2); ++i) {
        for (int64_t j = 0; j < d.size(-1); ++j) {
          const float expected = round_to(d.dtype(), static_cast<float>(dot(a, b, bi, i, j)));
          ASSERT_EQ(at(d, bi, i, j), expected) << "at [" << bi << ", " << i << ", " << j << "]";
        }
      }
    }
  }
};

struct LayoutCase {
  Layout a, b, d;
};

void PrintTo(const LayoutCase& c, std::ostream* os) {
  auto name = [](Layout l) { return l == Layout::kRowMajor ? "row-major" : "column-major"; };
  *os << "A " << name(c.a) << ", B " << name(c.b) << ", D " << name(c.d);
}

class CpuGemmLayoutTest : public CpuGemmTest, public ::testing::WithParamInterface<LayoutCase> {};

TEST_P(CpuGemmLayoutTest, TwoDimensionalMatchesReference) {
  const auto [la, lb, ld] = GetParam();
  OwnedTensor a = make({5, 7}, DType::kF32, la);
  OwnedTensor b = make({7, 3}, DType::kF32, lb);
  OwnedTensor d = make({5, 3}, DType::kF32, ld);
  fill_seeded(a, seed_of({1}), Values::kSmallInts);
  fill_seeded(b, seed_of({2}), Values::kSmallInts);
  gemm({a, b, d});
  expect_exact(a, b, d);
}

TEST_P(CpuGemmLayoutTest, RandomValuesWithinRoundingOfReference) {
  const auto [la, lb, ld] = GetParam();
  const int64_t m = 4, k = 33, n = 6;
  OwnedTensor a = make({m, k}, DType::kF32, la);
  OwnedTensor b = make({k, n}, DType::kF32, lb);
  OwnedTensor d = make({m, n}, DType::kF32, ld);
  fill_seeded(a, seed_of({3}), Values::kRandom);
  fill_seeded(b, seed_of({4}), Values::kRandom);
  gemm({a, b, d});
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double magnitude = 0;
      for (int64_t kk = 0; kk < k; ++kk)
        magnitude += std::fabs(at(a, 0, i, kk) * at(b, 0, kk, j));
      EXPECT_NEAR(at(d, 0, i, j), dot(a, b, 0, i, j), 1e-6 * k * magnitude + 1e-30);
    }
  }
}

TEST_P(CpuGemmLayoutTest, BatchedMatchesReference) {
  const auto [la, lb, ld] = GetParam();
  OwnedTensor a = make({3, 4, 5}, DType::kF32, la);
  OwnedTensor b = make({3, 5, 2}, DType::kF32, lb);
  OwnedTensor d = make({3, 4, 2}, DType::kF32, ld);
  fill_seeded(a, seed_of({5}), Values::kSmallInts);
  fill_seeded(b, seed_of({6}), Values::kSmallInts);
  gemm({a, b, d});
  expect_exact(a, b, d);
}

TEST_P(CpuGemmLayoutTest, SharedTwoDimensionalB) {
  const auto [la, lb, ld] = GetParam();
  OwnedTensor a = make({3, 4, 5}, DType::kF32, la);
  OwnedTensor b = make({5, 2}, DType::kF32, lb);
  OwnedTensor d = make({3, 4, 2}, DType::kF32, ld);
  fill_seeded(a, seed_of({7}), Values::kSmallInts);
  fill_seeded(b, seed_of({8}), Values::kSmallInts);
  gemm({a, b, d});
  expect_exact(a, b, d);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, CpuGemmLayoutTest,
    ::testing::Values(LayoutCase{Layout::kRowMajor, Layout::kRowMajor, Layout::kRowMajor},
                      LayoutCase{Layout::kColMajor, Layout::kRowMajor, Layout::kRowMajor},
                      LayoutCase{Layout::kRowMajor, Layout::kColMajor, Layout::kRowMajor},
                      LayoutCase{Layout::kColMajor, Layout::kColMajor, Layout::kRowMajor},
                      LayoutCase{Layout::kRowMajor, Layout::kRowMajor, Layout::kColMajor},
                      LayoutCase{Layout::kColMajor, Layout::kColMajor, Layout::kColMajor}),
    [](const auto& info) {
      auto name = [](Layout l) { return l == Layout::kRowMajor ? "R" : "C"; };
      return fmt::format("A{}_B{}_D{}", name(info.param.a), name(info.param.b), name(info.param.d));
    });

TEST_F(CpuGemmTest, PaddedRowsAndBatchSlices) {
  // Operands that are views into larger allocations: padded rows, every other batch entry.
  OwnedTensor a = testing::empty_padded({4, 3, 5}, DType::kF32, 3);
  OwnedTensor b_storage = empty_host({4, 5, 2}, DType::kF32);
  const Tensor b = b_storage->narrow(0, 1, 2);  // batch entries 1 and 2
  OwnedTensor d = testing::empty_padded({2, 3, 2}, DType::kF32, 1);
  fill_seeded(a, seed_of({9}), Values::kSmallInts);
  fill_seeded(b_storage, seed_of({10}), Values::kSmallInts);
  const Tensor a_view = a->narrow(0, 2, 2);
  gemm({a_view, b, d});
  expect_exact(a_view, b, d);
}

TEST_F(CpuGemmTest, OutputDtypesRoundOnce) {
  for (DType in : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (DType out : {DType::kF32, DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(fmt::format("{} x {} -> {}", in, in, out));
      OwnedTensor a = empty_host({3, 9}, in);
      OwnedTensor b = empty_host({9, 4}, in);
      OwnedTensor d = empty_host({3, 4}, out);
      // Large integers: the exact sums need more bits than bf16 has, so rounding is visible.
      for (int64_t i = 0; i < a->numel(); ++i)
        testing::set(a, i, float(17 + 13 * (i % 11)));
      fill_seeded(b, seed_of({11}), Values::kSmallInts);
      gemm({a, b, d});
      expect_exact(a, b, d);
    }
  }
}

TEST_F(CpuGemmTest, AccumulateOverKSlicesGivesTheSameBitsAsOneGemm) {
  const int64_t m = 5, k = 24, n = 7;
  OwnedTensor a = empty_host({m, k}, DType::kF32);
  OwnedTensor b = empty_host({k, n}, DType::kF32);
  fill_seeded(a, seed_of({12}), Values::kRandom);
  fill_seeded(b, seed_of({13}), Values::kRandom);
  OwnedTensor whole = empty_host({m, n}, DType::kF32);
  gemm({a, b, whole});
  for (const std::vector<int64_t>& cuts :
       {std::vector<int64_t>{0, 12, 24}, std::vector<int64_t>{0, 1, 9, 10, 24},
        std::vector<int64_t>{0, 6, 12, 18, 24}}) {
    SCOPED_TRACE(fmt::format("K cut at {}", fmt::join(cuts, ", ")));
    OwnedTensor pieces = empty_host({m, n}, DType::kF32);
    for (size_t p = 0; p + 1 < cuts.size(); ++p) {
      const int64_t len = cuts[p + 1] - cuts[p];
      GemmArgs args{a->narrow(1, cuts[p], len), b->narrow(0, cuts[p], len), pieces};
      args.accumulate = p > 0;
      gemm(args);
    }
    EXPECT_TRUE(same_bits(pieces, whole));
  }
}

TEST_F(CpuGemmTest, AccumulateAddsToExistingValues) {
  OwnedTensor a = empty_host({2, 3}, DType::kF32);
  OwnedTensor b = empty_host({3, 2}, DType::kF32);
  OwnedTensor d = empty_host({2, 2}, DType::kBF16);
  fill_seeded(a, seed_of({14}), Values::kSmallInts);
  fill_seeded(b, seed_of({15}), Values::kSmallInts);
  testing::fill_value(d, 100.0f);
  GemmArgs args{a, b, d};
  args.accumulate = true;
  gemm(args);
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 2; ++j)
      EXPECT_EQ(at(d, 0, i, j), 100.0 + dot(a, b, 0, i, j));
  }
}

TEST_F(CpuGemmTest, EmptyDimensions) {
  // K = 0: the product is zero (or D unchanged when accumulating).
  OwnedTensor a = empty_host({3, 0}, DType::kF32);
  OwnedTensor b = empty_host({0, 2}, DType::kF32);
  OwnedTensor d = empty_host({3, 2}, DType::kBF16);
  testing::fill_value(d, 5.0f);
  GemmArgs acc{a, b, d};
  acc.accumulate = true;
  gemm(acc);
  for (int64_t i = 0; i < 6; ++i)
    EXPECT_EQ(get(d, i), 5.0f);
  gemm({a, b, d});
  for (int64_t i = 0; i < 6; ++i)
    EXPECT_EQ(get(d, i), 0.0f);
  // M = 0 and N = 0 (also batched with a shared B): nothing to write, nothing to read past.
  OwnedTensor a2 = empty_host({2, 0, 4}, DType::kF32);
  OwnedTensor b2 = empty_host({4, 3}, DType::kF32);
  OwnedTensor d2 = empty_host({2, 0, 3}, DType::kF32);
  EXPECT_NO_THROW(gemm({a2, b2, d2}));
  OwnedTensor a3 = empty_host({2, 3, 4}, DType::kF32);
  OwnedTensor b3 = empty_host({4, 0}, DType::kF32);
  OwnedTensor d3 = empty_host({2, 3, 0}, DType::kF32);
  fill_seeded(a3, seed_of({20}), Values::kRandom);
  EXPECT_NO_THROW(gemm({a3, b3, d3}));
}

class CpuScaledGemmTest : public CpuGemmTest, public ::testing::WithParamInterface<Float8Case> {};

TEST_P(CpuScaledGemmTest, MatchesReferenceScaledInDocumentedOrder) {
  const Float8Case c = GetParam();
  const int64_t batch = c.batched ? 2 : 1, m = 3, k = 8, n = 5;
  const ScaledOperands in(c, batch, m, k, n, Values::kQuarters, 16);
  OwnedTensor d = empty_host(in.d_shape, c.out);
  gemm(in.args(d));
  for (int64_t bi = 0; bi < batch; ++bi) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        // Products of quarters are exact, and so is their f32 sum; then the two scale
        // multiplications, in f32 and in this order, and one rounding into the output dtype.
        float expected = static_cast<float>(dot(in.a, in.b, bi, i, j));
        expected = expected * get(in.sa, c.rowwise ? bi * m + i : 0);
        expected = expected * get(in.sb, c.colwise ? j : 0);
        EXPECT_EQ(at(d, bi, i, j), round_to(c.out, expected))
            << "at [" << bi << ", " << i << ", " << j << "]";
      }
    }
  }
}

// fast_accum is a permission the reference leaves unused: random float8 values (whose f32 sums
// round), a fast call gives the exact call's bits.
TEST_P(CpuScaledGemmTest, FastAccumulationGivesTheExactBits) {
  const Float8Case c = GetParam();
  const ScaledOperands in(c, c.batched ? 2 : 1, 4, 96, 6, Values::kRandom, 21);
  OwnedTensor exact = empty_host(in.d_shape, c.out);
  OwnedTensor fast = empty_host(in.d_shape, c.out);
  gemm(in.args(exact));
  GemmArgs args = in.args(fast);
  args.fast_accum = true;
  gemm(args);
  EXPECT_TRUE(same_bits(fast, exact));
}

INSTANTIATE_TEST_SUITE_P(
    Float8, CpuScaledGemmTest,
    ::testing::Values(Float8Case{DType::kF8E4M3, DType::kF8E4M3, DType::kF32, false, false, false},
                      Float8Case{DType::kF8E4M3, DType::kF8E4M3, DType::kBF16, true, false, false},
                      Float8Case{DType::kF8E4M3, DType::kF8E4M3, DType::kF16, false, true, false},
                      Float8Case{DType::kF8E4M3, DType::kF8E4M3, DType::kBF16, true, true, true},
                      Float8Case{DType::kF8E5M2, DType::kF8E5M2, DType::kF32, true, true, false},
                      Float8Case{DType::kF8E5M2, DType::kF8E5M2, DType::kF16, false, false, true},
                      Float8Case{DType::kF8E4M3, DType::kF8E5M2, DType::kBF16, true, true, false},
                      Float8Case{DType::kF8E5M2, DType::kF8E4M3, DType::kF32, false, true, true}),
    [](const auto& info) {
      const Float8Case& c = info.param;
      return fmt::format("{}x{}_to_{}_{}_{}{}", c.a_dtype, c.b_dtype, c.out,
                         c.rowwise ? "rowwise" : "tensorwise", c.colwise ? "colwise" : "tensorwise",
                         c.batched ? "_batched" : "");
    });

// --- validate_gemm: each failure names the bad argument -------------------------------------

class ValidateGemmTest : public ::testing::Test {
 protected:
  OwnedTensor a_ = empty_host({4, 3}, DType::kF32);
  OwnedTensor b_ = empty_host({3, 2}, DType::kF32);
  OwnedTensor d_ = empty_host({4, 2}, DType::kF32);
  OwnedTensor a8_ = empty_host({4, 3}, DType::kF8E4M3);
  OwnedTensor b8_ = empty_host({3, 2}, DType::kF8E4M3);
  OwnedTensor one_ = empty_host({1}, DType::kF32);

  static std::string check(const GemmArgs& args) {
    return error_of([&] { validate_gemm(args); });
  }
  GemmArgs scaled() const {
    GemmArgs args{a8_, b8_, d_};
    args.a_scale = one_;
    args.b_scale = one_;
    return args;
  }
};

TEST_F(ValidateGemmTest, AcceptsWellFormedArguments) {
  EXPECT_NO_THROW(validate_gemm({a_, b_, d_}));
  EXPECT_NO_THROW(validate_gemm(scaled()));
}

TEST_F(ValidateGemmTest, MissingOperand) {
  EXPECT_THAT(check({a_, Tensor(), d_}), HasSubstr("a, b and d must all be given"));
}

TEST_F(ValidateGemmTest, OperandRanks) {
  OwnedTensor a1 = empty_host({12}, DType::kF32);
  EXPECT_THAT(check({a1, b_, d_}), HasSubstr("a must be 2-D or 3-D, got f32[12]"));
  OwnedTensor a4 = empty_host({1, 1, 4, 3}, DType::kF32);
  EXPECT_THAT(check({a4, b_, d_}), HasSubstr("a must be 2-D or 3-D, got f32[1, 1, 4, 3]"));
  OwnedTensor d3 = empty_host({1, 4, 2}, DType::kF32);
  EXPECT_THAT(check({a_, b_, d3}), HasSubstr("d f32[1, 4, 2]"));
  EXPECT_THAT(check({a_, b_, d3}), HasSubstr("must have a's rank (2)"));
  OwnedTensor b3 = empty_host({1, 3, 2}, DType::kF32);
  EXPECT_THAT(check({a_, b3, d_}), HasSubstr("b f32[1, 3, 2]"));
}

TEST_F(ValidateGemmTest, BatchSizes) {
  OwnedTensor a = empty_host({2, 4, 3}, DType::kF32);
  OwnedTensor d = empty_host({3, 4, 2}, DType::kF32);
  EXPECT_THAT(check({a, b_, d}), HasSubstr("batch of a (2) and d (3) differ"));
  OwnedTensor d2 = empty_host({2, 4, 2}, DType::kF32);
  OwnedTensor b = empty_host({5, 3, 2}, DType::kF32);
  EXPECT_THAT(check({a, b, d2}), HasSubstr("batch of a (2) and b (5) differ"));
}

TEST_F(ValidateGemmTest, MatrixSizes) {
  OwnedTensor d5 = empty_host({5, 2}, DType::kF32);
  EXPECT_THAT(check({a_, b_, d5}), HasSubstr("a has 4 rows but d has 5"));
  OwnedTensor b4 = empty_host({4, 2}, DType::kF32);
  EXPECT_THAT(check({a_, b4, d_}), HasSubstr("a's inner dim 3 differs from b's 4 rows"));
  OwnedTensor d3 = empty_host({4, 3}, DType::kF32);
  EXPECT_THAT(check({a_, b_, d3}), HasSubstr("b has 2 columns but d has 3"));
}

TEST_F(ValidateGemmTest, OutputDtype) {
  OwnedTensor d8 = empty_host({4, 2}, DType::kF8E5M2);
  EXPECT_THAT(check({a_, b_, d8}), HasSubstr("output dtype must be f32, bf16 or f16, got f8e5m2"));
}

TEST_F(ValidateGemmTest, NoUnitStride) {
  OwnedTensor storage = empty_host({8, 6}, DType::kF32);
  const Tensor strided(storage->data(), DType::kF32, {4, 3}, {12, 2});
  EXPECT_THAT(check({strided, b_, d_}), HasSubstr("operand f32[4, 3] strides [12, 2]"));
  EXPECT_THAT(check({strided, b_, d_}), HasSubstr("no unit stride"));
}

TEST_F(ValidateGemmTest, Dtypes) {
  OwnedTensor b16 = empty_host({3, 2}, DType::kBF16);
  EXPECT_THAT(check({a_, b16, d_}), HasSubstr("a is f32 but b is bf16"));
  GemmArgs mixed{a8_, b_, d_};
  mixed.a_scale = one_;
  mixed.b_scale = one_;
  EXPECT_THAT(check(mixed), HasSubstr("both operands in float8, got a f8e4m3 and b f32"));
  GemmArgs with_scales{a_, b_, d_};
  with_scales.a_scale = one_;
  EXPECT_THAT(check(with_scales), HasSubstr("scales are only for float8 operands (a is f32)"));
}

TEST_F(ValidateGemmTest, Float8Scales) {
  EXPECT_THAT(check({a8_, b8_, d_}), HasSubstr("float8 operands need a_scale and b_scale"));
  GemmArgs acc = scaled();
  acc.accumulate = true;
  EXPECT_THAT(check(acc), HasSubstr("accumulate is not supported with scales"));
  OwnedTensor bf = empty_host({1}, DType::kBF16);
  GemmArgs dtype = scaled();
  dtype.b_scale = bf;
  EXPECT_THAT(check(dtype), HasSubstr("scales must be f32, got a_scale f32 and b_scale bf16"));
  OwnedTensor rows = empty_host({4}, DType::kF32);
  GemmArgs rowwise = scaled();
  rowwise.a_scale = rows;
  EXPECT_THAT(check(rowwise), HasSubstr("row-wise a_scale must have shape [4, 1]"));
  EXPECT_THAT(check(rowwise), HasSubstr("got f32[4]"));
  OwnedTensor cols = empty_host({2, 1}, DType::kF32);
  GemmArgs colwise = scaled();
  colwise.b_scale = cols;
  EXPECT_THAT(check(colwise),
              HasSubstr("column-wise b_scale must have shape [1, 2], got f32[2, 1]"));
}

}  // namespace
}  // namespace asynctp
