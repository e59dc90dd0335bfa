// The ops' memo of calls seen before (ops/call_memo.h): keys tell apart every piece of metadata
// the checks and the choice read, and a call that hits a memo gives the same results, counts and
// errors as one that does not.
#include "ops/call_memo.h"

#include "ops/op_testing.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;  // NOLINT(google-build-using-namespace)
using ::testing::HasSubstr;

constexpr char kOp[] = "op";
constexpr char kOtherOp[] = "op";  // same text, another literal: another op

detail::CallMemo memo_of(Path path, int dim) {
  detail::CallMemo memo;
  memo.decision.path = path;
  memo.dim = dim;
  return memo;
}

TEST(CallMemosTest, KeysTellApartEveryPieceOfMetadata) {
  alignas(16) float data[65] = {};
  const Tensor base(data, DType::kF32, {4, 8});
  const std::vector<std::pair<std::string, Tensor>> variants = {
      {"shape", Tensor(data, DType::kF32, {8, 4})},
      {"strides", Tensor(data, DType::kF32, {4, 8}, {1, 4})},
      {"dtype", Tensor(data, DType::kBF16, {4, 8})},
      {"device", Tensor(data, DType::kF32, {4, 8}, Device::cuda(0))},
      {"device index", Tensor(data, DType::kF32, {4, 8}, Device::cuda(1))},
      {"rank", Tensor(data, DType::kF32, {1, 4, 8})},
      {"undefined", Tensor()},
      // What the native GEMM's alignment checks read of the pointer.
      {"offset from a 16-byte boundary", Tensor(data + 1, DType::kF32, {4, 8})},
  };
  detail::CallMemos memos;
  memos.start(kOp);
  memos.add(base);
  ASSERT_EQ(memos.find(), nullptr);
  memos.remember(memo_of(Path::kNative, 0));
  // The data pointer is not part of the key, only its offset from a 16-byte boundary.
  alignas(16) float other[64] = {};
  memos.start(kOp);
  memos.add(base.with_data(other));
  ASSERT_NE(memos.find(), nullptr);
  EXPECT_EQ(memos.find()->decision.path, Path::kNative);
  for (const auto& [what, t] : variants) {
    memos.start(kOp);
    memos.add(t);
    EXPECT_EQ(memos.find(), nullptr) << what;
  }
  memos.start(kOtherOp);
  memos.add(base);
  EXPECT_EQ(memos.find(), nullptr) << "another op";
  memos.start(kOp);
  memos.add(base);
  memos.add(1);
  EXPECT_EQ(memos.find(), nullptr) << "an option more";
  // A list's length is part of the key: [t] then nothing differs from [] then t.
  memos.start(kOp);
  memos.add(std::span<const Tensor>(&base, 1));
  memos.remember(memo_of(Path::kSplit, 1));
  memos.start(kOp);
  memos.add(std::span<const Tensor>());
  memos.add(base);
  EXPECT_EQ(memos.find(), nullptr);
}

TEST(CallMemosTest, StartsOverPastItsBound) {
  detail::CallMemos memos;
  for (int64_t i = 0; i <= static_cast<int64_t>(detail::CallMemos::kMaxMemos); ++i) {
    memos.start(kOp);
    memos.add(i);
    memos.remember(memo_of(Path::kSplit, 0));
  }
  EXPECT_EQ(memos.size(), 1u);
  memos.start(kOp);
  memos.add(int64_t{0});
  EXPECT_EQ(memos.find(), nullptr);
}

// Calls of one shape with new data each time, then a bad call of a shape seen before but one
// argument off, then a transposed B: every result against the reference, every error as on a
// first call.
TEST(CallMemosTest, OpsGiveTheSameResultsAndErrorsOnAHit) {
  auto statuses = run_ranks(2, [](OpContext& ctx) {
    Backend& be = ctx.backend();
    const int ws = ctx.world_size();
    const Dims shard{4, 6};
    for (int i = 0; i < 3; ++i) {
      const OwnedTensor a = seeded(shard, DType::kF32, {90, uint64_t(i), uint64_t(ctx.rank())});
      const OwnedTensor b = seeded({6, 5}, DType::kF32, {91, uint64_t(i)});
      OwnedTensor out = empty_host({4 * ws, 5}, DType::kF32);
      all_gather_matmul(ctx, a, b.tensor, out.tensor);
      std::vector<OwnedTensor> shards;
      for (int r = 0; r < ws; ++r)
        shards.push_back(seeded(shard, DType::kF32, {90, uint64_t(i), uint64_t(r)}));
      OwnedTensor expected = empty_host({4 * ws, 5}, DType::kF32);
      reference_gemm(be, concat(be, shards, 0), b, expected);
      EXPECT_TRUE(same_bits(out, expected)) << "call " << i;
    }
    const size_t memos = ctx.call_memos().size();
    EXPECT_GE(memos, 1u);
    EXPECT_EQ(ctx.usage().count("all_gather_matmul", Path::kSplit) +
                  ctx.usage().count("all_gather_matmul", Path::kNative),
              3);
    const OwnedTensor a = seeded(shard, DType::kF32, {92, uint64_t(ctx.rank())});
    const OwnedTensor b = seeded({6, 5}, DType::kF32, {93});
    const OwnedTensor bad_out = empty_host({4 * ws, 4}, DType::kF32);
    EXPECT_THAT(error_of([&] { all_gather_matmul(ctx, a, b.tensor, bad_out.tensor); }),
                HasSubstr("all_gather_matmul: outs[0] must have shape"));
    // B as the transpose of a [5, 6] matrix: new strides, a new memo, still right.
    const OwnedTensor bt = seeded({5, 6}, DType::kF32, {93});
    OwnedTensor out = empty_host({4 * ws, 5}, DType::kF32);
    all_gather_matmul(ctx, a, bt->t(), out.tensor);
    EXPECT_EQ(ctx.call_memos().size(), memos + 1);
    std::vector<OwnedTensor> shards;
    for (int r = 0; r < ws; ++r)
      shards.push_back(seeded(shard, DType::kF32, {92, uint64_t(r)}));
    OwnedTensor expected = empty_host({4 * ws, 5}, DType::kF32);
    reference_gemm(be, concat(be, shards, 0), bt->t(), expected);
    EXPECT_TRUE(same_bits(out, expected));

    // matmul_reduce_scatter: the same, and an avg after sums of the same shapes.
    const OwnedTensor ra = seeded({4 * ws, 6}, DType::kF32, {94, uint64_t(ctx.rank())});
    OwnedTensor rout = empty_host({4, 5}, DType::kF32);
    for (int i = 0; i < 2; ++i) {
      matmul_reduce_scatter(ctx, ra, b, rout);
    }
    MatmulReduceScatterOptions avg;
    avg.reduce_op = ReduceOp::kAvg;
    OwnedTensor rout_avg = empty_host({4, 5}, DType::kF32);
    matmul_reduce_scatter(ctx, ra, b, rout_avg, avg);
    std::vector<OwnedTensor> partials;
    for (int r = 0; r < ws; ++r) {
      partials.push_back(empty_host({4 * ws, 5}, DType::kF32));
      reference_gemm(be, seeded({4 * ws, 6}, DType::kF32, {94, uint64_t(r)}), b, partials.back());
    }
    OwnedTensor rs_expected = empty_host({4, 5}, DType::kF32);
    reference_reduce_scatter(be, rs_expected, partials, 0, ctx.rank(), ReduceOp::kSum);
    EXPECT_TRUE(same_bits(rout, rs_expected));
    reference_reduce_scatter(be, rs_expected, partials, 0, ctx.rank(), ReduceOp::kAvg);
    EXPECT_TRUE(same_bits(rout_avg, rs_expected));
    EXPECT_THAT(error_of([&] { matmul_reduce_scatter(ctx, ra, b, bad_out); }),
                HasSubstr("matmul_reduce_scatter: "));
  });
  EXPECT_RANKS_OK(statuses);
}

}  // namespace
}  // namespace asynctp
