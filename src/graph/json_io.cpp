#include "graph/json_io.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace asynctp::graph {

using json = nlohmann::ordered_json;

namespace {

// Where a value sits, for messages: "node mm, args[1]".
struct Where {
  std::string_view origin;
  std::string node;
  std::string field;
  std::string text() const {
    return fmt::format("{}: node {}{}{}", origin, node.empty() ? "?" : clipped(node),
                       field.empty() ? "" : ", ", field);
  }
};

// A value as a message shows it: bounded and without recursion. Scalars as written (strings
// clipped), lists by length, objects by their first keys.
std::string excerpt(const json& j) {
  const auto quoted = [](std::string_view text) {
    // Cutting may split a UTF-8 sequence: replace, never throw.
    return json(clipped(text)).dump(-1, ' ', false, json::error_handler_t::replace);
  };
  switch (j.type()) {
    case json::value_t::string:
      return quoted(j.get_ref<const std::string&>());
    case json::value_t::array:
      return fmt::format("a list of {}", j.size());
    case json::value_t::object: {
      std::string keys;
      size_t shown = 0;
      for (auto it = j.begin(); it != j.end() && shown < 3; ++it, ++shown)
        keys += (shown == 0 ? "" : ", ") + quoted(it.key());
      return fmt::format("an object of {} keys ({}{})", j.size(), keys,
                         j.size() > shown ? ", ..." : "");
    }
    default:
      return j.dump();  // null, a boolean or a number
  }
}

// The member `key` of object `j`, or nullptr.
const json* member(const json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

// "line 3, column 14 (byte 52)" of the 0-based byte `offset` of `text`.
std::string position_in(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  const std::string_view before = text.substr(0, offset);
  const size_t line = 1 + static_cast<size_t>(std::count(before.begin(), before.end(), '\n'));
  const size_t line_start = before.rfind('\n');
  const size_t column = line_start == std::string_view::npos ? offset + 1 : offset - line_start;
  return fmt::format("line {}, column {} (byte {})", line, column, offset);
}

// Rejects a document whose arrays and objects nest deeper than kMaxJsonNesting, before any
// parser sees it, so that nothing later (parsing, copying, destroying, printing a value) recurses
// deeper than that. One pass, no recursion. Brackets count as nlohmann's lexer reads them, that
// is, not inside strings; past a syntax error the parser stops anyway.
void check_nesting(std::string_view text, std::string_view origin) {
  size_t depth = 0;
  size_t deepest = 0;
  size_t first_too_deep = std::string_view::npos;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (depth > kMaxJsonNesting && first_too_deep == std::string_view::npos) first_too_deep = i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  ASYNCTP_CHECK(first_too_deep == std::string_view::npos,
                "{}: lists and objects nested {} deep; at most {} levels are read (level {} "
                "opens at {})",
                origin, deepest, kMaxJsonNesting, kMaxJsonNesting + 1,
                position_in(text, first_too_deep));
}

// nlohmann's DOM built through its SAX interface, which hands parse errors over with their
// position (its own DOM parser throws some of them, number overflow among them, without one).
// The stack holds the open arrays and objects, innermost last; each one lives inside the one
// before it, and only the innermost grows, so the pointers stay valid. ordered_json looks a key
// up by walking its object, which makes an object of n keys cost n^2 / 2 comparisons (0.9 s for
// 40,000 keys): an object past kIndexedKeys keys gets a hash index of its keys while it is open.
class DomBuilder final : public nlohmann::json_sax<json> {
 public:
  json root;
  size_t error_offset = 0;  // 0-based byte where parsing stopped
  std::string error;        // empty when the text parsed

  bool null() override { return add(nullptr) != nullptr; }
  bool boolean(bool v) override { return add(v) != nullptr; }
  bool number_integer(number_integer_t v) override { return add(v) != nullptr; }
  bool number_unsigned(number_unsigned_t v) override { return add(v) != nullptr; }
  bool number_float(number_float_t v, const string_t&) override { return add(v) != nullptr; }
  bool string(string_t& v) override { return add(std::move(v)) != nullptr; }
  bool binary(binary_t& v) override { return add(json::binary(std::move(v))) != nullptr; }
  bool start_object(std::size_t) override {
    open_.push_back({add(json::object()), {}});
    return true;
  }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    open_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    open_.push_back({add(json::array()), {}});
    return true;
  }
  bool end_array() override {
    open_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const json::exception& e) override {
    // `position` counts the characters read, the offending one included.
    error_offset = position > 0 ? position - 1 : 0;
    // "[json.exception.parse_error.101] parse error at line 1, column 2: syntax error while
    // parsing value - ...; last read: '...'": keep the reason, cut (the last token may be long).
    std::string_view what = e.what();
    if (const size_t bracket = what.find("] "); bracket != std::string_view::npos)
      what.remove_prefix(bracket + 2);
    if (what.starts_with("parse error")) {
      if (const size_t colon = what.find(": "); colon != std::string_view::npos)
        what.remove_prefix(colon + 2);
    }
    error = what.size() <= 160 ? std::string(what) : fmt::format("{}...", what.substr(0, 160));
    return false;
  }

 private:
  static constexpr size_t kIndexedKeys = 32;
  struct Open {
    json* value;
    std::unordered_map<std::string, size_t> keys;  // key -> position; objects past kIndexedKeys
  };
  std::vector<Open> open_;
  string_t key_;

  json* add(json&& v) {
    if (open_.empty()) {
      root = std::move(v);
      return &root;
    }
    Open& parent = open_.back();
    if (parent.value->is_array()) {
      parent.value->push_back(std::move(v));
      return &parent.value->back();
    }
    // A repeated key keeps its last value, as nlohmann's own parser does.
    json::object_t& members = parent.value->get_ref<json::object_t&>();
    if (members.size() < kIndexedKeys) {
      json& slot = (*parent.value)[key_];
      slot = std::move(v);
      return &slot;
    }
    if (parent.keys.empty()) {
      for (size_t i = 0; i < members.size(); ++i)
        parent.keys.emplace((members.begin() + static_cast<std::ptrdiff_t>(i))->first, i);
    }
    const auto [it, fresh] = parent.keys.try_emplace(key_, members.size());
    if (fresh) {
      members.emplace_back(key_, std::move(v));
      return &members.back().second;
    }
    json& slot = (members.begin() + static_cast<std::ptrdiff_t>(it->second))->second;
    slot = std::move(v);
    return &slot;
  }
};

json parse_json(std::string_view text, std::string_view origin) {
  check_nesting(text, origin);
  DomBuilder dom;
  const bool ok = json::sax_parse(text.begin(), text.end(), &dom);
  ASYNCTP_CHECK(ok && dom.error.empty(), "{}: not valid JSON at {}: {}", origin,
                position_in(text, dom.error_offset), dom.error);
  return std::move(dom.root);
}

Value decode_value(const json& j, const Where& w, int depth) {
  ASYNCTP_CHECK(depth < 64, "{}: values nested more than 64 deep", w.text());
  if (j.is_null()) return Value::none();
  if (j.is_boolean()) return Value::boolean(j.get<bool>());
  if (j.is_number_integer() && !j.is_number_unsigned()) return Value::integer(j.get<int64_t>());
  if (j.is_number_unsigned()) {
    const auto u = j.get<uint64_t>();
    ASYNCTP_CHECK(u <= static_cast<uint64_t>(INT64_MAX), "{}: integer {} is out of range", w.text(),
                  u);
    return Value::integer(static_cast<int64_t>(u));
  }
  if (j.is_number_float()) return Value::real(j.get<double>());
  if (j.is_string()) return Value::string(j.get<std::string>());
  if (j.is_array()) {
    std::vector<Value> items;
    items.reserve(j.size());
    for (const auto& item : j)
      items.push_back(decode_value(item, w, depth + 1));
    return Value::of_list(std::move(items));
  }
  // Objects are tagged values with exactly one key.
  ASYNCTP_CHECK(j.is_object() && j.size() == 1,
                "{}: an encoded object must have exactly one key "
                "(node, dtype, device, layout, memory_format, dict or repr), got {}",
                w.text(), excerpt(j));
  const auto first = j.begin();
  const std::string& key = first.key();
  const json& inner = first.value();
  if (key == "dict") {
    ASYNCTP_CHECK(inner.is_object(), "{}: {{\"dict\": ...}} must hold an object, got {}", w.text(),
                  excerpt(inner));
    Value out;
    out.kind = Value::Kind::kDict;
    for (const auto& [k, v] : inner.items())
      out.dict.emplace_back(k, decode_value(v, w, depth + 1));
    return out;
  }
  static const std::pair<const char*, Value::Kind> kTags[] = {
      {"node", Value::Kind::kNode},
      {"dtype", Value::Kind::kDType},
      {"device", Value::Kind::kDevice},
      {"layout", Value::Kind::kLayout},
      {"memory_format", Value::Kind::kMemoryFormat},
      {"repr", Value::Kind::kRepr}};
  for (const auto& [tag, kind] : kTags) {
    if (key != tag) continue;
    ASYNCTP_CHECK(inner.is_string(), "{}: {{\"{}\": ...}} must hold a string, got {}", w.text(),
                  tag, excerpt(inner));
    ASYNCTP_CHECK(kind != Value::Kind::kNode || !inner.get_ref<const std::string&>().empty(),
                  "{}: empty node reference", w.text());
    return Value::tagged(kind, inner.get<std::string>());
  }
  ASYNCTP_FAIL("{}: unknown encoded object key '{}'", w.text(), clipped(key));
}

Dims decode_dims(const json& j, const Where& w, const char* what) {
  ASYNCTP_CHECK(j.is_array(), "{}: val.{} must be a list of integers, got {}", w.text(), what,
                excerpt(j));
  ASYNCTP_CHECK(j.size() <= static_cast<size_t>(kMaxDims),
                "{}: val.{} has {} dims; at most {} "
                "are supported",
                w.text(), what, j.size(), kMaxDims);
  Dims out;
  for (const auto& v : j) {
    // An unsigned value above INT64_MAX reads as negative and is refused with the rest.
    ASYNCTP_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0,
                  "{}: val.{} must hold non-negative integers, got {}", w.text(), what, excerpt(v));
    out.push_back(v.get<int64_t>());
  }
  return out;
}

std::optional<TensorMeta> decode_tensor_meta(const json& j, const Where& w) {
  if (j.is_null()) return std::nullopt;
  ASYNCTP_CHECK(j.is_object(), "{}: val must be an object, a list or null, got {}", w.text(),
                excerpt(j));
  const json* shape = member(j, "shape");
  const json* stride = member(j, "stride");
  const json* dtype = member(j, "dtype");
  ASYNCTP_CHECK(shape != nullptr, "{}: val has no 'shape'", w.text());
  ASYNCTP_CHECK(stride != nullptr, "{}: val has no 'stride'", w.text());
  ASYNCTP_CHECK(dtype != nullptr, "{}: val has no 'dtype'", w.text());
  TensorMeta m;
  m.shape = decode_dims(*shape, w, "shape");
  m.stride = decode_dims(*stride, w, "stride");
  ASYNCTP_CHECK(m.shape.size() == m.stride.size(),
                "{}: val.shape {} and val.stride {} differ in "
                "rank",
                w.text(), m.shape, m.stride);
  ASYNCTP_CHECK(dtype->is_string(), "{}: val.dtype must be a string, got {}", w.text(),
                excerpt(*dtype));
  m.dtype = dtype->get<std::string>();
  if (const json* device = member(j, "device")) {
    ASYNCTP_CHECK(device->is_string(), "{}: val.device must be a string, got {}", w.text(),
                  excerpt(*device));
    m.device = device->get<std::string>();
  }
  return m;
}

Meta decode_meta(const json& j, const Where& w) {
  Meta meta;
  if (j.is_null()) return meta;
  if (j.is_array()) {
    meta.kind = Meta::Kind::kTuple;
    for (const auto& item : j) {
      ASYNCTP_CHECK(!item.is_array(), "{}: nested lists in val are not supported", w.text());
      meta.tuple.push_back(decode_tensor_meta(item, w));
    }
    return meta;
  }
  meta.kind = Meta::Kind::kTensor;
  meta.tensor = *decode_tensor_meta(j, w);
  return meta;
}

OpKind decode_op(const json& j, const Where& w) {
  ASYNCTP_CHECK(j.is_string(), "{}: 'op' must be a string, got {}", w.text(), excerpt(j));
  const auto& op = j.get_ref<const std::string&>();
  if (op == "placeholder") return OpKind::kPlaceholder;
  if (op == "call_function") return OpKind::kCallFunction;
  if (op == "output") return OpKind::kOutput;
  ASYNCTP_FAIL("{}: op '{}' is not supported (placeholder, call_function or output)", w.text(),
               clipped(op));
}

Node decode_node(const json& j, size_t index, std::string_view origin) {
  Where w{origin, fmt::format("#{}", index), ""};
  ASYNCTP_CHECK(j.is_object(), "{}: a node must be an object, got {}", w.text(), excerpt(j));
  const json* name = member(j, "name");
  ASYNCTP_CHECK(name != nullptr && name->is_string(), "{}: missing string 'name'", w.text());
  Node n;
  n.name = name->get<std::string>();
  w.node = n.name;
  ASYNCTP_CHECK(!n.name.empty(), "{}: empty name", w.text());
  const json* op = member(j, "op");
  ASYNCTP_CHECK(op != nullptr, "{}: missing 'op'", w.text());
  n.op = decode_op(*op, w);
  const json* target = member(j, "target");
  ASYNCTP_CHECK(target != nullptr && target->is_string(), "{}: missing string 'target'", w.text());
  n.target = target->get<std::string>();
  if (const json* args = member(j, "args")) {
    ASYNCTP_CHECK(args->is_array(), "{}: 'args' must be a list, got {}", w.text(), excerpt(*args));
    n.args.reserve(args->size());
    for (size_t i = 0; i < args->size(); ++i) {
      Where wa = w;
      wa.field = fmt::format("args[{}]", i);
      n.args.push_back(decode_value((*args)[i], wa, 0));
    }
  }
  if (const json* kwargs = member(j, "kwargs")) {
    ASYNCTP_CHECK(kwargs->is_object(), "{}: 'kwargs' must be an object, got {}", w.text(),
                  excerpt(*kwargs));
    for (const auto& [k, v] : kwargs->items()) {
      Where wk = w;
      wk.field = fmt::format("kwargs.{}", clipped(k));
      n.kwargs.emplace_back(k, decode_value(v, wk, 0));
    }
  }
  if (const json* val = member(j, "val")) {
    Where wv = w;
    wv.field = "val";
    n.val = decode_meta(*val, wv);
  }
  return n;
}

json encode_value(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kNone:
      return nullptr;
    case Value::Kind::kBool:
      return v.b;
    case Value::Kind::kInt:
      return v.i;
    case Value::Kind::kDouble:
      return v.d;
    case Value::Kind::kString:
      return v.s;
    case Value::Kind::kList: {
      json out = json::array();
      for (const auto& item : v.list)
        out.push_back(encode_value(item));
      return out;
    }
    case Value::Kind::kNode:
      return {{"node", v.s}};
    case Value::Kind::kDType:
      return {{"dtype", v.s}};
    case Value::Kind::kDevice:
      return {{"device", v.s}};
    case Value::Kind::kLayout:
      return {{"layout", v.s}};
    case Value::Kind::kMemoryFormat:
      return {{"memory_format", v.s}};
    case Value::Kind::kRepr:
      return {{"repr", v.s}};
    case Value::Kind::kDict: {
      json inner = json::object();
      for (const auto& [k, item] : v.dict)
        inner[k] = encode_value(item);
      return {{"dict", inner}};
    }
  }
  return nullptr;
}

json encode_tensor_meta(const std::optional<TensorMeta>& m) {
  if (!m) return nullptr;
  json out = json::object();
  out["shape"] = std::vector<int64_t>(m->shape.begin(), m->shape.end());
  out["stride"] = std::vector<int64_t>(m->stride.begin(), m->stride.end());
  out["dtype"] = m->dtype;
  out["device"] = m->device;
  return out;
}

json encode_meta(const Meta& m) {
  switch (m.kind) {
    case Meta::Kind::kNone:
      return nullptr;
    case Meta::Kind::kTensor:
      return encode_tensor_meta(m.tensor);
    case Meta::Kind::kTuple: {
      json out = json::array();
      for (const auto& t : m.tuple)
        out.push_back(encode_tensor_meta(t));
      return out;
    }
  }
  return nullptr;
}

}  // namespace

Graph parse_graph(std::string_view text, std::string_view origin) {
  const json doc = parse_json(text, origin);
  ASYNCTP_CHECK(doc.is_object(), "{}: the document must be an object, got {}", origin,
                excerpt(doc));
  const json* format = member(doc, "format");
  ASYNCTP_CHECK(format != nullptr && *format == "fx-graph-json",
                "{}: 'format' must be \"fx-graph-json\"", origin);
  const json* version = member(doc, "version");
  ASYNCTP_CHECK(version != nullptr && version->is_number_integer() && version->get<int64_t>() == 1,
                "{}: 'version' must be 1 (the only version this reader knows)", origin);
  Graph g;
  if (const json* source = member(doc, "source")) {
    ASYNCTP_CHECK(source->is_string(), "{}: 'source' must be a string", origin);
    g.source = source->get<std::string>();
  }
  const json* world_size = member(doc, "world_size");
  ASYNCTP_CHECK(world_size != nullptr && world_size->is_number_integer() &&
                    world_size->get<int64_t>() >= 1 && world_size->get<int64_t>() <= 65536,
                "{}: 'world_size' must be an integer in [1, 65536]", origin);
  g.world_size = static_cast<int>(world_size->get<int64_t>());
  const json* nodes = member(doc, "nodes");
  ASYNCTP_CHECK(nodes != nullptr && nodes->is_array(), "{}: 'nodes' must be a list", origin);
  for (size_t i = 0; i < nodes->size(); ++i) {
    Node n = decode_node((*nodes)[i], i, origin);
    ASYNCTP_CHECK(g.find(n.name) == nullptr, "{}: node name '{}' is used twice", origin,
                  clipped(n.name));
    g.insert(g.size(), std::move(n));
  }
  try {
    g.validate();
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", origin, e.what()));
  }
  return g;
}

Graph read_graph_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ASYNCTP_CHECK(in.good(), "cannot open graph file '{}'", path);
  std::stringstream buf;
  buf << in.rdbuf();
  return parse_graph(buf.str(), path);
}

std::string dump_graph(const Graph& g) {
  std::string out = "{";
  out += fmt::format(
      "\"format\": \"fx-graph-json\", \"version\": {}, \"source\": {}, "
      "\"world_size\": {},\n \"nodes\": [",
      g.version, json(g.source).dump(), g.world_size);
  for (size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    json node = json::object();
    node["name"] = n.name;
    node["op"] = std::string(op_kind_name(n.op));
    node["target"] = n.target;
    json args = json::array();
    for (const auto& a : n.args)
      args.push_back(encode_value(a));
    node["args"] = args;
    json kwargs = json::object();
    for (const auto& [k, v] : n.kwargs)
      kwargs[k] = encode_value(v);
    node["kwargs"] = kwargs;
    node["val"] = encode_meta(n.val);
    out += (i == 0 ? "\n  " : ",\n  ") + node.dump();
  }
  out += "\n ]}\n";
  return out;
}

void write_graph_file(const Graph& g, const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  ASYNCTP_CHECK(out.good(), "cannot write graph file '{}'", path);
  out << dump_graph(g);
  ASYNCTP_CHECK(out.good(), "writing graph file '{}' failed", path);
}

}  // namespace asynctp::graph
