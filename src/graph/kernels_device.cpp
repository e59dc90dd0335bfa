// Kernels that run on the OpContext's backend: mm, bmm, _scaled_mm, the functional collectives and
// the project's fused targets (docs/GRAPH.md gives their signatures). Host tensors are staged to
// the device and back through Backend::copy; on the CPU backend host memory is the device memory,
// so nothing is copied.
#include <algorithm>

#include "core/error.h"
#include "graph/kernel.h"
#include "ops/collectives.h"
#include "ops/fused_matmul.h"

namespace asynctp::graph {

namespace {

using Table = std::vector<std::pair<std::string, Kernel>>;

// Device views of host tensors for the duration of one kernel.
class Staging {
 public:
  explicit Staging(OpContext& ctx) : ctx_(ctx), host_is_device_(ctx.backend().device().is_cpu()) {}

  // A device tensor holding x (x itself on the CPU backend). GEMM operands need a unit stride in
  // one of their two matrix dims: other layouts are made contiguous first.
  Tensor in(const HostTensor& x, bool gemm_operand = false) {
    HostTensor src = x;
    if (gemm_operand && x.t.dim() >= 2 && x.t.stride(-1) != 1 && x.t.stride(-2) != 1 &&
        x.t.size(-1) != 1 && x.t.size(-2) != 1) {
      src = host_contiguous(x);
    }
    if (host_is_device_) return src.t;
    Buffer buf = ctx_.backend().allocate(std::max<size_t>(src.t.nbytes(), 1));
    Tensor dev(buf.data(), src.t.dtype(), src.t.shape(), ctx_.backend().device());
    ctx_.backend().copy(dev, src.t, ctx_.stream());
    buffers_.push_back(std::move(buf));
    return dev;
  }
  // Device memory for the result `host` (host itself on the CPU backend); copied back by finish().
  Tensor out(const HostTensor& host) {
    if (host_is_device_) return host.t;
    Buffer buf = ctx_.backend().allocate(std::max<size_t>(host.t.nbytes(), 1));
    Tensor dev(buf.data(), host.t.dtype(), host.t.shape(), ctx_.backend().device());
    buffers_.push_back(std::move(buf));
    outs_.emplace_back(host.t, dev);
    return dev;
  }
  void finish() {
    for (const auto& [host, dev] : outs_)
      ctx_.backend().copy(host, dev, ctx_.stream());
    ctx_.backend().synchronize();
  }

 private:
  OpContext& ctx_;
  bool host_is_device_;
  std::vector<Buffer> buffers_;
  std::vector<std::pair<Tensor, Tensor>> outs_;
};

void check_group(Call& c, int64_t group_size, const std::string& group_name) {
  const int ws = c.ctx().world_size();
  ASYNCTP_CHECK(group_size == ws,
                "{}: group_size {} differs from the world size {}: only the world "
                "group is supported",
                c.where(), group_size, ws);
  ASYNCTP_CHECK(group_name == c.world_group(),
                "{}: group '{}' is not the world group ('{}'): "
                "only the world group is supported (see --world-group)",
                c.where(), group_name, c.world_group());
}

void check_matmul_dtype(Call& c, const Tensor& t, const char* what) {
  ASYNCTP_CHECK(!is_float8(t.dtype()), "{}: {} is {}; float8 matmuls go through _scaled_mm",
                c.where(), what, t.dtype());
}

DType out_dtype_of(Call& c, size_t index, std::string_view key, DType fallback) {
  return c.dtype_or(index, key).value_or(fallback);
}

// GEMM d = a @ b (+ scales); float8 or biased results go through an f32 temporary so that the
// bias is added before the single rounding, as PyTorch's epilogue does. fast_accum: the
// permission of GemmArgs::fast_accum (a float8 product may accumulate fast).
void gemm(Call& c, Staging& st, const HostTensor& a, const HostTensor& b, const HostTensor& out,
          const HostTensor* sa, const HostTensor* sb, const HostTensor* bias,
          bool fast_accum = false) {
  const bool direct = bias == nullptr && !is_float8(out.t.dtype());
  HostTensor acc = direct ? out : host_empty(out.t.shape(), DType::kF32);
  GemmArgs args;
  args.a = st.in(a, true);
  args.b = st.in(b, true);
  args.d = st.out(acc);
  if (sa != nullptr) {
    args.a_scale = st.in(*sa);
    args.b_scale = st.in(*sb);
  }
  args.fast_accum = fast_accum;
  c.ctx().backend().gemm(args, c.ctx().stream());
  st.finish();
  if (!direct) {
    std::vector<float> v = load_f32(acc.t);
    if (bias != nullptr) {
      const std::vector<float> bv = load_f32(bias->t, out.t.shape());
      for (size_t i = 0; i < v.size(); ++i)
        v[i] += bv[i];
    }
    store_f32(out.t, v);
  }
}

RtValue mm(Call& c) {
  const HostTensor& a = c.tensor(0, "self");
  const HostTensor& b = c.tensor(1, "mat2");
  ASYNCTP_CHECK(a.t.dim() == 2 && b.t.dim() == 2 && a.t.size(1) == b.t.size(0),
                "{}: mm needs [M, K] @ [K, N], got {} and {}", c.where(), a.t.describe(),
                b.t.describe());
  check_matmul_dtype(c, a.t, "self");
  ASYNCTP_CHECK(a.t.dtype() == b.t.dtype(), "{}: self is {} but mat2 is {}", c.where(), a.t.dtype(),
                b.t.dtype());
  HostTensor out = c.alloc({a.t.size(0), b.t.size(1)}, a.t.dtype());
  Staging st(c.ctx());
  gemm(c, st, a, b, out, nullptr, nullptr, nullptr);
  return RtValue::of(out);
}

RtValue bmm(Call& c) {
  const HostTensor& a = c.tensor(0, "self");
  const HostTensor& b = c.tensor(1, "mat2");
  ASYNCTP_CHECK(
      a.t.dim() == 3 && b.t.dim() == 3 && a.t.size(0) == b.t.size(0) && a.t.size(2) == b.t.size(1),
      "{}: bmm needs [B, M, K] @ [B, K, N], got {} and {}", c.where(), a.t.describe(),
      b.t.describe());
  check_matmul_dtype(c, a.t, "self");
  HostTensor out = c.alloc({a.t.size(0), a.t.size(1), b.t.size(2)}, a.t.dtype());
  Staging st(c.ctx());
  gemm(c, st, a, b, out, nullptr, nullptr, nullptr);
  return RtValue::of(out);
}

// addmm(self, mat1, mat2, *, beta, alpha) = beta * self + alpha * (mat1 @ mat2): the product in
// f32, then the broadcast bias added and rounded once (nn.Linear with a bias).
RtValue addmm(Call& c) {
  const HostTensor& bias = c.tensor(0, "self");
  const HostTensor& a = c.tensor(1, "mat1");
  const HostTensor& b = c.tensor(2, "mat2");
  ASYNCTP_CHECK(a.t.dim() == 2 && b.t.dim() == 2 && a.t.size(1) == b.t.size(0),
                "{}: addmm needs [M, K] @ [K, N], got {} and {}", c.where(), a.t.describe(),
                b.t.describe());
  check_matmul_dtype(c, a.t, "mat1");
  const float beta = static_cast<float>(c.number_or(3, "beta", 1.0));
  const float alpha = static_cast<float>(c.number_or(4, "alpha", 1.0));
  HostTensor out = c.alloc({a.t.size(0), b.t.size(1)}, a.t.dtype());
  HostTensor acc = host_empty(out.t.shape(), DType::kF32);
  Staging st(c.ctx());
  gemm(c, st, a, b, acc, nullptr, nullptr, nullptr);
  std::vector<float> v = load_f32(acc.t);
  const std::vector<float> bv = load_f32(bias.t, out.t.shape());
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = beta * bv[i] + alpha * v[i];
  store_f32(out.t, v);
  return RtValue::of(out);
}

// (self, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)
RtValue scaled_mm(Call& c) {
  const HostTensor& a = c.tensor(0, "self");
  const HostTensor& b = c.tensor(1, "mat2");
  ASYNCTP_CHECK(a.t.dim() == 2 && b.t.dim() == 2 && a.t.size(1) == b.t.size(0),
                "{}: _scaled_mm needs [M, K] @ [K, N], got {} and {}", c.where(), a.t.describe(),
                b.t.describe());
  ASYNCTP_CHECK(!c.has(5, "scale_result"), "{}: scale_result is not supported", c.where());
  const HostTensor* bias = c.has(4, "bias") ? &c.tensor(4, "bias") : nullptr;
  const DType out_dtype = out_dtype_of(c, 6, "out_dtype", a.t.dtype());
  const bool fast_accum = c.boolean_or(7, "use_fast_accum", false);
  HostTensor out = c.alloc({a.t.size(0), b.t.size(1)}, out_dtype);
  Staging st(c.ctx());
  gemm(c, st, a, b, out, &c.tensor(2, "scale_a"), &c.tensor(3, "scale_b"), bias, fast_accum);
  return RtValue::of(out);
}

RtValue all_gather(Call& c) {
  const HostTensor& x = c.tensor(0, "input");
  check_group(c, c.integer(1, "group_size"), c.string(2, "group_name"));
  ASYNCTP_CHECK(x.t.dim() >= 1, "{}: cannot gather a 0-d tensor", c.where());
  Dims shape = x.t.shape();
  shape[0] *= c.ctx().world_size();
  HostTensor out = c.alloc(shape, x.t.dtype());
  Staging st(c.ctx());
  asynctp::all_gather(c.ctx(), st.in(x), st.out(out), 0);
  st.finish();
  return RtValue::of(out);
}

RtValue reduce_scatter(Call& c) {
  const HostTensor& x = c.tensor(0, "input");
  const ReduceOp op = parse_reduce_op(c.string(1, "reduce_op"));
  check_group(c, c.integer(2, "group_size"), c.string(3, "group_name"));
  const int ws = c.ctx().world_size();
  ASYNCTP_CHECK(x.t.dim() >= 1 && x.t.size(0) % ws == 0,
                "{}: dim 0 of {} is not divisible by the "
                "world size {}",
                c.where(), x.t.describe(), ws);
  Dims shape = x.t.shape();
  shape[0] /= ws;
  HostTensor out = c.alloc(shape, x.t.dtype());
  Staging st(c.ctx());
  asynctp::reduce_scatter(c.ctx(), st.in(x), st.out(out), op, 0);
  st.finish();
  return RtValue::of(out);
}

RtValue all_reduce(Call& c) {
  const HostTensor& x = c.tensor(0, "input");
  const ReduceOp op = parse_reduce_op(c.string(1, "reduce_op"));
  check_group(c, c.ctx().world_size(), c.string(2, "group_name"));
  HostTensor out = c.alloc(x.t.shape(), x.t.dtype());
  store_f32(out.t, load_f32(x.t));
  Staging st(c.ctx());
  const Tensor dev = st.out(out);
  if (!c.ctx().backend().device().is_cpu()) c.ctx().backend().copy(dev, out.t, c.ctx().stream());
  asynctp::all_reduce(c.ctx(), dev, op);
  st.finish();
  return RtValue::of(out);
}

// The scaled fused targets' keyword use_fast_accum: one bool per B (fused_all_gather_scaled_matmul,
// count = the number of Bs), or one bool (fused_scaled_matmul_reduce_scatter, count 0). Absent or
// None: exact accumulation.
std::vector<bool> fast_accum_kwarg(Call& c, size_t count) {
  const RtValue* v = c.kwarg("use_fast_accum");
  if (v == nullptr || v->is_none()) return {};
  auto is_bool = [](const Value& x) { return x.kind == Value::Kind::kBool; };
  const bool literal = v->kind == RtValue::Kind::kLiteral;
  if (count == 0) {
    ASYNCTP_CHECK(literal && is_bool(v->literal), "{}: use_fast_accum must be a bool, got {}",
                  c.where(), v->describe());
    return {v->literal.b};
  }
  ASYNCTP_CHECK(literal && v->literal.is_list() && v->literal.list.size() == count &&
                    std::all_of(v->literal.list.begin(), v->literal.list.end(), is_bool),
                "{}: use_fast_accum must be a list of {} bools (one per B), got {}", c.where(),
                count, v->describe());
  std::vector<bool> flags;
  for (const Value& x : v->literal.list)
    flags.push_back(x.b);
  return flags;
}

// Result of the fused all-gather ops: (A or None, [out_0, ...]).
RtValue gather_result(const std::optional<HostTensor>& a, const std::vector<HostTensor>& outs) {
  std::vector<RtValue> items;
  for (const auto& o : outs)
    items.push_back(RtValue::of(o));
  return RtValue::list({a ? RtValue::of(*a) : RtValue{}, RtValue::list(std::move(items))});
}

// Keyword `key` as a flag: absent or None is false.
bool flag_kwarg(Call& c, const char* key) {
  const RtValue* v = c.kwarg(key);
  ASYNCTP_CHECK(v == nullptr || v->is_none() ||
                    (v->kind == RtValue::Kind::kLiteral && v->literal.kind == Value::Kind::kBool),
                "{}: {} must be a bool, got {}", c.where(), key, v ? v->describe() : "");
  return v != nullptr && !v->is_none() && v->literal.b;
}

// The checks every fused all-gather shares on A_shard and gather_dim.
void check_gather(Call& c, const HostTensor& a, int64_t gather_dim) {
  ASYNCTP_CHECK(a.t.dim() >= 2, "{}: A_shard must have rank >= 2, got {}", c.where(),
                a.t.describe());
  ASYNCTP_CHECK(gather_dim >= -a.t.dim() && gather_dim < a.t.dim(),
                "{}: gather_dim {} out of range for A_shard {}", c.where(), gather_dim,
                a.t.describe());
}

// asynctp.fused_all_gather_matmul(A_shard, Bs, gather_dim, group_name, *, return_A)
// asynctp.fused_all_gather_scaled_matmul(A_shard, A_scale, Bs, B_scales, gather_dim, group_name,
//                                        out_dtypes, *, return_A, use_fast_accum)
RtValue fused_all_gather(Call& c, bool scaled) {
  const size_t o = scaled ? 2 : 0;  // offset of the arguments after the scales
  const HostTensor& a = c.tensor(0, "A_shard");
  const std::vector<HostTensor> bs = c.tensor_list(scaled ? 2 : 1, "Bs");
  const int64_t gather_dim = c.integer(2 + o, "gather_dim");
  check_group(c, c.ctx().world_size(), c.string(3 + o, "group_name"));
  const bool return_a = flag_kwarg(c, "return_A");
  check_gather(c, a, gather_dim);
  std::vector<DType> out_dtypes(bs.size(), a.t.dtype());
  std::vector<HostTensor> b_scales;
  if (scaled) {
    b_scales = c.tensor_list(3, "B_scales");
    const RtValue& dts = c.value(4 + o, "out_dtypes");
    ASYNCTP_CHECK(dts.kind == RtValue::Kind::kLiteral && dts.literal.is_list() &&
                      dts.literal.list.size() == bs.size(),
                  "{}: out_dtypes must be a list of {} dtypes", c.where(), bs.size());
    for (size_t i = 0; i < bs.size(); ++i) {
      auto d = dtype_from_torch(dts.literal.list[i].s);
      ASYNCTP_CHECK(dts.literal.list[i].kind == Value::Kind::kDType && d,
                    "{}: out_dtypes[{}] must be a "
                    "supported dtype, got {}",
                    c.where(), i, dts.literal.list[i].describe());
      out_dtypes[i] = *d;
    }
  }
  const int ws = c.ctx().world_size();
  const Dims gathered = all_gather_shape(a.t, static_cast<int>(gather_dim), ws);
  std::optional<HostTensor> a_full;
  if (return_a) a_full = host_empty(gathered, a.t.dtype());
  std::vector<HostTensor> outs;
  Staging st(c.ctx());
  std::vector<Tensor> dev_bs, dev_scales, dev_outs;
  for (size_t i = 0; i < bs.size(); ++i) {
    ASYNCTP_CHECK(bs[i].t.dim() == 2, "{}: Bs[{}] must be 2-D, got {}", c.where(), i,
                  bs[i].t.describe());
    Dims shape = gathered;
    shape[shape.size() - 1] = bs[i].t.size(1);
    outs.push_back(host_empty(shape, out_dtypes[i]));
    dev_bs.push_back(st.in(bs[i], true));
    dev_outs.push_back(st.out(outs.back()));
    if (scaled) dev_scales.push_back(st.in(b_scales.at(i)));
  }
  const Tensor dev_a_out = a_full ? st.out(*a_full) : Tensor();
  AllGatherMatmulOptions options;
  options.gather_dim = static_cast<int>(gather_dim);
  if (scaled) options.fast_accum = fast_accum_kwarg(c, bs.size());
  if (scaled) {
    all_gather_scaled_matmul(c.ctx(), st.in(a), st.in(c.tensor(1, "A_scale")), dev_bs, dev_scales,
                             dev_outs, dev_a_out, options);
  } else {
    all_gather_matmul(c.ctx(), st.in(a), dev_bs, dev_outs, dev_a_out, options);
  }
  st.finish();
  return gather_result(a_full, outs);
}

// asynctp.fused_all_gather_matmul_swiglu(A_shard, B, gather_dim, group_name, *, return_A,
//                                        return_pre) -> (A or None, P or None, out)
// B [K, 2N]; P = A @ B [.., 2N]; out = silu(P[.., :N]) * P[.., N:] [.., N].
RtValue fused_all_gather_swiglu(Call& c) {
  const HostTensor& a = c.tensor(0, "A_shard");
  const HostTensor& b = c.tensor(1, "B");
  const int64_t gather_dim = c.integer(2, "gather_dim");
  check_group(c, c.ctx().world_size(), c.string(3, "group_name"));
  const bool return_a = flag_kwarg(c, "return_A");
  const bool return_pre = flag_kwarg(c, "return_pre");
  check_gather(c, a, gather_dim);
  ASYNCTP_CHECK(b.t.dim() == 2 && b.t.size(1) % 2 == 0,
                "{}: B must be 2-D with an even number of columns (gate | up), got {}", c.where(),
                b.t.describe());
  const Dims gathered = all_gather_shape(a.t, static_cast<int>(gather_dim), c.ctx().world_size());
  Dims pre_shape = gathered, out_shape = gathered;
  pre_shape[pre_shape.size() - 1] = b.t.size(1);
  out_shape[out_shape.size() - 1] = b.t.size(1) / 2;
  const HostTensor out = host_empty(out_shape, a.t.dtype());
  std::optional<HostTensor> pre, a_full;
  if (return_pre) pre = host_empty(pre_shape, a.t.dtype());
  if (return_a) a_full = host_empty(gathered, a.t.dtype());
  Staging st(c.ctx());
  AllGatherMatmulOptions options;
  options.gather_dim = static_cast<int>(gather_dim);
  const Tensor dev_out = st.out(out);
  const Tensor dev_pre = pre ? st.out(*pre) : Tensor();
  const Tensor dev_a_out = a_full ? st.out(*a_full) : Tensor();
  all_gather_matmul_swiglu(c.ctx(), st.in(a), st.in(b, true), dev_out, dev_pre, dev_a_out, options);
  st.finish();
  return RtValue::list({a_full ? RtValue::of(*a_full) : RtValue{},
                        pre ? RtValue::of(*pre) : RtValue{}, RtValue::of(out)});
}

// asynctp.fused_matmul_reduce_scatter(As, Bs, reduce_op, scatter_dim, group_name)
RtValue fused_matmul_reduce_scatter(Call& c) {
  const std::vector<HostTensor> as = c.tensor_list(0, "As");
  const std::vector<HostTensor> bs = c.tensor_list(1, "Bs");
  ASYNCTP_CHECK(!as.empty() && as.size() == bs.size(),
                "{}: As and Bs must be non-empty lists of "
                "the same length, got {} and {}",
                c.where(), as.size(), bs.size());
  MatmulReduceScatterOptions options;
  options.reduce_op = parse_reduce_op(c.string(2, "reduce_op"));
  options.scatter_dim = static_cast<int>(c.integer(3, "scatter_dim"));
  check_group(c, c.ctx().world_size(), c.string(4, "group_name"));
  for (size_t i = 0; i < as.size(); ++i) {
    ASYNCTP_CHECK(bs[i].t.dim() == 2 && as[i].t.dim() >= 2,
                  "{}: As[{}] {} and Bs[{}] {} must be "
                  "[.., K] and [K, N]",
                  c.where(), i, as[i].t.describe(), i, bs[i].t.describe());
  }
  HostTensor out = c.alloc(
      matmul_reduce_scatter_out_shape(as[0].t, bs[0].t, options.scatter_dim, c.ctx().world_size()),
      as[0].t.dtype());
  Staging st(c.ctx());
  std::vector<Tensor> dev_as, dev_bs;
  for (size_t i = 0; i < as.size(); ++i) {
    dev_as.push_back(st.in(as[i]));
    dev_bs.push_back(st.in(bs[i], true));
  }
  if (as.size() == 1) {
    matmul_reduce_scatter(c.ctx(), dev_as[0], dev_bs[0], st.out(out), options);
  } else {
    matmul_reduce_scatter(c.ctx(), dev_as, dev_bs, st.out(out), options);
  }
  st.finish();
  return RtValue::of(out);
}

// asynctp.fused_scaled_matmul_reduce_scatter(A, A_scale, B, B_scale, reduce_op, scatter_dim,
//                                            group_name, out_dtype, *, use_fast_accum)
RtValue fused_scaled_matmul_reduce_scatter(Call& c) {
  const HostTensor& a = c.tensor(0, "A");
  const HostTensor& b = c.tensor(2, "B");
  MatmulReduceScatterOptions options;
  options.reduce_op = parse_reduce_op(c.string(4, "reduce_op"));
  options.scatter_dim = static_cast<int>(c.integer(5, "scatter_dim"));
  check_group(c, c.ctx().world_size(), c.string(6, "group_name"));
  const std::vector<bool> fast_accum = fast_accum_kwarg(c, 0);
  options.fast_accum = !fast_accum.empty() && fast_accum[0];
  const DType out_dtype = out_dtype_of(c, 7, "out_dtype", DType::kBF16);
  ASYNCTP_CHECK(a.t.dim() >= 2 && b.t.dim() == 2, "{}: A {} and B {} must be [.., K] and [K, N]",
                c.where(), a.t.describe(), b.t.describe());
  HostTensor out =
      c.alloc(matmul_reduce_scatter_out_shape(a.t, b.t, options.scatter_dim, c.ctx().world_size()),
              out_dtype);
  Staging st(c.ctx());
  scaled_matmul_reduce_scatter(c.ctx(), st.in(a), st.in(c.tensor(1, "A_scale")), st.in(b, true),
                               st.in(c.tensor(3, "B_scale")), st.out(out), options);
  st.finish();
  return RtValue::of(out);
}

}  // namespace

void register_device_kernels(Table& t) {
  t.emplace_back("aten.mm.default", mm);
  t.emplace_back("aten.bmm.default", bmm);
  t.emplace_back("aten.addmm.default", addmm);
  t.emplace_back("aten._scaled_mm.default", scaled_mm);
  t.emplace_back("_c10d_functional.all_gather_into_tensor.default", all_gather);
  t.emplace_back("_c10d_functional.reduce_scatter_tensor.default", reduce_scatter);
  t.emplace_back("_c10d_functional.all_reduce.default", all_reduce);
  t.emplace_back("_c10d_functional.wait_tensor.default",
                 [](Call& c) { return RtValue::of(c.tensor(0, "tensor")); });
  t.emplace_back("asynctp.fused_all_gather_matmul",
                 [](Call& c) { return fused_all_gather(c, false); });
  t.emplace_back("asynctp.fused_all_gather_scaled_matmul",
                 [](Call& c) { return fused_all_gather(c, true); });
  t.emplace_back("asynctp.fused_all_gather_matmul_swiglu", fused_all_gather_swiglu);
  t.emplace_back("asynctp.fused_matmul_reduce_scatter", fused_matmul_reduce_scatter);
  t.emplace_back("asynctp.fused_scaled_matmul_reduce_scatter", fused_scaled_matmul_reduce_scatter);
}

}  // namespace asynctp::graph
