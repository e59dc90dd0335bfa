// Random graphs through the passes: random mixes of gathers feeding matmuls (2-D and sequence-dim
// 3-D), matmuls and sums of matmuls feeding reduce-scatters, parameter gathers, elementwise ops,
// extra uses of gathered tensors and products; random pass options and bucket caps. Every
// transformed graph must be valid, topologically sorted, report every collective once, and give
// the same outputs as the original on 2 CPU ranks.
#include <random>

#include "graph/graph_builder.h"
#include "passes/pass_testing.h"

namespace asynctp::testing {
namespace {

constexpr int kWs = 2;
constexpr int kGraphs = 150;

graph::Graph random_graph(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](const std::vector<std::string>& v) { return v[rng() % v.size()]; };
  GraphBuilder b(kWs);
  std::vector<std::string> shards{b.input("x", {4, 8})};  // [T/ws, H]
  std::vector<std::string> fulls{b.input("y", {8, 8})};   // [T, H]
  std::vector<std::string> outs;
  const int steps = 3 + static_cast<int>(rng() % 6);
  for (int s = 0; s < steps; ++s) {
    switch (rng() % 7) {
      case 0: {  // gather -> 1..3 matmuls, maybe another use of the gathered tensor
        const auto g = b.all_gather(pick(shards), 0);
        for (int i = 0, n = 1 + static_cast<int>(rng() % 3); i < n; ++i)
          fulls.push_back(b.mm(g, b.input("w", {8, 8})));
        if (rng() % 2)
          outs.push_back(b.call("neg", "aten.neg.default", {node(g)}, {8, 8}, "float32"));
        break;
      }
      case 1: {  // matmul -> reduce-scatter, maybe with another use of the product
        const auto p = b.mm(pick(fulls), b.permute2d(b.input("w", {8, 8})));
        shards.push_back(b.reduce_scatter(p, 0));
        if (rng() % 4 == 0) outs.push_back(p);
        break;
      }
      case 2: {  // sum of matmuls -> reduce-scatter
        std::string sum;
        for (int i = 0, n = 2 + static_cast<int>(rng() % 2); i < n; ++i) {
          const auto t = b.mm(pick(fulls), b.input("w", {8, 8}));
          sum = sum.empty() ? t : b.add(sum, t);
        }
        shards.push_back(b.reduce_scatter(sum, 0));
        break;
      }
      case 3: {  // elementwise
        const auto a = pick(fulls);
        fulls.push_back(rng() % 2
                            ? b.call("relu", "aten.relu.default", {node(a)}, {8, 8}, "float32")
                            : b.add(a, pick(fulls)));
        break;
      }
      case 4: {  // sequence-dim gather of [B, S/ws, H] -> reshape -> mm -> reshape
        const auto x3 = b.reshape(pick(shards), {2, 2, 8});
        const auto g = b.reshape(b.all_gather(x3, 1), {8, 8});
        fulls.push_back(b.reshape(b.reshape(b.mm(g, b.input("w", {8, 8})), {2, 4, 8}), {8, 8}));
        break;
      }
      case 5: {  // parameter gather used as a right-hand operand (FSDP): bucketing material
        fulls.push_back(b.mm(pick(fulls), b.all_gather(b.input("w_shard", {4, 8}), 0)));
        break;
      }
      case 6: {  // sequence-dim reduce-scatter of a 3-D product
        const auto p = b.reshape(b.mm(pick(fulls), b.input("w", {8, 8})), {2, 4, 8});
        shards.push_back(b.reshape(b.reduce_scatter(p, 1), {4, 8}));
        break;
      }
    }
  }
  outs.push_back(shards.back());
  outs.push_back(fulls.back());
  b.output(outs);
  return b.build();
}

passes::PassOptions random_options(uint64_t seed) {
  std::mt19937_64 rng(seed * 31 + 5);
  passes::PassOptions o;
  o.fuse = rng() % 5 != 0;
  o.tp.enable_last_dim = rng() % 2;
  o.tp.enable_last_dim_scatter = rng() % 2;
  o.tp.enable_transpose = rng() % 2;
  if (rng() % 2)
    o.bucket.cap_mb = {static_cast<double>(1 + rng() % 3) * 256.0 / (1024 * 1024), 1.0};
  return o;
}

TEST(Stress, RandomGraphsStayValidSortedAndEqual) {
  std::vector<graph::Graph> originals, transformed;
  for (uint64_t seed = 0; seed < kGraphs; ++seed) {
    originals.push_back(random_graph(seed));
    graph::Graph g = originals.back();
    passes::FusionReport report;
    // A graph the passes fail on is written out, to replay with `asynctp passes`.
    try {
      report = passes::run_passes(g, random_options(seed));
    } catch (const Error& e) {
      const std::string dump =
          ::testing::TempDir() + "/asynctp_stress_" + std::to_string(seed) + ".json";
      graph::write_graph_file(originals.back(), dump);
      FAIL() << "seed " << seed << " (written to " << dump << "): " << e.what();
    }
    EXPECT_NO_THROW(g.validate()) << "seed " << seed;
    EXPECT_TRUE(passes::is_topologically_sorted(g)) << "seed " << seed;
    EXPECT_EQ(static_cast<int>(report.entries().size()), collectives_of(originals.back()))
        << "seed " << seed;
    // The written form reads back.
    EXPECT_NO_THROW(graph::parse_graph(graph::dump_graph(g))) << "seed " << seed;
    transformed.push_back(std::move(g));
  }
  // One set of processes runs every pair (forking per graph would dominate the run time).
  auto statuses = run_ranks(kWs, [&](OpContext& ctx) {
    for (size_t i = 0; i < originals.size(); ++i) {
      const graph::Inputs inputs = graph::random_inputs(originals[i], ctx.rank(), 100 + i);
      const auto ref = graph::execute(ctx, originals[i], inputs);
      const auto got = graph::execute(ctx, transformed[i], inputs);
      for (const auto& d : graph::compare_outputs(got, ref)) {
        EXPECT_TRUE(d.ok) << "graph " << i << " output " << d.index << ": " << d.rel_error << " "
                          << d.note;
      }
    }
  });
  EXPECT_RANKS_OK(statuses);
}

}  // namespace
}  // namespace asynctp::testing
