#include "graph/ir.h"

#include <cmath>
#include <limits>
#include <unordered_set>

#include "core/error.h"

namespace asynctp::graph {

Value::Value() = default;
Value::Value(const Value&) = default;
Value::Value(Value&&) noexcept = default;
Value& Value::operator=(const Value&) = default;
Value& Value::operator=(Value&&) noexcept = default;
Value::~Value() = default;

Value Value::boolean(bool v) {
  Value out;
  out.kind = Kind::kBool;
  out.b = v;
  return out;
}
Value Value::integer(int64_t v) {
  Value out;
  out.kind = Kind::kInt;
  out.i = v;
  return out;
}
Value Value::real(double v) {
  Value out;
  out.kind = Kind::kDouble;
  out.d = v;
  return out;
}
Value Value::string(std::string v) {
  return tagged(Kind::kString, std::move(v));
}
Value Value::node(std::string name) {
  return tagged(Kind::kNode, std::move(name));
}
Value Value::dtype(std::string name) {
  return tagged(Kind::kDType, std::move(name));
}
Value Value::of_list(std::vector<Value> items) {
  Value out;
  out.kind = Kind::kList;
  out.list = std::move(items);
  return out;
}
Value Value::tagged(Kind kind, std::string text) {
  Value out;
  out.kind = kind;
  out.s = std::move(text);
  return out;
}

bool Value::is_number() const {
  if (kind == Kind::kInt || kind == Kind::kDouble) return true;
  return kind == Kind::kRepr && (s == "inf" || s == "-inf" || s == "nan");
}

double Value::as_double() const {
  switch (kind) {
    case Kind::kInt:
      return static_cast<double>(i);
    case Kind::kDouble:
      return d;
    case Kind::kBool:
      return b ? 1.0 : 0.0;
    case Kind::kRepr:
      if (s == "inf") return std::numeric_limits<double>::infinity();
      if (s == "-inf") return -std::numeric_limits<double>::infinity();
      if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
      break;
    default:
      break;
  }
  ASYNCTP_FAIL("expected a number, got {}", describe());
}

std::string Value::describe() const {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b ? "True" : "False";
    case Kind::kInt:
      return fmt::format("int {}", i);
    case Kind::kDouble:
      return fmt::format("float {}", d);
    case Kind::kString:
      return fmt::format("string '{}'", s);
    case Kind::kList:
      return fmt::format("list of {}", list.size());
    case Kind::kNode:
      return fmt::format("node {}", s);
    case Kind::kDType:
      return fmt::format("dtype {}", s);
    case Kind::kDevice:
      return fmt::format("device {}", s);
    case Kind::kLayout:
      return fmt::format("layout {}", s);
    case Kind::kMemoryFormat:
      return fmt::format("memory_format {}", s);
    case Kind::kDict:
      return fmt::format("dict of {}", dict.size());
    case Kind::kRepr:
      return fmt::format("repr '{}'", s);
  }
  return "?";
}

bool operator==(const Value& a, const Value& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kBool:
      return a.b == b.b;
    case Value::Kind::kInt:
      return a.i == b.i;
    case Value::Kind::kDouble:
      return a.d == b.d || (std::isnan(a.d) && std::isnan(b.d));
    case Value::Kind::kList:
      return a.list == b.list;
    case Value::Kind::kDict:
      return a.dict == b.dict;
    default:
      return a.s == b.s;
  }
}

std::string clipped(std::string_view text) {
  constexpr size_t kShown = 40;
  if (text.size() <= kShown) return std::string(text);
  return fmt::format("{}... ({} characters)", text.substr(0, kShown), text.size());
}

std::string_view op_kind_name(OpKind op) {
  switch (op) {
    case OpKind::kPlaceholder:
      return "placeholder";
    case OpKind::kCallFunction:
      return "call_function";
    case OpKind::kOutput:
      return "output";
  }
  return "?";
}

const Value* Node::kwarg(std::string_view key) const {
  for (const auto& [k, v] : kwargs) {
    if (k == key) return &v;
  }
  return nullptr;
}

const Value* Node::arg(size_t index, std::string_view key) const {
  if (index < args.size()) return &args[index];
  return kwarg(key);
}

namespace {
void collect_inputs(const Value& v, std::vector<std::string>* out) {
  if (v.kind == Value::Kind::kNode) out->push_back(v.s);
  for (const auto& item : v.list)
    collect_inputs(item, out);
  for (const auto& [k, item] : v.dict)
    collect_inputs(item, out);
}
int rename(Value& v, const std::string& from, const std::string& to) {
  int n = 0;
  if (v.kind == Value::Kind::kNode && v.s == from) {
    v.s = to;
    ++n;
  }
  for (auto& item : v.list)
    n += rename(item, from, to);
  for (auto& [k, item] : v.dict)
    n += rename(item, from, to);
  return n;
}
}  // namespace

std::vector<std::string> Node::inputs() const {
  std::vector<std::string> out;
  for (const auto& a : args)
    collect_inputs(a, &out);
  for (const auto& [k, v] : kwargs)
    collect_inputs(v, &out);
  return out;
}

int Node::replace_input(const std::string& from, const std::string& to) {
  int n = 0;
  for (auto& a : args)
    n += rename(a, from, to);
  for (auto& [k, v] : kwargs)
    n += rename(v, from, to);
  return n;
}

void Graph::build_index() const {
  if (index_valid_) return;
  index_.clear();
  for (size_t i = 0; i < nodes_.size(); ++i)
    index_.emplace(nodes_[i].name, i);
  index_valid_ = true;
}

const Node* Graph::find(std::string_view name) const {
  build_index();
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &nodes_[it->second];
}

Node* Graph::find_mutable(std::string_view name) {
  return const_cast<Node*>(static_cast<const Graph*>(this)->find(name));
}

size_t Graph::index_of(std::string_view name) const {
  build_index();
  auto it = index_.find(std::string(name));
  ASYNCTP_CHECK(it != index_.end(), "graph has no node named '{}'", name);
  return it->second;
}

const Node& Graph::output() const {
  ASYNCTP_CHECK(!nodes_.empty() && nodes_.back().op == OpKind::kOutput,
                "graph has no output node at its end");
  return nodes_.back();
}

size_t Graph::insert(size_t index, Node node) {
  ASYNCTP_CHECK(index <= nodes_.size(), "insert position {} past the end ({} nodes)", index,
                nodes_.size());
  ASYNCTP_CHECK(find(node.name) == nullptr, "node name '{}' is already used", node.name);
  // Appending (what a reader does, node after node) keeps the index: the positions before it do
  // not move. Inserting elsewhere shifts them, and find() rebuilds the index on its next call.
  const bool keep_index = index_valid_ && index == nodes_.size();
  index_valid_ = false;
  nodes_.insert(nodes_.begin() + static_cast<std::ptrdiff_t>(index), std::move(node));
  if (keep_index) {
    index_.emplace(nodes_.back().name, index);
    index_valid_ = true;
  }
  return index;
}

void Graph::erase(std::string_view name) {
  const size_t i = index_of(name);
  nodes_.erase(nodes_.begin() + static_cast<std::ptrdiff_t>(i));
  index_valid_ = false;
}

void Graph::replace_all_uses(const std::string& from, const std::string& to) {
  for (auto& n : nodes_) {
    if (n.name != from) n.replace_input(from, to);
  }
}

std::string Graph::unique_name(std::string_view base) const {
  std::string name(base);
  for (int k = 1; find(name) != nullptr; ++k)
    name = fmt::format("{}_{}", base, k);
  return name;
}

std::unordered_map<std::string, std::vector<std::string>> Graph::users() const {
  std::unordered_map<std::string, std::vector<std::string>> out;
  for (const auto& n : nodes_) {
    std::unordered_set<std::string> seen;
    for (const auto& in : n.inputs()) {
      if (seen.insert(in).second) out[in].push_back(n.name);
    }
  }
  return out;
}

void Graph::validate() const {
  ASYNCTP_CHECK(world_size >= 1, "graph world_size must be >= 1, got {}", world_size);
  std::unordered_set<std::string> defined;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    ASYNCTP_CHECK(!n.name.empty(), "node {} (target '{}') has an empty name", i, clipped(n.target));
    ASYNCTP_CHECK(!defined.count(n.name), "node name '{}' is used twice (second at position {})",
                  clipped(n.name), i);
    ASYNCTP_CHECK(!n.target.empty(), "node {}: empty target", clipped(n.name));
    if (n.op == OpKind::kPlaceholder) {
      ASYNCTP_CHECK(n.args.empty() && n.kwargs.empty(), "placeholder {} must take no arguments",
                    clipped(n.name));
    }
    if (n.op == OpKind::kOutput) {
      ASYNCTP_CHECK(i + 1 == nodes_.size(),
                    "output node {} is at position {} but must be last "
                    "({} nodes)",
                    clipped(n.name), i, nodes_.size());
      ASYNCTP_CHECK(n.args.size() == 1,
                    "output node {} must have one argument (the list of "
                    "outputs), got {}",
                    clipped(n.name), n.args.size());
    }
    for (const auto& in : n.inputs()) {
      if (defined.count(in)) continue;
      ASYNCTP_CHECK(in != n.name, "node {} reads itself", clipped(n.name));
      bool later = false;
      for (size_t j = i + 1; j < nodes_.size() && !later; ++j)
        later = nodes_[j].name == in;
      ASYNCTP_FAIL("node {} reads '{}', which {}", clipped(n.name), clipped(in),
                   later ? "is defined only after it (the nodes are not in topological order)"
                         : "is not a node of the graph (dangling reference)");
    }
    defined.insert(n.name);
  }
  ASYNCTP_CHECK(!nodes_.empty() && nodes_.back().op == OpKind::kOutput,
                "graph has no output node (the last node must be the output)");
}

}  // namespace asynctp::graph
