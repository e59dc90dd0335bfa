// The graph's name index: find() agrees with the node list after appends, inserts in the middle,
// erasures and edits through mutable_nodes().
#include <gtest/gtest.h>

#include "core/error.h"
#include "graph/ir.h"

namespace asynctp::graph {
namespace {

Node named(const std::string& name) {
  Node n;
  n.name = name;
  n.target = "aten.relu.default";
  return n;
}

void expect_index_matches(const Graph& g) {
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_EQ(g.find(g.nodes()[i].name), &g.nodes()[i]) << g.nodes()[i].name;
    EXPECT_EQ(g.index_of(g.nodes()[i].name), i);
  }
}

TEST(GraphIndex, FindFollowsAppendsInsertsAndErasures) {
  Graph g;
  for (int i = 0; i < 100; ++i) {
    g.insert(g.size(), named(fmt::format("n{}", i)));
    ASSERT_NE(g.find(fmt::format("n{}", i)), nullptr);
  }
  expect_index_matches(g);
  g.insert(10, named("middle"));
  EXPECT_EQ(g.index_of("middle"), 10u);
  EXPECT_EQ(g.index_of("n10"), 11u);
  g.insert(g.size(), named("last"));
  expect_index_matches(g);
  g.erase("n0");
  EXPECT_EQ(g.find("n0"), nullptr);
  EXPECT_EQ(g.index_of("middle"), 9u);
  g.insert(g.size(), named("after_erase"));
  expect_index_matches(g);
  g.mutable_nodes().back().name = "renamed";
  EXPECT_EQ(g.find("after_erase"), nullptr);
  g.insert(g.size(), named("after_edit"));
  expect_index_matches(g);
  EXPECT_THROW(g.insert(g.size(), named("n5")), Error);
  EXPECT_THROW(g.insert(g.size() + 1, named("past_the_end")), Error);
  expect_index_matches(g);
}

}  // namespace
}  // namespace asynctp::graph
