// core/balanced_orders.h: the orders in which the bench and the dispatcher time their variants.
#include "core/balanced_orders.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <utility>

namespace asynctp {
namespace {

// Every row a permutation; over all rows every ordered pair of distinct variants adjacent
// equally often (once in n rows for even n, twice in 2n for odd n).
TEST(BalancedOrders, EveryVariantFollowsEveryOtherEquallyOften) {
  for (size_t n = 1; n <= 13; ++n) {
    SCOPED_TRACE(n);
    const auto rows = balanced_orders(n);
    ASSERT_EQ(rows.size(), n % 2 == 0 ? n : 2 * n);
    EXPECT_EQ(balanced_order_rows(n), rows.size());
    std::map<std::pair<size_t, size_t>, int> adjacent;
    for (const auto& row : rows) {
      std::vector<size_t> sorted = row;
      std::sort(sorted.begin(), sorted.end());
      std::vector<size_t> all(n);
      std::iota(all.begin(), all.end(), size_t{0});
      ASSERT_EQ(sorted, all);
      for (size_t j = 1; j < n; ++j)
        ++adjacent[{row[j - 1], row[j]}];
    }
    const int want = n % 2 == 0 ? 1 : 2;
    EXPECT_EQ(adjacent.size(), n * (n - 1));
    for (const auto& [pair, count] : adjacent)
      EXPECT_EQ(count, want) << pair.first << " then " << pair.second;
  }
}

// The rounds as the timing loop joins them: round_order's strides change the pair across the
// boundary between rounds from block to block. For an even number of variants, over the first
// `blocks` blocks (as many as there are strides, up to 3) every ordered pair of distinct
// variants is adjacent `blocks` or `blocks` + 1 times; visiting the rows in the same order in
// every block (stride 1 throughout) gives one pair per variant 2 x `blocks` times.
TEST(BalancedOrders, BoundariesBetweenRoundsChangeFromBlockToBlock) {
  for (size_t n = 4; n <= 16; n += 2) {
    SCOPED_TRACE(n);
    const auto rows = balanced_orders(n);
    const int blocks = n <= 6 ? 2 : 3;  // strides coprime to 4: 1, 3; to 6: 1, 5
    auto adjacent_counts = [&](bool strided) {
      std::vector<size_t> runs;
      for (size_t i = 0; i < blocks * rows.size(); ++i) {
        const auto& row = strided ? round_order(rows, i) : rows[i % rows.size()];
        runs.insert(runs.end(), row.begin(), row.end());
      }
      std::map<std::pair<size_t, size_t>, int> adjacent;
      for (size_t j = 1; j < runs.size(); ++j)
        ++adjacent[{runs[j - 1], runs[j]}];
      return adjacent;
    };
    const auto joined = adjacent_counts(true);
    EXPECT_EQ(joined.size(), n * (n - 1)) << "a variant ran twice in a row";
    for (const auto& [pair, count] : joined) {
      EXPECT_GE(count, blocks) << pair.first << " then " << pair.second;
      EXPECT_LE(count, blocks + 1) << pair.first << " then " << pair.second;
    }
    int most = 0;
    for (const auto& [pair, count] : adjacent_counts(false))
      most = std::max(most, count);
    EXPECT_EQ(most, 2 * blocks);
  }
  // Every order round_order gives is one of the rows, for any count of variants.
  for (size_t n = 1; n <= 9; ++n) {
    const auto rows = balanced_orders(n);
    for (size_t i = 0; i < 5 * rows.size(); ++i)
      EXPECT_NE(std::find(rows.begin(), rows.end(), round_order(rows, i)), rows.end());
  }
}

TEST(BalancedOrders, NoVariantsIsOneEmptyRound) {
  const auto rows = balanced_orders(0);
  EXPECT_EQ(balanced_order_rows(0), rows.size());
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_TRUE(rows[0].empty());
  EXPECT_TRUE(round_order(rows, 7).empty());
}

}  // namespace
}  // namespace asynctp
