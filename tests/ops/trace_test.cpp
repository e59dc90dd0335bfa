// OpTrace (ops/trace.h): the step marks of the split paths, in the order the op takes its steps,
// and none while no trace is attached.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "ops/context.h"
#include "ops/fused_matmul.h"
#include "support/multiprocess.h"

namespace asynctp {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> labels_of(const std::vector<OpTrace::Mark>& marks) {
  std::vector<std::string> out;
  for (const auto& m : marks)
    out.push_back(m.label);
  return out;
}

TEST(OpTrace, MarksTheStepsOfBothSplitPathsInOrder) {
  auto statuses = testing::run_ranks(3, [](OpContext& ctx) {
    const int r = ctx.rank();
    OwnedTensor a_shard = empty_host({2, 4}, DType::kF32);
    OwnedTensor b = empty_host({4, 3}, DType::kF32);
    OwnedTensor gathered_out = empty_host({6, 3}, DType::kF32);
    OwnedTensor a = empty_host({6, 4}, DType::kF32);
    OwnedTensor scattered = empty_host({2, 3}, DType::kF32);
    for (OwnedTensor* t : {&a_shard, &b, &a}) {
      for (int64_t i = 0; i < (*t)->numel(); ++i)
        (*t)->data_as<float>()[i] = static_cast<float>((i + r) % 5);
    }
    const Tensor bs[] = {b.tensor};
    const Tensor outs[] = {gathered_out.tensor};

    OpTrace trace(ctx.backend());
    all_gather_matmul(ctx, a_shard, bs, outs);  // no trace attached: no marks
    EXPECT_TRUE(trace.read().empty());

    ctx.set_trace(&trace);
    all_gather_matmul(ctx, a_shard, bs, outs);
    ctx.set_trace(nullptr);
    const auto ag = trace.read();
    const int p1 = (r + 1) % 3, p2 = (r + 2) % 3;
    // Marks in the order the op enqueues them: the first push (to r-1) goes before the own GEMM,
    // the others after it.
    EXPECT_THAT(
        labels_of(ag),
        ElementsAre("call", "start", fmt::format("pushed to {}", p2), fmt::format("gemm {}", r),
                    fmt::format("pushed to {}", p1), fmt::format("gemm {}", p1),
                    fmt::format("gemm {}", p2), "joined", "end"));
    EXPECT_EQ(ag.front().device_ms, 0.0);
    EXPECT_EQ(ag.front().host_ms, 0.0);
    // On the device the marks of the compute stream come in order; a push's mark (on a flag
    // stream) falls anywhere before the op's end, which joins the flag streams.
    double compute_ms = 0.0;
    for (size_t i = 1; i < ag.size(); ++i) {
      EXPECT_GE(ag[i].host_ms, ag[i - 1].host_ms) << ag[i].label;
      EXPECT_LE(ag[i].device_ms, ag.back().device_ms) << ag[i].label;
      if (ag[i].label.starts_with("pushed to")) continue;
      EXPECT_GE(ag[i].device_ms, compute_ms) << ag[i].label;
      compute_ms = ag[i].device_ms;
    }

    trace.clear();
    ctx.set_trace(&trace);
    matmul_reduce_scatter(ctx, a, b, scattered);
    ctx.set_trace(nullptr);
    EXPECT_THAT(
        labels_of(trace.read()),
        ElementsAre("call", "start", fmt::format("gemm {}", p1), fmt::format("pushed to {}", p1),
                    fmt::format("gemm {}", p2), fmt::format("pushed to {}", p2),
                    fmt::format("gemm {}", r), "computed", "reduced", "end"));
  });
  EXPECT_RANKS_OK(statuses);
}

}  // namespace
}  // namespace asynctp
