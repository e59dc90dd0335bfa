// `asynctp passes IN.json -o OUT.json`: runs the graph passes (micro-pipeline-TP fusion,
// bucketing) on an fx-graph-json graph and writes the result; --report prints what became of
// every collective.
#include <cstdio>

#include <fmt/format.h>

#include "graph/json_io.h"
#include "passes/pipeline.h"
#include "tools/commands.h"
#include "tools/options.h"

namespace asynctp::tools {

namespace {

struct PassesOptions {
  std::string input;
  std::string output;
  bool report = false;
  bool json = false;
  bool strict = false;
  bool no_fuse = false;
  std::vector<double> bucket_mb;
  bool enable_last_dim = false;
  bool no_last_dim_scatter = false;
  bool enable_transpose = false;
  bool enable_swiglu = false;
};

int run_passes_command(const PassesOptions& o) {
  graph::Graph g = graph::read_graph_file(o.input);
  passes::PassOptions options;
  options.fuse = !o.no_fuse;
  options.strict = o.strict;
  options.tp.enable_last_dim = o.enable_last_dim;
  options.tp.enable_last_dim_scatter = !o.no_last_dim_scatter;
  options.tp.enable_transpose = o.enable_transpose;
  options.tp.enable_swiglu = o.enable_swiglu;
  options.bucket.cap_mb = o.bucket_mb;
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
  cmd->add_flag("--no-fuse", o->no_fuse, "skip the fusion pass (bucketing only)");
  add_numbers_option(cmd, "--bucket-mb", options::kBucketMb, &o->bucket_mb,
                     "bucket the remaining all-gathers and reduce-scatters up to this many MiB per "
                     "bucket (inf: one bucket); several values give the caps of buckets 0, 1, ... "
                     "(the last repeats)");
  cmd->add_flag("--enable-last-dim", o->enable_last_dim,
                "also fuse gathers on the contraction (last) dim (each rank's product becomes a "
                "partial sum)");
  cmd->add_flag("--no-last-dim-scatter", o->no_last_dim_scatter,
                "leave reduce-scatters on the output (last) dim unfused (fused by default)");
  cmd->add_flag("--enable-transpose", o->enable_transpose,
                "also fuse mm(A, all_gather(B).t()) through the transposed product");
  cmd->add_flag("--enable-swiglu", o->enable_swiglu,
                "also move silu(g) * u after a fused gather's product [g | u] into the GEMM's "
                "epilogue (asynctp.fused_all_gather_matmul_swiglu)");
  cmd->footer("Example: asynctp passes block.pre.json -o block.fused.json --report");
  return {cmd, [o] { return run_passes_command(*o); }};
}

}  // namespace asynctp::tools
