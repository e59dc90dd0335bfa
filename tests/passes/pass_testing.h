// Shared checks of the pass tests: run a graph before and after the passes on CPU ranks (the
// real multi-process harness) and compare every output.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "graph/compare.h"
#include "graph/executor.h"
#include "graph/inputs.h"
#include "graph/json_io.h"
#include "passes/graph_edit.h"
#include "passes/pipeline.h"
#include "support/multiprocess.h"

namespace asynctp::testing {

// Every rank runs both graphs on the same seeded inputs; outputs must agree within `tolerance`
// (< 0: the dtype's default), 0 meaning bit for bit.
inline void expect_same_outputs(const graph::Graph& original, const graph::Graph& transformed,
                                double tolerance = -1, uint64_t seed = 7) {
  auto statuses = run_ranks(original.world_size, [&](OpContext& ctx) {
    const graph::Inputs inputs = graph::random_inputs(original, ctx.rank(), seed);
    const auto ref = graph::execute(ctx, original, inputs);
    const auto got = graph::execute(ctx, transformed, inputs);
    for (const auto& d : graph::compare_outputs(got, ref, tolerance)) {
      EXPECT_TRUE(d.ok) << "output " << d.index << " (" << d.dtype << "): relative error "
                        << d.rel_error << " > " << d.tolerance << " " << d.note;
    }
  });
  EXPECT_RANKS_OK(statuses);
}

// How many collectives PyTorch's own pass fused: collectives in `pre` minus those left in `post`.
inline int collectives_of(const graph::Graph& g) {
  int n = 0;
  for (const auto& node : g.nodes()) {
    n += node.target == "_c10d_functional.all_gather_into_tensor.default" ||
         node.target == "_c10d_functional.reduce_scatter_tensor.default";
  }
  return n;
}

inline int count_target(const graph::Graph& g, const std::string& target) {
  int n = 0;
  for (const auto& node : g.nodes())
    n += node.target == target;
  return n;
}

}  // namespace asynctp::testing
