// The executor's comparison, where, logical, integer and activation-backward kernels, its type
// promotion, and every scaled-dot-product-attention variant: each against values computed here
// (plain loops, finite differences, or an independent formulation such as explicitly repeated
// key/value heads for grouped-query attention).
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include <gtest/gtest.h>

#include "graph/compare.h"
#include "graph/executor.h"
#include "graph/executor_testing.h"
#include "graph/graph_builder.h"
#include "graph/inputs.h"
#include "support/multiprocess.h"

namespace asynctp::testing {
namespace {

// Runs body on one rank: a child process, as every executor test, so values computed inside
// stay inside and every check happens there.
void on_one_rank(const std::function<void(OpContext&)>& body) {
  auto statuses = run_ranks(1, body);
  EXPECT_RANKS_OK(statuses);
}

// Runs g on one rank with `inputs` and hands the outputs to `check`.
void run_one(const graph::Graph& g, const graph::Inputs& inputs,
             const std::function<void(const std::vector<graph::RtValue>&)>& check) {
  on_one_rank([&](OpContext& ctx) { check(graph::execute(ctx, g, inputs)); });
}

std::string error_of(OpContext& ctx, const graph::Graph& g, const graph::Inputs& inputs) {
  try {
    graph::execute(ctx, g, inputs);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// eq/ne/lt/le/gt/ge, Tensor and Scalar overloads, with NaN and broadcasting: IEEE comparisons.
TEST(Kernels, ComparisonsAreIeeeAndBroadcast) {
  GraphBuilder b(1);
  const auto x = b.input("x", {2, 3}), y = b.input("y", {3});
  const char* ops[] = {"eq", "ne", "lt", "le", "gt", "ge"};
  std::vector<std::string> outs;
  for (const char* op : ops) {
    outs.push_back(
        b.call(op, fmt::format("aten.{}.Tensor", op), {node(x), node(y)}, {2, 3}, "bool"));
    outs.push_back(
        b.call(op, fmt::format("aten.{}.Scalar", op), {node(x), Value::real(0.5)}, {2, 3}, "bool"));
  }
  b.output(outs);
  const std::vector<float> xv{0.5f, -1, kNaN, 2, 0.25f, 3}, yv{0.5f, 0, 1};
  auto ref = [](const char* op, float a, float c) {
    const std::string o = op;
    return o == "eq"   ? a == c
           : o == "ne" ? a != c
           : o == "lt" ? a < c
           : o == "le" ? a <= c
           : o == "gt" ? a > c
                       : a >= c;
  };
  run_one(b.build(), {{x, from_values({2, 3}, xv)}, {y, from_values({3}, yv)}},
          [&](const auto& out) {
            for (size_t k = 0; k < 6; ++k) {
              EXPECT_EQ(out[2 * k].tensor.t.dtype(), DType::kBool);
              const auto tv = values(out[2 * k]), sv = values(out[2 * k + 1]);
              for (size_t i = 0; i < 6; ++i) {
                EXPECT_EQ(tv[i], ref(ops[k], xv[i], yv[i % 3]) ? 1.0f : 0.0f) << ops[k] << " " << i;
                EXPECT_EQ(sv[i], ref(ops[k], xv[i], 0.5f) ? 1.0f : 0.0f) << ops[k] << " " << i;
              }
            }
          });
}

// A comparison casts its operands to their common dtype: a bf16 tensor against the number 0.1
// compares with 0.1 rounded to bf16, so bf16(0.1) == 0.1 holds, as in PyTorch.
TEST(Kernels, ComparisonRoundsTheScalarToTheCommonDtype) {
  GraphBuilder b(1);
  const auto x = b.input("x", {2}, "bfloat16");
  b.output({b.call("eq", "aten.eq.Scalar", {node(x), Value::real(0.1)}, {2}, "bool")});
  run_one(b.build(), {{x, from_values({2}, {0.1f, 0.2f}, DType::kBF16)}}, [](const auto& out) {
    EXPECT_EQ(values(out[0]), (std::vector<float>{1, 0}));
  });
}

// ReLU's backward as PyTorch lowers it: le(x, 0) in the forward (saved, a bool graph input of the
// backward), where(mask, 0.0, grad); and threshold_backward, the unlowered form.
TEST(Kernels, ReluBackwardThroughWhereAndThresholdBackward) {
  GraphBuilder b(1);
  const auto x = b.input("x", {2, 2}, "bfloat16"), g = b.input("g", {2, 2}, "bfloat16");
  const auto mask = b.call("le", "aten.le.Scalar", {node(x), Value::integer(0)}, {2, 2}, "bool");
  const auto zero = b.call("zero", "aten.full.default", {ints({}), Value::real(0.0)}, {},
                           "bfloat16", {{"dtype", Value::dtype("bfloat16")}});
  const auto w =
      b.call("where", "aten.where.self", {node(mask), node(zero), node(g)}, {2, 2}, "bfloat16");
  const auto tb = b.call("tb", "aten.threshold_backward.default",
                         {node(g), node(x), Value::integer(0)}, {2, 2}, "bfloat16");
  b.output({mask, w, tb});
  const std::vector<float> xv{-1, 0, 2, 0.5f}, gv{3, 4, 5, 6};
  run_one(b.build(),
          {{x, from_values({2, 2}, xv, DType::kBF16)}, {g, from_values({2, 2}, gv, DType::kBF16)}},
          [&](const auto& out) {
            EXPECT_EQ(values(out[0]), (std::vector<float>{1, 1, 0, 0}));
            EXPECT_EQ(values(out[1]), (std::vector<float>{0, 0, 5, 6}));
            EXPECT_EQ(values(out[2]), (std::vector<float>{0, 0, 5, 6}));
            EXPECT_EQ(out[1].tensor.t.dtype(), DType::kBF16);
          });
}

// where's scalar overloads and broadcasting of all three operands; logical ops and value tests.
TEST(Kernels, WhereOverloadsLogicalOpsAndTests) {
  GraphBuilder b(1);
  const auto c = b.input("c", {2, 1}, "bool"), x = b.input("x", {3});
  const auto w1 = b.call("w", "aten.where.ScalarSelf", {node(c), Value::real(-1.0), node(x)},
                         {2, 3}, "float32");
  const auto w2 = b.call("w", "aten.where.ScalarOther", {node(c), node(x), Value::real(7.0)},
                         {2, 3}, "float32");
  const auto w3 = b.call("w", "aten.where.Scalar", {node(c), Value::integer(1), Value::integer(0)},
                         {2, 1}, "int64");
  const auto nan = b.call("isnan", "aten.isnan.default", {node(x)}, {3}, "bool");
  const auto inf = b.call("isinf", "aten.isinf.default", {node(x)}, {3}, "bool");
  const auto fin = b.call("isfinite", "aten.isfinite.default", {node(x)}, {3}, "bool");
  const auto land = b.call("and", "aten.logical_and.default", {node(c), node(nan)}, {2, 3}, "bool");
  const auto lor = b.call("or", "aten.logical_or.default", {node(c), node(x)}, {2, 3}, "bool");
  const auto lxor = b.call("xor", "aten.logical_xor.default", {node(c), node(nan)}, {2, 3}, "bool");
  const auto lnot = b.call("not", "aten.logical_not.default", {node(x)}, {3}, "bool");
  const auto bnot = b.call("bnot", "aten.bitwise_not.default", {node(c)}, {2, 1}, "bool");
  const auto band = b.call("band", "aten.bitwise_and.Tensor", {node(c), node(fin)}, {2, 3}, "bool");
  b.output({w1, w2, w3, nan, inf, fin, land, lor, lxor, lnot, bnot, band});
  const float inf_v = std::numeric_limits<float>::infinity();
  run_one(b.build(),
          {{c, from_values({2, 1}, {1, 0}, DType::kBool)}, {x, from_values({3}, {kNaN, inf_v, 0})}},
          [&](const auto& out) {
            const auto v1 = values(out[0]), v2 = values(out[1]);
            EXPECT_EQ(v1[0], -1);
            EXPECT_TRUE(std::isnan(v1[3]));
            EXPECT_EQ(v1[4], inf_v);
            EXPECT_TRUE(std::isnan(v2[0]));
            EXPECT_EQ(v2[5], 7);
            EXPECT_EQ(out[2].tensor.t.dtype(), DType::kI64);
            EXPECT_EQ(values(out[2]), (std::vector<float>{1, 0}));
            EXPECT_EQ(values(out[3]), (std::vector<float>{1, 0, 0}));
            EXPECT_EQ(values(out[4]), (std::vector<float>{0, 1, 0}));
            EXPECT_EQ(values(out[5]), (std::vector<float>{0, 0, 1}));
            EXPECT_EQ(values(out[6]), (std::vector<float>{1, 0, 0, 0, 0, 0}));
            EXPECT_EQ(values(out[7]), (std::vector<float>{1, 1, 1, 1, 1, 0}));  // NaN is true
            EXPECT_EQ(values(out[8]), (std::vector<float>{0, 1, 1, 1, 0, 0}));
            EXPECT_EQ(values(out[9]), (std::vector<float>{0, 0, 1}));
            EXPECT_EQ(values(out[10]), (std::vector<float>{0, 1}));
            EXPECT_EQ(values(out[11]), (std::vector<float>{0, 0, 1, 0, 0, 0}));
          });
}

// PyTorch's result_type: levels (dim tensors, 0-d tensors, numbers) and categories.
TEST(Kernels, TypePromotionFollowsResultType) {
  GraphBuilder b(1);
  const auto bf = b.input("bf", {2}, "bfloat16"), f0 = b.input("f0", {}),
             i = b.input("i", {2}, "int64"), m = b.input("m", {2}, "bool"),
             h = b.input("h", {2}, "float16");
  const std::vector<std::string> outs{
      b.call("a", "aten.mul.Tensor", {node(bf), node(f0)}, {2}, "bfloat16"),  // 0-d: same category
      b.call("a", "aten.mul.Tensor", {node(i), Value::real(0.5)}, {2}, "float32"),
      b.call("a", "aten.add.Tensor", {node(i), Value::integer(3)}, {2}, "int64"),
      b.call("a", "aten.add.Tensor", {node(m), node(i)}, {2}, "int64"),
      b.call("a", "aten.mul.Tensor", {node(m), node(bf)}, {2}, "bfloat16"),
      b.call("a", "aten.add.Tensor", {node(bf), node(h)}, {2}, "float32"),
      b.call("a", "aten.div.Tensor", {node(i), Value::integer(2)}, {2}, "float32"),  // true div
      b.call("a", "aten.mul.Tensor", {node(f0), node(i)}, {2}, "float32"),  // 0-d float wins
      b.call("a", "aten.exp.default", {node(i)}, {2}, "float32"),
      b.call("a", "aten.neg.default", {node(i)}, {2}, "int64"),
      b.call("a", "aten.sum.default", {node(m)}, {}, "int64"),  // a sum of bools counts them
      // rsub(self, other, alpha) = other - alpha * self
      b.call("a", "aten.rsub.Scalar", {node(bf), Value::integer(1), Value::real(2.0)}, {2},
             "bfloat16"),
  };
  b.output(outs);
  run_one(b.build(),
          {{bf, from_values({2}, {1.5f, -2}, DType::kBF16)},
           {f0, from_values({}, {2})},
           {i, from_values({2}, {3, -4}, DType::kI64)},
           {m, from_values({2}, {1, 0}, DType::kBool)},
           {h, from_values({2}, {0.5f, 1}, DType::kF16)}},
          [&](const auto& out) {
            EXPECT_EQ(values(out[0]), (std::vector<float>{3, -4}));
            EXPECT_EQ(values(out[1]), (std::vector<float>{1.5f, -2}));
            EXPECT_EQ(values(out[2]), (std::vector<float>{6, -1}));
            EXPECT_EQ(values(out[3]), (std::vector<float>{4, -4}));
            EXPECT_EQ(values(out[4]), (std::vector<float>{1.5f, 0}));
            EXPECT_EQ(values(out[5]), (std::vector<float>{2, -1}));
            EXPECT_EQ(values(out[6]), (std::vector<float>{1.5f, -2}));
            EXPECT_EQ(values(out[7]), (std::vector<float>{6, -8}));
            EXPECT_FLOAT_EQ(values(out[8])[0], std::exp(3.0f));
            EXPECT_EQ(values(out[9]), (std::vector<float>{-3, 4}));
            EXPECT_EQ(values(out[10]), (std::vector<float>{1}));
            EXPECT_EQ(values(out[11]), (std::vector<float>{-2, 5}));
          });
  GraphBuilder c(1);  // a recorded dtype that promotion disagrees with is an error
  const auto x = c.input("x", {2}, "int64");
  c.output({c.call("bad", "aten.mul.Tensor", {node(x), Value::real(0.5)}, {2}, "int64")});
  const graph::Graph g = c.build();
  on_one_rank([&](OpContext& ctx) {
    const std::string e = error_of(ctx, g, graph::random_inputs(g, 0, 0));
    EXPECT_NE(e.find("has dtype float32 but its val records int64"), std::string::npos) << e;
  });
}

// Unary math against <cmath>; fmod and remainder signs; integer results are exact or an error.
TEST(Kernels, UnaryMathAndRemainders) {
  const std::pair<const char*, float (*)(float)> ops[] = {
      {"sin", [](float v) { return std::sin(v); }},
      {"cos", [](float v) { return std::cos(v); }},
      {"floor", [](float v) { return std::floor(v); }},
      {"ceil", [](float v) { return std::ceil(v); }},
      {"trunc", [](float v) { return std::trunc(v); }},
      {"round", [](float v) { return std::nearbyint(v); }},
      {"log1p", [](float v) { return std::log1p(v); }},
      {"expm1", [](float v) { return std::expm1(v); }},
      {"log2", [](float v) { return std::log2(v); }},
      {"exp2", [](float v) { return std::exp2(v); }},
      {"log10", [](float v) { return std::log10(v); }},
      {"sign", [](float v) { return v > 0   ? 1.0f
                                    : v < 0 ? -1.0f
                                            : 0.0f; }},
  };
  GraphBuilder b(1);
  const auto x = b.input("x", {5});
  std::vector<std::string> outs;
  for (const auto& [name, fn] : ops)
    outs.push_back(b.call(name, fmt::format("aten.{}.default", name), {node(x)}, {5}, "float32"));
  outs.push_back(b.call("fmod", "aten.fmod.Scalar", {node(x), Value::real(-1.0)}, {5}, "float32"));
  outs.push_back(
      b.call("rem", "aten.remainder.Scalar", {node(x), Value::real(-1.0)}, {5}, "float32"));
  b.output(outs);
  const std::vector<float> xv{0.5f, 2.5f, 3.75f, 1.5f, 0.0f};
  run_one(b.build(), {{x, from_values({5}, xv)}}, [&](const auto& out) {
    for (size_t k = 0; k < std::size(ops); ++k) {
      for (size_t i = 0; i < xv.size(); ++i)
        EXPECT_FLOAT_EQ(values(out[k])[i], ops[k].second(xv[i])) << ops[k].first << " " << xv[i];
    }
    const auto fm = values(out[std::size(ops)]), rm = values(out[std::size(ops) + 1]);
    for (size_t i = 0; i < xv.size(); ++i) {
      EXPECT_FLOAT_EQ(fm[i], std::fmod(xv[i], -1.0f));
      const float r = xv[i] - std::floor(xv[i] / -1.0f) * -1.0f;  // Python's %
      EXPECT_FLOAT_EQ(rm[i], r) << xv[i];
    }
  });
  GraphBuilder c(1);
  const auto i = c.input("i", {1}, "int64");
  c.output({c.call("big", "aten.mul.Scalar", {node(i), Value::integer(1 << 20)}, {1}, "int64")});
  const graph::Graph big = c.build();
  on_one_rank([&](OpContext& ctx) {
    const std::string e = error_of(ctx, big, {{i, from_values({1}, {1000}, DType::kI64)}});
    EXPECT_NE(e.find("2^24"), std::string::npos) << e;
  });
}

// The activations' backward ops against central differences of their forward ops.
TEST(Kernels, ActivationBackwardMatchesFiniteDifferences) {
  struct Case {
    const char* backward;
    const char* forward;
    bool takes_output;  // sigmoid/tanh backward read the forward's output
    std::vector<std::pair<std::string, Value>> fwd_kwargs;
  };
  const Case cases[] = {
      {"aten.gelu_backward.default", "aten.gelu.default", false, {}},
      {"aten.gelu_backward.default",
       "aten.gelu.default",
       false,
       {{"approximate", Value::string("tanh")}}},
      {"aten.silu_backward.default", "aten.silu.default", false, {}},
      {"aten.sigmoid_backward.default", "aten.sigmoid.default", true, {}},
      {"aten.tanh_backward.default", "aten.tanh.default", true, {}},
  };
  const std::vector<float> xv{-2.5f, -0.7f, 0.0f, 0.3f, 1.9f};
  for (const Case& cs : cases) {
    SCOPED_TRACE(cs.backward);
    GraphBuilder b(1);
    const auto x = b.input("x", {5}), g = b.input("g", {5});
    const auto y = b.call("y", cs.forward, {node(x)}, {5}, "float32", cs.fwd_kwargs);
    std::vector<std::pair<std::string, Value>> kw;
    for (const auto& [k, v] : cs.fwd_kwargs)
      kw.emplace_back(k, v);
    const auto dx =
        b.call("dx", cs.backward, {node(g), node(cs.takes_output ? y : x)}, {5}, "float32", kw);
    b.output({y, dx});
    const graph::Graph graph = b.build();
    const std::vector<float> gv{1.0f, -2.0f, 0.5f, 3.0f, 1.5f};
    on_one_rank([&](OpContext& ctx) {
      auto run = [&](float shift, int which) {
        std::vector<float> xs = xv;
        for (float& v : xs)
          v += shift;
        return values(graph::execute(
            ctx, graph, {{x, from_values({5}, xs)}, {g, from_values({5}, gv)}})[which]);
      };
      const float h = 1e-3f;
      const auto grad = run(0, 1), plus = run(h, 0), minus = run(-h, 0);
      for (size_t i = 0; i < xv.size(); ++i)
        EXPECT_NEAR(grad[i], gv[i] * (plus[i] - minus[i]) / (2 * h), 2e-3) << "x = " << xv[i];
    });
  }
}

// slice_scatter, arange/iota, full with an integer fill, and int64 values that pass through the
// graph bit for bit (an RNG seed beyond f32's exact range).
TEST(Kernels, SliceScatterSequencesAndExactIntegers) {
  GraphBuilder b(1);
  const auto x = b.input("x", {2, 6}), src = b.input("src", {2, 2});
  const auto seed = b.input("seed", {2}, "int64");
  const auto ss = b.call("ss", "aten.slice_scatter.default",
                         {node(x), node(src), Value::integer(1), Value::integer(1),
                          Value::integer(5), Value::integer(2)},
                         {2, 6}, "float32");
  const auto ar = b.call("ar", "aten.arange.start_step",
                         {Value::integer(2), Value::integer(9), Value::integer(3)}, {3}, "int64");
  const auto arf = b.call("arf", "aten.arange.default", {Value::real(2.0)}, {2}, "float32");
  const auto io = b.call("iota", "prims.iota.default", {Value::integer(4)}, {4}, "int64",
                         {{"start", Value::integer(5)},
                          {"step", Value::integer(-2)},
                          {"dtype", Value::dtype("int64")}});
  const auto fi = b.call("fi", "aten.full.default", {ints({2}), Value::integer(7)}, {2}, "int64");
  const auto pass = b.call("alias", "aten.alias.default", {node(seed)}, {2}, "int64");
  const auto cat =
      b.call("cat", "aten.cat.default", {Value::of_list({node(pass), node(seed)})}, {4}, "int64");
  b.output({ss, ar, arf, io, fi, cat});
  std::vector<float> xv(12);
  for (int i = 0; i < 12; ++i)
    xv[i] = static_cast<float>(i);
  graph::HostTensor seeds = graph::host_empty({2}, DType::kI64);
  const int64_t big[] = {(int64_t{1} << 62) + 12345, -987654321012345};
  std::memcpy(seeds.t.data(), big, sizeof(big));
  run_one(
      b.build(),
      {{x, from_values({2, 6}, xv)}, {src, from_values({2, 2}, {-1, -2, -3, -4})}, {seed, seeds}},
      [&](const auto& out) {
        EXPECT_EQ(values(out[0]), (std::vector<float>{0, -1, 2, -2, 4, 5, 6, -3, 8, -4, 10, 11}));
        EXPECT_EQ(values(out[1]), (std::vector<float>{2, 5, 8}));
        EXPECT_EQ(values(out[2]), (std::vector<float>{0, 1}));
        EXPECT_EQ(values(out[3]), (std::vector<float>{5, 3, 1, -1}));
        EXPECT_EQ(values(out[4]), (std::vector<float>{7, 7}));
        const auto* got = static_cast<const int64_t*>(out[5].tensor.t.data());
        EXPECT_EQ(got[0], big[0]);
        EXPECT_EQ(got[1], big[1]);
        EXPECT_EQ(got[2], big[0]);
        EXPECT_EQ(got[3], big[1]);
      });
}

// Random inputs: integers in [0, 1024) for int64 and uint64, 0/1 for bool; integer and bool
// outputs compare exactly.
TEST(Kernels, IntegerAndBoolInputsAndExactComparison) {
  GraphBuilder b(1);
  b.input("seed", {64}, "int64");
  b.input("offset", {64}, "uint64");
  b.input("mask", {64}, "bool");
  b.output({});
  const graph::Graph g = b.build();
  const graph::Inputs in = graph::random_inputs(g, 0, 5);
  bool saw_true = false, saw_false = false;
  for (const char* name : {"seed", "offset", "mask"}) {
    const auto v = graph::load_f32(in.at(name).t);
    for (float e : v) {
      EXPECT_EQ(e, std::floor(e));
      EXPECT_GE(e, 0);
      EXPECT_LT(e, std::string(name) == "mask" ? 2 : 1024);
      if (std::string(name) == "mask") (e != 0 ? saw_true : saw_false) = true;
    }
  }
  EXPECT_TRUE(saw_true && saw_false);
  const graph::RtValue a = graph::RtValue::of(from_values({3}, {1, 0, 1}, DType::kBool));
  const graph::RtValue same = graph::RtValue::of(from_values({3}, {1, 0, 1}, DType::kBool));
  const graph::RtValue other = graph::RtValue::of(from_values({3}, {1, 1, 1}, DType::kBool));
  EXPECT_TRUE(graph::compare_outputs({a}, {same})[0].ok);
  const auto diff = graph::compare_outputs({a}, {other})[0];
  EXPECT_FALSE(diff.ok);
  EXPECT_NEAR(diff.rel_error, 1.0 / 3, 1e-12);
}

// --- attention ---------------------------------------------------------------------------------

constexpr int64_t kB = 1, kH = 4, kHkv = 2, kL = 5, kE = 3;

struct AttnCase {
  const char* forward;
  const char* backward;
};

// Builds q [B, H, L, E], k/v [B, Hkv, L, E] and one variant's forward and backward with their
// real argument lists; returns the graph whose outputs are (out, dq, dk, dv).
graph::Graph attention_graph(const std::string& variant, int64_t hkv) {
  GraphBuilder b(1);
  const Dims qs{kB, kH, kL, kE}, ks{kB, hkv, kL, kE};
  const auto q = b.input("q", qs), k = b.input("k", ks), v = b.input("v", ks),
             dout = b.input("dout", qs);
  const Value none = Value::none(), zero = Value::real(0.0), causal = Value::boolean(true);
  std::string fwd, bwd;
  auto item = [&](const std::string& t, int i) {
    return b.call_untyped("item", "_operator.getitem", {node(t), Value::integer(i)});
  };
  if (variant == "cpu") {
    fwd = b.call_untyped("fwd", "aten._scaled_dot_product_flash_attention_for_cpu.default",
                         {node(q), node(k), node(v), zero, causal});
    bwd = b.call_untyped("bwd", "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
                         {node(dout), node(q), node(k), node(v), node(item(fwd, 0)),
                          node(item(fwd, 1)), zero, causal});
  } else if (variant == "flash") {
    fwd = b.call_untyped("fwd", "aten._scaled_dot_product_flash_attention.default",
                         {node(q), node(k), node(v), zero, causal});
    bwd = b.call_untyped("bwd", "aten._scaled_dot_product_flash_attention_backward.default",
                         {node(dout), node(q), node(k), node(v), node(item(fwd, 0)),
                          node(item(fwd, 1)), none, none, Value::integer(kL), Value::integer(kL),
                          zero, causal, node(item(fwd, 6)), node(item(fwd, 7))});
  } else if (variant == "efficient") {
    fwd = b.call_untyped("fwd", "aten._scaled_dot_product_efficient_attention.default",
                         {node(q), node(k), node(v), none, Value::boolean(true), zero, causal});
    bwd = b.call_untyped("bwd", "aten._scaled_dot_product_efficient_attention_backward.default",
                         {node(dout), node(q), node(k), node(v), none, node(item(fwd, 0)),
                          node(item(fwd, 1)), node(item(fwd, 2)), node(item(fwd, 3)), zero,
                          Value::of_list({causal, causal, causal, Value::boolean(false)}), causal});
  } else {
    fwd = b.call_untyped("fwd", "aten._scaled_dot_product_cudnn_attention.default",
                         {node(q), node(k), node(v), none, Value::boolean(true), zero, causal,
                          Value::boolean(false)});
    bwd = b.call_untyped("bwd", "aten._scaled_dot_product_cudnn_attention_backward.default",
                         {node(dout), node(q), node(k), node(v), node(item(fwd, 0)),
                          node(item(fwd, 1)), node(item(fwd, 6)), node(item(fwd, 7)), none, none,
                          none, Value::integer(kL), Value::integer(kL), zero, causal});
  }
  b.output({item(fwd, 0), item(bwd, 0), item(bwd, 1), item(bwd, 2)});
  return b.build();
}

// Every variant agrees with the CPU flash reference (checked against finite differences in
// executor_test.cpp) on grouped-query inputs, and the grouped-query reference agrees with the
// same attention over explicitly repeated key/value heads (dK, dV summed over each group).
TEST(Kernels, EveryAttentionVariantMatchesTheReference) {
  const graph::Graph full = attention_graph("cpu", kH);
  graph::Inputs in = graph::random_inputs(attention_graph("cpu", kHkv), 0, 11);
  // Key/value heads repeated: head h reads kv head h / (H / Hkv).
  graph::Inputs repeated = in;
  for (const char* name : {"k", "v"}) {
    const auto src = graph::load_f32(in.at(name).t);
    std::vector<float> rep(static_cast<size_t>(kB * kH * kL * kE));
    for (int64_t h = 0; h < kH; ++h) {
      for (int64_t i = 0; i < kL * kE; ++i)
        rep[h * kL * kE + i] = src[(h / (kH / kHkv)) * kL * kE + i];
    }
    repeated[name] = from_values({kB, kH, kL, kE}, rep);
  }
  on_one_rank([&](OpContext& ctx) {
    std::vector<std::vector<float>> want;
    for (const auto& o : graph::execute(ctx, full, repeated))
      want.push_back(values(o));
    for (const char* variant : {"cpu", "flash", "efficient", "cudnn"}) {
      SCOPED_TRACE(variant);
      {
        const auto out = graph::execute(ctx, attention_graph(variant, kHkv), in);
        for (int which : {0, 1}) {  // out, dq
          const auto got = values(out[which]);
          for (size_t i = 0; i < got.size(); ++i)
            EXPECT_NEAR(got[i], want[which][i], 1e-5) << which << "[" << i << "]";
        }
        for (int which : {2, 3}) {  // dk, dv: the repeated heads' gradients summed per group
          const auto got = values(out[which]);
          ASSERT_EQ(got.size(), static_cast<size_t>(kB * kHkv * kL * kE));
          for (int64_t kvh = 0; kvh < kHkv; ++kvh) {
            for (int64_t i = 0; i < kL * kE; ++i) {
              float sum = 0;
              for (int64_t r = 0; r < kH / kHkv; ++r)
                sum += want[which][(kvh * (kH / kHkv) + r) * kL * kE + i];
              EXPECT_NEAR(got[kvh * kL * kE + i], sum, 1e-5) << which << " head " << kvh;
            }
          }
        }
      }
    }
  });
}

// The real output tuples: logsumexp shapes, max_q/max_k as integers, RNG state in the recorded
// dtype (uint64 for PyTorch 2.15's CUDA flash), the empty debug mask.
TEST(Kernels, AttentionOutputTuplesAreRecordedShapes) {
  GraphBuilder b(1);
  const Dims qs{kB, kH, kL, kE};
  const auto q = b.input("q", qs), k = b.input("k", qs), v = b.input("v", qs);
  const auto flash = b.call_untyped("flash", "aten._scaled_dot_product_flash_attention.default",
                                    {node(q), node(k), node(v)});
  auto tuple_meta = [](std::vector<std::optional<TensorMeta>> items) {
    Meta m;
    m.kind = Meta::Kind::kTuple;
    m.tuple = std::move(items);
    return m;
  };
  auto tm = [](Dims shape, const char* dtype) {
    return TensorMeta{shape, contiguous_strides(shape), dtype, "cuda"};
  };
  b.graph().find_mutable(flash)->val = tuple_meta(
      {tm(qs, "float32"), tm({kB, kH, kL}, "float32"), std::nullopt, std::nullopt, std::nullopt,
       std::nullopt, tm({2}, "uint64"), tm({}, "uint64"), tm({0}, "float32")});
  const auto eff = b.call_untyped("eff", "aten._scaled_dot_product_efficient_attention.default",
                                  {node(q), node(k), node(v), Value::none(), Value::boolean(true)});
  b.graph().find_mutable(eff)->val = tuple_meta(
      {tm(qs, "float32"), tm({kB, kH, 32}, "float32"), tm({}, "int64"), tm({}, "int64")});
  const auto cud = b.call_untyped("cudnn", "aten._scaled_dot_product_cudnn_attention.default",
                                  {node(q), node(k), node(v), Value::none(), Value::boolean(true)});
  b.graph().find_mutable(cud)->val =
      tuple_meta({tm(qs, "float32"), tm({kB, kH, kL, 1}, "float32"), std::nullopt, std::nullopt,
                  std::nullopt, std::nullopt, tm({}, "int64"), tm({}, "int64"), std::nullopt});
  b.output({flash, eff, cud});
  const graph::Graph g = b.build();
  run_one(g, graph::random_inputs(g, 0, 2), [&](const auto& out) {
    // The output node flattens one level: each tuple is one output.
    const auto& f = out[0].items;
    ASSERT_EQ(f.size(), 9u);
    EXPECT_TRUE(f[2].is_none());
    EXPECT_EQ(f[4].literal.i, kL);
    EXPECT_EQ(f[5].literal.i, kL);
    EXPECT_EQ(f[6].tensor.t.dtype(), DType::kU64);
    EXPECT_EQ(f[6].tensor.t.shape(), Dims{2});
    EXPECT_EQ(f[8].tensor.t.shape(), Dims{0});
    const auto& e = out[1].items;
    ASSERT_EQ(e.size(), 4u);
    const auto lse = values(e[1]), flse = values(f[1]), clse = values(out[2].items[1]);
    for (int64_t h = 0; h < kH; ++h) {
      for (int64_t i = 0; i < 32; ++i) {
        EXPECT_EQ(lse[h * 32 + i], i < kL ? flse[h * kL + i] : 0.0f);  // padded to 32 with 0
        if (i < kL) {
          EXPECT_EQ(clse[h * kL + i], flse[h * kL + i]);
        }
      }
    }
    EXPECT_EQ(out[2].items.size(), 9u);
    EXPECT_EQ(out[2].items[1].tensor.t.shape(), (Dims{kB, kH, kL, 1}));
  });
}

// The efficient backward's bias gradient (grad_input_mask[3]) against finite differences of
// L = sum(out * dO) in the bias.
TEST(Kernels, EfficientAttentionBiasGradient) {
  GraphBuilder b(1);
  const Dims qs{1, 2, 3, 2}, bs{1, 2, 3, 3};
  const auto q = b.input("q", qs), k = b.input("k", qs), v = b.input("v", qs),
             bias = b.input("bias", bs), dout = b.input("dout", qs);
  const Value zero = Value::real(0.0), no = Value::boolean(false);
  const auto fwd =
      b.call_untyped("fwd", "aten._scaled_dot_product_efficient_attention.default",
                     {node(q), node(k), node(v), node(bias), Value::boolean(true), zero, no});
  const auto out =
      b.call("out", "_operator.getitem", {node(fwd), Value::integer(0)}, qs, "float32");
  const auto lse = b.call_untyped("lse", "_operator.getitem", {node(fwd), Value::integer(1)});
  const auto bwd = b.call_untyped(
      "bwd", "aten._scaled_dot_product_efficient_attention_backward.default",
      {node(dout), node(q), node(k), node(v), node(bias), node(out), node(lse), Value::none(),
       Value::none(), zero, Value::of_list({no, no, no, Value::boolean(true)}), no});
  b.output({out, b.call("db", "_operator.getitem", {node(bwd), Value::integer(3)}, bs, "float32")});
  const graph::Graph g = b.build();
  graph::Inputs in = graph::random_inputs(g, 0, 4);
  const std::vector<float> dov = graph::load_f32(in.at(dout).t),
                           b0 = graph::load_f32(in.at(bias).t);
  on_one_rank([&](OpContext& ctx) {
    const auto grad = values(graph::execute(ctx, g, in)[1]);
    for (size_t i = 0; i < b0.size(); ++i) {
      double loss[2];
      for (int s = 0; s < 2; ++s) {
        std::vector<float> bv = b0;
        bv[i] += s == 0 ? 1e-2f : -1e-2f;
        graph::Inputs shifted = in;
        shifted[bias] = from_values(bs, bv);
        const auto ov = values(graph::execute(ctx, g, shifted)[0]);
        loss[s] = 0;
        for (size_t j = 0; j < ov.size(); ++j)
          loss[s] += static_cast<double>(ov[j]) * dov[j];
      }
      EXPECT_NEAR(grad[i], (loss[0] - loss[1]) / 2e-2, 2e-3) << "bias[" << i << "]";
    }
  });
}

}  // namespace
}  // namespace asynctp::testing
