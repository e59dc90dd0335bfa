#include "graph/large_graph.h"

#include <fmt/format.h>

#include "graph/ir.h"
#include "graph/json_io.h"

namespace asynctp::testing {

namespace {

constexpr int64_t kTokens = 16, kHidden = 8, kFfn = 32;

graph::Node make_node(std::string name, graph::OpKind op, std::string target,
                      std::vector<graph::Value> args, Dims shape) {
  graph::Node n;
  n.name = std::move(name);
  n.op = op;
  n.target = std::move(target);
  n.args = std::move(args);
  n.val = graph::Meta::of({shape, Dims{shape[1], 1}, "float32", "cpu"});
  return n;
}

}  // namespace

std::string large_graph_json(size_t num_nodes) {
  using graph::OpKind;
  using graph::Value;
  graph::Graph g;
  g.source = fmt::format("large_graph_json({})", num_nodes);
  g.world_size = 1;
  const auto append = [&](graph::Node n) { g.insert(g.size(), std::move(n)); };
  append(make_node("x", OpKind::kPlaceholder, "x", {}, {kTokens, kHidden}));
  std::string h = "x";
  constexpr size_t kNodesPerLayer = 6;
  for (size_t layer = 0; g.size() + kNodesPerLayer + 1 <= num_nodes || layer == 0; ++layer) {
    const std::string w1 = fmt::format("w1_{}", layer), w2 = fmt::format("w2_{}", layer);
    append(make_node(w1, OpKind::kPlaceholder, w1, {}, {kHidden, kFfn}));
    append(make_node(w2, OpKind::kPlaceholder, w2, {}, {kFfn, kHidden}));
    const std::string up = fmt::format("mm_{}", 2 * layer), act = fmt::format("relu_{}", layer),
                      down = fmt::format("mm_{}", 2 * layer + 1),
                      sum = fmt::format("add_{}", layer);
    append(make_node(up, OpKind::kCallFunction, "aten.mm.default",
                     {Value::node(h), Value::node(w1)}, {kTokens, kFfn}));
    append(make_node(act, OpKind::kCallFunction, "aten.relu.default", {Value::node(up)},
                     {kTokens, kFfn}));
    append(make_node(down, OpKind::kCallFunction, "aten.mm.default",
                     {Value::node(act), Value::node(w2)}, {kTokens, kHidden}));
    append(make_node(sum, OpKind::kCallFunction, "aten.add.Tensor",
                     {Value::node(h), Value::node(down)}, {kTokens, kHidden}));
    h = sum;
  }
  graph::Node out;
  out.name = "output";
  out.op = OpKind::kOutput;
  out.target = "output";
  out.args.push_back(Value::of_list({Value::node(h)}));
  append(std::move(out));
  return graph::dump_graph(g);
}

}  // namespace asynctp::testing
