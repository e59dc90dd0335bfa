#include "graph/json_io.h"

#include <fstream>
#include <sstream>

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
    return fmt::format("{}: node {}{}{}", origin, node.empty() ? "?" : node,
                       field.empty() ? "" : ", ", field);
  }
};

std::string kind_of(const json& j) {
  return std::string(j.type_name());
}

Value decode_value(const json& j, const Where& w, int depth) {
  ASYNCTP_CHECK(depth < 64, "{}: values nested more than 64 deep", w.text());
  if (j.is_null()) return Value::none();
  if (j.is_boolean()) return Value::boolean(j.get<bool>());
  if (j.is_number_integer()) return Value::integer(j.get<int64_t>());
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
                w.text(), j.dump().substr(0, 120));
  const auto first = j.begin();
  const std::string key = first.key();
  const json& inner = first.value();
  if (key == "dict") {
    ASYNCTP_CHECK(inner.is_object(), "{}: {{\"dict\": ...}} must hold an object, got {}", w.text(),
                  kind_of(inner));
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
                  tag, kind_of(inner));
    ASYNCTP_CHECK(kind != Value::Kind::kNode || !inner.get<std::string>().empty(),
                  "{}: empty node reference", w.text());
    return Value::tagged(kind, inner.get<std::string>());
  }
  ASYNCTP_FAIL("{}: unknown encoded object key '{}'", w.text(), key);
}

Dims decode_dims(const json& j, const Where& w, const char* what) {
  ASYNCTP_CHECK(j.is_array(), "{}: val.{} must be a list of integers, got {}", w.text(), what,
                kind_of(j));
  ASYNCTP_CHECK(j.size() <= static_cast<size_t>(kMaxDims),
                "{}: val.{} has {} dims; at most {} "
                "are supported",
                w.text(), what, j.size(), kMaxDims);
  Dims out;
  for (const auto& v : j) {
    ASYNCTP_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0,
                  "{}: val.{} must hold non-negative integers, got {}", w.text(), what,
                  v.dump().substr(0, 40));
    out.push_back(v.get<int64_t>());
  }
  return out;
}

std::optional<TensorMeta> decode_tensor_meta(const json& j, const Where& w) {
  if (j.is_null()) return std::nullopt;
  ASYNCTP_CHECK(j.is_object(), "{}: val must be an object, a list or null, got {}", w.text(),
                kind_of(j));
  TensorMeta m;
  for (const char* key : {"shape", "stride", "dtype"}) {
    ASYNCTP_CHECK(j.contains(key), "{}: val has no '{}'", w.text(), key);
  }
  m.shape = decode_dims(j["shape"], w, "shape");
  m.stride = decode_dims(j["stride"], w, "stride");
  ASYNCTP_CHECK(m.shape.size() == m.stride.size(),
                "{}: val.shape {} and val.stride {} differ in "
                "rank",
                w.text(), m.shape, m.stride);
  ASYNCTP_CHECK(j["dtype"].is_string(), "{}: val.dtype must be a string", w.text());
  m.dtype = j["dtype"].get<std::string>();
  if (j.contains("device")) {
    ASYNCTP_CHECK(j["device"].is_string(), "{}: val.device must be a string", w.text());
    m.device = j["device"].get<std::string>();
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
  ASYNCTP_CHECK(j.is_string(), "{}: 'op' must be a string, got {}", w.text(), kind_of(j));
  const auto op = j.get<std::string>();
  if (op == "placeholder") return OpKind::kPlaceholder;
  if (op == "call_function") return OpKind::kCallFunction;
  if (op == "output") return OpKind::kOutput;
  ASYNCTP_FAIL("{}: op '{}' is not supported (placeholder, call_function or output)", w.text(), op);
}

Node decode_node(const json& j, size_t index, std::string_view origin) {
  Where w{origin, fmt::format("#{}", index), ""};
  ASYNCTP_CHECK(j.is_object(), "{}: a node must be an object, got {}", w.text(), kind_of(j));
  ASYNCTP_CHECK(j.contains("name") && j["name"].is_string(), "{}: missing string 'name'", w.text());
  Node n;
  n.name = j["name"].get<std::string>();
  w.node = n.name;
  ASYNCTP_CHECK(!n.name.empty(), "{}: empty name", w.text());
  ASYNCTP_CHECK(j.contains("op"), "{}: missing 'op'", w.text());
  n.op = decode_op(j["op"], w);
  ASYNCTP_CHECK(j.contains("target") && j["target"].is_string(), "{}: missing string 'target'",
                w.text());
  n.target = j["target"].get<std::string>();
  if (j.contains("args")) {
    ASYNCTP_CHECK(j["args"].is_array(), "{}: 'args' must be a list, got {}", w.text(),
                  kind_of(j["args"]));
    for (size_t i = 0; i < j["args"].size(); ++i) {
      Where wa = w;
      wa.field = fmt::format("args[{}]", i);
      n.args.push_back(decode_value(j["args"][i], wa, 0));
    }
  }
  if (j.contains("kwargs")) {
    ASYNCTP_CHECK(j["kwargs"].is_object(), "{}: 'kwargs' must be an object, got {}", w.text(),
                  kind_of(j["kwargs"]));
    for (const auto& [k, v] : j["kwargs"].items()) {
      Where wk = w;
      wk.field = fmt::format("kwargs.{}", k);
      n.kwargs.emplace_back(k, decode_value(v, wk, 0));
    }
  }
  if (j.contains("val")) {
    Where wv = w;
    wv.field = "val";
    n.val = decode_meta(j["val"], wv);
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
  json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  ASYNCTP_CHECK(!doc.is_discarded(), "{}: not valid JSON", origin);
  ASYNCTP_CHECK(doc.is_object(), "{}: the document must be an object, got {}", origin,
                kind_of(doc));
  ASYNCTP_CHECK(doc.contains("format") && doc["format"] == "fx-graph-json",
                "{}: 'format' must be \"fx-graph-json\"", origin);
  ASYNCTP_CHECK(doc.contains("version") && doc["version"].is_number_integer() &&
                    doc["version"].get<int64_t>() == 1,
                "{}: 'version' must be 1 (the only version this reader knows)", origin);
  Graph g;
  if (doc.contains("source")) {
    ASYNCTP_CHECK(doc["source"].is_string(), "{}: 'source' must be a string", origin);
    g.source = doc["source"].get<std::string>();
  }
  ASYNCTP_CHECK(doc.contains("world_size") && doc["world_size"].is_number_integer() &&
                    doc["world_size"].get<int64_t>() >= 1 &&
                    doc["world_size"].get<int64_t>() <= 65536,
                "{}: 'world_size' must be an integer in [1, 65536]", origin);
  g.world_size = static_cast<int>(doc["world_size"].get<int64_t>());
  ASYNCTP_CHECK(doc.contains("nodes") && doc["nodes"].is_array(), "{}: 'nodes' must be a list",
                origin);
  for (size_t i = 0; i < doc["nodes"].size(); ++i) {
    Node n = decode_node(doc["nodes"][i], i, origin);
    ASYNCTP_CHECK(g.find(n.name) == nullptr, "{}: node name '{}' is used twice", origin, n.name);
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
