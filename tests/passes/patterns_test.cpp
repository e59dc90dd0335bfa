// Hand-built graphs for every pattern of the micro-pipeline-TP pass, each checked three ways:
// what the report says, which fused targets the graph holds, and equal outputs before and after
// on 4 CPU ranks. Shapes are tiny: T tokens, H hidden, F per-rank FFN width.
#include "graph/graph_builder.h"
#include "passes/pass_testing.h"
#include "passes/swiglu_graph.h"

namespace asynctp::testing {
namespace {

constexpr int kWs = 4;
constexpr const char* kAgMm = "asynctp.fused_all_gather_matmul";
constexpr const char* kAgScaledMm = "asynctp.fused_all_gather_scaled_matmul";
constexpr const char* kMmRs = "asynctp.fused_matmul_reduce_scatter";
constexpr const char* kScaledMmRs = "asynctp.fused_scaled_matmul_reduce_scatter";
constexpr const char* kAllGather = "_c10d_functional.all_gather_into_tensor.default";
constexpr const char* kReduceScatter = "_c10d_functional.reduce_scatter_tensor.default";

struct Result {
  graph::Graph g;
  passes::FusionReport report;
};

Result run(const graph::Graph& g, passes::PassOptions options = {}) {
  Result r{g, {}};
  r.report = passes::run_passes(r.g, options);
  EXPECT_TRUE(passes::is_topologically_sorted(r.g));
  return r;
}

passes::Outcome outcome(const Result& r, const std::string& coll) {
  const auto* e = r.report.find(coll);
  EXPECT_NE(e, nullptr) << "no report line for " << coll;
  return e == nullptr ? passes::Outcome::kUnmatched : e->outcome;
}

std::string detail(const Result& r, const std::string& coll) {
  const auto* e = r.report.find(coll);
  return e == nullptr ? "" : e->detail;
}

// x_shard [T/ws, H] -AG(0)-> [T, H] @ W [H, F] -> relu -> @ W2 [F, H] -RS(0)-> [T/ws, H]
TEST(Patterns, MlpTwoDimensional) {
  GraphBuilder b(kWs);
  const auto x = b.input("x", {2, 8}), w1 = b.input("w1", {8, 6}), w2 = b.input("w2", {6, 8});
  std::string ag, rs;
  const auto h = b.mm(b.all_gather(x, 0, &ag), w1);
  const auto r = b.call("relu", "aten.relu.default", {node(h)}, {8, 6}, "float32");
  const auto y = b.reduce_scatter(b.mm(r, w2), 0, &rs);
  b.output({y});
  const Result res = run(b.build());
  EXPECT_EQ(outcome(res, ag), passes::Outcome::kFused);
  EXPECT_EQ(outcome(res, rs), passes::Outcome::kFused);
  EXPECT_EQ(count_target(res.g, kAgMm), 1);
  EXPECT_EQ(count_target(res.g, kMmRs), 1);
  EXPECT_EQ(count_target(res.g, kAllGather) + count_target(res.g, kReduceScatter), 0);
  expect_same_outputs(b.build(), res.g, 0.0);  // same GEMMs, same reduction order: bit for bit
}

// Attention projections: x [B, S/ws, H] gathered on the sequence dim (chunk-cat), reshaped to
// [B*S, H], three matmuls (Q/K/V) reshaped back to [B, S, N]: one fused op with three Bs; the
// gathered tensor is also an output (saved for backward), so the op returns A.
TEST(Patterns, SequenceDimGatherSharedByThreeProjections) {
  GraphBuilder b(kWs);
  const auto x = b.input("x", {2, 2, 8});
  std::vector<std::string> ws_, outs;
  std::string ag;
  const auto g = b.all_gather(x, 1, &ag);  // [2, 8, 8]
  const auto g2 = b.reshape(g, {16, 8});
  for (int i = 0; i < 3; ++i) {
    const auto w = b.input("w", {4, 8});  // Linear weight [out, in], used transposed
    outs.push_back(b.reshape(b.mm(g2, b.permute2d(w)), {2, 8, 4}));
  }
  outs.push_back(g2);
  b.output(outs);
  const Result res = run(b.build());
  EXPECT_EQ(outcome(res, ag), passes::Outcome::kFused) << detail(res, ag);
  EXPECT_NE(detail(res, ag).find("3 matmuls"), std::string::npos) << detail(res, ag);
  EXPECT_NE(detail(res, ag).find("returns A"), std::string::npos) << detail(res, ag);
  EXPECT_EQ(count_target(res.g, kAgMm), 1);
  EXPECT_EQ(count_target(res.g, "aten.mm.default"), 0);
  expect_same_outputs(b.build(), res.g, 0.0);
}

// One sequence per rank: x [1, S/ws, H] is gathered on dim 0 into [ws, S/ws, H] and viewed as
// [1, S, H], then as [S, H] for the GEMM (PyTorch's graph when the batch is 1). The chain of
// reshapes reads the gathered tensor; the intermediate view, saved for the backward, reads A.
TEST(Patterns, GatherReadThroughAChainOfReshapes) {
  GraphBuilder b(kWs);
  const auto x = b.input("x", {1, 2, 8}), w = b.input("w", {4, 8});
  std::string ag;
  const auto g = b.all_gather(x, 0, &ag);  // [4, 2, 8]
  const auto seq = b.reshape(g, {1, 8, 8});
  const auto flat = b.reshape(seq, {8, 8});
  const auto y = b.reshape(b.mm(flat, b.permute2d(w)), {1, 8, 4});
  b.output({y, flat});
  const Result res = run(b.build());
  EXPECT_EQ(outcome(res, ag), passes::Outcome::kFused) << detail(res, ag);
  EXPECT_NE(detail(res, ag).find("returns A"), std::string::npos) << detail(res, ag);
  EXPECT_EQ(count_target(res.g, kAgMm), 1);
  EXPECT_EQ(count_target(res.g, kAllGather) + count_target(res.g, "aten.mm.default"), 0);
  expect_same_outputs(b.build(), res.g, 0.0);
}

// Training backward: the gathered gradient feeds the input-gradient matmul (fused) and, through
// a transpose, the weight-gradient matmul (reads the returned A); the input gradients of Q/K/V
// are summed and reduce-scattered on the sequence dim: one fused op over the three products.
TEST(Patterns, BackwardSumOfMatmulsIntoOneReduceScatter) {
  GraphBuilder b(kWs);
  const auto dy = b.input("dy", {2, 2, 8}, "bfloat16");
  const auto w = b.input("w", {8, 4}, "bfloat16");
  const auto act = b.input("act", {16, 4}, "bfloat16");
  std::string ag, rs;
  const auto g2 = b.reshape(b.all_gather(dy, 1, &ag), {16, 8});
  const auto dact = b.mm(g2, b.permute2d(b.permute2d(w)));  // [16, 8] @ [8, 4]
  const auto dw = b.mm(b.permute2d(g2), act);               // [8, 16] @ [16, 4]: weight grad
  std::string sum;
  for (int i = 0; i < 3; ++i) {
    const auto wi = b.input("wq", {4, 8}, "bfloat16");
    const auto term = b.reshape(b.mm(dact, wi), {2, 8, 8});
    sum = sum.empty() ? term : b.add(sum, term);
  }
  const auto dx = b.reduce_scatter(sum, 1, &rs);
  b.output({dx, dw});
  const Result res = run(b.build());
  EXPECT_EQ(outcome(res, ag), passes::Outcome::kFused) << detail(res, ag);
  EXPECT_EQ(outcome(res, rs), passes::Outcome::kFused) << detail(res, rs);
  EXPECT_NE(detail(res, rs).find("3 matmuls summed"), std::string::npos) << detail(res, rs);
  EXPECT_NE(detail(res, rs).find("scatter dim 1"), std::string::npos) << detail(res, rs);
  EXPECT_EQ(count_target(res.g, kMmRs), 1);
  EXPECT_EQ(count_target(res.g, "aten.add.Tensor"), 0);
  expect_same_outputs(b.build(), res.g);  // f32 accumulation of the sum: within bf16 tolerance
}

// A matmul whose result is used elsewhere is not fused into the reduce-scatter, and the report
// says why; --strict turns that into an error.
TEST(Patterns, MatmulWithOtherUsersIsNotFusedIntoReduceScatter) {
  GraphBuilder b(kWs);
  const auto a = b.input("a", {8, 4}), w = b.input("w", {4, 8});
  std::string rs;
  const auto p = b.mm(a, w);
  const auto y = b.reduce_scatter(p, 0, &rs);
  b.output({y, p});
  const Result res = run(b.build());
  EXPECT_EQ(outcome(res, rs), passes::Outcome::kBlocked);
  EXPECT_NE(detail(res, rs).find("other users"), std::string::npos) << detail(res, rs);
  graph::Graph g = b.build();
  passes::PassOptions strict;
  strict.strict = true;
  EXPECT_THROW(passes::run_passes(g, strict), Error);
  expect_same_outputs(b.build(), res.g, 0.0);
}

// reshape -> mm -> reshape feeding a sequence-dim reduce-scatter: the scatter dim (1) is carried
// to the 3-D product (it is not a dim-0 scatter of the flattened product).
TEST(Patterns, ReshapeMatmulReshapeScatterDimCarried) {
  GraphBuilder b(kWs);
  const auto h = b.input("h", {2, 8, 6}), w = b.input("w", {6, 8});
  std::string rs;
  const auto y = b.reduce_scatter(b.reshape(b.mm(b.reshape(h, {16, 6}), w), {2, 8, 8}), 1, &rs);
  b.output({y});
  const Result res = run(b.build());
  EXPECT_EQ(outcome(res, rs), passes::Outcome::kFused) << detail(res, rs);
  EXPECT_NE(detail(res, rs).find("scatter dim 1"), std::string::npos);
  expect_same_outputs(b.build(), res.g, 0.0);
}

// float8 with tensor-wise scales (0-d) on both sides, and row-wise scales whose gather goes with
// the gathered tensor (that all-gather disappears too).
TEST(Patterns, Float8TensorwiseAndRowwise) {
  for (bool rowwise : {false, true}) {
    GraphBuilder b(kWs);
    const auto x = b.input("x", {2, 8}, "float8_e4m3fn");
    const auto w = b.input("w", {6, 8}, "float8_e4m3fn");
    const auto w2 = b.input("w2", {8, 6}, "float8_e4m3fn");
    std::string ag, ag_scale, rs, sa, sb, sa2, sb2;
    const auto gx = b.all_gather(x, 0, &ag);
    if (rowwise) {
      sa = b.all_gather(b.input("x_scale", {2, 1}), 0, &ag_scale);  // [8, 1]
      sb = b.permute2d(b.input("w_scale", {6, 1}));
      sa2 = b.input("h_scale", {8, 1});
      sb2 = b.permute2d(b.input("w2_scale", {8, 1}));
    } else {
      sa = b.input("x_scale", {});
      sb = b.input("w_scale", {});
      sa2 = b.input("h_scale", {});
      sb2 = b.input("w2_scale", {});
    }
    const auto h = b.call("_scaled_mm", "aten._scaled_mm.default",
                          {node(gx), node(b.permute2d(w)), node(sa), node(sb), Value::none(),
                           Value::none(), Value::dtype("bfloat16")},
                          {8, 6}, "bfloat16");
    const auto hq = b.call("convert", "prims.convert_element_type.default",
                           {node(h), Value::dtype("float8_e4m3fn")}, {8, 6}, "float8_e4m3fn");
    const auto y = b.call("_scaled_mm", "aten._scaled_mm.default",
                          {node(hq), node(b.permute2d(w2)), node(sa2), node(sb2), Value::none(),
                           Value::none(), Value::dtype("bfloat16")},
                          {8, 8}, "bfloat16");
    b.output({b.reduce_scatter(y, 0, &rs)});
    const Result res = run(b.build());
    EXPECT_EQ(outcome(res, ag), passes::Outcome::kFused) << detail(res, ag);
    EXPECT_EQ(outcome(res, rs), passes::Outcome::kFused) << detail(res, rs);
    if (rowwise) {
      EXPECT_EQ(outcome(res, ag_scale), passes::Outcome::kFused) << detail(res, ag_scale);
    }
    EXPECT_EQ(count_target(res.g, kAgScaledMm), 1);
    EXPECT_EQ(count_target(res.g, kScaledMmRs), 1);
    EXPECT_EQ(count_target(res.g, kAllGather), 0);
    expect_same_outputs(b.build(), res.g, 0.0);
  }
}

// Each _scaled_mm's use_fast_accum (positional or keyword) goes into the fused node that replaces
// it: one per B for the gather (two Bs: one fast, one not), one for the scatter. The outputs are
// unchanged (the CPU backend accumulates in f32 either way).
TEST(Patterns, Float8UseFastAccumGoesIntoTheFusedOps) {
  GraphBuilder b(kWs);
  const auto x = b.input("x", {2, 8}, "float8_e4m3fn");
  const auto w = b.input("w", {6, 8}, "float8_e4m3fn");
  const auto w1 = b.input("w1", {6, 8}, "float8_e4m3fn");
  const auto w2 = b.input("w2", {8, 6}, "float8_e4m3fn");
  std::string ag, rs;
  const auto gx = b.all_gather(x, 0, &ag);
  const auto sa = b.input("x_scale", {}), sb = b.input("w_scale", {});
  const auto h = b.call("_scaled_mm", "aten._scaled_mm.default",
                        {node(gx), node(b.permute2d(w)), node(sa), node(sb), Value::none(),
                         Value::none(), Value::dtype("bfloat16"), Value::boolean(true)},
                        {8, 6}, "bfloat16");
  const auto h1 = b.call("_scaled_mm", "aten._scaled_mm.default",
                         {node(gx), node(b.permute2d(w1)), node(sa), node(sb), Value::none(),
                          Value::none(), Value::dtype("bfloat16")},
                         {8, 6}, "bfloat16");
  const auto sum = b.call("add", "aten.add.Tensor", {node(h), node(h1)}, {8, 6}, "bfloat16");
  const auto hq = b.call("convert", "prims.convert_element_type.default",
                         {node(sum), Value::dtype("float8_e4m3fn")}, {8, 6}, "float8_e4m3fn");
  const auto y = b.call(
      "_scaled_mm", "aten._scaled_mm.default",
      {node(hq), node(b.permute2d(w2)), node(b.input("h_scale", {})), node(b.input("w2_scale", {})),
       Value::none(), Value::none(), Value::dtype("bfloat16")},
      {8, 8}, "bfloat16", {{"use_fast_accum", Value::boolean(true)}});
  b.output({b.reduce_scatter(y, 0, &rs)});
  const Result res = run(b.build());
  ASSERT_EQ(outcome(res, ag), passes::Outcome::kFused) << detail(res, ag);
  ASSERT_EQ(outcome(res, rs), passes::Outcome::kFused) << detail(res, rs);
  for (const auto& n : res.g.nodes()) {
    if (n.target == kAgScaledMm) {
      const Value* fast = n.kwarg("use_fast_accum");
      ASSERT_NE(fast, nullptr);
      ASSERT_TRUE(fast->is_list() && fast->list.size() == 2) << fast->describe();
      // The Bs in the order of the matmuls: h (fast), then h1 (not).
      EXPECT_TRUE(fast->list[0].kind == Value::Kind::kBool && fast->list[0].b);
      EXPECT_TRUE(fast->list[1].kind == Value::Kind::kBool && !fast->list[1].b);
    }
    if (n.target == kScaledMmRs) {
      const Value* fast = n.kwarg("use_fast_accum");
      ASSERT_NE(fast, nullptr);
      EXPECT_TRUE(fast->kind == Value::Kind::kBool && fast->b) << fast->describe();
    }
  }
  EXPECT_EQ(count_target(res.g, kAgScaledMm), 1);
  EXPECT_EQ(count_target(res.g, kScaledMmRs), 1);
  expect_same_outputs(b.build(), res.g, 0.0);
}

// A row-wise scale computed on the gathered rows (not gathered itself) cannot go with the shard:
// the report says so.
TEST(Patterns, RowwiseScaleThatIsNotGatheredBlocksTheFusion) {
  GraphBuilder b(kWs);
  const auto x = b.input("x", {2, 8}, "float8_e4m3fn");
  const auto w = b.input("w", {8, 6}, "float8_e4m3fn");
  std::string ag;
  const auto gx = b.all_gather(x, 0, &ag);
  const auto sa = b.call("full", "aten.full.default", {ints({8, 1}), Value::real(1.0)}, {8, 1},
                         "float32", {{"dtype", Value::dtype("float32")}});
  const auto y = b.call("_scaled_mm", "aten._scaled_mm.default",
                        {node(gx), node(w), node(sa), node(b.input("w_scale", {1, 6})),
                         Value::none(), Value::none(), Value::dtype("float32")},
                        {8, 6}, "float32");
  b.output({y});
  const Result res = run(b.build());
  EXPECT_EQ(outcome(res, ag), passes::Outcome::kBlocked);
  EXPECT_NE(detail(res, ag).find("row-wise scale_a"), std::string::npos) << detail(res, ag);
  expect_same_outputs(b.build(), res.g, 0.0);
}

// mm(X, all_gather(W).t()): fused through (W @ X^T)^T only with enable_transpose.
TEST(Patterns, TransposedRightHandOperand) {
  GraphBuilder b(kWs);
  const auto x = b.input("x", {6, 8}), w = b.input("w", {2, 8});
  std::string ag;
  const auto gw = b.all_gather(w, 0, &ag);  // [8, 8] = [N, K]
  b.output({b.mm(x, b.permute2d(gw))});
  const Result off = run(b.build());
  EXPECT_EQ(outcome(off, ag), passes::Outcome::kBlocked);
  EXPECT_NE(detail(off, ag).find("--enable-transpose"), std::string::npos) << detail(off, ag);
  passes::PassOptions options;
  options.tp.enable_transpose = true;
  const Result on = run(b.build(), options);
  EXPECT_EQ(outcome(on, ag), passes::Outcome::kFused) << detail(on, ag);
  EXPECT_EQ(count_target(on.g, kAgMm), 1);
  expect_same_outputs(b.build(), on.g, 0.0);
}

// Gather on the contraction (last) dim: only with enable_last_dim. Scatter on the output (last)
// dim: by default, unless enable_last_dim_scatter is off.
TEST(Patterns, LastDimGatherAndScatter) {
  GraphBuilder b(kWs);
  const auto x = b.input("x", {8, 2}), w = b.input("w", {8, 8}), w2 = b.input("w2", {8, 8});
  std::string ag, rs;
  const auto h = b.mm(b.all_gather(x, 1, &ag), w);  // [8, 8] gathered on K
  b.output({b.reduce_scatter(b.mm(h, w2), 1, &rs)});
  const Result defaults = run(b.build());
  EXPECT_EQ(outcome(defaults, ag), passes::Outcome::kBlocked) << detail(defaults, ag);
  EXPECT_NE(detail(defaults, ag).find("--enable-last-dim"), std::string::npos);
  EXPECT_EQ(outcome(defaults, rs), passes::Outcome::kFused) << detail(defaults, rs);
  expect_same_outputs(b.build(), defaults.g, 1e-5);
  passes::PassOptions off;
  off.tp.enable_last_dim_scatter = false;
  const Result no_scatter = run(b.build(), off);
  EXPECT_EQ(outcome(no_scatter, rs), passes::Outcome::kBlocked) << detail(no_scatter, rs);
  EXPECT_NE(detail(no_scatter, rs).find("--no-last-dim-scatter"), std::string::npos);
  passes::PassOptions options;
  options.tp.enable_last_dim = true;
  const Result on = run(b.build(), options);
  EXPECT_EQ(outcome(on, ag), passes::Outcome::kFused) << detail(on, ag);
  EXPECT_EQ(outcome(on, rs), passes::Outcome::kFused) << detail(on, rs);
  expect_same_outputs(b.build(), on.g, 1e-5);  // partial sums over K slices: f32 reassociation
}

// B produced after the all-gather is moved above the fused node; a B that depends on the
// gathered tensor blocks the fusion.
TEST(Patterns, LateBIsHoistedAndDependentBBlocks) {
  GraphBuilder b(kWs);
  const auto x = b.input("x", {2, 8}), w = b.input("w", {8, 6});
  std::string ag;
  const auto gx = b.all_gather(x, 0, &ag);
  const auto w_late = b.call("neg", "aten.neg.default", {node(w)}, {8, 6}, "float32");
  b.output({b.mm(gx, w_late)});
  const Result res = run(b.build());
  EXPECT_EQ(outcome(res, ag), passes::Outcome::kFused);
  EXPECT_LT(res.g.index_of(w_late), res.g.index_of("fused_all_gather_matmul"));
  expect_same_outputs(b.build(), res.g, 0.0);

  GraphBuilder d(kWs);
  const auto x2 = d.input("x", {2, 8});
  std::string ag2;
  const auto g2 = d.all_gather(x2, 0, &ag2);  // [8, 8]
  d.output({d.mm(g2, d.call("neg", "aten.neg.default", {node(g2)}, {8, 8}, "float32"))});
  const Result dep = run(d.build());
  EXPECT_EQ(outcome(dep, ag2), passes::Outcome::kBlocked);
  EXPECT_NE(detail(dep, ag2).find("depends on the gathered tensor"), std::string::npos)
      << detail(dep, ag2);
}

// The slice form PyTorch writes in backward graphs (torch.compile of funcol's autograd
// collectives): the gathered gradient is cut by ws slices on dim 0 and concatenated on the
// sequence dim; the scattered product is cut by ws slices on the sequence dim (the last slice's
// end past the size, as PyTorch may write it) and concatenated on dim 0.
//   dy [2, S/ws, 8] -AG(1)-> [2, S, 8] -> [2S, 8] @ W [8, 4] -> relu -> @ W2 [4, 8] -> [2, S, 8]
//   -RS(1)-> [2, S/ws, 8]
TEST(Patterns, SliceFormGatherAndScatter) {
  GraphBuilder b(kWs);
  const int64_t s = 2;  // tokens per rank
  const auto dy = b.input("dy", {2, s, 8});
  const auto w = b.input("w", {8, 4});
  const auto w2 = b.input("w2", {4, 8});
  const auto ag =
      b.call("all_gather_into_tensor", "_c10d_functional.all_gather_into_tensor.default",
             {node(dy), Value::integer(kWs), Value::string("0")}, {2 * kWs, s, 8}, "float32");
  const auto wait = b.call("wait_tensor", "_c10d_functional.wait_tensor.default", {node(ag)},
                           {2 * kWs, s, 8}, "float32");
  std::vector<Value> parts;
  for (int64_t r = 0; r < kWs; ++r) {
    parts.push_back(node(
        b.call("slice", "aten.slice.Tensor",
               {node(wait), Value::integer(0), Value::integer(r * 2), Value::integer((r + 1) * 2)},
               {2, s, 8}, "float32")));
  }
  const auto gathered =
      b.call("cat", "aten.cat.default", {Value::of_list(parts), Value::integer(1)}, {2, kWs * s, 8},
             "float32");
  const auto h =
      b.call("relu", "aten.relu.default", {node(b.mm(b.reshape(gathered, {2 * kWs * s, 8}), w))},
             {2 * kWs * s, 4}, "float32");
  const auto p = b.reshape(b.mm(h, w2), {2, kWs * s, 8});
  std::vector<Value> pieces;
  for (int64_t r = 0; r < kWs; ++r) {
    const int64_t end = r == kWs - 1 ? INT64_MAX : (r + 1) * s;
    pieces.push_back(
        node(b.call("slice", "aten.slice.Tensor",
                    {node(p), Value::integer(1), Value::integer(r * s), Value::integer(end)},
                    {2, s, 8}, "float32", {}, Dims{kWs * s * 8, 8, 1})));
  }
  const auto stacked =
      b.call("cat", "aten.cat.default", {Value::of_list(pieces)}, {2 * kWs, s, 8}, "float32");
  const auto rs =
      b.call("reduce_scatter_tensor", "_c10d_functional.reduce_scatter_tensor.default",
             {node(stacked), Value::string("sum"), Value::integer(kWs), Value::string("0")},
             {2, s, 8}, "float32");
  b.output({b.call("wait_tensor", "_c10d_functional.wait_tensor.default", {node(rs)}, {2, s, 8},
                   "float32")});
  const Result res = run(b.build());
  EXPECT_EQ(outcome(res, ag), passes::Outcome::kFused) << detail(res, ag);
  EXPECT_NE(detail(res, ag).find("gather dim 1"), std::string::npos) << detail(res, ag);
  EXPECT_EQ(outcome(res, rs), passes::Outcome::kFused) << detail(res, rs);
  EXPECT_NE(detail(res, rs).find("scatter dim 1"), std::string::npos) << detail(res, rs);
  EXPECT_EQ(count_target(res.g, kAllGather) + count_target(res.g, kReduceScatter), 0);
  EXPECT_EQ(count_target(res.g, "aten.slice.Tensor"), 0);
  expect_same_outputs(b.build(), res.g, 0.0);
}

// Collectives without a pattern get a line saying so; an all-reduce is reported too.
TEST(Patterns, EveryCollectiveIsReported) {
  GraphBuilder b(kWs);
  const auto x = b.input("x", {2, 8});
  std::string ag;
  const auto g = b.all_gather(x, 0, &ag);
  const auto e = b.call("exp", "aten.exp.default", {node(g)}, {8, 8}, "float32");
  const auto ar = b.call("all_reduce", "_c10d_functional.all_reduce.default",
                         {node(e), Value::string("sum"), Value::string("0")}, {8, 8}, "float32");
  b.output({b.call("wait_tensor", "_c10d_functional.wait_tensor.default", {node(ar)}, {8, 8},
                   "float32")});
  const Result res = run(b.build());
  EXPECT_EQ(outcome(res, ag), passes::Outcome::kUnmatched);
  EXPECT_NE(detail(res, ag).find("feeds no matmul"), std::string::npos);
  EXPECT_EQ(outcome(res, ar), passes::Outcome::kUnmatched);
  EXPECT_EQ(res.report.entries().size(), 2u);
  expect_same_outputs(b.build(), res.g, 0.0);
}

// ---- the SwiGLU epilogue ----------------------------------------------------------------------

const graph::Node* only_node(const graph::Graph& g, const std::string& target) {
  const graph::Node* found = nullptr;
  for (const auto& n : g.nodes()) {
    if (n.target != target) continue;
    EXPECT_EQ(found, nullptr) << "two " << target << " nodes";
    found = &n;
  }
  return found;
}

passes::PassOptions with_swiglu() {
  passes::PassOptions o;
  o.tp.enable_swiglu = true;
  return o;
}

class SwigluEpilogue : public ::testing::TestWithParam<std::tuple<SiluForm, bool>> {};

TEST_P(SwigluEpilogue, GoesIntoTheFusedGather) {
  const auto [form, save_pre] = GetParam();
  const SwigluGraph s = swiglu_graph(form, save_pre);
  const Result res = run(s.g, with_swiglu());
  EXPECT_EQ(outcome(res, s.ag), passes::Outcome::kFused) << detail(res, s.ag);
  EXPECT_EQ(count_target(res.g, kAgMm), 0);
  const graph::Node* f = only_node(res.g, "asynctp.fused_all_gather_matmul_swiglu");
  ASSERT_NE(f, nullptr);
  const Value* pre = f->kwarg("return_pre");
  ASSERT_NE(pre, nullptr);
  EXPECT_EQ(pre->b, save_pre);
  EXPECT_FALSE(f->kwarg("return_A")->b);
  // The SwiGLU's nodes went with it.
  for (const char* gone : {"aten.mul.Tensor", "aten.silu.default", "aten.sigmoid.default",
                           "aten.div.Tensor", "aten.split.Tensor"}) {
    EXPECT_EQ(count_target(res.g, gone), 0) << gone;
  }
  EXPECT_NE(detail(res, s.ag).find("into " + f->name), std::string::npos) << detail(res, s.ag);
  EXPECT_NE(detail(res, s.ag).find("SwiGLU " + s.mul), std::string::npos) << detail(res, s.ag);
  EXPECT_EQ(detail(res, s.ag).find("returns the products") != std::string::npos, save_pre)
      << detail(res, s.ag);
  // One rounding where the decomposition rounds silu(g) first: within the dtype's tolerance.
  expect_same_outputs(s.g, res.g);
}

INSTANTIATE_TEST_SUITE_P(Forms, SwigluEpilogue,
                         ::testing::Combine(::testing::Values(SiluForm::kAten, SiluForm::kDivExp,
                                                              SiluForm::kSigmoid),
                                            ::testing::Bool()));

// The gathered tensor is also an output (a forward saves it for the weight gradient): the
// SwiGLU op returns it, and the graph's output reads that.
TEST(Patterns, SwigluEpilogueReturnsTheGatheredA) {
  const SwigluGraph s = swiglu_graph(SiluForm::kAten, true, /*save_a=*/true);
  const Result res = run(s.g, with_swiglu());
  const graph::Node* f = only_node(res.g, "asynctp.fused_all_gather_matmul_swiglu");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->kwarg("return_A")->b);
  EXPECT_TRUE(f->kwarg("return_pre")->b);
  EXPECT_EQ(count_target(res.g, kAgMm) + count_target(res.g, kAllGather), 0);
  EXPECT_NE(detail(res, s.ag).find("returns A"), std::string::npos) << detail(res, s.ag);
  expect_same_outputs(s.g, res.g);
}

TEST(Patterns, WhatIsNoSwigluOfTheOpsOrWithoutTheOptionStaysAsItIs) {
  for (const SiluForm form : {SiluForm::kUpHalf, SiluForm::kAlphaTwo, SiluForm::kConvertF16}) {
    const SwigluGraph s = swiglu_graph(form, true);
    const Result res = run(s.g, with_swiglu());
    EXPECT_EQ(outcome(res, s.ag), passes::Outcome::kFused);
    EXPECT_EQ(count_target(res.g, kAgMm), 1) << static_cast<int>(form);
    EXPECT_EQ(count_target(res.g, "asynctp.fused_all_gather_matmul_swiglu"), 0)
        << static_cast<int>(form);
    EXPECT_EQ(detail(res, s.ag).find("SwiGLU"), std::string::npos) << detail(res, s.ag);
    expect_same_outputs(s.g, res.g, 0.0);
  }

  const SwigluGraph s = swiglu_graph(SiluForm::kAten, false);
  const Result plain = run(s.g);  // the default: off
  EXPECT_EQ(count_target(plain.g, kAgMm), 1);
  EXPECT_EQ(count_target(plain.g, "asynctp.fused_all_gather_matmul_swiglu"), 0);
  EXPECT_EQ(detail(plain, s.ag).find("SwiGLU"), std::string::npos) << detail(plain, s.ag);
  expect_same_outputs(s.g, plain.g, 0.0);
}

}  // namespace
}  // namespace asynctp::testing
