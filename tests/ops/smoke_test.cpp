#include <gtest/gtest.h>

#include "ops/fused_matmul.h"
#include "support/multiprocess.h"

namespace asynctp {
namespace {

TEST(OpsSmoke, AllGatherMatmulRunsFusedOnFourRanks) {
  auto statuses = testing::run_ranks(4, [](OpContext& ctx) {
    OwnedTensor a = empty_host({2, 3}, DType::kF32);
    OwnedTensor b = empty_host({3, 2}, DType::kF32);
    OwnedTensor out = empty_host({8, 2}, DType::kF32);
    for (int i = 0; i < 6; ++i)
      a->data_as<float>()[i] = static_cast<float>(ctx.rank() * 6 + i);
    for (int i = 0; i < 6; ++i)
      b->data_as<float>()[i] = static_cast<float>(i == 0 || i == 3);
    const Tensor bs[] = {b.tensor};
    const Tensor outs[] = {out.tensor};
    all_gather_matmul(ctx, a, bs, outs);
    ctx.stream().synchronize();  // the op runs on the context's stream; the host reads `out`
    EXPECT_EQ(ctx.usage().count("all_gather_matmul", Path::kSplit), 1);
    // Row r of the gathered A is [3r, 3r+1, 3r+2]; B picks columns 0 and 1.
    for (int r = 0; r < 8; ++r) {
      EXPECT_EQ(out->data_as<float>()[2 * r], 3.0f * r);
      EXPECT_EQ(out->data_as<float>()[2 * r + 1], 3.0f * r + 1);
    }
  });
  EXPECT_RANKS_OK(statuses);
}

}  // namespace
}  // namespace asynctp
