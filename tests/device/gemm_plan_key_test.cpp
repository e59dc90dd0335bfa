// gemm_plan_key: equal calls share a key, and every property a cached plan depends on (fast
// accumulation above all: a fast plan must never serve an exact call, nor the reverse) gives
// another key.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "device/gemm_plan_key.h"
#include "support/tensor_testing.h"

namespace asynctp {
namespace {

// [batch, rows, cols] views over one host allocation, at `offset` bytes.
class GemmPlanKeyTest : public ::testing::Test {
 protected:
  Tensor view(DType dtype, Dims shape, Dims strides, size_t offset = 0) {
    return Tensor(static_cast<char*>(storage_.tensor.data()) + offset, dtype, std::move(shape),
                  std::move(strides), Device::cpu());
  }
  Tensor a(size_t offset = 0) { return view(DType::kF8E4M3, {1, 64, 32}, {2048, 32, 1}, offset); }
  // Column-major [32, 48] (a transposed [48, 32]).
  Tensor b() { return view(DType::kF8E4M3, {1, 32, 48}, {1536, 1, 32}); }
  Tensor d() { return view(DType::kBF16, {1, 64, 48}, {3072, 48, 1}); }

  OwnedTensor storage_ = empty_host({1 << 16}, DType::kF32);
};

TEST_F(GemmPlanKeyTest, EqualCallsShareAKey) {
  const GemmPlanKey k1 = gemm_plan_key(a(), b(), d(), false, 1, true);
  const GemmPlanKey k2 = gemm_plan_key(a(), b(), d(), false, 1, true);
  EXPECT_EQ(k1, k2);
  EXPECT_EQ(GemmPlanKeyHash{}(k1), GemmPlanKeyHash{}(k2));
}

TEST_F(GemmPlanKeyTest, FastAccumulationIsPartOfTheKey) {
  for (int scale_mode : {0, 1, 2}) {
    const GemmPlanKey exact = gemm_plan_key(a(), b(), d(), false, scale_mode, false);
    const GemmPlanKey fast = gemm_plan_key(a(), b(), d(), false, scale_mode, true);
    EXPECT_NE(exact, fast) << "scale mode " << scale_mode;
  }
}

TEST_F(GemmPlanKeyTest, EveryPropertyOfTheCallChangesTheKey) {
  const GemmPlanKey base = gemm_plan_key(a(), b(), d(), false, 1, false);
  const std::vector<std::pair<std::string, std::function<GemmPlanKey()>>> variants = {
      {"a's dtype",
       [&] {
         return gemm_plan_key(view(DType::kF8E5M2, {1, 64, 32}, {2048, 32, 1}), b(), d(), false, 1,
                              false);
       }},
      {"b's dtype",
       [&] {
         return gemm_plan_key(a(), view(DType::kF8E5M2, {1, 32, 48}, {1536, 1, 32}), d(), false, 1,
                              false);
       }},
      {"d's dtype",
       [&] {
         return gemm_plan_key(a(), b(), view(DType::kF32, {1, 64, 48}, {3072, 48, 1}), false, 1,
                              false);
       }},
      {"m",
       [&] {
         return gemm_plan_key(view(DType::kF8E4M3, {1, 32, 32}, {1024, 32, 1}), b(),
                              view(DType::kBF16, {1, 32, 48}, {1536, 48, 1}), false, 1, false);
       }},
      {"a's row stride (padded rows)",
       [&] {
         return gemm_plan_key(view(DType::kF8E4M3, {1, 64, 32}, {4096, 64, 1}), b(), d(), false, 1,
                              false);
       }},
      {"b's layout (row-major)",
       [&] {
         return gemm_plan_key(a(), view(DType::kF8E4M3, {1, 32, 48}, {1536, 48, 1}), d(), false, 1,
                              false);
       }},
      {"the batch",
       [&] {
         return gemm_plan_key(view(DType::kF8E4M3, {2, 64, 32}, {2048, 32, 1}), b(),
                              view(DType::kBF16, {2, 64, 48}, {3072, 48, 1}), false, 1, false);
       }},
      {"a's alignment", [&] { return gemm_plan_key(a(16), b(), d(), false, 1, false); }},
      {"accumulate", [&] { return gemm_plan_key(a(), b(), d(), true, 1, false); }},
      {"the scale mode", [&] { return gemm_plan_key(a(), b(), d(), false, 2, false); }},
      {"fast accumulation", [&] { return gemm_plan_key(a(), b(), d(), false, 1, true); }},
  };
  for (const auto& [what, make] : variants)
    EXPECT_NE(make(), base) << what;
}

TEST(PointerAlignment, LargestPowerOfTwoUpTo256) {
  alignas(512) static char buffer[1024];
  EXPECT_EQ(pointer_alignment(buffer), 256);
  EXPECT_EQ(pointer_alignment(buffer + 128), 128);
  EXPECT_EQ(pointer_alignment(buffer + 48), 16);
  EXPECT_EQ(pointer_alignment(buffer + 6), 2);
  EXPECT_EQ(pointer_alignment(buffer + 7), 1);
}

TEST_F(GemmPlanKeyTest, OperandsMustBeBatched) {
  const Tensor a2 = view(DType::kF8E4M3, {64, 32}, {32, 1});
  EXPECT_THROW(gemm_plan_key(a2, b(), d(), false, 1, false), Error);
}

}  // namespace
}  // namespace asynctp
