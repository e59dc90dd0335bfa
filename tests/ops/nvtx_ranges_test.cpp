// The ops' NVTX ranges (device/nvtx.h): each call pushes one range in the asynctp domain, named
// after the op, the path it took and its operands, coloured by path, and pops it before it
// returns; a fallback's collectives nest inside it. Read through the test NVTX tool
// (support/nvtx_recorder.cpp), so these run as <test>/nvtx_tool (NVTX_TOOL, cmake/Targets.cmake)
// and skip without it. The side streams' names hold for every build.
#include <functional>
#include <string>
#include <vector>

#include "device/cpu_streams.h"
#include "device/nvtx.h"
#include "op_testing.h"
#include "support/nvtx_record.h"

namespace asynctp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::seeded;

// The NVTX events of `call`, which runs on ctx's stream.
std::vector<std::string> events_of(OpContext& ctx, const std::function<void()>& call) {
  testing::nvtx_clear_record();
  call();
  ctx.stream().synchronize();
  return testing::nvtx_record().value_or(std::vector<std::string>{"(no tool loaded)"});
}

bool tool_loaded() {
  return testing::nvtx_tool_named() && nvtx::compiled_in();
}

TEST(NvtxRangesTest, AllGatherMatmulNamesItsPathAndOperands) {
  if (!tool_loaded()) GTEST_SKIP() << "runs with the test NVTX tool (<test>/nvtx_tool)";
  auto statuses = testing::run_ranks(2, [](OpContext& ctx) {
    ASSERT_TRUE(nvtx::attached());  // loads the tool in this rank's process
    const OwnedTensor a = seeded({64, 16}, DType::kBF16, {1, uint64_t(ctx.rank())});
    const OwnedTensor b = seeded({16, 8}, DType::kBF16, {2});
    OwnedTensor out = empty_host({128, 8}, DType::kBF16);
    auto run = [&](PathChoice path) {
      return events_of(ctx, [&] { all_gather_matmul(ctx, a, b, out, {}, {.path = path}); });
    };
    const std::string operands = "A_shard bf16[64, 16] gather_dim 0, Bs [16, 8], ws 2";
    EXPECT_THAT(
        run(PathChoice::kNative),
        ElementsAre("push asynctp ff76b900 all_gather_matmul native: " + operands, "pop asynctp"));
    EXPECT_THAT(
        run(PathChoice::kSplit),
        ElementsAre("push asynctp ff1f77b4 all_gather_matmul split: " + operands, "pop asynctp"));
    EXPECT_THAT(run(PathChoice::kFallback),
                ElementsAre("push asynctp ffff7f0e all_gather_matmul fallback: " + operands,
                            "push asynctp ff8c8c8c all_gather: bf16[64, 16] dim 0, ws 2",
                            "pop asynctp", "pop asynctp"));
    // A call seen before (its path remembered, ops/call_memo.h) is named alike.
    EXPECT_THAT(
        run(PathChoice::kSplit),
        ElementsAre("push asynctp ff1f77b4 all_gather_matmul split: " + operands, "pop asynctp"));
  });
  EXPECT_RANKS_OK(statuses);
}

TEST(NvtxRangesTest, ScaledAndSeveralProductsSayWhichTheyAre) {
  if (!tool_loaded()) GTEST_SKIP() << "runs with the test NVTX tool (<test>/nvtx_tool)";
  auto statuses = testing::run_ranks(2, [](OpContext& ctx) {
    ASSERT_TRUE(nvtx::attached());
    const OwnedTensor a8 = seeded({64, 16}, DType::kF8E4M3, {3, uint64_t(ctx.rank())});
    const OwnedTensor a_scale =
        seeded({64, 1}, DType::kF32, {4, uint64_t(ctx.rank())}, testing::Values::kPositive);
    const OwnedTensor b8 = seeded({16, 8}, DType::kF8E4M3, {5});
    const OwnedTensor b_scale = seeded({1}, DType::kF32, {6}, testing::Values::kPositive);
    OwnedTensor out = empty_host({128, 8}, DType::kBF16);
    EXPECT_THAT(events_of(ctx,
                          [&] {
                            all_gather_scaled_matmul(ctx, a8, a_scale, b8, b_scale, out, {},
                                                     {.path = PathChoice::kSplit});
                          }),
                ElementsAre("push asynctp ff1f77b4 all_gather_scaled_matmul split: A_shard "
                            "f8e4m3[64, 16] gather_dim 0, Bs [16, 8], row-wise scales, ws 2",
                            "pop asynctp"));
    const OwnedTensor a = seeded({256, 16}, DType::kBF16, {7, uint64_t(ctx.rank())});
    const OwnedTensor b = seeded({16, 8}, DType::kBF16, {8});
    OwnedTensor chunk = empty_host({128, 8}, DType::kBF16);
    EXPECT_THAT(events_of(ctx,
                          [&] {
                            matmul_reduce_scatter(
                                ctx, a, b, chunk,
                                {.reduce_op = ReduceOp::kAvg, .path = PathChoice::kNative});
                          }),
                ElementsAre("push asynctp ff76b900 matmul_reduce_scatter native: A bf16[256, 16] "
                            "@ B [16, 8], scatter_dim 0, avg, ws 2",
                            "pop asynctp"));
    const Tensor as[] = {a, a};
    const Tensor bs[] = {b, b};
    EXPECT_THAT(
        events_of(ctx,
                  [&] { matmul_reduce_scatter(ctx, as, bs, chunk, {.path = PathChoice::kSplit}); }),
        ElementsAre("push asynctp ff1f77b4 matmul_reduce_scatter split: As bf16[256, 16] [256, "
                    "16] @ Bs [16, 8] [16, 8], scatter_dim 0, sum, ws 2",
                    "pop asynctp"));
    EXPECT_THAT(
        events_of(
            ctx, [&] { matmul_reduce_scatter(ctx, a, b, chunk, {.path = PathChoice::kFallback}); }),
        ElementsAre("push asynctp ffff7f0e matmul_reduce_scatter fallback: A bf16[256, "
                    "16] @ B [16, 8], scatter_dim 0, sum, ws 2",
                    "push asynctp ff8c8c8c reduce_scatter: bf16[256, 8] dim 0, sum, ws 2",
                    "pop asynctp", "pop asynctp"));
    OwnedTensor t = seeded({4, 4}, DType::kF32, {9});
    EXPECT_THAT(
        events_of(ctx, [&] { all_reduce(ctx, t, ReduceOp::kSum); }),
        ElementsAre("push asynctp ff8c8c8c all_reduce: f32[4, 4] sum, ws 2", "pop asynctp"));
  });
  EXPECT_RANKS_OK(statuses);
}

// The side streams carry their role and rank (the CUDA backend hands the name to NVTX; the CPU
// backend's stream errors say it).
TEST(NvtxRangesTest, SideStreamsAreNamedByRoleAndRank) {
  auto statuses = testing::run_ranks(2, [](OpContext& ctx) {
    EXPECT_THAT(cpu::as_cpu(ctx.copy_stream(), "test").name(),
                HasSubstr(fmt::format("(asynctp copy rank {})", ctx.rank())));
  });
  EXPECT_RANKS_OK(statuses);
}

}  // namespace
}  // namespace asynctp
