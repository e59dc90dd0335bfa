// Graph surgery shared by the passes: building nodes, reading recorded shapes, ancestry,
// hoisting producers, dead-code removal and a stable topological sort.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "graph/ir.h"

namespace asynctp::passes {

using graph::Graph;
using graph::Meta;
using graph::Node;
using graph::TensorMeta;
using graph::Value;
using Users = std::unordered_map<std::string, std::vector<std::string>>;

// A call_function node (its val from `meta`, null when absent).
Node make_call(std::string name, std::string target, std::vector<Value> args,
               std::vector<std::pair<std::string, Value>> kwargs = {}, Meta meta = {});
// Contiguous tensor metadata of (shape, dtype) on `device`.
TensorMeta contiguous_meta(const Dims& shape, std::string dtype, std::string device);
Value int_list(const Dims& dims);

// The node's recorded tensor metadata, or nullptr.
const TensorMeta* tensor_meta(const Graph& g, const std::string& name);
// Positional arg `i` of `node` when it is a node reference ("" otherwise).
std::string node_arg(const Node& node, size_t i);
// The users of `name` (empty when none).
const std::vector<std::string>& users_of(const Users& users, const std::string& name);

bool is_reshape(const Node& node);  // aten.reshape / aten.view / aten._unsafe_view
// The resolved target shape of a reshape node, from its val (or its argument without -1).
std::optional<Dims> reshape_shape(const Graph& g, const Node& node);

// Every node reachable from `root` through uses (root included).
std::unordered_set<std::string> descendants(const Graph& g, const Users& users,
                                            const std::string& root);

// Moves the producers of `needed` (and their ancestors) that sit at or after `position` to just
// before it, keeping their order. The moved set is closed under "input of" among the nodes at or
// after `position`, so the order stays valid as long as the node at `position` is not among them
// (the caller checks that nothing needed depends on it; moving it is refused). Returns the new
// index of the node that was at `position`.
size_t hoist_before(Graph& g, size_t position, const std::vector<std::string>& needed);

// Removes call_function nodes without users whose targets have no side effects (aten.*, prims.*,
// getitem, the asynctp fused ops); collectives and unknown targets are kept. Returns how many.
int remove_dead_code(Graph& g);

// Reorders the nodes so that every node follows its inputs, moving as few as possible (Kahn's
// algorithm, ready nodes taken in their current order). Throws on a cycle, naming a node in it.
void stable_topological_sort(Graph& g);
bool is_topologically_sorted(const Graph& g);

}  // namespace asynctp::passes
