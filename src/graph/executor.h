// The executor: runs a graph on one rank of an OpContext (every rank of the job runs the same
// graph, one process per rank, as PyTorch does). Matmuls, collectives and the fused targets run on
// the OpContext's backend; elementwise ops, reductions, views and the attention reference run on
// host memory (kernels_*.cpp). Every node's result is checked against the shape and dtype PyTorch
// recorded in its `val`; a mismatch, an unsupported target or dtype is an error naming the node.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "graph/ir.h"
#include "graph/kernel.h"

namespace asynctp::graph {

struct ExecOptions {
  // The collectives' group name that stands for the world group ("0" is PyTorch's default
  // process group). A collective on any other group is an error.
  std::string world_group = "0";
  // Compare every result with its recorded `val` (shape and dtype).
  bool check_meta = true;
};

// Placeholder name -> value. Placeholders whose `val` is null (non-tensor inputs) may be absent.
using Inputs = std::unordered_map<std::string, HostTensor>;

// The graph's outputs: the output node's list, flattened one level (None entries kept).
std::vector<RtValue> execute(OpContext& ctx, const Graph& graph, const Inputs& inputs,
                             const ExecOptions& options = {});

}  // namespace asynctp::graph
