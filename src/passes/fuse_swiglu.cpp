// SwiGLU after a fused all-gather matmul  =>  asynctp.fused_all_gather_matmul_swiglu.
//
//   F = fused_all_gather_matmul(A_shard, [B], d, group)        B [K, 2N]
//   P = F[1][0]                                                 [.., 2N]
//   g, u = split(P, N, -1)            (aten.split.Tensor, or split_with_sizes [N, N])
//   out = mul(silu(g), u)             (either order)
// with silu(g) as PyTorch writes it after its decompositions:
//   aten.silu(g)
//   c / (exp(-c) + 1)    or   c * sigmoid(c)   (either order), with c = g computed in g's dtype,
//                        or c = convert(g, f32) computed in f32 and the result converted back
// and nothing but the op's getitems reading F (so that the gather runs once).
//   =>  F' = fused_all_gather_matmul_swiglu(A_shard, B, d, group, return_A, return_pre)
//       A = F'[0], P = F'[1], out = F'[2]
// Every other use of P (a forward graph saves it for the backward, which recomputes the SwiGLU's
// gradient from it) reads F'[1]; return_pre only when one remains, return_A as F had it. The
// silu chain goes with the mul where nothing else reads it (dead-code removal). The fused op
// applies the SwiGLU in f32 and rounds once; PyTorch's decomposition rounds silu(g) to g's dtype
// before the product, so the two differ by up to an ulp of the output.
#include <fmt/format.h>

#include "core/error.h"
#include "passes/graph_edit.h"
#include "passes/micro_pipeline_tp.h"

namespace asynctp::passes {

namespace {

constexpr const char* kFusedAgMm = "asynctp.fused_all_gather_matmul";
constexpr const char* kFusedAgMmSwiglu = "asynctp.fused_all_gather_matmul_swiglu";
constexpr const char* kGetitem = "_operator.getitem";
constexpr const char* kConvert = "prims.convert_element_type.default";

// The getitem user of `of` taking index `index` ("" when none, or when there are several).
std::string getitem_user(const Graph& g, const Users& users, const std::string& of, int64_t index) {
  std::string found;
  for (const auto& u : users_of(users, of)) {
    const Node* n = g.find(u);
    if (n->target != kGetitem || node_arg(*n, 0) != of || n->args.size() < 2 ||
        !n->args[1].is_int() || n->args[1].i != index)
      continue;
    if (!found.empty()) return "";
    found = u;
  }
  return found;
}

bool is_number(const Value& v, double x) {
  return (v.is_int() && static_cast<double>(v.i) == x) ||
         (v.kind == Value::Kind::kDouble && v.d == x);
}

// convert_element_type(x, dtype) -> x's name; else "".
std::string converted(const Node& n, std::string_view dtype) {
  if (n.target != kConvert || n.args.size() < 2 || n.args[1].kind != Value::Kind::kDType ||
      n.args[1].s != dtype)
    return "";
  return node_arg(n, 0);
}

// Whether `s` computes silu(g), in one of the forms of the file comment.
bool is_silu_of(const Graph& g, const std::string& s, const std::string& gate,
                const std::string& gate_dtype) {
  const Node* n = g.find(s);
  if (n == nullptr) return false;
  if (n->target == "aten.silu.default") return node_arg(*n, 0) == gate;
  // Either the body computes in the gate's dtype on the gate itself, or in f32 on the gate
  // converted to f32, and s converts it back: c is what the body reads.
  const std::string inner = converted(*n, gate_dtype);
  const bool in_f32 = !inner.empty();
  const std::string body = in_f32 ? inner : s;
  const Node* b = g.find(body);
  if (b == nullptr) return false;
  const std::string compute_dtype = in_f32 ? "float32" : gate_dtype;
  if (const TensorMeta* bm = tensor_meta(g, body); bm != nullptr && bm->dtype != compute_dtype)
    return false;
  auto is_c = [&](const std::string& c) {
    if (!in_f32) return c == gate;
    const Node* cn = g.find(c);
    return cn != nullptr && converted(*cn, "float32") == gate;
  };
  if (b->target == "aten.div.Tensor" && b->args.size() == 2) {
    // c / (exp(-c) + 1), add's alpha 1
    const std::string c = node_arg(*b, 0);
    const Node* add = g.find(node_arg(*b, 1));
    if (!is_c(c) || add == nullptr || add->target != "aten.add.Tensor" || add->args.size() != 2)
      return false;
    if (const Value* alpha = add->kwarg("alpha"); alpha != nullptr && !is_number(*alpha, 1.0))
      return false;
    const Node* ex = g.find(node_arg(*add, 0));
    if (ex == nullptr || !is_number(add->args[1], 1.0) || ex->target != "aten.exp.default")
      return false;
    const Node* neg = g.find(node_arg(*ex, 0));
    return neg != nullptr && neg->target == "aten.neg.default" && node_arg(*neg, 0) == c;
  }
  if (b->target == "aten.mul.Tensor" && b->args.size() == 2) {
    // c * sigmoid(c)
    for (int k = 0; k < 2; ++k) {
      const std::string c = node_arg(*b, k);
      const Node* sig = g.find(node_arg(*b, 1 - k));
      if (is_c(c) && sig != nullptr && sig->target == "aten.sigmoid.default" &&
          node_arg(*sig, 0) == c)
        return true;
    }
  }
  return false;
}

// The split of P into its two halves on the last dim: (gate, up) getitem names, or nullopt.
std::optional<std::pair<std::string, std::string>> halves(const Graph& g, const Users& users,
                                                          const Node& split, int64_t n,
                                                          size_t rank) {
  const Value* dim = split.arg(2, "dim");
  if (dim != nullptr && !dim->is_int()) return std::nullopt;
  const int64_t d = dim == nullptr ? 0 : dim->i;  // split's default dim is 0
  if (d != -1 && d != static_cast<int64_t>(rank) - 1) return std::nullopt;
  if (split.args.size() < 2) return std::nullopt;
  const Value& sizes = split.args[1];
  if (split.target == "aten.split.Tensor") {
    if (!sizes.is_int() || sizes.i != n) return std::nullopt;
  } else if (split.target == "aten.split_with_sizes.default") {
    if (!sizes.is_list() || sizes.list.size() != 2 || !is_number(sizes.list[0], n) ||
        !is_number(sizes.list[1], n))
      return std::nullopt;
  } else {
    return std::nullopt;
  }
  const std::string gate = getitem_user(g, users, split.name, 0);
  const std::string up = getitem_user(g, users, split.name, 1);
  if (gate.empty() || up.empty()) return std::nullopt;
  return std::make_pair(gate, up);
}

struct SwigluMatch {
  std::string fused, a, outs, out, mul;
};

std::optional<SwigluMatch> match(const Graph& g, const Users& users, const Node& f) {
  if (f.target != kFusedAgMm || f.args.size() != 4 || !f.args[1].is_list() ||
      f.args[1].list.size() != 1)
    return std::nullopt;
  SwigluMatch m;
  m.fused = f.name;
  m.outs = getitem_user(g, users, f.name, 1);
  m.a = getitem_user(g, users, f.name, 0);
  if (m.outs.empty() || users_of(users, m.outs).size() != 1) return std::nullopt;
  // Nothing else reads F (so that it goes, and the gather runs once), and a returned A has its
  // shape recorded.
  for (const auto& u : users_of(users, f.name)) {
    if (u != m.outs && u != m.a) return std::nullopt;
  }
  if (!m.a.empty() && tensor_meta(g, m.a) == nullptr) return std::nullopt;
  m.out = getitem_user(g, users, m.outs, 0);
  const TensorMeta* p = m.out.empty() ? nullptr : tensor_meta(g, m.out);
  if (p == nullptr || p->shape.empty() || p->shape.back() % 2 != 0) return std::nullopt;
  const int64_t n = p->shape.back() / 2;
  for (const auto& u : users_of(users, m.out)) {
    const Node& split = *g.find(u);
    const auto gu = halves(g, users, split, n, p->shape.size());
    if (!gu) continue;
    Dims half = p->shape;
    half[half.size() - 1] = n;
    // The mul reads the up half (a user of it) and s = silu(gate), however deep that chain is.
    for (const auto& mul : users_of(users, gu->second)) {
      const Node& mn = *g.find(mul);
      const TensorMeta* mm = tensor_meta(g, mul);
      // (A mul nothing reads would go with the rest as dead code, and the new op with it.)
      if (mn.target != "aten.mul.Tensor" || mn.args.size() != 2 || mm == nullptr ||
          mm->dtype != p->dtype || mm->shape != half || users_of(users, mul).empty())
        continue;
      const std::string s = node_arg(mn, 0) == gu->second ? node_arg(mn, 1) : node_arg(mn, 0);
      if (!is_silu_of(g, s, gu->first, p->dtype)) continue;
      m.mul = mul;
      return m;
    }
  }
  return std::nullopt;
}

void fuse_one(Graph& g, const SwigluMatch& m, FusionReport& report) {
  const Node f = *g.find(m.fused);
  const TensorMeta pre = *tensor_meta(g, m.out);
  const TensorMeta out = *tensor_meta(g, m.mul);
  const Value* ra = f.kwarg("return_A");
  const bool return_a = ra != nullptr && ra->kind == Value::Kind::kBool && ra->b && !m.a.empty();
  const std::string name = g.unique_name("fused_all_gather_matmul_swiglu");
  size_t pos = g.index_of(m.fused);
  // return_pre for now; dropped below when nothing reads P but the SwiGLU itself.
  g.insert(
      ++pos,
      make_call(name, kFusedAgMmSwiglu, {f.args[0], f.args[1].list[0], f.args[2], f.args[3]},
                {{"return_A", Value::boolean(return_a)}, {"return_pre", Value::boolean(true)}}));
  auto item = [&](const std::string& suffix, int64_t i, const TensorMeta& meta) {
    const std::string item_name = g.unique_name(name + suffix);
    g.insert(++pos, make_call(item_name, kGetitem, {Value::node(name), Value::integer(i)}, {},
                              Meta::of(contiguous_meta(meta.shape, meta.dtype, meta.device))));
    return item_name;
  };
  if (return_a) g.replace_all_uses(m.a, item("_A", 0, *tensor_meta(g, m.a)));
  const std::string p = item("_pre", 1, pre);
  const std::string o = item("_out", 2, out);
  g.replace_all_uses(m.mul, o);
  g.replace_all_uses(m.out, p);
  remove_dead_code(g);  // the SwiGLU's nodes, the old op and its items; P's item if unread
  const bool return_pre = g.find(p) != nullptr;
  if (!return_pre) {
    for (auto& [key, value] : g.find_mutable(name)->kwargs) {
      if (key == "return_pre") value = Value::boolean(false);
    }
  }
  // The all-gather's report entry ("into F (what F holds)") now names this node.
  const std::string prefix = "into " + m.fused + " (";
  for (const auto& e : report.entries()) {
    if (e.outcome != Outcome::kFused || e.detail.rfind(prefix, 0) != 0 || e.detail.back() != ')')
      continue;
    const std::string held = e.detail.substr(prefix.size(), e.detail.size() - prefix.size() - 1);
    const std::string collective = e.collective, kind = e.kind;
    report.set(collective, kind, Outcome::kFused,
               fmt::format("into {} ({}; the SwiGLU {} in its epilogue{})", name, held, m.mul,
                           return_pre ? "; returns the products" : ""));
    break;
  }
}

}  // namespace

void fuse_swiglu_epilogues(Graph& g, FusionReport& report) {
  std::vector<std::string> fused;
  for (const auto& n : g.nodes()) {
    if (n.target == kFusedAgMm) fused.push_back(n.name);
  }
  for (const auto& name : fused) {
    const Users users = g.users();
    const Node* f = g.find(name);
    if (f == nullptr) continue;
    if (const auto m = match(g, users, *f)) fuse_one(g, *m, report);
  }
}

}  // namespace asynctp::passes
