// Bucketing of FSDP-like chains: per-layer parameter all-gathers (each feeding the layer's
// matmul as its right-hand operand, so nothing fuses them) and per-layer gradient
// reduce-scatters. Checked: how many collectives remain for a cap, that dependent collectives
// never share a bucket, per-index caps, and equal outputs on 4 CPU ranks.
#include "graph/graph_builder.h"
#include "passes/pass_testing.h"

namespace asynctp::testing {
namespace {

constexpr int kWs = 4;
constexpr double kOneGather = 8.0 * 8 * 4 / (1024.0 * 1024.0);  // MiB of one [8, 8] f32 output

// `layers` layers: W_l = AG(w_l [2, 8]); h = h @ W_l; grad_l = RS(h^T @ h_prev) [2, 8].
// With `chain`, each layer's parameter shard depends on the previous gathered parameter.
graph::Graph fsdp_chain(int layers, bool chain, std::vector<std::string>* ags,
                        std::vector<std::string>* rss) {
  GraphBuilder b(kWs);
  std::string h = b.input("h", {8, 8});
  std::vector<std::string> outs;
  std::string prev_w;
  for (int l = 0; l < layers; ++l) {
    std::string shard = b.input("w_shard", {2, 8});
    if (chain && !prev_w.empty()) {
      const auto top =
          b.call("slice", "aten.slice.Tensor",
                 {node(prev_w), Value::integer(0), Value::integer(0), Value::integer(2)}, {2, 8},
                 "float32");
      shard = b.add(shard, top);
    }
    std::string ag, rs;
    const auto w = b.all_gather(shard, 0, &ag);
    ags->push_back(ag);
    const auto next = b.mm(h, w);
    outs.push_back(b.reduce_scatter(b.mm(b.permute2d(next), h), 0, &rs));
    rss->push_back(rs);
    h = next;
    prev_w = w;
  }
  outs.push_back(h);
  b.output(outs);
  return b.build();
}

passes::PassOptions bucket_only(std::vector<double> caps) {
  passes::PassOptions o;
  o.fuse = false;
  o.bucket.cap_mb = std::move(caps);
  return o;
}

TEST(Bucketing, IndependentCollectivesMergeUpToTheCap) {
  std::vector<std::string> ags, rss;
  const graph::Graph g = fsdp_chain(4, false, &ags, &rss);
  graph::Graph all = g;
  const auto report = passes::run_passes(all, bucket_only({1024}));
  EXPECT_EQ(count_target(all, "_c10d_functional.all_gather_into_tensor.default"), 1);
  EXPECT_EQ(count_target(all, "_c10d_functional.reduce_scatter_tensor.default"), 1);
  for (const auto& n : ags)
    EXPECT_EQ(report.find(n)->outcome, passes::Outcome::kBucketed) << report.text();
  for (const auto& n : rss)
    EXPECT_EQ(report.find(n)->outcome, passes::Outcome::kBucketed) << report.text();
  EXPECT_TRUE(passes::is_topologically_sorted(all));
  expect_same_outputs(g, all, 0.0);

  graph::Graph pairs = g;
  passes::run_passes(pairs, bucket_only({2 * kOneGather}));
  EXPECT_EQ(count_target(pairs, "_c10d_functional.all_gather_into_tensor.default"), 2);
  expect_same_outputs(g, pairs, 0.0);
}

TEST(Bucketing, PerIndexCaps) {
  std::vector<std::string> ags, rss;
  const graph::Graph g = fsdp_chain(4, false, &ags, &rss);
  graph::Graph h = g;
  // Bucket 0 holds one gather (so stays alone), bucket 1 and later take the rest.
  const auto report = passes::run_passes(h, bucket_only({kOneGather, 1024}));
  EXPECT_EQ(count_target(h, "_c10d_functional.all_gather_into_tensor.default"), 2);
  EXPECT_NE(report.find(ags[0])->outcome, passes::Outcome::kBucketed);
  for (size_t i = 1; i < ags.size(); ++i)
    EXPECT_EQ(report.find(ags[i])->outcome, passes::Outcome::kBucketed);
  expect_same_outputs(g, h, 0.0);
}

TEST(Bucketing, DependentCollectivesNeverShareABucket) {
  std::vector<std::string> ags, rss;
  const graph::Graph g = fsdp_chain(3, true, &ags, &rss);
  graph::Graph h = g;
  const auto report = passes::run_passes(h, bucket_only({1024}));
  // Each parameter gather depends on the previous one: no two can be merged.
  EXPECT_EQ(count_target(h, "_c10d_functional.all_gather_into_tensor.default"), 3);
  for (const auto& n : ags)
    EXPECT_NE(report.find(n)->outcome, passes::Outcome::kBucketed);
  // The gradient reduce-scatters are independent of each other: one bucket.
  EXPECT_EQ(count_target(h, "_c10d_functional.reduce_scatter_tensor.default"), 1);
  EXPECT_TRUE(passes::is_topologically_sorted(h));
  expect_same_outputs(g, h, 0.0);
}

}  // namespace
}  // namespace asynctp::testing
