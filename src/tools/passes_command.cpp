// `asynctp passes IN.json -o OUT.json`: runs the graph passes (micro-pipeline-TP fusion,
// bucketing) on an fx-graph-json graph and writes the result; --report prints what became of
// every collective.
#include <cstdio>

#include <fmt/format.h>

#include "graph/json_io.h"
#include "passes/pipeline.h"
#include "tools/commands.h"
#include "tools/pass_flags.h"

namespace asynctp::tools {

namespace {

struct PassesOptions {
  std::string input;
  std::string output;
  bool report = false;
  bool json = false;
  bool strict = false;
  PassFlags flags;
};

int run_passes_command(const PassesOptions& o) {
  graph::Graph g = graph::read_graph_file(o.input);
  passes::PassOptions options = o.flags.options();
  options.strict = o.strict;
  const passes::FusionReport report = passes::run_passes(g, options);
  graph::write_graph_file(g, o.output);
  if (o.json) {
    std::printf("%s\n", report.json().c_str());
  } else if (o.report) {
    std::printf("%s", report.text().c_str());
  }
  return 0;
}

}  // namespace

Command add_passes_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "passes",
      "Run the graph passes on an fx-graph-json graph: fuse all-gather -> matmul and "
      "matmul -> reduce-scatter into asynctp's fused ops, bucket the remaining collectives, and "
      "write the result.");
  auto o = std::make_shared<PassesOptions>();
  cmd->add_option("input", o->input, "the graph (fx-graph-json)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", o->output, "where to write the transformed graph")->required();
  cmd->add_flag("--report", o->report,
                "print one line per collective: fused, bucketed, or why not");
  cmd->add_flag("--json", o->json, "print the report as JSON instead");
  cmd->add_flag("--strict", o->strict,
                "fail when a collective matched a fusion pattern but was not fused");
  add_pass_flags(cmd, o->flags, "");
  cmd->footer("Example: asynctp passes block.pre.json -o block.fused.json --report");
  return {cmd, [o] { return run_passes_command(*o); }};
}

}  // namespace asynctp::tools
