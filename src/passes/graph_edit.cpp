#include "passes/graph_edit.h"

#include <algorithm>
#include <queue>

#include <asynctp/tensor.h>
#include "core/error.h"

namespace asynctp::passes {

Node make_call(std::string name, std::string target, std::vector<Value> args,
               std::vector<std::pair<std::string, Value>> kwargs, Meta meta) {
  Node n;
  n.name = std::move(name);
  n.op = graph::OpKind::kCallFunction;
  n.target = std::move(target);
  n.args = std::move(args);
  n.kwargs = std::move(kwargs);
  n.val = std::move(meta);
  return n;
}

TensorMeta contiguous_meta(const Dims& shape, std::string dtype, std::string device) {
  return TensorMeta{shape, contiguous_strides(shape), std::move(dtype), std::move(device)};
}

Value int_list(const Dims& dims) {
  std::vector<Value> items;
  for (int64_t d : dims)
    items.push_back(Value::integer(d));
  return Value::of_list(std::move(items));
}

const TensorMeta* tensor_meta(const Graph& g, const std::string& name) {
  const Node* n = g.find(name);
  return n != nullptr && n->val.is_tensor() ? &n->val.tensor : nullptr;
}

std::string node_arg(const Node& node, size_t i) {
  return i < node.args.size() && node.args[i].is_node() ? node.args[i].s : std::string();
}

const std::vector<std::string>& users_of(const Users& users, const std::string& name) {
  static const std::vector<std::string> kNone;
  auto it = users.find(name);
  return it == users.end() ? kNone : it->second;
}

bool is_reshape(const Node& node) {
  return node.target == "aten.reshape.default" || node.target == "aten.view.default" ||
         node.target == "aten._unsafe_view.default";
}

std::optional<Dims> reshape_shape(const Graph& g, const Node& node) {
  if (!is_reshape(node)) return std::nullopt;
  if (node.val.is_tensor()) return node.val.tensor.shape;
  if (node.args.size() < 2 || !node.args[1].is_list()) return std::nullopt;
  Dims out;
  for (const auto& v : node.args[1].list) {
    if (!v.is_int() || v.i < 0) return std::nullopt;
    out.push_back(v.i);
  }
  return out;
}

std::unordered_set<std::string> descendants(const Graph& g, const Users& users,
                                            const std::string& root) {
  std::unordered_set<std::string> seen{root};
  std::vector<std::string> stack{root};
  while (!stack.empty()) {
    const std::string n = stack.back();
    stack.pop_back();
    for (const auto& u : users_of(users, n)) {
      if (seen.insert(u).second) stack.push_back(u);
    }
  }
  return seen;
}

size_t hoist_before(Graph& g, size_t position, const std::vector<std::string>& needed) {
  std::unordered_set<std::string> move;
  std::vector<std::string> stack;
  for (const auto& n : needed) {
    if (g.index_of(n) >= position) stack.push_back(n);
  }
  while (!stack.empty()) {
    const std::string n = stack.back();
    stack.pop_back();
    if (!move.insert(n).second) continue;
    for (const auto& in : g.find(n)->inputs()) {
      if (g.index_of(in) >= position && !move.count(in)) stack.push_back(in);
    }
  }
  if (move.empty()) return position;
  const std::string anchor = g.nodes()[position].name;
  ASYNCTP_CHECK(!move.count(anchor), "hoisting the inputs of {} would move {} itself", anchor,
                anchor);
  std::vector<Node> moved, rest;
  auto& nodes = g.mutable_nodes();
  for (size_t i = position; i < nodes.size(); ++i) {
    (move.count(nodes[i].name) ? moved : rest).push_back(std::move(nodes[i]));
  }
  nodes.resize(position);
  for (auto& n : moved)
    nodes.push_back(std::move(n));
  for (auto& n : rest)
    nodes.push_back(std::move(n));
  return g.index_of(anchor);
}

namespace {
bool is_pure(const Node& n) {
  if (n.op != graph::OpKind::kCallFunction) return false;
  const std::string& t = n.target;
  return t.rfind("aten.", 0) == 0 || t.rfind("prims.", 0) == 0 || t == "_operator.getitem" ||
         t.rfind("asynctp.", 0) == 0;
}
}  // namespace

int remove_dead_code(Graph& g) {
  int removed = 0;
  bool changed = true;
  while (changed) {
    changed = false;
    const Users users = g.users();
    std::vector<std::string> dead;
    for (const auto& n : g.nodes()) {
      if (is_pure(n) && users_of(users, n.name).empty()) dead.push_back(n.name);
    }
    for (const auto& name : dead)
      g.erase(name);
    removed += static_cast<int>(dead.size());
    changed = !dead.empty();
  }
  return removed;
}

void stable_topological_sort(Graph& g) {
  auto& nodes = g.mutable_nodes();
  const size_t n = nodes.size();
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < n; ++i)
    index.emplace(nodes[i].name, i);
  std::vector<int> pending(n, 0);
  std::vector<std::vector<size_t>> users(n);
  for (size_t i = 0; i < n; ++i) {
    std::unordered_set<std::string> seen;
    for (const auto& in : nodes[i].inputs()) {
      auto it = index.find(in);
      ASYNCTP_CHECK(it != index.end(), "node {} reads '{}', which is not in the graph",
                    nodes[i].name, in);
      if (!seen.insert(in).second) continue;
      ++pending[i];
      users[it->second].push_back(i);
    }
  }
  std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;
  for (size_t i = 0; i < n; ++i) {
    if (pending[i] == 0) ready.push(i);
  }
  std::vector<size_t> order;
  while (!ready.empty()) {
    const size_t i = ready.top();
    ready.pop();
    order.push_back(i);
    for (size_t u : users[i]) {
      if (--pending[u] == 0) ready.push(u);
    }
  }
  if (order.size() != n) {
    for (size_t i = 0; i < n; ++i) {
      ASYNCTP_CHECK(pending[i] == 0, "the graph has a cycle through node {}", nodes[i].name);
    }
  }
  std::vector<Node> sorted;
  sorted.reserve(n);
  for (size_t i : order)
    sorted.push_back(std::move(nodes[i]));
  nodes = std::move(sorted);
}

bool is_topologically_sorted(const Graph& g) {
  std::unordered_set<std::string> seen;
  for (const auto& n : g.nodes()) {
    for (const auto& in : n.inputs()) {
      if (!seen.count(in)) return false;
    }
    seen.insert(n.name);
  }
  return true;
}

}  // namespace asynctp::passes
