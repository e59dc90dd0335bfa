// The graph IR: PyTorch FX graphs as the passes and the executor see them.
//
// A Graph is a list of Nodes in topological order (every argument names an earlier node). Nodes
// refer to each other by name, so a pass rewires a use by renaming it; names are unique. Values
// keep exactly what fx-graph-json encodes (docs/GRAPH.md, ../shared/graphs/FORMAT.md), so that a
// graph read and written back is the same graph, unknown targets included.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <asynctp/dims.h>

#include "core/dtype.h"

namespace asynctp::graph {

// An argument value (FORMAT.md "Encoded values").
struct Value {
  enum class Kind : uint8_t {
    kNone,
    kBool,
    kInt,
    kDouble,
    kString,
    kList,
    kNode,
    kDType,
    kDevice,
    kLayout,
    kMemoryFormat,
    kDict,
    kRepr
  };
  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double d = 0;
  std::string s;  // string, node name, dtype/device/layout/memory-format name, repr text
  std::vector<Value> list;
  std::vector<std::pair<std::string, Value>> dict;  // in document order

  // Defined in ir.cpp, where Value is complete: the implicit ones would destroy `dict`'s pairs of
  // a still incomplete Value inside this class, which clang with libstdc++ refuses.
  Value();
  Value(const Value&);
  Value(Value&&) noexcept;
  Value& operator=(const Value&);
  Value& operator=(Value&&) noexcept;
  ~Value();

  static Value none() { return {}; }
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value real(double v);
  static Value string(std::string v);
  static Value node(std::string name);
  static Value dtype(std::string name);
  static Value of_list(std::vector<Value> items);
  static Value tagged(Kind kind, std::string text);  // device, layout, memory format, repr

  bool is_none() const { return kind == Kind::kNone; }
  bool is_node() const { return kind == Kind::kNode; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_int() const { return kind == Kind::kInt; }
  // Numbers (ints, doubles, and the reprs 'inf', '-inf', 'nan') as double.
  bool is_number() const;
  double as_double() const;
  // "int 3", "node mm", "list of 2", ...: for messages.
  std::string describe() const;
  friend bool operator==(const Value& a, const Value& b);
};

// `val` metadata of one tensor.
struct TensorMeta {
  Dims shape;
  Dims stride;
  std::string dtype;   // PyTorch's name: bfloat16, float8_e4m3fn, int64, ...
  std::string device;  // "cuda", "cpu", ...
  friend bool operator==(const TensorMeta&, const TensorMeta&) = default;
};

// A node's `val`: absent (null), one tensor, or a tuple whose entries may be absent.
struct Meta {
  enum class Kind : uint8_t { kNone, kTensor, kTuple };
  Kind kind = Kind::kNone;
  TensorMeta tensor;
  std::vector<std::optional<TensorMeta>> tuple;

  static Meta of(TensorMeta t) { return {Kind::kTensor, std::move(t), {}}; }
  bool is_tensor() const { return kind == Kind::kTensor; }
  friend bool operator==(const Meta&, const Meta&) = default;
};

// `text` as messages show names and keys from a document: at most its first 40 characters, then
// its length ("abc... (100000 characters)").
std::string clipped(std::string_view text);

enum class OpKind : uint8_t { kPlaceholder, kCallFunction, kOutput };
std::string_view op_kind_name(OpKind op);

struct Node {
  std::string name;
  OpKind op = OpKind::kCallFunction;
  std::string target;
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  Meta val;

  // kwargs[key], or nullptr.
  const Value* kwarg(std::string_view key) const;
  // Positional argument `index`, else keyword `key`, else nullptr (FX may give either).
  const Value* arg(size_t index, std::string_view key) const;
  // The names of every node this one reads, in argument order, with repeats.
  std::vector<std::string> inputs() const;
  // Renames every reference to `from` into `to`; returns how many were changed.
  int replace_input(const std::string& from, const std::string& to);
};

class Graph {
 public:
  std::string source;
  int world_size = 1;
  int version = 1;

  const std::vector<Node>& nodes() const { return nodes_; }
  // For reordering or editing nodes in place. Drops the name index, which find() rebuilds: do not
  // call find() while still editing through the returned reference.
  std::vector<Node>& mutable_nodes() {
    index_valid_ = false;
    return nodes_;
  }
  size_t size() const { return nodes_.size(); }

  // The node named `name`, or nullptr; index_of throws for an unknown name.
  const Node* find(std::string_view name) const;
  Node* find_mutable(std::string_view name);
  size_t index_of(std::string_view name) const;
  const Node& output() const;

  // Inserts `node` before position `index` (size() appends) and returns its position.
  size_t insert(size_t index, Node node);
  void erase(std::string_view name);
  // Every use of `from` (other than in `from` itself) now reads `to`.
  void replace_all_uses(const std::string& from, const std::string& to);
  // A fresh name from `base` ("mm" -> "mm", "mm_1", ...).
  std::string unique_name(std::string_view base) const;
  // name -> names of the nodes reading it (each user once, in graph order).
  std::unordered_map<std::string, std::vector<std::string>> users() const;

  // Throws (naming the node) unless: names are unique and non-empty; every reference names an
  // earlier node; there is exactly one output node and it is last; placeholders take no args.
  void validate() const;

 private:
  std::vector<Node> nodes_;
  mutable std::unordered_map<std::string, size_t> index_;  // rebuilt lazily when stale
  mutable bool index_valid_ = false;
  void build_index() const;
};

}  // namespace asynctp::graph
