// The executor on hand-built graphs: host kernels against values computed here, strided
// (permuted) operands, the attention reference against finite differences, the checks of
// recorded metadata, and errors that name the node and the target.
#include <cmath>
#include <filesystem>

#include <gtest/gtest.h>

#include "graph/executor.h"
#include "graph/executor_testing.h"
#include "graph/graph_builder.h"
#include "graph/inputs.h"
#include "support/multiprocess.h"

namespace asynctp::testing {
namespace {

std::string error_of(OpContext& ctx, const graph::Graph& g, const graph::Inputs& in,
                     graph::ExecOptions o = {}) {
  try {
    graph::execute(ctx, g, in, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Executor, PointwiseReductionsAndViews) {
  GraphBuilder b(1);
  const auto x = b.input("x", {2, 3});
  const auto w = b.input("w", {4, 3});  // used as permute(w): a column-major [3, 4] operand
  const auto y = b.call(
      "add", "aten.add.Tensor",
      {node(b.call("mul", "aten.mul.Tensor", {node(x), Value::real(2.0)}, {2, 3}, "float32")),
       Value::integer(1)},
      {2, 3}, "float32");
  const auto sub =
      b.call("sub", "aten.sub.Tensor", {Value::integer(1), node(x)}, {2, 3}, "float32");
  const auto ms = b.call("mean", "aten.mean.dim", {node(x), ints({-1}), Value::boolean(true)},
                         {2, 1}, "float32");
  const auto rs = b.call(
      "rsqrt", "aten.rsqrt.default",
      {node(b.call("add", "aten.add.Tensor", {node(ms), Value::real(4.0)}, {2, 1}, "float32"))},
      {2, 1}, "float32");
  const auto norm =
      b.call("mul", "aten.mul.Tensor", {node(x), node(rs)}, {2, 3}, "float32");  // broadcast
  const auto s = b.call("sum", "aten.sum.dim_IntList", {node(x), ints({0})}, {3}, "float32");
  const auto mm = b.mm(x, b.permute2d(w));
  const auto bf = b.call("cvt", "prims.convert_element_type.default",
                         {node(x), Value::dtype("bfloat16")}, {2, 3}, "bfloat16");
  const auto split =
      b.call_untyped("split", "aten.split.Tensor", {node(x), Value::integer(2), Value::integer(1)});
  const auto second =
      b.call("getitem", "_operator.getitem", {node(split), Value::integer(1)}, {2, 1}, "float32");
  const auto cat =
      b.call("cat", "aten.cat.default",
             {Value::of_list({node(second), node(x)}), Value::integer(1)}, {2, 4}, "float32");
  const auto rep =
      b.call("repeat", "aten.repeat.default", {node(second), ints({1, 2})}, {2, 2}, "float32");
  const auto pw =
      b.call("pow", "aten.pow.Tensor_Scalar", {node(x), Value::integer(2)}, {2, 3}, "float32");
  const auto bias = b.input("bias", {4});
  const auto lin = b.call("addmm", "aten.addmm.default",
                          {node(bias), node(x), node(b.permute2d(w))}, {2, 4}, "float32");
  b.output({y, sub, norm, s, mm, bf, cat, rep, pw, lin});
  const graph::Graph g = b.build();
  auto statuses = run_ranks(1, [&](OpContext& ctx) {
    const std::vector<float> xv{1, -2, 3, 0.5f, 4, -1};
    std::vector<float> wv(12);
    for (int i = 0; i < 12; ++i)
      wv[i] = 0.25f * i - 1;
    const std::vector<float> bv{0.5f, -1, 2, 0};
    const auto out = graph::execute(
        ctx, g,
        {{x, from_values({2, 3}, xv)}, {w, from_values({4, 3}, wv)}, {bias, from_values({4}, bv)}});
    for (int i = 0; i < 6; ++i) {
      EXPECT_FLOAT_EQ(values(out[0])[i], 2 * xv[i] + 1);
      EXPECT_FLOAT_EQ(values(out[1])[i], 1 - xv[i]);
      EXPECT_FLOAT_EQ(values(out[8])[i], xv[i] * xv[i]);
    }
    for (int r = 0; r < 2; ++r) {
      const float mean = (xv[3 * r] + xv[3 * r + 1] + xv[3 * r + 2]) / 3;
      for (int c = 0; c < 3; ++c)
        EXPECT_NEAR(values(out[2])[3 * r + c], xv[3 * r + c] / std::sqrt(mean + 4), 1e-6);
      for (int n = 0; n < 4; ++n) {
        float acc = 0;
        for (int k = 0; k < 3; ++k)
          acc += xv[3 * r + k] * wv[3 * n + k];
        EXPECT_FLOAT_EQ(values(out[4])[4 * r + n], acc);
        EXPECT_FLOAT_EQ(values(out[9])[4 * r + n], acc + bv[n]);
      }
      EXPECT_FLOAT_EQ(values(out[6])[4 * r], xv[3 * r + 2]);  // cat([x[:, 2:], x], 1)
      EXPECT_FLOAT_EQ(values(out[6])[4 * r + 1], xv[3 * r]);
      EXPECT_FLOAT_EQ(values(out[7])[2 * r + 1], xv[3 * r + 2]);
    }
    for (int c = 0; c < 3; ++c)
      EXPECT_FLOAT_EQ(values(out[3])[c], xv[c] + xv[3 + c]);
    EXPECT_EQ(out[5].tensor.t.dtype(), DType::kBF16);
  });
  EXPECT_RANKS_OK(statuses);
}

// Attention forward/backward against finite differences of L = sum(out * dO) (f32, causal).
TEST(Executor, AttentionReferenceMatchesFiniteDifferences) {
  GraphBuilder b(1);
  const Dims shape{1, 2, 3, 2};
  const auto q = b.input("q", shape), k = b.input("k", shape), v = b.input("v", shape),
             dout = b.input("dout", shape);
  const auto fwd =
      b.call_untyped("sdpa", "aten._scaled_dot_product_flash_attention_for_cpu.default",
                     {node(q), node(k), node(v), Value::real(0.0), Value::boolean(true)});
  const auto out =
      b.call("out", "_operator.getitem", {node(fwd), Value::integer(0)}, shape, "float32");
  const auto lse =
      b.call("lse", "_operator.getitem", {node(fwd), Value::integer(1)}, {1, 2, 3}, "float32");
  const auto bwd = b.call_untyped(
      "sdpa_bwd", "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
      {node(dout), node(q), node(k), node(v), node(out), node(lse), Value::real(0.0),
       Value::boolean(true)});
  std::vector<std::string> outs{out};
  for (int i = 0; i < 3; ++i)
    outs.push_back(
        b.call("grad", "_operator.getitem", {node(bwd), Value::integer(i)}, shape, "float32"));
  b.output(outs);
  const graph::Graph g = b.build();
  auto statuses = run_ranks(1, [&](OpContext& ctx) {
    graph::Inputs in = graph::random_inputs(g, 0, 3);
    const auto base = graph::execute(ctx, g, in);
    const std::vector<float> dov = graph::load_f32(in.at(dout).t);
    auto loss = [&](const graph::Inputs& inputs) {
      const auto o = values(graph::execute(ctx, g, inputs)[0]);
      double l = 0;
      for (size_t i = 0; i < o.size(); ++i)
        l += static_cast<double>(o[i]) * dov[i];
      return l;
    };
    const std::string names[] = {q, k, v};
    for (int which = 0; which < 3; ++which) {
      const std::vector<float> grad = values(base[1 + which]);
      const std::vector<float> x0 = graph::load_f32(in.at(names[which]).t);
      for (size_t i = 0; i < x0.size(); ++i) {
        const float h = 1e-2f;
        std::vector<float> xp = x0, xm = x0;
        xp[i] += h;
        xm[i] -= h;
        graph::Inputs ip = in, im = in;
        ip[names[which]] = from_values(shape, xp);
        im[names[which]] = from_values(shape, xm);
        EXPECT_NEAR(grad[i], (loss(ip) - loss(im)) / (2 * h), 2e-3)
            << names[which] << "[" << i << "]";
      }
    }
  });
  EXPECT_RANKS_OK(statuses);
}

TEST(Executor, ErrorsNameTheNodeAndTarget) {
  auto statuses = run_ranks(2, [](OpContext& ctx) {
    {  // recorded shape disagrees with the computed one
      GraphBuilder b(2);
      const auto x = b.input("x", {2, 3});
      b.output({b.call("bad", "aten.neg.default", {node(x)}, {3, 2}, "float32")});
      const graph::Graph g = b.build();
      const std::string e = error_of(ctx, g, graph::random_inputs(g, ctx.rank(), 0));
      EXPECT_NE(e.find("node bad (aten.neg.default)"), std::string::npos) << e;
      EXPECT_NE(e.find("[2, 3] but its val records [3, 2]"), std::string::npos) << e;
    }
    {  // unsupported target and dtype
      GraphBuilder b(2);
      const auto x = b.input("x", {2, 3});
      b.output({b.call("weird", "aten.frobnicate.default", {node(x)}, {2, 3}, "float32")});
      const graph::Graph g = b.build();
      EXPECT_NE(error_of(ctx, g, graph::random_inputs(g, ctx.rank(), 0))
                    .find("node weird: target aten.frobnicate.default is not supported"),
                std::string::npos);
      GraphBuilder c(2);
      const auto y = c.input("y", {2, 3});
      c.output({c.call("idx", "aten.neg.default", {node(y)}, {2, 3}, "int32")});
      const graph::Graph h = c.build();
      EXPECT_NE(error_of(ctx, h, graph::random_inputs(h, ctx.rank(), 0))
                    .find("node idx (aten.neg.default): dtype int32"),
                std::string::npos);
    }
    {  // collectives on another group, or of another size
      GraphBuilder b(2);
      const auto x = b.input("x", {2, 3});
      b.output({b.all_gather(x, 0)});
      graph::Graph g = b.build();
      graph::ExecOptions other;
      other.world_group = "7";
      EXPECT_NE(error_of(ctx, g, graph::random_inputs(g, ctx.rank(), 0), other)
                    .find("is not the world group"),
                std::string::npos);
      g.mutable_nodes()[1].args[1] = Value::integer(4);
      EXPECT_NE(error_of(ctx, g, graph::random_inputs(g, ctx.rank(), 0))
                    .find("group_size 4 differs from the world size 2"),
                std::string::npos);
    }
    {  // a graph recorded for another world size
      GraphBuilder b(4);
      b.output({b.input("x", {1})});
      const graph::Graph g = b.build();
      EXPECT_NE(error_of(ctx, g, {}).find("world size 4"), std::string::npos);
    }
  });
  EXPECT_RANKS_OK(statuses);
}

TEST(Executor, InputsFromRawFiles) {
  GraphBuilder b(2);
  const auto x = b.input("x", {2, 2}, "bfloat16");
  b.output({b.all_gather(x, 0)});
  const graph::Graph g = b.build();
  const std::string dir = ::testing::TempDir() + "/asynctp_inputs";
  std::filesystem::create_directories(dir);
  for (int r = 0; r < 2; ++r) {
    graph::write_raw(dir + "/x.rank" + std::to_string(r) + ".bin",
                     from_values({2, 2}, {1.0f * r, 2, 3, 4}, DType::kBF16).t);
  }
  auto statuses = run_ranks(2, [&](OpContext& ctx) {
    const auto out = graph::execute(ctx, g, graph::read_inputs(g, ctx.rank(), dir));
    const std::vector<float> expected{0, 2, 3, 4, 1, 2, 3, 4};
    EXPECT_EQ(values(out[0]), expected);
    EXPECT_THROW(graph::read_raw(dir + "/x.rank0.bin", {3, 3}, DType::kBF16), Error);
  });
  EXPECT_RANKS_OK(statuses);
}

}  // namespace
}  // namespace asynctp::testing
