// The warm-up that the dispatcher's sustained tuning and the bench share (ops/warm_up.h): every
// rank runs the same rounds, until every rank has spent the time asked for, however unequal the
// ranks' rounds; and max_over_ranks gives every rank the largest value.
#include "ops/warm_up.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "ops/op_testing.h"

namespace asynctp {
namespace {

TEST(WarmUpTest, EveryRankRunsTheSameRoundsUntilEachHasSpentTheTime) {
  auto statuses = testing::run_ranks(2, [](OpContext& ctx) {
    using Ms = std::chrono::duration<double, std::milli>;
    // Rank 1's rounds take three times rank 0's: rank 0 alone would need three times as many.
    const Ms length(ctx.rank() == 0 ? 2.0 : 6.0);
    const auto began = std::chrono::steady_clock::now();
    int64_t counted = 0;
    const int64_t rounds = warm_up_for(
        ctx,
        [&] {
          ++counted;
          std::this_thread::sleep_for(length);
        },
        100.0, began);
    EXPECT_GE(Ms(std::chrono::steady_clock::now() - began).count(), 100.0);
    EXPECT_EQ(rounds, counted);
    EXPECT_GE(rounds, 2);
    Store& store = ctx.group().store();
    store.set("test/warm_up/" + std::to_string(ctx.rank()), std::to_string(rounds));
    for (int r = 0; r < ctx.world_size(); ++r)
      EXPECT_EQ(store.get("test/warm_up/" + std::to_string(r)), std::to_string(rounds))
          << "rank " << r;
    EXPECT_EQ(max_over_ranks(ctx.group(), 10.0 * ctx.rank()), 10.0);
  });
  EXPECT_RANKS_OK(statuses);
}

// Time already spent (a warm-up that follows other rounds) counts: one round, to time a round,
// and no more.
TEST(WarmUpTest, TimeAlreadySpentCounts) {
  auto statuses = testing::run_ranks(2, [](OpContext& ctx) {
    const auto began = std::chrono::steady_clock::now() - std::chrono::seconds(1);
    int64_t counted = 0;
    EXPECT_EQ(warm_up_for(
                  ctx, [&] { ++counted; }, 100.0, began),
              1);
    EXPECT_EQ(counted, 1);
  });
  EXPECT_RANKS_OK(statuses);
}

}  // namespace
}  // namespace asynctp
