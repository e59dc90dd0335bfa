// A sequence-parallel SwiGLU gate/up projection as PyTorch's graphs hold it, for the tests of the
// SwiGLU epilogue pass (patterns_test.cpp, cli_test.cpp).
#pragma once

#include <string>
#include <vector>

#include "graph/graph_builder.h"

namespace asynctp::testing {

// kUpHalf, kAlphaTwo and kConvertF16 are no SwiGLU of the op's: silu of the up half,
// g / (exp(-g) + 2) (add's alpha 2), silu computed in f16 in a bf16 graph.
enum class SiluForm { kAten, kDivExp, kSigmoid, kUpHalf, kAlphaTwo, kConvertF16 };

// x [2, H=8] -AG(0)-> [8, 8] @ w13 [8, 2N=12] -> split(N, -1) -> silu(g) * u -> @ w2 [6, 8] -RS->,
// silu in the form PyTorch writes it (kDivExp: in f32 between converts of a bf16 graph, as
// Inductor decomposes it); kUpHalf takes silu of the wrong half, which is no SwiGLU of the op's.
// 4 ranks. save_pre: P is also a graph output (the forward of a training step saves it); save_a:
// the gathered x is too (saved for the weight gradient).
struct SwigluGraph {
  graph::Graph g;
  std::string ag, mul;
};
inline SwigluGraph swiglu_graph(SiluForm form, bool save_pre, bool save_a = false) {
  const bool div_exp =
      form == SiluForm::kDivExp || form == SiluForm::kAlphaTwo || form == SiluForm::kConvertF16;
  const std::string dt = div_exp ? "bfloat16" : "float32";
  GraphBuilder b(4);
  const auto x = b.input("x", {2, 8}, dt), w13 = b.input("w13", {8, 12}, dt),
             w2 = b.input("w2", {6, 8}, dt);
  SwigluGraph out;
  const auto gathered = b.all_gather(x, 0, &out.ag);
  const auto p = b.mm(gathered, w13);
  const auto split = b.call_untyped("split", "aten.split.Tensor",
                                    {node(p), Value::integer(6), Value::integer(-1)});
  const auto gate =
      b.call("getitem", "_operator.getitem", {node(split), Value::integer(0)}, {8, 6}, dt);
  const auto up =
      b.call("getitem", "_operator.getitem", {node(split), Value::integer(1)}, {8, 6}, dt);
  auto unary = [&](const char* target, const std::string& a, const std::string& dtype) {
    return b.call("u", target, {node(a)}, {8, 6}, dtype);
  };
  std::string s, other = up;
  switch (form) {
    case SiluForm::kAten:
      s = unary("aten.silu.default", gate, dt);
      break;
    case SiluForm::kUpHalf:
      s = unary("aten.silu.default", up, dt);
      other = gate;
      break;
    case SiluForm::kSigmoid:
      s = b.call("mul", "aten.mul.Tensor",
                 {node(unary("aten.sigmoid.default", gate, dt)), node(gate)}, {8, 6}, dt);
      break;
    case SiluForm::kDivExp:
    case SiluForm::kAlphaTwo:
    case SiluForm::kConvertF16: {
      const std::string cd = form == SiluForm::kConvertF16 ? "float16" : "float32";
      const auto c = b.call("convert", "prims.convert_element_type.default",
                            {node(gate), Value::dtype(cd)}, {8, 6}, cd);
      const auto e = unary("aten.exp.default", unary("aten.neg.default", c, cd), cd);
      std::vector<std::pair<std::string, Value>> alpha;
      if (form == SiluForm::kAlphaTwo) alpha.emplace_back("alpha", Value::integer(2));
      const auto d =
          b.call("add", "aten.add.Tensor", {node(e), Value::integer(1)}, {8, 6}, cd, alpha);
      const auto q = b.call("div", "aten.div.Tensor", {node(c), node(d)}, {8, 6}, cd);
      s = b.call("convert", "prims.convert_element_type.default", {node(q), Value::dtype(dt)},
                 {8, 6}, dt);
      break;
    }
  }
  out.mul = b.call("mul", "aten.mul.Tensor", {node(s), node(other)}, {8, 6}, dt);
  const auto y = b.reduce_scatter(b.mm(out.mul, w2), 0);
  std::vector<std::string> outputs{y};
  if (save_pre) outputs.push_back(p);
  if (save_a) outputs.push_back(gathered);
  b.output(outputs);
  out.g = b.build();
  return out;
}

}  // namespace asynctp::testing
