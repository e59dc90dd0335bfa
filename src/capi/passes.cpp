// The graph passes over an fx-graph-json string: what `asynctp passes` does to a file, for callers
// that hold the graph in memory (the torch.compile pass of the Python package).
#include <cstdlib>
#include <cstring>

#include <nlohmann/json.hpp>

#include "capi/internal.h"
#include "graph/json_io.h"
#include "passes/pipeline.h"

using namespace asynctp;
using namespace asynctp::capi;

namespace {

using Json = nlohmann::ordered_json;

bool bool_option(const Json& value, std::string_view name) {
  if (!value.is_boolean()) invalid("option {} is {}, expected true or false", name, value.dump());
  return value.get<bool>();
}

// --bucket-mb: one cap or a list of caps, each a number > 0 (MiB).
std::vector<double> bucket_option(const Json& value) {
  const Json list = value.is_array() ? value : Json::array({value});
  std::vector<double> caps;
  for (const auto& v : list) {
    if (!v.is_number() || !(v.get<double>() > 0))
      invalid("option bucket_mb is {}, expected a number > 0 or a list of them", value.dump());
    caps.push_back(v.get<double>());
  }
  return caps;
}

// The options of `asynctp passes` (src/tools/passes_command.cpp), named by their flags without
// the dashes. Every name is read here and written back by options_json, so the two stay one list.
passes::PassOptions options_of(const char* text) {
  passes::PassOptions options;
  if (text == nullptr) return options;
  Json doc;
  try {
    doc = Json::parse(text);
  } catch (const Json::parse_error& e) {
    invalid("options_json is not JSON: {}", e.what());
  }
  if (!doc.is_object()) invalid("options_json is {}, expected a JSON object", doc.dump());
  for (const auto& [name, value] : doc.items()) {
    if (name == "enable_last_dim") {
      options.tp.enable_last_dim = bool_option(value, name);
    } else if (name == "no_last_dim_scatter") {
      options.tp.enable_last_dim_scatter = !bool_option(value, name);
    } else if (name == "enable_transpose") {
      options.tp.enable_transpose = bool_option(value, name);
    } else if (name == "enable_swiglu") {
      options.tp.enable_swiglu = bool_option(value, name);
    } else if (name == "no_fuse") {
      options.fuse = !bool_option(value, name);
    } else if (name == "strict") {
      options.strict = bool_option(value, name);
    } else if (name == "bucket_mb") {
      options.bucket.cap_mb = bucket_option(value);
    } else {
      invalid(
          "unknown option {} (the options of `asynctp passes`: enable_last_dim, "
          "no_last_dim_scatter, enable_transpose, enable_swiglu, bucket_mb, no_fuse, strict)",
          name);
    }
  }
  return options;
}

Json options_json(const passes::PassOptions& o) {
  return Json{{"enable_last_dim", o.tp.enable_last_dim},
              {"no_last_dim_scatter", !o.tp.enable_last_dim_scatter},
              {"enable_transpose", o.tp.enable_transpose},
              {"enable_swiglu", o.tp.enable_swiglu},
              {"bucket_mb", o.bucket.cap_mb},
              {"no_fuse", !o.fuse},
              {"strict", o.strict}};
}

char* copy_string(const std::string& text) {
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  if (out == nullptr) throw std::bad_alloc();
  std::memcpy(out, text.data(), text.size() + 1);
  return out;
}

}  // namespace

extern "C" {

asynctp_status asynctp_run_passes(const char* graph_json, const char* options_json_text,
                                  char** out) {
  return guarded(__func__, [&] {
    check_out(out, "out");
    *out = nullptr;
    const passes::PassOptions options = options_of(options_json_text);
    std::string result = "{\"options\":" + options_json(options).dump();
    if (graph_json != nullptr) {
      // Defects of the document and --strict failures are the caller's argument.
      graph::Graph g;
      passes::FusionReport report;
      try {
        g = graph::parse_graph(graph_json, "graph_json");
        report = passes::run_passes(g, options);
      } catch (const Error& e) {
        invalid("{}", e.what());
      }
      result += ",\"report\":" + report.json() + ",\"graph\":" + graph::dump_graph(g);
    }
    result += "}";
    *out = copy_string(result);
  });
}

void asynctp_string_free(char* s) {
  std::free(s);
}

}  // extern "C"
