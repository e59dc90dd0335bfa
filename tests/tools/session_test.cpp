// tools/session.h: the orders in which the bench times its variants.
#include "tools/session.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <utility>

namespace asynctp::tools {
namespace {

// Every row a permutation; over all rows every ordered pair of distinct variants adjacent
// equally often (once in n rows for even n, twice in 2n for odd n).
TEST(BalancedOrders, EveryVariantFollowsEveryOtherEquallyOften) {
  for (size_t n = 1; n <= 13; ++n) {
    SCOPED_TRACE(n);
    const auto rows = balanced_orders(n);
    ASSERT_EQ(rows.size(), n % 2 == 0 ? n : 2 * n);
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

TEST(BalancedOrders, NoVariantsIsOneEmptyRound) {
  const auto rows = balanced_orders(0);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_TRUE(rows[0].empty());
}

}  // namespace
}  // namespace asynctp::tools
