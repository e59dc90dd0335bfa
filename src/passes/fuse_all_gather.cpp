// all-gather -> matmul(s)  =>  asynctp.fused_all_gather_(scaled_)matmul.
//
//   G = AG(A_shard, d) [.., ws*s@d, .., K]
//   uses: mm(G2, B_i) with G2 = G (2-D) or reshape(G, [M, K]) (then out_i is viewed back as
//         [M, N_i] for the mm's users, and a reshape of the mm to G's shape with N_i reads out_i).
//         A chain of reshapes of G counts as one: with one sequence per rank ([1, s, h] shards),
//         PyTorch gathers dim 1 as dim 0 and views [ws, s, h] as [1, ws*s, h], then as [ws*s, h].
//   fused(A_shard, [B_i], d) -> (A, [out_i = G @ B_i  : G's shape with N_i])
// Transposed form (enable_transpose): mm(X [M, K], permute(G [N, K])) = (G @ X^T)^T, so the fused
// op gets B = X^T and the result is transposed back.
#include <unordered_set>

#include "core/error.h"
#include "passes/collective_match.h"
#include "passes/micro_pipeline_tp.h"

namespace asynctp::passes {

namespace {

constexpr const char* kMm = "aten.mm.default";
constexpr const char* kScaledMm = "aten._scaled_mm.default";

struct Use {
  std::string mm;       // the matmul node
  std::string reshape;  // the reshape of G it reads, or ""
  bool transposed = false;
  std::string permute;  // transposed form: the permute of G
};

bool is_transpose(const Node& n) {
  if (n.target == "aten.t.default") return true;
  if (n.target != "aten.permute.default" || n.args.size() < 2 || !n.args[1].is_list()) return false;
  const auto& l = n.args[1].list;
  return l.size() == 2 && l[0].is_int() && l[1].is_int() && l[0].i == 1 && l[1].i == 0;
}

// Resolves a row-wise scale_a to the shard scale whose gather produced it: the scale node is
// (reshape of) the result of another all-gather on the same dim, of a shard with A_shard's shape
// and last dim 1. Returns the matching gather, or nullopt.
std::optional<GatherMatch> gathered_scale(const Graph& g, const Users& users, std::string scale,
                                          const GatherMatch& a, const TensorMeta& a_shard) {
  const Node* n = g.find(scale);
  if (is_reshape(*n)) n = g.find(node_arg(*n, 0));
  for (const auto& ag_name : [&] {
         std::vector<std::string> out;
         for (const auto& node : g.nodes()) {
           if (node.target == kAllGather) out.push_back(node.name);
         }
         return out;
       }()) {
    std::string why;
    auto m = match_all_gather(g, users, *g.find(ag_name), &why);
    if (!m || m->result != n->name || m->gather_dim != a.gather_dim || m->group != a.group)
      continue;
    const TensorMeta* s = tensor_meta(g, m->shard);
    Dims expected = a_shard.shape;
    expected[expected.size() - 1] = 1;
    if (s != nullptr && s->shape == expected) return m;
  }
  return std::nullopt;
}

// reshape(reshape(G, s1), s2) reads G as reshape(G, s2) (the same values whatever the layouts);
// the inner reshape goes when nothing else reads it. Returns whether the graph changed.
bool fold_reshape_chains(Graph& g, const std::string& gathered) {
  bool changed = false;
  for (bool again = true; again;) {
    again = false;
    const Users users = g.users();
    for (const auto& u : users_of(users, gathered)) {
      if (!is_reshape(*g.find(u))) continue;
      for (const auto& uu : users_of(users, u)) {
        Node* outer = g.find_mutable(uu);
        if (!is_reshape(*outer) || node_arg(*outer, 0) != u) continue;
        outer->args[0] = Value::node(gathered);
        again = changed = true;
      }
    }
  }
  if (changed) remove_dead_code(g);
  return changed;
}

void fuse_one(Graph& g, const MicroPipelineOptions& options, FusionReport& report,
              const std::string& ag_name) {
  std::string why;
  auto set = [&](Outcome o, std::string detail) {
    report.set(ag_name, "all_gather", o, std::move(detail));
  };
  if (auto first = match_all_gather(g, g.users(), *g.find(ag_name), &why))
    fold_reshape_chains(g, first->result);
  const Users users = g.users();
  const Node ag = *g.find(ag_name);
  const auto match = match_all_gather(g, users, ag, &why);
  if (!match) return set(Outcome::kUnmatched, why);
  if (tensor_meta(g, match->shard) == nullptr || tensor_meta(g, match->result) == nullptr) {
    return set(Outcome::kUnmatched, "the shard or the gathered tensor has no recorded shape");
  }
  // Copies: the graph's node storage moves when nodes are inserted below.
  const TensorMeta shard_meta = *tensor_meta(g, match->shard);
  const TensorMeta gathered_meta = *tensor_meta(g, match->result);
  const TensorMeta* shard = &shard_meta;
  const TensorMeta* gathered = &gathered_meta;

  // Classify every use of G.
  std::vector<Use> mms, scaled, transposed;
  std::vector<std::string> reasons;  // why a matmul-looking use was not taken
  const std::unordered_set<std::string> after_ag = descendants(g, users, ag_name);
  auto b_ok = [&](const Node& mm, const std::vector<size_t>& operand_idx) {
    for (size_t i : operand_idx) {
      const std::string b = node_arg(mm, i);
      if (!b.empty() && after_ag.count(b)) {
        reasons.push_back(fmt::format("{}: operand {} depends on the gathered tensor", mm.name, b));
        return false;
      }
    }
    return true;
  };
  auto add_mm = [&](const Node& mm, const std::string& via) {
    if (node_arg(mm, 0) != (via.empty() ? match->result : via)) return false;
    if (mm.target == kMm) {
      if (b_ok(mm, {1})) mms.push_back({mm.name, via});
      return true;
    }
    if (mm.target == kScaledMm) {
      if (b_ok(mm, {1, 3})) scaled.push_back({mm.name, via});
      return true;
    }
    return false;
  };
  for (const auto& u : users_of(users, match->result)) {
    const Node& un = *g.find(u);
    if (add_mm(un, "")) continue;
    if (is_reshape(un) && gathered->shape.size() >= 3) {
      auto shape = reshape_shape(g, un);
      if (shape && shape->size() == 2 && (*shape)[1] == gathered->shape.back()) {
        for (const auto& uu : users_of(users, u))
          add_mm(*g.find(uu), u);
      }
      continue;
    }
    if (is_transpose(un) && gathered->shape.size() == 2 && match->gather_dim == 0) {
      for (const auto& uu : users_of(users, u)) {
        const Node& mm = *g.find(uu);
        if (mm.target == kMm && node_arg(mm, 1) == u && node_arg(mm, 0) != u) {
          if (!options.enable_transpose) {
            reasons.push_back(
                fmt::format("{} uses the gathered tensor as its transposed right-hand "
                            "operand; enable with --enable-transpose",
                            mm.name));
          } else if (b_ok(mm, {0})) {
            transposed.push_back({mm.name, "", true, u});
          }
        }
      }
    }
  }
  // One kind per fused op (as in PyTorch): plain matmuls first, then scaled, then transposed.
  std::vector<Use> uses = !mms.empty() ? mms : !scaled.empty() ? scaled : transposed;
  if (uses.empty()) {
    if (!reasons.empty())
      return set(Outcome::kBlocked, fmt::format("{}", fmt::join(reasons, "; ")));
    return set(Outcome::kUnmatched, fmt::format("the gathered tensor {} feeds no matmul as its "
                                                "left-hand operand",
                                                match->result));
  }
  const bool is_scaled = uses[0].mm.size() && g.find(uses[0].mm)->target == kScaledMm;
  const bool is_transposed = uses[0].transposed;
  const int rank = shard->shape.size();
  if (match->gather_dim == rank - 1 && !options.enable_last_dim) {
    return set(Outcome::kBlocked,
               "it gathers the contraction (last) dim; enable with --enable-last-dim");
  }
  if (rank < 2) return set(Outcome::kUnmatched, "the shard has rank < 2");
  if (match->group_size != g.world_size) {
    return set(Outcome::kBlocked, fmt::format("group size {} is not the world size {}",
                                              match->group_size, g.world_size));
  }

  // Scaled: one A_scale for all uses; row-wise scales must be gathers of the shard's scale.
  Value a_scale;
  std::optional<GatherMatch> scale_gather;
  std::vector<Value> b_scales, out_dtypes;
  // Each _scaled_mm's use_fast_accum (arg 7), carried into the fused node: absent or None is
  // False, as in _scaled_mm's schema.
  std::vector<Value> fast_accum;
  bool any_fast = false;
  if (is_scaled) {
    if (match->gather_dim == rank - 1)
      return set(Outcome::kBlocked, "a scaled matmul cannot gather the contraction dim");
    std::string sa;
    for (const auto& u : uses) {
      const Node& mm = *g.find(u.mm);
      if ((mm.args.size() > 4 && !mm.args[4].is_none()) ||
          (mm.args.size() > 5 && !mm.args[5].is_none())) {
        return set(Outcome::kBlocked, fmt::format("{} has a bias or scale_result", mm.name));
      }
      const std::string s = node_arg(mm, 2);
      if (s.empty() || (!sa.empty() && s != sa)) {
        return set(Outcome::kBlocked, "the scaled matmuls of this gather use different scale_a");
      }
      sa = s;
      b_scales.push_back(Value::node(node_arg(mm, 3)));
      const Value* od = mm.arg(6, "out_dtype");
      out_dtypes.push_back(
          od != nullptr && !od->is_none() ? *od : Value::dtype(tensor_meta(g, mm.name)->dtype));
      const Value* fa = mm.arg(7, "use_fast_accum");
      if (fa != nullptr && !fa->is_none() && fa->kind != Value::Kind::kBool) {
        return set(Outcome::kBlocked,
                   fmt::format("{}'s use_fast_accum is not a bool: {}", mm.name, fa->describe()));
      }
      const bool fast = fa != nullptr && !fa->is_none() && fa->b;
      fast_accum.push_back(Value::boolean(fast));
      any_fast |= fast;
    }
    const TensorMeta* sm = tensor_meta(g, sa);
    if (sm == nullptr)
      return set(Outcome::kBlocked, fmt::format("scale_a {} has no recorded shape", sa));
    if (sm->shape.product() == 1) {
      a_scale = Value::node(sa);
    } else {
      scale_gather = gathered_scale(g, users, sa, *match, *shard);
      if (!scale_gather) {
        return set(Outcome::kBlocked,
                   fmt::format("row-wise scale_a {} is not an all-gather (on the same "
                               "dim) of the shard's own scale",
                               sa));
      }
      a_scale = Value::node(scale_gather->shard);
    }
  }

  // Other uses of G (anything that is not a fused matmul or its reshape) read the returned A.
  std::unordered_set<std::string> fused_mms, own_views;
  for (const auto& u : uses) {
    fused_mms.insert(u.mm);
    if (!u.reshape.empty()) own_views.insert(u.reshape);
    if (!u.permute.empty()) own_views.insert(u.permute);
  }
  bool return_a = false;
  for (const auto& u : users_of(users, match->result)) {
    if (!own_views.count(u) && !fused_mms.count(u)) return_a = true;
  }
  for (const auto& v : own_views) {
    for (const auto& u : users_of(users, v)) {
      if (!fused_mms.count(u)) return_a = true;
    }
  }

  // Insert the fused node at the all-gather and hoist the Bs' producers above it.
  size_t pos = g.index_of(ag_name);
  std::vector<std::string> needed;
  std::vector<Value> bs;
  for (const auto& u : uses) {
    const Node& mm = *g.find(u.mm);
    needed.push_back(node_arg(mm, u.transposed ? 0 : 1));
    if (is_scaled) needed.push_back(node_arg(mm, 3));
  }
  if (is_scaled && a_scale.is_node()) needed.push_back(a_scale.s);
  pos = hoist_before(g, pos, needed);
  const std::string device = gathered->device;
  for (const auto& u : uses) {
    const Node mm = *g.find(u.mm);
    if (!u.transposed) {
      bs.push_back(Value::node(node_arg(mm, 1)));
      continue;
    }
    // B = X^T for mm(X, G^T).
    const TensorMeta* x = tensor_meta(g, node_arg(mm, 0));
    Meta meta;
    if (x != nullptr)
      meta = Meta::of(
          {Dims{x->shape[1], x->shape[0]}, Dims{x->stride[1], x->stride[0]}, x->dtype, x->device});
    Node t = make_call(g.unique_name(node_arg(mm, 0) + "_t"), "aten.permute.default",
                       {Value::node(node_arg(mm, 0)), int_list(Dims{1, 0})}, {}, meta);
    bs.push_back(Value::node(t.name));
    g.insert(pos++, std::move(t));
  }
  const std::string fused_name =
      g.unique_name(is_scaled ? "fused_all_gather_scaled_matmul" : "fused_all_gather_matmul");
  std::vector<Value> args{Value::node(match->shard)};
  if (is_scaled) args.push_back(a_scale);
  args.push_back(Value::of_list(bs));
  if (is_scaled) args.push_back(Value::of_list(b_scales));
  args.push_back(Value::integer(match->gather_dim));
  args.push_back(Value::string(match->group));
  if (is_scaled) args.push_back(Value::of_list(out_dtypes));
  std::vector<std::pair<std::string, Value>> kwargs{{"return_A", Value::boolean(return_a)}};
  // Only where some matmul allows it: absent means exact for every B.
  if (any_fast) kwargs.emplace_back("use_fast_accum", Value::of_list(fast_accum));
  g.insert(pos++, make_call(fused_name,
                            is_scaled ? "asynctp.fused_all_gather_scaled_matmul"
                                      : "asynctp.fused_all_gather_matmul",
                            std::move(args), std::move(kwargs)));
  std::string a_node;
  if (return_a) {
    a_node = g.unique_name(fused_name + "_A");
    g.insert(pos++,
             make_call(a_node, "_operator.getitem", {Value::node(fused_name), Value::integer(0)},
                       {}, Meta::of(contiguous_meta(gathered->shape, gathered->dtype, device))));
  }
  const std::string outs = g.unique_name(fused_name + "_outs");
  g.insert(pos++,
           make_call(outs, "_operator.getitem", {Value::node(fused_name), Value::integer(1)}));
  std::vector<std::string> names;
  for (size_t i = 0; i < uses.size(); ++i) {
    const Node mm = *g.find(uses[i].mm);
    ASYNCTP_CHECK(tensor_meta(g, mm.name) != nullptr, "matmul {} has no recorded shape", mm.name);
    const TensorMeta mm_meta_copy = *tensor_meta(g, mm.name);
    const TensorMeta* mm_meta = &mm_meta_copy;
    Dims out_shape = gathered->shape;
    std::string dtype = mm_meta->dtype;
    if (uses[i].transposed)
      out_shape = Dims{mm_meta->shape[1], mm_meta->shape[0]};
    else
      out_shape[out_shape.size() - 1] = mm_meta->shape[1];
    const std::string out = g.unique_name(fused_name + "_out");
    g.insert(pos++, make_call(out, "_operator.getitem",
                              {Value::node(outs), Value::integer(static_cast<int64_t>(i))}, {},
                              Meta::of(contiguous_meta(out_shape, dtype, device))));
    // What replaces the mm's [M, N] result: out itself, a view of it, or its transpose.
    std::string repl = out;
    if (uses[i].transposed || out_shape != mm_meta->shape) {
      Node r =
          uses[i].transposed
              ? make_call(g.unique_name(mm.name + "_fused"), "aten.permute.default",
                          {Value::node(out), int_list(Dims{1, 0})}, {},
                          Meta::of({mm_meta->shape, Dims{1, mm_meta->shape[0]}, dtype, device}))
              : make_call(g.unique_name(mm.name + "_fused"), "aten.reshape.default",
                          {Value::node(out), int_list(mm_meta->shape)}, {}, Meta::of(*mm_meta));
      repl = r.name;
      g.insert(pos++, std::move(r));
    }
    // A reshape of the mm straight back to out's shape reads out directly.
    for (const auto& u : users_of(users, mm.name)) {
      const Node* un = g.find(u);
      auto shape = un != nullptr ? reshape_shape(g, *un) : std::nullopt;
      if (!uses[i].transposed && shape && *shape == out_shape) g.replace_all_uses(u, out);
    }
    g.replace_all_uses(mm.name, repl);
    names.push_back(mm.name);
  }
  if (return_a) g.replace_all_uses(match->result, a_node);
  g.erase(match->wait);
  g.erase(match->ag);
  if (scale_gather) {
    // The scale's gather goes with its tensor when nothing else reads it.
    remove_dead_code(g);
    const Users now = g.users();
    if (users_of(now, scale_gather->wait).empty()) {
      g.erase(scale_gather->wait);
      g.erase(scale_gather->ag);
      report.set(
          scale_gather->ag, "all_gather", Outcome::kFused,
          fmt::format("into {} (row-wise scale gathered with its tensor {})", fused_name, ag_name));
    } else {
      report.set(
          scale_gather->ag, "all_gather", Outcome::kBlocked,
          fmt::format("row-wise scale of {}: fused into {}, but its gathered value has other users",
                      ag_name, fused_name));
    }
  }
  remove_dead_code(g);
  stable_topological_sort(g);
  set(Outcome::kFused,
      fmt::format("into {} ({} {}matmul{}: {}; gather dim {}{}{})", fused_name, names.size(),
                  is_scaled ? "scaled " : "", names.size() == 1 ? "" : "s", fmt::join(names, ", "),
                  match->gather_dim, return_a ? "; returns A" : "",
                  is_transposed ? "; transposed" : ""));
}

}  // namespace

void fuse_all_gathers(Graph& g, const MicroPipelineOptions& options, FusionReport& report) {
  std::vector<std::string> names;
  for (const auto& n : g.nodes()) {
    if (n.target == kAllGather) names.push_back(n.name);
  }
  for (const auto& name : names) {
    const ReportEntry* e = report.find(name);
    if (g.find(name) == nullptr || (e != nullptr && e->outcome == Outcome::kFused)) continue;
    fuse_one(g, options, report, name);
  }
}

void micro_pipeline_tp(Graph& g, const MicroPipelineOptions& options, FusionReport& report) {
  for (const auto& n : g.nodes()) {
    if (n.target == kAllGather)
      report.set(n.name, "all_gather", Outcome::kUnmatched, "not examined");
    else if (n.target == kReduceScatter)
      report.set(n.name, "reduce_scatter", Outcome::kUnmatched, "not examined");
    else if (n.target == kAllReduce)
      report.set(n.name, "all_reduce", Outcome::kUnmatched, "no fused op for all-reduce");
  }
  fuse_reduce_scatters(g, options, report);
  fuse_all_gathers(g, options, report);
  if (options.enable_swiglu) fuse_swiglu_epilogues(g, report);
  stable_topological_sort(g);
  g.validate();
}

}  // namespace asynctp::passes
