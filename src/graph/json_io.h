// fx-graph-json import and export (../shared/graphs/FORMAT.md, docs/GRAPH.md).
//
// Reading checks the whole document: the format tag and version, each node's fields and their
// kinds, every encoded value, every `val`, and then the graph itself (Graph::validate: unique
// names, no dangling or forward references, exactly one output, last). Any defect throws
// asynctp::Error naming the node (and the argument) at fault, or, for text that is not JSON, the
// line, column and byte; nothing the reader is given makes it crash (tests/fuzz/graph_reader.cpp).
// Lists and objects nested deeper than kMaxJsonNesting are refused before parsing, so no step
// recurses deeper than that, and messages show bounded excerpts of values, never whole ones.
// Reading is linear in the size of the document. Unknown targets are kept as they are.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "graph/ir.h"

namespace asynctp::graph {

// The deepest nesting of JSON lists and objects read: the document, its nodes and their fields
// take 4 levels, an encoded value up to 64 (2 for each {"dict": {...}}).
inline constexpr size_t kMaxJsonNesting = 256;

// `origin` names the input in messages (a file name).
Graph parse_graph(std::string_view text, std::string_view origin = "<input>");
Graph read_graph_file(const std::string& path);

// The document, one node per line (diff-friendly).
std::string dump_graph(const Graph& graph);
void write_graph_file(const Graph& graph, const std::string& path);

}  // namespace asynctp::graph
