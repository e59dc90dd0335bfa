// Generated fx-graph-json documents of any size: the reader's timing test loads one of 20,000
// nodes (whole-model post-grad graphs are that large).
#pragma once

#include <cstddef>
#include <string>

namespace asynctp::testing {

// A graph of about `num_nodes` nodes shaped like a stack of residual MLP layers, every node with
// its `val`: per layer two weight placeholders and
//   mm [T, F] = h [T, H] @ w1 [H, F] -> relu -> mm [T, H] = . @ w2 [F, H] -> add (h, .)
// then the output. Nodes read earlier nodes only; names are unique.
std::string large_graph_json(size_t num_nodes);

}  // namespace asynctp::testing
