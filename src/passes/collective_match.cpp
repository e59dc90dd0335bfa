#include "passes/collective_match.h"

namespace asynctp::passes {

namespace {

// The single wait reading `coll`, or "" (with *why) when there is none or there are others.
std::string only_wait(const Graph& g, const Users& users, const Node& coll, std::string* why) {
  const auto& us = users_of(users, coll.name);
  if (us.size() != 1 || g.find(us[0])->target != kWait) {
    *why = us.empty() ? "its result is never waited on"
                      : fmt::format("its result is used by {} node(s) other than one wait_tensor",
                                    us.size());
    return "";
  }
  return us[0];
}

// The cat that reads `parts` (every user of one node), each part read only by that cat, in the
// order `index_of` gives them (0..ws-1; -1: not a part); "" otherwise. On success appends the
// parts in order, then the cat, to `nodes`.
template <typename IndexOf>
std::string parts_cat(const Graph& g, const Users& users, const std::vector<std::string>& parts,
                      int64_t ws, IndexOf index_of, std::vector<std::string>* nodes) {
  if (static_cast<int64_t>(parts.size()) != ws) return "";
  std::vector<std::string> by_index(static_cast<size_t>(ws));
  std::string cat;
  for (const auto& part : parts) {
    const int64_t idx = index_of(*g.find(part));
    if (idx < 0 || idx >= ws || !by_index[idx].empty()) return "";
    by_index[idx] = part;
    const auto& cu = users_of(users, part);
    if (cu.size() != 1 || g.find(cu[0])->target != "aten.cat.default") return "";
    if (!cat.empty() && cat != cu[0]) return "";
    cat = cu[0];
  }
  const Node* c = g.find(cat);
  if (c->args.empty() || !c->args[0].is_list() ||
      static_cast<int64_t>(c->args[0].list.size()) != ws)
    return "";
  for (int64_t i = 0; i < ws; ++i) {
    const Value& part = c->args[0].list[i];
    if (!part.is_node() || part.s != by_index[i]) return "";
  }
  for (const auto& n : by_index)
    nodes->push_back(n);
  nodes->push_back(cat);
  return cat;
}

int64_t int_arg(const Node& n, size_t i, std::string_view key, int64_t fallback) {
  const Value* v = n.arg(i, key);
  return v != nullptr && v->is_int() ? v->i : fallback;
}

// If `split_node` = split(src, size, dim) has exactly `ws` getitem users 0..ws-1, each read only
// by one cat node, returns that cat (its parts in order) and fills `nodes` (the split, the
// getitems, the cat).
std::string chunk_cat(const Graph& g, const Users& users, const Node& split_node, int64_t ws,
                      std::vector<std::string>* nodes) {
  std::vector<std::string> found{split_node.name};
  const std::string cat = parts_cat(
      g, users, users_of(users, split_node.name), ws,
      [](const Node& gi) -> int64_t {
        if (gi.target != "_operator.getitem" || gi.args.size() != 2 || !gi.args[1].is_int())
          return -1;
        return gi.args[1].i;
      },
      &found);
  if (!cat.empty()) nodes->insert(nodes->end(), found.begin(), found.end());
  return cat;
}

// The slice form of the same (PyTorch writes it in backward graphs): if the users of `src` are
// exactly `ws` nodes slice(src, dim, r*chunk, (r+1)*chunk) for r = 0..ws-1 (step 1; the last end
// may be past the size), each read only by one cat that takes them in order, returns that cat
// and fills `nodes` (the slices, then the cat).
std::string slice_cat(const Graph& g, const Users& users, const Node& src, int64_t dim,
                      int64_t chunk, int64_t ws, std::vector<std::string>* nodes) {
  if (chunk <= 0) return "";
  return parts_cat(
      g, users, users_of(users, src.name), ws,
      [&](const Node& s) -> int64_t {
        if (s.target != "aten.slice.Tensor" || node_arg(s, 0) != src.name ||
            int_arg(s, 1, "dim", 0) != dim || int_arg(s, 4, "step", 1) != 1)
          return -1;
        const int64_t start = int_arg(s, 2, "start", -1);
        if (start < 0 || start % chunk != 0) return -1;
        const int64_t idx = start / chunk, end = int_arg(s, 3, "end", -1);
        if (end != start + chunk && !(idx == ws - 1 && end > start + chunk)) return -1;
        return idx;
      },
      nodes);
}

// The dim of a chunk-cat's cat node, made non-negative for a tensor of rank `rank`.
int64_t cat_dim(const Graph& g, const std::string& cat, size_t rank) {
  int64_t d = int_arg(*g.find(cat), 1, "dim", 0);
  return d < 0 ? d + static_cast<int64_t>(rank) : d;
}

}  // namespace

std::optional<GatherMatch> match_all_gather(const Graph& g, const Users& users, const Node& ag,
                                            std::string* why) {
  GatherMatch m;
  m.ag = ag.name;
  m.shard = node_arg(ag, 0);
  if (m.shard.empty() || ag.args.size() < 3 || !ag.args[1].is_int() ||
      ag.args[2].kind != Value::Kind::kString) {
    *why = "unexpected arguments (expected input, group_size, group_name)";
    return std::nullopt;
  }
  m.group_size = ag.args[1].i;
  m.group = ag.args[2].s;
  m.wait = only_wait(g, users, ag, why);
  if (m.wait.empty()) return std::nullopt;
  m.result = m.wait;
  const TensorMeta* shard = tensor_meta(g, m.shard);
  if (shard == nullptr || shard->shape.empty()) return m;
  const auto& wu = users_of(users, m.wait);
  std::vector<std::string> nodes;
  std::string cat;
  if (wu.size() == 1) {
    const Node* s = g.find(wu[0]);
    if (s->target == "aten.split.Tensor" && int_arg(*s, 1, "split_size", -1) == shard->shape[0] &&
        int_arg(*s, 2, "dim", 0) == 0) {
      cat = chunk_cat(g, users, *s, m.group_size, &nodes);
    }
  } else {
    cat = slice_cat(g, users, *g.find(m.wait), 0, shard->shape[0], m.group_size, &nodes);
  }
  if (!cat.empty()) {
    m.gather_dim = static_cast<int>(cat_dim(g, cat, shard->shape.size()));
    m.result = cat;
    m.chunk_nodes = std::move(nodes);
  }
  return m;
}

std::optional<ScatterMatch> match_reduce_scatter(const Graph& g, const Users& users, const Node& rs,
                                                 std::string* why) {
  ScatterMatch m;
  m.rs = rs.name;
  m.input = node_arg(rs, 0);
  if (m.input.empty() || rs.args.size() < 4 || rs.args[1].kind != Value::Kind::kString ||
      !rs.args[2].is_int() || rs.args[3].kind != Value::Kind::kString) {
    *why = "unexpected arguments (expected input, reduce_op, group_size, group_name)";
    return std::nullopt;
  }
  m.reduce_op = rs.args[1].s;
  m.group_size = rs.args[2].i;
  m.group = rs.args[3].s;
  m.wait = only_wait(g, users, rs, why);
  if (m.wait.empty()) return std::nullopt;
  // Chunk-cat form: input = cat(split(P, c, d)[0..ws-1]) on dim 0, each piece used only there.
  const Node* c = g.find(m.input);
  if (c->target == "aten.cat.default" && int_arg(*c, 1, "dim", 0) == 0 &&
      users_of(users, c->name).size() == 1 && !c->args.empty() && c->args[0].is_list() &&
      !c->args[0].list.empty() && c->args[0].list[0].is_node()) {
    const Node* first = g.find(c->args[0].list[0].s);
    const std::string split = first->target == "_operator.getitem" ? node_arg(*first, 0) : "";
    const Node* s = split.empty() ? nullptr : g.find(split);
    if (first->target == "aten.slice.Tensor") {
      // Slice form: parts[r] = slice(P, d, r*c, (r+1)*c).
      const std::string src = node_arg(*first, 0);
      const TensorMeta* p = src.empty() ? nullptr : tensor_meta(g, src);
      int64_t d = int_arg(*first, 1, "dim", 0);
      if (p != nullptr && d < 0) d += p->shape.size();
      if (p != nullptr && d >= 0 && d < static_cast<int64_t>(p->shape.size()) &&
          p->shape[d] % m.group_size == 0) {
        std::vector<std::string> nodes;
        const std::string cat =
            slice_cat(g, users, *g.find(src), d, p->shape[d] / m.group_size, m.group_size, &nodes);
        if (cat == c->name) {
          m.scatter_dim = static_cast<int>(d);
          m.input = src;
          m.chunk_nodes = std::move(nodes);
        }
      }
    } else if (s != nullptr && s->target == "aten.split.Tensor") {
      std::vector<std::string> nodes;
      const std::string cat = chunk_cat(g, users, *s, m.group_size, &nodes);
      const TensorMeta* p = tensor_meta(g, node_arg(*s, 0));
      if (cat == c->name && p != nullptr) {
        int64_t d = int_arg(*s, 2, "dim", 0);
        if (d < 0) d += p->shape.size();
        if (d >= 0 && d < p->shape.size() &&
            int_arg(*s, 1, "split_size", -1) * m.group_size == p->shape[d]) {
          m.scatter_dim = static_cast<int>(d);
          m.input = node_arg(*s, 0);
          m.chunk_nodes = std::move(nodes);
        }
      }
    }
  }
  return m;
}

}  // namespace asynctp::passes
