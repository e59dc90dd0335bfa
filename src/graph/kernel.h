// The executor's kernel interface: a runtime value type, the per-node call context with typed
// argument accessors (whose errors name the node, the argument and the value), and the registry
// that maps a target name to its implementation.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "graph/host_tensor.h"
#include "graph/ir.h"
#include "ops/context.h"

namespace asynctp::graph {

// A value while the graph runs: None, a host tensor, a tuple/list, or a literal (numbers,
// strings, dtypes, ...) taken from the graph.
struct RtValue {
  enum class Kind : uint8_t { kNone, kTensor, kList, kLiteral };
  Kind kind = Kind::kNone;
  HostTensor tensor;
  std::vector<RtValue> items;
  Value literal;

  static RtValue of(HostTensor t) {
    RtValue v;
    v.kind = Kind::kTensor;
    v.tensor = std::move(t);
    return v;
  }
  static RtValue list(std::vector<RtValue> items) {
    RtValue v;
    v.kind = Kind::kList;
    v.items = std::move(items);
    return v;
  }
  static RtValue lit(Value value) {
    RtValue v;
    v.kind = value.is_none() ? Kind::kNone : Kind::kLiteral;
    v.literal = std::move(value);
    return v;
  }
  bool is_tensor() const { return kind == Kind::kTensor; }
  bool is_none() const { return kind == Kind::kNone; }
  std::string describe() const;
};

// Everything a kernel sees of one node: its evaluated arguments and the context.
class Call {
 public:
  Call(OpContext& ctx, const Node& node, std::vector<RtValue> args,
       std::vector<std::pair<std::string, RtValue>> kwargs, std::string world_group)
      : ctx_(ctx),
        node_(node),
        args_(std::move(args)),
        kwargs_(std::move(kwargs)),
        world_group_(std::move(world_group)) {}

  OpContext& ctx() { return ctx_; }
  // The group name that stands for the world group of the OpContext (ExecOptions::world_group).
  const std::string& world_group() const { return world_group_; }
  const Node& node() const { return node_; }
  size_t num_args() const { return args_.size(); }

  // Argument `index` (positional) or `key` (keyword); nullptr when absent.
  const RtValue* find(size_t index, std::string_view key) const;
  // A keyword-only argument (after `*` in the schema); nullptr when absent.
  const RtValue* kwarg(std::string_view key) const;
  bool has(size_t index, std::string_view key) const;
  // Typed accessors: throw naming the node, target and argument when missing or of another kind.
  const HostTensor& tensor(size_t index, std::string_view key) const;
  double number(size_t index, std::string_view key) const;
  double number_or(size_t index, std::string_view key, double fallback) const;
  int64_t integer(size_t index, std::string_view key) const;
  int64_t integer_or(size_t index, std::string_view key, int64_t fallback) const;
  bool boolean_or(size_t index, std::string_view key, bool fallback) const;
  std::string string(size_t index, std::string_view key) const;
  std::vector<int64_t> int_list(size_t index, std::string_view key) const;
  std::vector<HostTensor> tensor_list(size_t index, std::string_view key) const;
  // A dtype argument (PyTorch name) as DType; nullopt when absent or None.
  std::optional<DType> dtype_or(size_t index, std::string_view key) const;
  const RtValue& value(size_t index, std::string_view key) const;

  // "node mm (aten.mm.default)": the prefix of every kernel error.
  std::string where() const;
  // The meta dtype / strides PyTorch recorded for this node's (single) result, if any.
  std::optional<DType> meta_dtype() const;
  std::optional<Dims> meta_strides() const;
  // Allocates this node's result, laid out as PyTorch recorded it when the record matches.
  HostTensor alloc(const Dims& shape, DType dtype) const;

 private:
  std::string arg_name(size_t index, std::string_view key) const;
  OpContext& ctx_;
  const Node& node_;
  std::vector<RtValue> args_;
  std::vector<std::pair<std::string, RtValue>> kwargs_;
  std::string world_group_;
};

using Kernel = std::function<RtValue(Call&)>;

// Target name -> kernel. Kernels register from the kernels_*.cpp files through register_*().
const Kernel* find_kernel(std::string_view target);
std::vector<std::string> kernel_targets();

// Registration entry points (one per kernels_*.cpp file), called once by find_kernel.
void register_pointwise_kernels(std::vector<std::pair<std::string, Kernel>>& table);
void register_compare_kernels(std::vector<std::pair<std::string, Kernel>>& table);
void register_shape_kernels(std::vector<std::pair<std::string, Kernel>>& table);
void register_reduction_kernels(std::vector<std::pair<std::string, Kernel>>& table);
void register_attention_kernels(std::vector<std::pair<std::string, Kernel>>& table);
void register_device_kernels(std::vector<std::pair<std::string, Kernel>>& table);

// PyTorch dtype name -> DType, or nullopt for a dtype the executor does not support (int32,
// uint8, complex, ...).
std::optional<DType> dtype_from_torch(std::string_view name);

}  // namespace asynctp::graph
