#include "graph/graph_builder.h"

#include <asynctp/tensor.h>
#include "core/error.h"

namespace asynctp::testing {

namespace {
Value dims_value(const Dims& d) {
  std::vector<Value> items;
  for (int64_t x : d)
    items.push_back(Value::integer(x));
  return Value::of_list(std::move(items));
}
}  // namespace

std::string GraphBuilder::input(const std::string& name, Dims shape, const std::string& dtype) {
  Node n;
  n.name = g_.unique_name(name);
  n.op = graph::OpKind::kPlaceholder;
  n.target = n.name;
  n.val = Meta::of({shape, contiguous_strides(shape), dtype, "cpu"});
  const std::string out = n.name;
  g_.insert(g_.size(), std::move(n));
  return out;
}

std::string GraphBuilder::call(const std::string& name, const std::string& target,
                               std::vector<Value> args, Dims shape, const std::string& dtype,
                               std::vector<std::pair<std::string, Value>> kwargs,
                               std::optional<Dims> strides) {
  Node n;
  n.name = g_.unique_name(name);
  n.target = target;
  n.args = std::move(args);
  n.kwargs = std::move(kwargs);
  n.val = Meta::of({shape, strides.value_or(contiguous_strides(shape)), dtype, "cpu"});
  const std::string out = n.name;
  g_.insert(g_.size(), std::move(n));
  return out;
}

std::string GraphBuilder::call_untyped(const std::string& name, const std::string& target,
                                       std::vector<Value> args) {
  Node n;
  n.name = g_.unique_name(name);
  n.target = target;
  n.args = std::move(args);
  const std::string out = n.name;
  g_.insert(g_.size(), std::move(n));
  return out;
}

void GraphBuilder::output(const std::vector<std::string>& names) {
  Node n;
  n.name = "output";
  n.op = graph::OpKind::kOutput;
  n.target = "output";
  std::vector<Value> items;
  for (const auto& x : names)
    items.push_back(Value::node(x));
  n.args.push_back(Value::of_list(std::move(items)));
  g_.insert(g_.size(), std::move(n));
}

const TensorMeta& GraphBuilder::meta(const std::string& name) const {
  const Node* n = g_.find(name);
  ASYNCTP_CHECK(n != nullptr && n->val.is_tensor(), "builder: no tensor node {}", name);
  return n->val.tensor;
}

std::string GraphBuilder::mm(const std::string& a, const std::string& b) {
  const TensorMeta ma = meta(a), mb = meta(b);
  return call("mm", "aten.mm.default", {node(a), node(b)}, {ma.shape[0], mb.shape[1]}, ma.dtype);
}

std::string GraphBuilder::permute2d(const std::string& x) {
  const TensorMeta m = meta(x);
  return call("permute", "aten.permute.default", {node(x), ints({1, 0})}, {m.shape[1], m.shape[0]},
              m.dtype, {}, Dims{m.stride[1], m.stride[0]});
}

std::string GraphBuilder::reshape(const std::string& x, Dims shape) {
  return call("view", "aten.reshape.default", {node(x), dims_value(shape)}, shape, meta(x).dtype);
}

std::string GraphBuilder::add(const std::string& a, const std::string& b) {
  const TensorMeta m = meta(a);
  return call("add", "aten.add.Tensor", {node(a), node(b)}, m.shape, m.dtype);
}

std::string GraphBuilder::all_gather(const std::string& x, int dim, std::string* ag_name) {
  const TensorMeta m = meta(x);
  const int ws = g_.world_size;
  Dims stacked = m.shape;
  stacked[0] *= ws;
  const std::string ag =
      call("all_gather_into_tensor", "_c10d_functional.all_gather_into_tensor.default",
           {node(x), Value::integer(ws), Value::string("0")}, stacked, m.dtype);
  if (ag_name != nullptr) *ag_name = ag;
  const std::string wait =
      call("wait_tensor", "_c10d_functional.wait_tensor.default", {node(ag)}, stacked, m.dtype);
  if (dim == 0) return wait;
  const std::string split =
      call_untyped("split", "aten.split.Tensor", {node(wait), Value::integer(m.shape[0])});
  std::vector<Value> parts;
  for (int r = 0; r < ws; ++r) {
    parts.push_back(node(call("getitem", "_operator.getitem", {node(split), Value::integer(r)},
                              m.shape, m.dtype, {}, m.stride)));
  }
  Dims gathered = m.shape;
  gathered[dim] *= ws;
  return call("cat", "aten.cat.default", {Value::of_list(parts), Value::integer(dim)}, gathered,
              m.dtype);
}

std::string GraphBuilder::reduce_scatter(const std::string& x, int dim, std::string* rs_name,
                                         const std::string& op) {
  const TensorMeta m = meta(x);
  const int ws = g_.world_size;
  std::string in = x;
  if (dim != 0) {
    Dims chunk = m.shape;
    chunk[dim] /= ws;
    const std::string split = call_untyped(
        "split", "aten.split.Tensor", {node(x), Value::integer(chunk[dim]), Value::integer(dim)});
    std::vector<Value> parts;
    for (int r = 0; r < ws; ++r) {
      parts.push_back(node(call("getitem", "_operator.getitem", {node(split), Value::integer(r)},
                                chunk, m.dtype, {}, m.stride)));
    }
    Dims stacked = chunk;
    stacked[0] *= ws;
    in = call("cat", "aten.cat.default", {Value::of_list(parts)}, stacked, m.dtype);
  }
  Dims out = meta(in).shape;
  out[0] /= ws;
  const std::string rs =
      call("reduce_scatter_tensor", "_c10d_functional.reduce_scatter_tensor.default",
           {node(in), Value::string(op), Value::integer(ws), Value::string("0")}, out, m.dtype);
  if (rs_name != nullptr) *rs_name = rs;
  return call("wait_tensor", "_c10d_functional.wait_tensor.default", {node(rs)}, out, m.dtype);
}

graph::Graph GraphBuilder::build() const {
  graph::Graph g = g_;
  g.validate();
  return g;
}

}  // namespace asynctp::testing
