// fx-graph-json import and export (../shared/graphs/FORMAT.md, docs/GRAPH.md).
//
// Reading checks the whole document: the format tag and version, each node's fields and their
// kinds, every encoded value, every `val`, and then the graph itself (Graph::validate: unique
// names, no dangling or forward references, exactly one output, last). Any defect throws
// asynctp::Error naming the node (and the argument) at fault; nothing the reader is given makes it
// crash. Unknown targets are kept as they are.
#pragma once

#include <string>
#include <string_view>

#include "graph/ir.h"

namespace asynctp::graph {

// `origin` names the input in messages (a file name).
Graph parse_graph(std::string_view text, std::string_view origin = "<input>");
Graph read_graph_file(const std::string& path);

// The document, one node per line (diff-friendly).
std::string dump_graph(const Graph& graph);
void write_graph_file(const Graph& graph, const std::string& path);

}  // namespace asynctp::graph
