#include "passes/pipeline.h"

#include "core/error.h"
#include "passes/collective_match.h"
#include "passes/graph_edit.h"

namespace asynctp::passes {

FusionReport run_passes(graph::Graph& g, const PassOptions& options) {
  g.validate();
  FusionReport report;
  if (options.fuse) {
    micro_pipeline_tp(g, options.tp, report);
  } else {
    for (const auto& n : g.nodes()) {
      if (n.target == kAllGather)
        report.set(n.name, "all_gather", Outcome::kUnmatched, "fusion disabled");
      if (n.target == kReduceScatter)
        report.set(n.name, "reduce_scatter", Outcome::kUnmatched, "fusion disabled");
      if (n.target == kAllReduce)
        report.set(n.name, "all_reduce", Outcome::kUnmatched, "fusion disabled");
    }
  }
  if (options.strict) {
    for (const auto& e : report.entries()) {
      ASYNCTP_CHECK(e.outcome != Outcome::kBlocked,
                    "--strict: {} {} matched a fusion pattern but was "
                    "not fused: {}",
                    e.kind, e.collective, e.detail);
    }
  }
  bucket_collectives(g, options.bucket, report);
  remove_dead_code(g);
  stable_topological_sort(g);
  g.validate();
  return report;
}

}  // namespace asynctp::passes
