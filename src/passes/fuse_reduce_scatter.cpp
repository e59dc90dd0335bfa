// matmul (or a sum of matmuls) -> reduce-scatter  =>  asynctp.fused_(scaled_)matmul_reduce_scatter.
//
//   P [.., N] = sum_i reshape(mm(A_i [M, K_i], B_i [K_i, N]), [.., N])    (reshape optional)
//   RS(P, d)  =>  fused([A_i viewed as [.., K_i]], [B_i], op, d)
// Viewing A_i with P's leading dims keeps the scatter dim d meaningful (a sequence-dim scatter of
// [b, s, h] is not a dim-0 scatter of the flattened [b*s, h]).
#include <algorithm>

#include "core/error.h"
#include "passes/collective_match.h"
#include "passes/micro_pipeline_tp.h"

namespace asynctp::passes {

namespace {

struct Term {
  std::string mm;       // aten.mm / aten._scaled_mm node
  std::string reshape;  // the reshape of its result into P's shape, or ""
};

bool is_add(const Node& n) {
  if (n.target != "aten.add.Tensor" || n.args.size() != 2 || !n.args[0].is_node() ||
      !n.args[1].is_node()) {
    return false;
  }
  const Value* alpha = n.kwarg("alpha");
  return alpha == nullptr || alpha->as_double() == 1.0;
}

// Splits P into matmul terms; returns "" on success, else why not.
std::string collect_terms(const Graph& g, const Users& users, const std::string& name,
                          std::vector<Term>* terms, std::vector<std::string>* adds, bool top) {
  const Node* n = g.find(name);
  if (!top && users_of(users, name).size() != 1) {
    return fmt::format("{} ({}) has other users besides the reduce-scatter", name, n->target);
  }
  if (is_add(*n)) {
    adds->push_back(name);
    for (int i = 0; i < 2; ++i) {
      std::string why = collect_terms(g, users, n->args[i].s, terms, adds, false);
      if (!why.empty()) return why;
    }
    return "";
  }
  Term t;
  const Node* m = n;
  if (is_reshape(*n)) {
    t.reshape = name;
    const std::string src = node_arg(*n, 0);
    if (src.empty()) return fmt::format("{} reshapes a non-node", name);
    m = g.find(src);
    if (users_of(users, src).size() != 1) {
      if (m->target == "aten.mm.default" || m->target == "aten._scaled_mm.default") {
        return fmt::format("the matmul {} has other users besides the reduce-scatter", src);
      }
    }
  }
  if (m->target != "aten.mm.default" && m->target != "aten._scaled_mm.default") {
    return fmt::format("{} is {}, not a matmul", m->name, m->target);
  }
  if (!top && t.reshape.empty() && users_of(users, m->name).size() != 1) {
    return fmt::format("the matmul {} has other users besides the reduce-scatter", m->name);
  }
  t.mm = m->name;
  terms->push_back(t);
  return "";
}

// A node holding `src` viewed as `shape`: src itself, the source of a reshape of it with that
// shape, or a new reshape inserted at `*pos` (advancing it).
std::string view_as(Graph& g, const std::string& src, const Dims& shape, size_t* pos) {
  const TensorMeta* m = tensor_meta(g, src);
  if (m != nullptr && m->shape == shape) return src;
  const Node* n = g.find(src);
  if (is_reshape(*n)) {
    const TensorMeta* inner = tensor_meta(g, node_arg(*n, 0));
    if (inner != nullptr && inner->shape == shape) return node_arg(*n, 0);
  }
  Meta meta;
  if (m != nullptr) meta = Meta::of(contiguous_meta(shape, m->dtype, m->device));
  Node r = make_call(g.unique_name(src + "_nd"), "aten.reshape.default",
                     {Value::node(src), int_list(shape)}, {}, meta);
  const std::string name = r.name;
  g.insert((*pos)++, std::move(r));
  return name;
}

void fuse_one(Graph& g, const MicroPipelineOptions& options, FusionReport& report,
              const Node& rs_node) {
  const Users users = g.users();
  std::string why;
  const auto match = match_reduce_scatter(g, users, rs_node, &why);
  auto blocked = [&](const std::string& reason) {
    report.set(rs_node.name, "reduce_scatter", Outcome::kBlocked, reason);
  };
  if (!match) {
    report.set(rs_node.name, "reduce_scatter", Outcome::kUnmatched, why);
    return;
  }
  if (tensor_meta(g, match->input) == nullptr || tensor_meta(g, match->input)->shape.size() < 2) {
    report.set(rs_node.name, "reduce_scatter", Outcome::kUnmatched,
               fmt::format("its input {} has no recorded shape of rank >= 2", match->input));
    return;
  }
  const TensorMeta p_meta = *tensor_meta(g, match->input);  // a copy: nodes move on insert
  const TensorMeta* p = &p_meta;
  std::vector<Term> terms;
  std::vector<std::string> adds;
  why = collect_terms(g, users, match->input, &terms, &adds, true);
  if (!why.empty()) {
    const bool saw_matmul =
        why.find("matmul") != std::string::npos && why.find("not a matmul") == std::string::npos;
    report.set(rs_node.name, "reduce_scatter", saw_matmul ? Outcome::kBlocked : Outcome::kUnmatched,
               "input " + match->input + ": " + why);
    return;
  }
  // Its one user is the reduce-scatter's chunk-cat (the split, or the ws slices of the slice
  // form) or the reduce-scatter itself.
  for (const auto& u : users_of(users, match->input)) {
    if (u != match->rs && std::find(match->chunk_nodes.begin(), match->chunk_nodes.end(), u) ==
                              match->chunk_nodes.end())
      return blocked(fmt::format("the reduce-scatter's input {} has other users", match->input));
  }
  const int rank = p->shape.size();
  if (match->scatter_dim == rank - 1 && !options.enable_last_dim_scatter) {
    return blocked(
        "it scatters the last (output) dim of the matmul, which --no-last-dim-scatter turned off");
  }
  if (match->group_size != g.world_size) {
    return blocked(
        fmt::format("group size {} is not the world size {}", match->group_size, g.world_size));
  }
  const bool scaled = g.find(terms[0].mm)->target == "aten._scaled_mm.default";
  for (const auto& t : terms) {
    if ((g.find(t.mm)->target == "aten._scaled_mm.default") != scaled) {
      return blocked("the sum mixes scaled and unscaled matmuls");
    }
  }
  if (scaled && terms.size() > 1) {
    return blocked(fmt::format("a sum of {} scaled matmuls has no fused op", terms.size()));
  }
  Dims lead(std::span<const int64_t>(p->shape.begin(), p->shape.size() - 1));
  for (const auto& t : terms) {
    const TensorMeta* mm = tensor_meta(g, t.mm);
    const TensorMeta* r = t.reshape.empty() ? mm : tensor_meta(g, t.reshape);
    if (mm == nullptr || r == nullptr || r->shape != p->shape || mm->shape.size() != 2 ||
        mm->shape[1] != p->shape.back() || mm->shape[0] != lead.product()) {
      return blocked(
          fmt::format("matmul {} does not reshape into the scattered shape {}", t.mm, p->shape));
    }
  }
  const Node mm0_copy = *g.find(terms[0].mm);
  const Node* mm0 = &mm0_copy;
  if (scaled && mm0->args.size() > 4 && !mm0->args[4].is_none())
    return blocked("the scaled matmul has a bias");
  if (scaled && mm0->args.size() > 5 && !mm0->args[5].is_none())
    return blocked("the scaled matmul has scale_result");

  // Build the fused node where the reduce-scatter was.
  size_t pos = g.index_of(rs_node.name);
  const Node wait = *g.find(match->wait);
  std::vector<Value> as, bs;
  std::vector<std::string> mm_names;
  for (const auto& t : terms) {
    const Node mm = *g.find(t.mm);
    const std::string a = node_arg(mm, 0), b = node_arg(mm, 1);
    const TensorMeta* am = a.empty() ? nullptr : tensor_meta(g, a);
    if (b.empty() || am == nullptr)
      return blocked(fmt::format("matmul {} has an operand without a recorded shape", t.mm));
    Dims a_shape = lead;
    a_shape.push_back(am->shape.back());
    as.push_back(Value::node(view_as(g, a, a_shape, &pos)));
    bs.push_back(Value::node(b));
    mm_names.push_back(t.mm);
  }
  Node fused;
  const std::string group = match->group;
  const Value op = Value::string(match->reduce_op), dim = Value::integer(match->scatter_dim);
  if (!scaled) {
    fused = make_call(
        g.unique_name("fused_matmul_reduce_scatter"), "asynctp.fused_matmul_reduce_scatter",
        {Value::of_list(as), Value::of_list(bs), op, dim, Value::string(group)}, {}, wait.val);
  } else {
    const std::string sa = node_arg(*mm0, 2), sb = node_arg(*mm0, 3);
    const TensorMeta* sam = sa.empty() ? nullptr : tensor_meta(g, sa);
    if (sb.empty() || sam == nullptr)
      return blocked("the scaled matmul's scales have no recorded shape");
    Value a_scale = Value::node(sa);
    if (sam->shape.product() != 1) {  // row-wise [M, 1] -> [.., 1] like A
      Dims s_shape = lead;
      s_shape.push_back(1);
      a_scale = Value::node(view_as(g, sa, s_shape, &pos));
    }
    const Value* out_dtype = mm0->arg(6, "out_dtype");
    const Value dt = out_dtype != nullptr && !out_dtype->is_none()
                         ? *out_dtype
                         : Value::dtype(tensor_meta(g, mm0->name)->dtype);
    // _scaled_mm's use_fast_accum (arg 7; absent or None: False) goes with the product: a keyword
    // of the fused node where it is True.
    const Value* fa = mm0->arg(7, "use_fast_accum");
    if (fa != nullptr && !fa->is_none() && fa->kind != Value::Kind::kBool) {
      return blocked(
          fmt::format("{}'s use_fast_accum is not a bool: {}", mm0->name, fa->describe()));
    }
    std::vector<std::pair<std::string, Value>> kwargs;
    if (fa != nullptr && !fa->is_none() && fa->b)
      kwargs.emplace_back("use_fast_accum", Value::boolean(true));
    fused = make_call(g.unique_name("fused_scaled_matmul_reduce_scatter"),
                      "asynctp.fused_scaled_matmul_reduce_scatter",
                      {as[0], a_scale, bs[0], Value::node(sb), op, dim, Value::string(group), dt},
                      std::move(kwargs), wait.val);
  }
  const std::string fused_name = fused.name;
  g.insert(pos, std::move(fused));
  g.replace_all_uses(match->wait, fused_name);
  for (const auto& n : {match->wait, match->rs})
    g.erase(n);
  remove_dead_code(g);
  report.set(rs_node.name, "reduce_scatter", Outcome::kFused,
             fmt::format("into {} ({} matmul{}: {}; scatter dim {})", fused_name, mm_names.size(),
                         mm_names.size() == 1 ? "" : "s summed", fmt::join(mm_names, ", "),
                         match->scatter_dim));
}

}  // namespace

void fuse_reduce_scatters(Graph& g, const MicroPipelineOptions& options, FusionReport& report) {
  std::vector<std::string> names;
  for (const auto& n : g.nodes()) {
    if (n.target == kReduceScatter) names.push_back(n.name);
  }
  for (const auto& name : names) {
    const Node* n = g.find(name);
    if (n == nullptr) continue;
    const Node copy = *n;
    fuse_one(g, options, report, copy);
  }
}

}  // namespace asynctp::passes
