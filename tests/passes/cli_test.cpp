// `asynctp passes` and `asynctp run`, through the binary as a user runs them: the report, --strict,
// --bucket-mb, the self-launching --nproc path, --check, --json and errors.
#include <sys/wait.h>
#include <array>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "graph/graph_builder.h"
#include "passes/pass_testing.h"
#include "passes/swiglu_graph.h"

namespace asynctp::testing {
namespace {

struct CliRun {
  int code = -1;
  std::string out;  // stdout and stderr
};

CliRun sh(const std::string& args) {
  const std::string cmd = std::string(ASYNCTP_BINARY) + " " + args + " 2>&1";
  CliRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0)
    r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return r;
}

std::string graph_path(const std::string& name) {
  return std::string(ASYNCTP_TEST_GRAPHS_DIR) + "/" + name;
}

TEST(Cli, PassesWritesTheGraphAndReportsEveryCollective) {
  const std::string out = ::testing::TempDir() + "/asynctp_cli_passes.json";
  const CliRun r = sh("passes " + graph_path("sp_block.bwd.pre.json") + " -o " + out + " --report");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("4 collectives: 4 fused"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3 matmuls summed"), std::string::npos) << r.out;
  const graph::Graph g = graph::read_graph_file(out);
  EXPECT_EQ(count_target(g, "asynctp.fused_matmul_reduce_scatter"), 2);
  const CliRun j = sh("passes " + graph_path("sp_mlp.fwd.pre.json") + " -o " + out + " --json");
  ASSERT_EQ(j.code, 0) << j.out;
  EXPECT_EQ(nlohmann::json::parse(j.out).size(), 2u);
}

TEST(Cli, StrictFailsOnAMatchedButUnfusedCollective) {
  GraphBuilder b(4);
  const auto p = b.mm(b.input("a", {8, 4}), b.input("w", {4, 8}));
  b.output({b.reduce_scatter(p, 0), p});
  const std::string in = ::testing::TempDir() + "/asynctp_cli_strict.json";
  graph::write_graph_file(b.build(), in);
  const CliRun ok = sh("passes " + in + " -o " + in + ".out --report");
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("other users"), std::string::npos) << ok.out;
  const CliRun strict = sh("passes " + in + " -o " + in + ".out --strict");
  EXPECT_NE(strict.code, 0);
  EXPECT_NE(strict.out.find("--strict: reduce_scatter reduce_scatter_tensor"), std::string::npos)
      << strict.out;
}

// The SwiGLU epilogue through both commands: `passes --enable-swiglu` writes the fused target,
// `run --check --enable-swiglu` runs it against the unfused graph on 4 ranks.
TEST(Cli, EnableSwigluThroughPassesAndRun) {
  const SwigluGraph s = swiglu_graph(SiluForm::kAten, /*save_pre=*/true);
  const std::string in = ::testing::TempDir() + "/asynctp_cli_swiglu.json";
  graph::write_graph_file(s.g, in);
  for (const bool on : {false, true}) {
    const CliRun r =
        sh("passes " + in + " -o " + in + ".out --report" + (on ? " --enable-swiglu" : ""));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(r.out.find("SwiGLU mul") != std::string::npos, on) << r.out;
    const graph::Graph g = graph::read_graph_file(in + ".out");
    EXPECT_EQ(count_target(g, "asynctp.fused_all_gather_matmul_swiglu"), on ? 1 : 0);
  }
  const CliRun check = sh("run " + in + " --nproc 4 --check --enable-swiglu --timeout 120");
  EXPECT_EQ(check.code, 0) << check.out;
  EXPECT_NE(check.out.find("check: OK"), std::string::npos) << check.out;
}

TEST(Cli, RunCheckOnFourRanksWithFusionAndBuckets) {
  const CliRun r =
      sh("run " + graph_path("sp_mlp.bwd.pre.json") + " --nproc 4 --check --timeout 120");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("check: OK"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fused op matmul_reduce_scatter ran split path"), std::string::npos)
      << r.out;
  const CliRun j = sh("run " + graph_path("sp_block.fwd.pre.json") +
                      " --check --bucket-mb 1 --json --timeout 120");
  ASSERT_EQ(j.code, 0) << j.out;
  const std::string line = j.out.substr(j.out.find('{'));  // after the launcher's "[rank 0] " tag
  const auto doc = nlohmann::json::parse(line.substr(0, line.find('\n')));
  EXPECT_TRUE(doc["ok"].get<bool>());
  EXPECT_EQ(doc["world_size"], 4);
}

TEST(Cli, RunErrorsAreClear) {
  const std::string bad = ::testing::TempDir() + "/asynctp_cli_bad.json";
  std::FILE* f = std::fopen(bad.c_str(), "w");
  std::fputs("{\"format\": \"fx-graph-json\", \"version\": 1, \"world_size\": 2, \"nodes\": []}",
             f);
  std::fclose(f);
  const CliRun r = sh("run " + bad + " --nproc 2 --timeout 60");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("no output node"), std::string::npos) << r.out;
  const CliRun w = sh("run " + graph_path("sp_mlp.fwd.pre.json") + " --nproc 2 --timeout 60");
  EXPECT_NE(w.code, 0);
  EXPECT_NE(w.out.find("--nproc 2 but " + graph_path("sp_mlp.fwd.pre.json") +
                       " was recorded for world size 4: run it with --nproc 4"),
            std::string::npos)
      << w.out;
  EXPECT_EQ(w.out.find("[rank "), std::string::npos) << "ranks were started: " << w.out;
}

}  // namespace
}  // namespace asynctp::testing
