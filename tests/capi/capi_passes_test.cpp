// asynctp_run_passes: the pass pipeline of `asynctp passes` over an fx-graph-json string, through
// the C ABI only: options checked and filled in, the report and the rewritten graph returned,
// and every bad input a status with a message naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "asynctp/asynctp_c.h"

namespace {

using Json = nlohmann::json;

// x_shard [2, 8] -AG(0)-> [4, 8] @ w [8, 6] -> relu -> @ w2 [6, 4] -RS(0)-> [2, 4] at ws 2;
// `rs_input_returned` gives the second product another user, so that its reduce-scatter
// matches but cannot fuse.
std::string graph(bool rs_input_returned) {
  auto node = [](std::string name, std::string op, std::string target, Json args, Json val) {
    return Json{
        {"name", name}, {"op", op}, {"target", target}, {"args", args}, {"kwargs", Json::object()},
        {"val", val}};
  };
  auto meta = [](Json shape, Json stride) {
    return Json{{"shape", shape}, {"stride", stride}, {"dtype", "float32"}, {"device", "cpu"}};
  };
  Json nodes = Json::array();
  nodes.push_back(node("x", "placeholder", "x", Json::array(), meta({2, 8}, {8, 1})));
  nodes.push_back(node("w", "placeholder", "w", Json::array(), meta({8, 6}, {6, 1})));
  nodes.push_back(node("ag", "call_function", "_c10d_functional.all_gather_into_tensor.default",
                       {{{"node", "x"}}, 2, "0"}, meta({4, 8}, {8, 1})));
  nodes.push_back(node("wait", "call_function", "_c10d_functional.wait_tensor.default",
                       {{{"node", "ag"}}}, meta({4, 8}, {8, 1})));
  nodes.push_back(node("mm", "call_function", "aten.mm.default",
                       {{{"node", "wait"}}, {{"node", "w"}}}, meta({4, 6}, {6, 1})));
  nodes.push_back(node("w2", "placeholder", "w2", Json::array(), meta({6, 4}, {4, 1})));
  nodes.push_back(
      node("relu", "call_function", "aten.relu.default", {{{"node", "mm"}}}, meta({4, 6}, {6, 1})));
  nodes.push_back(node("mm_1", "call_function", "aten.mm.default",
                       {{{"node", "relu"}}, {{"node", "w2"}}}, meta({4, 4}, {4, 1})));
  nodes.push_back(node("rs", "call_function", "_c10d_functional.reduce_scatter_tensor.default",
                       {{{"node", "mm_1"}}, "sum", 2, "0"}, meta({2, 4}, {4, 1})));
  nodes.push_back(node("wait_1", "call_function", "_c10d_functional.wait_tensor.default",
                       {{{"node", "rs"}}}, meta({2, 4}, {4, 1})));
  Json outs = Json::array({Json{{"node", "wait_1"}}});
  if (rs_input_returned) outs.push_back(Json{{"node", "mm_1"}});
  nodes.push_back(node("output", "output", "output", {outs}, nullptr));
  return Json{{"format", "fx-graph-json"},
              {"version", 1},
              {"source", "test"},
              {"world_size", 2},
              {"nodes", nodes}}
      .dump();
}

// The call's result as JSON (the string released), or its status and message.
struct Call {
  asynctp_status status;
  Json result;
  std::string error;
};

Call run(const char* graph_json, const char* options) {
  char* out = reinterpret_cast<char*>(1);  // overwritten with NULL or the result
  Call c{asynctp_run_passes(graph_json, options, &out), nullptr, asynctp_last_error()};
  if (c.status == ASYNCTP_OK) {
    c.result = Json::parse(out);
    asynctp_string_free(out);
  } else {
    EXPECT_EQ(out, nullptr);
  }
  return c;
}

TEST(CapiPasses, OptionsAreCheckedAndFilledIn) {
  const Call defaults = run(nullptr, nullptr);
  ASSERT_EQ(defaults.status, ASYNCTP_OK) << defaults.error;
  EXPECT_EQ(defaults.result["options"],
            Json::parse(R"({"enable_last_dim": false, "no_last_dim_scatter": false,
                            "enable_transpose": false, "enable_swiglu": false,
                            "bucket_mb": [], "no_fuse": false, "strict": false})"));
  EXPECT_FALSE(defaults.result.contains("graph"));
  const Call set =
      run(nullptr, R"({"enable_last_dim": true, "no_last_dim_scatter": true, "bucket_mb": 4,
                       "enable_swiglu": true})");
  ASSERT_EQ(set.status, ASYNCTP_OK) << set.error;
  EXPECT_EQ(set.result["options"]["enable_swiglu"], true);
  EXPECT_EQ(set.result["options"]["enable_last_dim"], true);
  EXPECT_EQ(set.result["options"]["no_last_dim_scatter"], true);
  EXPECT_EQ(set.result["options"]["bucket_mb"], Json::array({4.0}));

  for (auto [options, message] :
       {std::pair{R"({"enable_everything": true})", "unknown option enable_everything"},
        std::pair{R"({"enable_transpose": 1})", "option enable_transpose is 1"},
        std::pair{R"({"bucket_mb": [4, -1]})", "option bucket_mb is [4,-1]"},
        std::pair{R"([1])", "expected a JSON object"}, std::pair{"{", "not JSON"}}) {
    const Call bad = run(nullptr, options);
    EXPECT_EQ(bad.status, ASYNCTP_ERROR_INVALID_ARGUMENT) << options;
    EXPECT_NE(bad.error.find(message), std::string::npos) << bad.error;
  }
  EXPECT_EQ(asynctp_run_passes(nullptr, nullptr, nullptr), ASYNCTP_ERROR_INVALID_ARGUMENT);
}

TEST(CapiPasses, FusesAndReportsEveryCollective) {
  const std::string g = graph(false);
  const Call c = run(g.c_str(), "{}");
  ASSERT_EQ(c.status, ASYNCTP_OK) << c.error;
  ASSERT_EQ(c.result["report"].size(), 2u) << c.result["report"];
  for (const auto& e : c.result["report"])
    EXPECT_EQ(e["outcome"], "fused") << e.dump();
  std::vector<std::string> targets;
  for (const auto& n : c.result["graph"]["nodes"])
    targets.push_back(n["target"]);
  EXPECT_NE(std::find(targets.begin(), targets.end(), "asynctp.fused_all_gather_matmul"),
            targets.end());
  EXPECT_NE(std::find(targets.begin(), targets.end(), "asynctp.fused_matmul_reduce_scatter"),
            targets.end());
  EXPECT_EQ(c.result["graph"]["world_size"], 2);
}

TEST(CapiPasses, BlockedCollectivesAndBadGraphs) {
  const std::string g = graph(true);
  const Call relaxed = run(g.c_str(), nullptr);
  ASSERT_EQ(relaxed.status, ASYNCTP_OK) << relaxed.error;
  const auto& report = relaxed.result["report"];
  ASSERT_EQ(report.size(), 2u) << report.dump();
  EXPECT_EQ(report[0]["collective"], "ag");
  EXPECT_EQ(report[0]["outcome"], "fused");
  EXPECT_EQ(report[1]["collective"], "rs");
  EXPECT_EQ(report[1]["outcome"], "blocked");
  const Call strict = run(g.c_str(), R"({"strict": true})");
  EXPECT_EQ(strict.status, ASYNCTP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(strict.error.find("--strict: reduce_scatter rs"), std::string::npos) << strict.error;

  const Call not_a_graph = run(R"({"format": "fx-graph-json", "version": 1})", nullptr);
  EXPECT_EQ(not_a_graph.status, ASYNCTP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(not_a_graph.error.find("graph_json"), std::string::npos) << not_a_graph.error;
}

}  // namespace
