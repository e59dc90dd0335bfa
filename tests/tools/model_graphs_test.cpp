// The graphs PyTorch makes for four sequence-parallel models at ws 2 (tests/graph/data/, written by
// scripts/export_model_graphs.py from torch.compile on CPU; CI does not export): a ReLU MLP, a
// GELU MLP, a SwiGLU MLP and a Llama-3 decoder layer, forward and backward. For each, through the
// binary as a user runs it:
//   asynctp run G --nproc 2 --check  executes every op of the graph as given and after the passes
//                                    on the CPU backend, and the outputs agree;
//   asynctp passes G --json          with the default options fuses every all-gather and
//                                    reduce-scatter of the graph.
#include <algorithm>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tools/run_command.h"

namespace asynctp::testing {
namespace {

std::string graph_path(const std::string& name) {
  return std::string(ASYNCTP_SOURCE_DIR) + "/tests/graph/data/" + name + ".json";
}

class ModelGraph : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelGraph, RunsAndChecksOnTwoRanks) {
  const Finished r = run_command(
      {ASYNCTP_BIN, "run", graph_path(GetParam()), "--nproc", "2", "--check", "--timeout", "240"},
      {}, Millis(300'000));
  ASSERT_TRUE(r.exited && r.exit_code == 0) << r.describe();
  EXPECT_NE(r.out.find("check: OK"), std::string::npos) << r.out;
}

TEST_P(ModelGraph, EveryCollectiveFusesWithTheDefaults) {
  const std::string out = ::testing::TempDir() + "/asynctp_model_" + GetParam() + ".json";
  const Finished r =
      run_command({ASYNCTP_BIN, "passes", graph_path(GetParam()), "-o", out, "--json"});
  ASSERT_TRUE(r.exited && r.exit_code == 0) << r.describe();
  const auto report = nlohmann::json::parse(r.out);
  std::set<std::string> kinds;
  for (const auto& entry : report) {
    const std::string kind = entry["kind"];
    kinds.insert(kind);
    EXPECT_TRUE(kind == "all_gather" || kind == "reduce_scatter") << entry.dump();
    EXPECT_EQ(entry["outcome"], "fused") << entry.dump();
  }
  // Sequence parallelism gathers before the column-parallel GEMMs and reduce-scatters after the
  // row-parallel ones, forward and backward.
  EXPECT_EQ(kinds, (std::set<std::string>{"all_gather", "reduce_scatter"})) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Exported, ModelGraph,
                         ::testing::Values("relu_mlp.fwd", "relu_mlp.bwd", "gelu_mlp.fwd",
                                           "gelu_mlp.bwd", "swiglu_mlp.fwd", "swiglu_mlp.bwd",
                                           "llama_layer.fwd", "llama_layer.bwd"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '.', '_');
                           return name;
                         });

}  // namespace
}  // namespace asynctp::testing
