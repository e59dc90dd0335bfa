// `asynctp run GRAPH.json`: executes an fx-graph-json graph on N ranks with seeded random inputs
// (or inputs from files). With --check it runs the graph as given and again after the passes on
// the same inputs, and fails unless every output agrees within its dtype's tolerance.
//
// Outside a job (no RANK in the environment) it starts its own N ranks by launching itself
// through asynctp::launch with the hidden --as-rank flag; under a launcher it is one rank.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "graph/compare.h"
#include "graph/executor.h"
#include "graph/inputs.h"
#include "graph/json_io.h"
#include "passes/pipeline.h"
#include "runtime/launcher.h"
#include "tools/commands.h"
#include "tools/options.h"
#include "tools/pass_flags.h"
#include "tools/session.h"

namespace asynctp::tools {

namespace {

struct RunOptions {
  std::string graph;
  int nproc = 0;  // 0: the graph's world size
  std::string backend = "auto";
  bool check = false;
  uint64_t seed = 0;
  std::string inputs;
  std::string save_outputs;
  std::string world_group = "0";
  double tolerance = -1;
  PassFlags pass_flags;  // the passes of --check
  bool json = false;
  double timeout_s = 0;
  bool as_rank = false;
};

std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  ASYNCTP_CHECK(n > 0, "cannot find this program's path (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

int launch_ranks(const RunOptions& o, int nproc) {
  LaunchOptions l;
  l.nproc = nproc;
  l.command = {self_exe(),      "run",        o.graph,  "--as-rank",
               "--backend",     o.backend,    "--seed", std::to_string(o.seed),
               "--world-group", o.world_group};
  auto add = [&](const char* flag, const std::string& v) {
    l.command.insert(l.command.end(), {flag, v});
  };
  if (o.check) l.command.push_back("--check");
  if (!o.inputs.empty()) add("--inputs", o.inputs);
  if (!o.save_outputs.empty()) add("--save-outputs", o.save_outputs);
  if (o.tolerance >= 0) add("--tolerance", fmt::format("{}", o.tolerance));
  const std::vector<std::string> pass_args = o.pass_flags.args();
  l.command.insert(l.command.end(), pass_args.begin(), pass_args.end());
  if (o.json) l.command.push_back("--json");
  if (o.timeout_s > 0) l.timeout_s = o.timeout_s;
  return launch(l);
}

int run_as_rank(const RunOptions& o) {
  const graph::Graph g = graph::read_graph_file(o.graph);
  Session s = Session::join(o.backend);
  OpContext& ctx = *s.ctx;
  const graph::Inputs inputs = o.inputs.empty() ? graph::random_inputs(g, s.rank(), o.seed)
                                                : graph::read_inputs(g, s.rank(), o.inputs);
  graph::ExecOptions exec;
  exec.world_group = o.world_group;
  const auto ref = graph::execute(ctx, g, inputs, exec);
  if (!o.save_outputs.empty()) graph::write_outputs(ref, s.rank(), o.save_outputs);
  nlohmann::ordered_json doc;
  doc["graph"] = o.graph;
  doc["world_size"] = s.world_size();
  doc["backend"] = std::string(ctx.backend().name());
  doc["outputs"] = ref.size();
  bool ok = true;
  std::string text = fmt::format("ran {} on {} ranks (backend {}): {} outputs\n", o.graph,
                                 s.world_size(), ctx.backend().name(), ref.size());
  if (o.check) {
    graph::Graph transformed = g;
    const passes::FusionReport report = passes::run_passes(transformed, o.pass_flags.options());
    ctx.usage().reset();
    const auto got = graph::execute(ctx, transformed, inputs, exec);
    const auto diffs = graph::compare_outputs(got, ref, o.tolerance);
    text += report.text();
    nlohmann::ordered_json outs = nlohmann::ordered_json::array();
    for (const auto& d : diffs) {
      // Every rank's error counts: the check passes only if it passes everywhere.
      const double worst =
          max_over_ranks(*s.group, std::isnan(d.rel_error) ? INFINITY : d.rel_error);
      const bool d_ok = d.note.empty() && worst <= d.tolerance;
      ok = ok && d_ok;
      if (d.dtype.empty() && d.note.empty()) continue;  // None outputs on both sides
      text += fmt::format("output {:<3} {:<7} rel error {:.3g} (tolerance {:.3g}) {}{}\n", d.index,
                          d.dtype, worst, d.tolerance, d_ok ? "OK" : "MISMATCH",
                          d.note.empty() ? "" : ": " + d.note);
      outs.push_back({{"index", d.index},
                      {"dtype", d.dtype},
                      {"rel_error", worst},
                      {"tolerance", d.tolerance},
                      {"ok", d_ok},
                      {"note", d.note}});
    }
    for (const auto& [key, count] : ctx.usage().counts()) {
      text += fmt::format("fused op {} ran {} path {} time(s)\n", key.first, path_name(key.second),
                          count);
    }
    text += ok ? "check: OK\n" : "check: MISMATCH\n";
    doc["report"] = nlohmann::ordered_json::parse(report.json());
    doc["check"] = outs;
    doc["ok"] = ok;
  }
  if (s.rank() == 0) {
    std::printf("%s", o.json ? (doc.dump() + "\n").c_str() : text.c_str());
    std::fflush(stdout);
  }
  return ok ? 0 : 1;
}

int run_command(const RunOptions& o) {
  const char* rank = std::getenv("RANK");
  if (o.as_rank || (rank != nullptr && *rank != '\0')) {
    if (o.nproc > 0) {
      const char* ws = std::getenv("WORLD_SIZE");
      ASYNCTP_CHECK(ws != nullptr && std::atoi(ws) == o.nproc,
                    "--nproc {} but this job's WORLD_SIZE is {}", o.nproc,
                    ws == nullptr ? "unset" : ws);
    }
    return run_as_rank(o);
  }
  // The graph fixes the job's size: ranks of any other number could only fail, each of them, so
  // a wrong --nproc is refused before anything is started.
  const int world_size = graph::read_graph_file(o.graph).world_size;
  ASYNCTP_CHECK(o.nproc == 0 || o.nproc == world_size,
                "--nproc {} but {} was recorded for world size {}: run it with --nproc {} (or "
                "without --nproc)",
                o.nproc, o.graph, world_size, world_size);
  return launch_ranks(o, world_size);
}

}  // namespace

Command add_run_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "run",
      "Execute an fx-graph-json graph on N ranks with seeded random inputs (or inputs from "
      "files); --check also runs it after the passes and compares the outputs.");
  auto o = std::make_shared<RunOptions>();
  cmd->add_option("graph", o->graph, "the graph (fx-graph-json)")
      ->required()
      ->check(CLI::ExistingFile);
  add_integer_option(cmd, "--nproc,-n", options::kNproc, &o->nproc,
                     "ranks to start (default: the graph's world_size); inside a "
                     "job (RANK set) it runs as that rank");
  cmd->add_option("--backend", o->backend, "auto, cpu or cuda")->capture_default_str();
  cmd->add_flag("--check", o->check,
                "run as given and after the passes on the same inputs; fail "
                "unless the outputs agree within the dtype's tolerance");
  add_integer_option(cmd, "--seed", options::kSeed, &o->seed, "seed of the random inputs")
      ->default_str(fmt::format("{}", o->seed));
  cmd->add_option("--inputs", o->inputs,
                  "read inputs from DIR/<placeholder>[.rank<R>].bin (raw "
                  "little-endian, row-major, the placeholder's dtype and shape)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--save-outputs", o->save_outputs,
                  "write DIR/output<i>.rank<R>.bin (+ .json) of the "
                  "graph as given");
  cmd->add_option("--world-group", o->world_group,
                  "the collectives' group name that is the world "
                  "group")
      ->capture_default_str();
  add_number_option(cmd, "--tolerance", options::kTolerance, &o->tolerance,
                    "largest relative error accepted by --check (default: "
                    "by dtype: f32 1e-4, f16 5e-3, bf16 3e-2, float8 0.15)");
  add_pass_flags(cmd, o->pass_flags, "passes of --check: ");
  cmd->add_flag("--json", o->json, "print one JSON document (rank 0)");
  add_number_option(cmd, "--timeout", options::kTimeout, &o->timeout_s,
                    "seconds after which the ranks are stopped");
  cmd->add_flag("--as-rank", o->as_rank,
                "internal: run as one rank of a job started by `asynctp run`")
      ->group("");
  cmd->footer("Example: asynctp run block.pre.json --nproc 4 --check");
  return {cmd, [o] { return run_command(*o); }};
}

}  // namespace asynctp::tools
