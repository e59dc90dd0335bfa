// The pass pipeline behind `asynctp passes` and `asynctp run --check`: micro-pipeline-TP fusion,
// then bucketing of what is left, dead-code removal and a final topological sort and validation.
#pragma once

#include "graph/ir.h"
#include "passes/bucketing.h"
#include "passes/micro_pipeline_tp.h"
#include "passes/report.h"

namespace asynctp::passes {

// Every field is an option of `asynctp passes` (src/tools/passes_command.cpp) and of the C ABI's
// asynctp_run_passes (src/capi/passes.cpp, options by name): a new field goes into both.
struct PassOptions {
  bool fuse = true;
  MicroPipelineOptions tp;
  BucketOptions bucket;  // empty cap: no bucketing
  // A collective that matched a fusion pattern but was left unfused is an error (naming it and
  // why), instead of a line in the report.
  bool strict = false;
};

FusionReport run_passes(graph::Graph& g, const PassOptions& options);

}  // namespace asynctp::passes
