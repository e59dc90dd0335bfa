// Recognizes the functional collectives of a graph together with the nodes PyTorch writes around
// them: the wait, and the "chunk-cat" form of a gather/scatter on a dim other than 0.
//
//   gather on dim d:   ag = all_gather_into_tensor(x, ws, g); w = wait_tensor(ag)
//                      parts = split(w, x.size(0)); cat([parts[0], ..., parts[ws-1]], d)
//   scatter on dim d:  parts = split(P, P.size(d) / ws, d); c = cat([parts[0..ws-1]])  (dim 0)
//                      rs = reduce_scatter_tensor(c, op, ws, g); w = wait_tensor(rs)
// or, as PyTorch writes them in backward graphs, with slices in place of split + getitem:
//   parts[r] = slice(w, 0, r*s, (r+1)*s) (gather); parts[r] = slice(P, d, r*c, (r+1)*c) (scatter).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "passes/graph_edit.h"

namespace asynctp::passes {

inline constexpr const char* kAllGather = "_c10d_functional.all_gather_into_tensor.default";
inline constexpr const char* kReduceScatter = "_c10d_functional.reduce_scatter_tensor.default";
inline constexpr const char* kAllReduce = "_c10d_functional.all_reduce.default";
inline constexpr const char* kWait = "_c10d_functional.wait_tensor.default";

struct GatherMatch {
  std::string ag, wait;
  std::string shard;   // the gathered input [.., s@d, ..]
  std::string result;  // the node holding the gathered tensor: the wait, or the cat
  std::vector<std::string> chunk_nodes;  // split, getitems, cat (empty for dim 0)
  int gather_dim = 0;
  int64_t group_size = 0;
  std::string group;
};

struct ScatterMatch {
  std::string rs, wait;
  std::string input;  // the tensor scattered on `scatter_dim` (before the chunk-cat)
  std::vector<std::string> chunk_nodes;
  int scatter_dim = 0;
  int64_t group_size = 0;
  std::string group, reduce_op;
};

// nullopt with *why set when `ag` is not an all-gather whose only user is its wait, etc.
std::optional<GatherMatch> match_all_gather(const Graph& g, const Users& users, const Node& ag,
                                            std::string* why);
std::optional<ScatterMatch> match_reduce_scatter(const Graph& g, const Users& users, const Node& rs,
                                                 std::string* why);

}  // namespace asynctp::passes
