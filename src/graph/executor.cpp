#include "graph/executor.h"

#include <unordered_set>

#include "core/error.h"

namespace asynctp::graph {

namespace {

using Env = std::unordered_map<std::string, RtValue>;

bool contains_node(const Value& v) {
  if (v.kind == Value::Kind::kNode) return true;
  for (const auto& item : v.list) {
    if (contains_node(item)) return true;
  }
  return false;
}

RtValue evaluate(const Value& v, const Env& env, const Node& node) {
  if (v.kind == Value::Kind::kNode) {
    auto it = env.find(v.s);
    ASYNCTP_CHECK(it != env.end(), "node {}: input '{}' has no value", node.name, v.s);
    return it->second;
  }
  if (v.kind == Value::Kind::kList) {
    if (contains_node(v)) {
      std::vector<RtValue> items;
      for (const auto& item : v.list)
        items.push_back(evaluate(item, env, node));
      return RtValue::list(std::move(items));
    }
  }
  return RtValue::lit(v);
}

void check_tensor_meta(const Node& node, const TensorMeta& meta, const RtValue& got,
                       const std::string& what) {
  ASYNCTP_CHECK(got.is_tensor(), "node {} ({}): {} should be a tensor {} per its val, got {}",
                node.name, node.target, what, meta.shape, got.describe());
  const Tensor& t = got.tensor.t;
  ASYNCTP_CHECK(t.shape() == meta.shape, "node {} ({}): {} has shape {} but its val records {}",
                node.name, node.target, what, t.shape(), meta.shape);
  const auto dtype = dtype_from_torch(meta.dtype);
  ASYNCTP_CHECK(dtype.has_value() && *dtype == t.dtype(),
                "node {} ({}): {} has dtype {} but its "
                "val records {}",
                node.name, node.target, what, torch_dtype_name(t.dtype()), meta.dtype);
}

void check_meta(const Node& node, const RtValue& got) {
  switch (node.val.kind) {
    case Meta::Kind::kNone:
      return;
    case Meta::Kind::kTensor:
      check_tensor_meta(node, node.val.tensor, got, "the result");
      return;
    case Meta::Kind::kTuple:
      ASYNCTP_CHECK(got.kind == RtValue::Kind::kList && got.items.size() == node.val.tuple.size(),
                    "node {} ({}): the result should be a tuple of {} per its val, got {}",
                    node.name, node.target, node.val.tuple.size(), got.describe());
      for (size_t i = 0; i < node.val.tuple.size(); ++i) {
        // Bookkeeping entries (RNG state, sequence lengths) are None here; only tensors compare.
        if (node.val.tuple[i] && !got.items[i].is_none()) {
          check_tensor_meta(node, *node.val.tuple[i], got.items[i], fmt::format("result [{}]", i));
        }
      }
      return;
  }
}

// Throws for a node whose recorded result dtype the executor cannot hold (int32, uint8, ...).
void check_supported_dtype(const Node& node) {
  if (node.val.is_tensor() && !dtype_from_torch(node.val.tensor.dtype)) {
    ASYNCTP_FAIL(
        "node {} ({}): dtype {} is not supported by the executor (float32, bfloat16, "
        "float16, float8_e4m3fn, float8_e5m2, int64, uint64, bool)",
        node.name, node.target, node.val.tensor.dtype);
  }
}

}  // namespace

std::vector<RtValue> execute(OpContext& ctx, const Graph& graph, const Inputs& inputs,
                             const ExecOptions& options) {
  ASYNCTP_CHECK(graph.world_size == ctx.world_size(),
                "the graph was recorded for world size {} "
                "but this job has {} ranks",
                graph.world_size, ctx.world_size());
  // Last use of every value, so that intermediate tensors are freed as soon as possible.
  std::unordered_map<std::string, size_t> last_use;
  for (size_t i = 0; i < graph.size(); ++i) {
    for (const auto& in : graph.nodes()[i].inputs())
      last_use[in] = i;
  }
  Env env;
  std::vector<RtValue> outputs;
  for (size_t i = 0; i < graph.size(); ++i) {
    const Node& node = graph.nodes()[i];
    if (node.op == OpKind::kPlaceholder) {
      auto it = inputs.find(node.name);
      if (it != inputs.end()) {
        RtValue v = RtValue::of(it->second);
        if (options.check_meta) check_meta(node, v);
        env[node.name] = std::move(v);
      } else {
        ASYNCTP_CHECK(!node.val.is_tensor(), "placeholder {} ({}{}) has no input value", node.name,
                      node.val.tensor.dtype, node.val.tensor.shape);
        env[node.name] = RtValue{};  // a non-tensor input PyTorch did not record: None
      }
      continue;
    }
    if (node.op == OpKind::kOutput) {
      const RtValue out = evaluate(node.args.at(0), env, node);
      if (out.kind == RtValue::Kind::kList) {
        outputs = out.items;
      } else {
        outputs.push_back(out);
      }
      break;
    }
    const Kernel* kernel = find_kernel(node.target);
    ASYNCTP_CHECK(kernel != nullptr, "node {}: target {} is not supported by the executor",
                  node.name, node.target);
    check_supported_dtype(node);
    std::vector<RtValue> args;
    for (const auto& a : node.args)
      args.push_back(evaluate(a, env, node));
    std::vector<std::pair<std::string, RtValue>> kwargs;
    for (const auto& [k, v] : node.kwargs)
      kwargs.emplace_back(k, evaluate(v, env, node));
    Call call(ctx, node, std::move(args), std::move(kwargs), options.world_group);
    RtValue result;
    try {
      result = (*kernel)(call);
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (msg.find("node " + node.name) != std::string::npos) throw;
      throw Error(fmt::format("node {} ({}): {}", node.name, node.target, msg));
    }
    if (options.check_meta) check_meta(node, result);
    env[node.name] = std::move(result);
    for (const auto& in : node.inputs()) {
      if (last_use[in] == i) env.erase(in);
    }
  }
  return outputs;
}

}  // namespace asynctp::graph
