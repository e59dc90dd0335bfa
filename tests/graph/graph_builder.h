// A small builder for hand-written test graphs: every node gets its recorded `val` (contiguous
// unless given), as PyTorch would write it, so that the executor checks every result.
#pragma once

#include <string>
#include <vector>

#include "graph/ir.h"

namespace asynctp::testing {

using graph::Meta;
using graph::Node;
using graph::TensorMeta;
using graph::Value;

class GraphBuilder {
 public:
  explicit GraphBuilder(int world_size) { g_.world_size = world_size; }

  std::string input(const std::string& name, Dims shape, const std::string& dtype = "float32");
  // A call_function node named `name` (made unique) with a tensor result of `shape`/`dtype`.
  std::string call(const std::string& name, const std::string& target, std::vector<Value> args,
                   Dims shape, const std::string& dtype,
                   std::vector<std::pair<std::string, Value>> kwargs = {},
                   std::optional<Dims> strides = std::nullopt);
  // A node without recorded val (tuples: split, ...).
  std::string call_untyped(const std::string& name, const std::string& target,
                           std::vector<Value> args);
  void output(const std::vector<std::string>& names);

  // Common shapes of PyTorch's graphs.
  std::string mm(const std::string& a, const std::string& b);
  std::string permute2d(const std::string& x);
  std::string reshape(const std::string& x, Dims shape);
  std::string add(const std::string& a, const std::string& b);
  // all_gather (+ wait, + chunk-cat for dim != 0) of x on `dim`; returns the gathered tensor.
  std::string all_gather(const std::string& x, int dim, std::string* ag_name = nullptr);
  // reduce_scatter (chunk-cat for dim != 0, + wait) of x on `dim`; returns the waited result.
  std::string reduce_scatter(const std::string& x, int dim, std::string* rs_name = nullptr,
                             const std::string& op = "sum");

  const TensorMeta& meta(const std::string& name) const;
  graph::Graph build() const;
  graph::Graph& graph() { return g_; }

 private:
  graph::Graph g_;
};

static inline Value node(const std::string& n) {
  return Value::node(n);
}
static inline Value ints(std::initializer_list<int64_t> v) {
  std::vector<Value> items;
  for (int64_t x : v)
    items.push_back(Value::integer(x));
  return Value::of_list(std::move(items));
}

}  // namespace asynctp::testing
