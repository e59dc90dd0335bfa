// A plain reference for the _scaled_dot_product_*_attention family (CPU flash, flash, efficient,
// cuDNN) and their backward ops, per (batch, head), in f32 with double row sums. Dropout is not
// supported (dropout_p must be 0); grouped-query attention is (Hq a multiple of Hkv).
//
//   q [B, Hq, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev] -> out [B, Hq, L, Ev]; query head h reads
//   key/value head h / (Hq / Hkv) (repeat_interleave, as PyTorch's enable_gqa)
//   P = softmax(q k^T * scale + bias), causal: key j > query i is dropped (top-left aligned)
//   backward: dV = P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(dO * O));  dQ = dS K s;
//   dK = dS^T Q s;  dbias = dS (summed into shared key/value heads for dK and dV)
//
// Each op returns its real output tuple, laid out as PyTorch's meta functions record it:
//   CPU flash  (out, logsumexp [B, H, L] f32)
//   flash      (out, logsumexp [B, H, L] f32, cum_seq_q None, cum_seq_k None, max_q int,
//               max_k int, philox_seed, philox_offset, debug_attn_mask [0])
//   efficient  (out, logsumexp [B, H, L rounded up to 32, or 0 when not asked], philox_seed,
//               philox_offset)
//   cuDNN      (out, logsumexp [B, H, L, 1] f32, None, None, max_q int, max_k int, philox_seed,
//               philox_offset, None)
// The RNG state of a dropout-free op is not read by its backward; it is returned as zeros of the
// recorded dtype and shape (int64 [] by default; PyTorch 2.15's CUDA flash records uint64 [2] and
// uint64 []).
#include <cmath>
#include <limits>

#include "core/error.h"
#include "graph/kernel.h"

namespace asynctp::graph {

namespace {

using Table = std::vector<std::pair<std::string, Kernel>>;

struct Attn {
  int64_t b = 0, h = 0, hkv = 0, l = 0, s = 0, e = 0, ev = 0;
  float scale = 1;
  bool causal = false;
  std::vector<float> q, k, v, bias;  // bias: [B, H, L, S] additive, empty when none

  int64_t kv_head(int64_t bh) const { return (bh / h) * hkv + (bh % h) / (h / hkv); }
};

Attn load(Call& c, size_t iq, bool causal, double dropout, const RtValue* bias,
          const RtValue* scale) {
  ASYNCTP_CHECK(dropout == 0.0, "{}: dropout_p {} is not supported (only 0)", c.where(), dropout);
  const Tensor& q = c.tensor(iq, "query").t;
  const Tensor& k = c.tensor(iq + 1, "key").t;
  const Tensor& v = c.tensor(iq + 2, "value").t;
  ASYNCTP_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
                "{}: query, key and value must be 4-D [B, H, L, E], got {}, {}, {}", c.where(),
                q.describe(), k.describe(), v.describe());
  Attn a;
  a.b = q.size(0), a.h = q.size(1), a.hkv = k.size(1), a.l = q.size(2), a.e = q.size(3),
  a.s = k.size(2), a.ev = v.size(3);
  ASYNCTP_CHECK(k.size(0) == a.b && v.size(0) == a.b && v.size(1) == a.hkv && k.size(3) == a.e &&
                    v.size(2) == a.s && a.hkv > 0 && a.h % a.hkv == 0,
                "{}: query {}, key {} and value {} do not match (key/value heads must divide the "
                "query heads)",
                c.where(), q.describe(), k.describe(), v.describe());
  a.causal = causal;
  a.scale = scale != nullptr && !scale->is_none() ? static_cast<float>(scale->literal.as_double())
                                                  : 1.0f / std::sqrt(static_cast<float>(a.e));
  a.q = load_f32(q), a.k = load_f32(k), a.v = load_f32(v);
  if (bias != nullptr && bias->is_tensor())
    a.bias = load_f32(bias->tensor.t, Dims{a.b, a.h, a.l, a.s});
  return a;
}

// Row i of P for query head bh (probabilities) and its log-sum-exp.
double probs(const Attn& a, int64_t bh, int64_t i, std::vector<double>& p) {
  const float* qi = &a.q[(bh * a.l + i) * a.e];
  const int64_t kvh = a.kv_head(bh);
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < a.s; ++j) {
    double sc = -std::numeric_limits<double>::infinity();
    if (!(a.causal && j > i)) {
      const float* kj = &a.k[(kvh * a.s + j) * a.e];
      double dot = 0;
      for (int64_t x = 0; x < a.e; ++x)
        dot += static_cast<double>(qi[x]) * kj[x];
      sc = dot * a.scale;
      if (!a.bias.empty()) sc += a.bias[(bh * a.l + i) * a.s + j];
    }
    p[j] = sc;
    mx = std::max(mx, sc);
  }
  double sum = 0;
  for (int64_t j = 0; j < a.s; ++j)
    sum += p[j] = std::isinf(mx) ? 0.0 : std::exp(p[j] - mx);
  for (int64_t j = 0; j < a.s; ++j)
    p[j] = sum > 0 ? p[j] / sum : 0.0;
  return sum > 0 ? mx + std::log(sum) : -std::numeric_limits<double>::infinity();
}

// The recorded meta of tuple entry i, if any.
const TensorMeta* tuple_meta(const Call& c, size_t i) {
  const Meta& val = c.node().val;
  if (val.kind != Meta::Kind::kTuple || val.tuple.size() <= i || !val.tuple[i]) return nullptr;
  return &*val.tuple[i];
}

// A result tensor for tuple entry i: laid out as recorded when the record matches `shape`.
HostTensor alloc_entry(const Call& c, size_t i, const Dims& shape, DType dtype) {
  const TensorMeta* m = tuple_meta(c, i);
  return host_empty(
      shape, dtype,
      m != nullptr && m->shape == shape ? std::optional<Dims>(m->stride) : std::nullopt);
}

RtValue filled(HostTensor t, const std::vector<float>& values) {
  store_f32(t.t, values);
  return RtValue::of(t);
}

// {out [B, H, L, Ev], logsumexp} with the log-sum-exp of row i at lse[bh * lse_len + i] (entries
// past L are 0), in the shape `lse_shape` (its product is B * H * lse_len).
std::pair<RtValue, RtValue> forward(Call& c, const Attn& a, const Dims& lse_shape, int64_t lse_len,
                                    DType lse_dtype) {
  std::vector<float> out(static_cast<size_t>(a.b * a.h * a.l * a.ev));
  std::vector<float> lse(static_cast<size_t>(a.b * a.h * lse_len), 0.0f);
  std::vector<double> p(a.s);
  for (int64_t bh = 0; bh < a.b * a.h; ++bh) {
    const int64_t kvh = a.kv_head(bh);
    for (int64_t i = 0; i < a.l; ++i) {
      const double m = probs(a, bh, i, p);
      if (i < lse_len) lse[bh * lse_len + i] = static_cast<float>(m);
      for (int64_t x = 0; x < a.ev; ++x) {
        double acc = 0;
        for (int64_t j = 0; j < a.s; ++j)
          acc += p[j] * a.v[(kvh * a.s + j) * a.ev + x];
        out[(bh * a.l + i) * a.ev + x] = static_cast<float>(acc);
      }
    }
  }
  const DType dtype = c.tensor(0, "query").t.dtype();
  return {filled(alloc_entry(c, 0, {a.b, a.h, a.l, a.ev}, dtype), out),
          filled(alloc_entry(c, 1, lse_shape, lse_dtype), lse)};
}

// {dq, dk, dv} (as tuple entries 0-2) and dS [B, H, L, S] when `want_ds`.
std::pair<std::vector<RtValue>, std::vector<float>> backward(Call& c, const Attn& a,
                                                             const Tensor& dout_t,
                                                             const Tensor& out_t, bool want_ds) {
  const std::vector<float> dout = load_f32(dout_t), out = load_f32(out_t);
  std::vector<double> dq(a.q.size(), 0.0), dk(a.k.size(), 0.0), dv(a.v.size(), 0.0);
  std::vector<float> ds_all(want_ds ? static_cast<size_t>(a.b * a.h * a.l * a.s) : 0);
  std::vector<double> p(a.s), ds(a.s);
  for (int64_t bh = 0; bh < a.b * a.h; ++bh) {
    const int64_t kvh = a.kv_head(bh);
    for (int64_t i = 0; i < a.l; ++i) {
      probs(a, bh, i, p);
      const float* doi = &dout[(bh * a.l + i) * a.ev];
      double d = 0;
      for (int64_t x = 0; x < a.ev; ++x)
        d += static_cast<double>(doi[x]) * out[(bh * a.l + i) * a.ev + x];
      for (int64_t j = 0; j < a.s; ++j) {
        double acc = 0;
        for (int64_t x = 0; x < a.ev; ++x) {
          acc += static_cast<double>(doi[x]) * a.v[(kvh * a.s + j) * a.ev + x];
          dv[(kvh * a.s + j) * a.ev + x] += p[j] * doi[x];
        }
        ds[j] = p[j] * (acc - d);
        if (want_ds) ds_all[(bh * a.l + i) * a.s + j] = static_cast<float>(ds[j]);
      }
      for (int64_t j = 0; j < a.s; ++j) {
        if (ds[j] == 0) continue;
        for (int64_t x = 0; x < a.e; ++x) {
          dq[(bh * a.l + i) * a.e + x] += ds[j] * a.k[(kvh * a.s + j) * a.e + x] * a.scale;
          dk[(kvh * a.s + j) * a.e + x] += ds[j] * a.q[(bh * a.l + i) * a.e + x] * a.scale;
        }
      }
    }
  }
  std::vector<RtValue> grads;
  const Dims shapes[] = {{a.b, a.h, a.l, a.e}, {a.b, a.hkv, a.s, a.e}, {a.b, a.hkv, a.s, a.ev}};
  const std::vector<double>* values[] = {&dq, &dk, &dv};
  for (size_t g = 0; g < 3; ++g) {
    grads.push_back(filled(alloc_entry(c, g, shapes[g], dout_t.dtype()),
                           std::vector<float>(values[g]->begin(), values[g]->end())));
  }
  return {std::move(grads), std::move(ds_all)};
}

RtValue none() {
  return RtValue{};
}

RtValue integer(int64_t v) {
  return RtValue::lit(Value::integer(v));
}

// Zeros of the recorded dtype and shape of tuple entry i (int64 [] when unrecorded): the RNG
// state of a dropout-free op.
RtValue rng_state(const Call& c, size_t i) {
  const TensorMeta* m = tuple_meta(c, i);
  DType dtype = DType::kI64;
  Dims shape;
  if (m != nullptr) {
    const auto d = dtype_from_torch(m->dtype);
    ASYNCTP_CHECK(d.has_value() && !is_floating_point(*d),
                  "{}: result [{}] (RNG state) is recorded as {}, not an integer dtype", c.where(),
                  i, m->dtype);
    dtype = *d;
    shape = m->shape;
  }
  return filled(host_empty(shape, dtype), std::vector<float>(static_cast<size_t>(shape.product())));
}

void check_no_debug_mask(const Call& c, size_t index) {
  ASYNCTP_CHECK(!c.boolean_or(index, "return_debug_mask", false),
                "{}: return_debug_mask=True is not supported (it records dropout's mask)",
                c.where());
}

}  // namespace

void register_attention_kernels(Table& t) {
  // (query, key, value, dropout_p, is_causal, *, attn_mask, scale) -> (out, logsumexp); the
  // log-sum-exp is in the query's computation dtype (f32 for bf16/f16).
  t.emplace_back("aten._scaled_dot_product_flash_attention_for_cpu.default", [](Call& c) {
    const Attn a = load(c, 0, c.boolean_or(4, "is_causal", false), c.number_or(3, "dropout_p", 0),
                        c.kwarg("attn_mask"), c.kwarg("scale"));
    auto [o, lse] = forward(c, a, {a.b, a.h, a.l}, a.l, DType::kF32);
    return RtValue::list({o, lse});
  });
  // (grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask, scale)
  t.emplace_back("aten._scaled_dot_product_flash_attention_for_cpu_backward.default", [](Call& c) {
    const Attn a = load(c, 1, c.boolean_or(7, "is_causal", false), c.number_or(6, "dropout_p", 0),
                        c.kwarg("attn_mask"), c.kwarg("scale"));
    return RtValue::list(
        backward(c, a, c.tensor(0, "grad_out").t, c.tensor(4, "out").t, false).first);
  });
  // (query, key, value, dropout_p, is_causal, return_debug_mask, *, scale)
  t.emplace_back("aten._scaled_dot_product_flash_attention.default", [](Call& c) {
    check_no_debug_mask(c, 5);
    const Attn a = load(c, 0, c.boolean_or(4, "is_causal", false), c.number_or(3, "dropout_p", 0),
                        nullptr, c.kwarg("scale"));
    auto [o, lse] = forward(c, a, {a.b, a.h, a.l}, a.l, DType::kF32);
    const DType dtype = c.tensor(0, "query").t.dtype();
    return RtValue::list({o, lse, none(), none(), integer(a.l), integer(a.s), rng_state(c, 6),
                          rng_state(c, 7), RtValue::of(alloc_entry(c, 8, Dims{0}, dtype))});
  });
  // (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
  //  is_causal, philox_seed, philox_offset, *, scale) -> (dq, dk, dv)
  t.emplace_back("aten._scaled_dot_product_flash_attention_backward.default", [](Call& c) {
    const Attn a = load(c, 1, c.boolean_or(11, "is_causal", false), c.number_or(10, "dropout_p", 0),
                        nullptr, c.kwarg("scale"));
    return RtValue::list(
        backward(c, a, c.tensor(0, "grad_out").t, c.tensor(4, "out").t, false).first);
  });
  // (query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, *, scale)
  t.emplace_back("aten._scaled_dot_product_efficient_attention.default", [](Call& c) {
    const Attn a = load(c, 0, c.boolean_or(6, "is_causal", false), c.number_or(5, "dropout_p", 0),
                        c.find(3, "attn_bias"), c.kwarg("scale"));
    const int64_t lse_len = c.boolean_or(4, "compute_log_sumexp", false) ? (a.l + 31) / 32 * 32 : 0;
    auto [o, lse] = forward(c, a, {a.b, a.h, lse_len}, lse_len, DType::kF32);
    return RtValue::list({o, lse, rng_state(c, 2), rng_state(c, 3)});
  });
  // (grad_out, query, key, value, attn_bias, out, logsumexp, philox_seed, philox_offset,
  //  dropout_p, grad_input_mask, is_causal, *, scale) -> (dq, dk, dv, dbias: None unless
  //  attn_bias is given and grad_input_mask[3])
  t.emplace_back("aten._scaled_dot_product_efficient_attention_backward.default", [](Call& c) {
    const RtValue* bias = c.find(4, "attn_bias");
    const Attn a = load(c, 1, c.boolean_or(11, "is_causal", false), c.number_or(9, "dropout_p", 0),
                        bias, c.kwarg("scale"));
    bool want_bias = false;
    if (bias != nullptr && bias->is_tensor() && c.has(10, "grad_input_mask")) {
      // [q, k, v, bias] flags, as bools (FX records Python bools) or integers.
      const RtValue& mask = c.value(10, "grad_input_mask");
      ASYNCTP_CHECK(mask.kind == RtValue::Kind::kLiteral && mask.literal.is_list() &&
                        mask.literal.list.size() == 4,
                    "{}: grad_input_mask must be a list of 4 flags, got {}", c.where(),
                    mask.describe());
      const Value& flag = mask.literal.list[3];
      want_bias = flag.kind == Value::Kind::kBool ? flag.b : flag.is_int() && flag.i != 0;
    }
    auto [grads, ds] = backward(c, a, c.tensor(0, "grad_out").t, c.tensor(5, "out").t, want_bias);
    if (!want_bias) {
      grads.push_back(none());
    } else {
      const Tensor& bt = bias->tensor.t;
      ASYNCTP_CHECK(bt.shape() == Dims({a.b, a.h, a.l, a.s}),
                    "{}: the bias gradient needs attn_bias of shape [B, H, L, S] = {}, got {}",
                    c.where(), Dims({a.b, a.h, a.l, a.s}), bt.describe());
      grads.push_back(filled(alloc_entry(c, 3, bt.shape(), bt.dtype()), ds));
    }
    return RtValue::list(std::move(grads));
  });
  // (query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, return_debug_mask,
  //  *, scale)
  t.emplace_back("aten._scaled_dot_product_cudnn_attention.default", [](Call& c) {
    check_no_debug_mask(c, 7);
    const Attn a = load(c, 0, c.boolean_or(6, "is_causal", false), c.number_or(5, "dropout_p", 0),
                        c.find(3, "attn_bias"), c.kwarg("scale"));
    auto [o, lse] = forward(c, a, {a.b, a.h, a.l, 1}, a.l, DType::kF32);
    return RtValue::list({o, lse, none(), none(), integer(a.l), integer(a.s), rng_state(c, 6),
                          rng_state(c, 7), none()});
  });
  // (grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_bias,
  //  cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, *, scale) -> (dq, dk, dv)
  t.emplace_back("aten._scaled_dot_product_cudnn_attention_backward.default", [](Call& c) {
    const Attn a = load(c, 1, c.boolean_or(14, "is_causal", false), c.number_or(13, "dropout_p", 0),
                        c.find(8, "attn_bias"), c.kwarg("scale"));
    return RtValue::list(
        backward(c, a, c.tensor(0, "grad_out").t, c.tensor(4, "out").t, false).first);
  });
}

}  // namespace asynctp::graph
