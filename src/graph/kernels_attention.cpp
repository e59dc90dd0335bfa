// A plain reference for the _scaled_dot_product_*_attention family and its backward ops, per
// (batch, head), in f32 with double row sums. Dropout is not supported (dropout_p must be 0).
//
//   q [B, H, L, E], k [B, H, S, E], v [B, H, S, Ev] -> out [B, H, L, Ev], logsumexp [B, H, L] (f32)
//   P = softmax(q k^T * scale + mask), causal mask: key j > query i is dropped (top-left aligned)
//   backward: dV = P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(dO * O));  dQ = dS K s;  dK = dS^T
//   Q s
#include <cmath>
#include <limits>

#include "core/error.h"
#include "graph/kernel.h"

namespace asynctp::graph {

namespace {

using Table = std::vector<std::pair<std::string, Kernel>>;

struct Attn {
  int64_t b = 0, h = 0, l = 0, s = 0, e = 0, ev = 0;
  float scale = 1;
  bool causal = false;
  std::vector<float> q, k, v, mask;  // mask: [B, H, L, S] additive, empty when none
};

Attn load(Call& c, size_t iq, bool causal, double dropout, const RtValue* mask,
          const RtValue* scale) {
  ASYNCTP_CHECK(dropout == 0.0, "{}: dropout_p {} is not supported (only 0)", c.where(), dropout);
  const Tensor& q = c.tensor(iq, "query").t;
  const Tensor& k = c.tensor(iq + 1, "key").t;
  const Tensor& v = c.tensor(iq + 2, "value").t;
  ASYNCTP_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
                "{}: query, key and value must be "
                "4-D [B, H, L, E], got {}, {}, {}",
                c.where(), q.describe(), k.describe(), v.describe());
  Attn a;
  a.b = q.size(0), a.h = q.size(1), a.l = q.size(2), a.e = q.size(3), a.s = k.size(2),
  a.ev = v.size(3);
  ASYNCTP_CHECK(k.size(0) == a.b && v.size(0) == a.b && k.size(1) == a.h && v.size(1) == a.h &&
                    k.size(3) == a.e && v.size(2) == a.s,
                "{}: query {}, key {} and value {} do not match (grouped heads are not supported)",
                c.where(), q.describe(), k.describe(), v.describe());
  a.causal = causal;
  a.scale = scale != nullptr && !scale->is_none() ? static_cast<float>(scale->literal.as_double())
                                                  : 1.0f / std::sqrt(static_cast<float>(a.e));
  a.q = load_f32(q), a.k = load_f32(k), a.v = load_f32(v);
  if (mask != nullptr && mask->is_tensor())
    a.mask = load_f32(mask->tensor.t, Dims{a.b, a.h, a.l, a.s});
  return a;
}

// Row i of P for (bh) (probabilities) and its log-sum-exp.
double probs(const Attn& a, int64_t bh, int64_t i, std::vector<double>& p) {
  const float* qi = &a.q[(bh * a.l + i) * a.e];
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < a.s; ++j) {
    double sc = -std::numeric_limits<double>::infinity();
    if (!(a.causal && j > i)) {
      const float* kj = &a.k[(bh * a.s + j) * a.e];
      double dot = 0;
      for (int64_t x = 0; x < a.e; ++x)
        dot += static_cast<double>(qi[x]) * kj[x];
      sc = dot * a.scale;
      if (!a.mask.empty()) sc += a.mask[(bh * a.l + i) * a.s + j];
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

// Returns {out [B,H,L,Ev], lse [B,H,lse_len]} (lse entries past L are 0).
std::pair<HostTensor, HostTensor> forward(Call& c, const Attn& a, int64_t lse_len, DType out_dtype,
                                          const std::optional<Dims>& out_strides) {
  std::vector<float> out(static_cast<size_t>(a.b * a.h * a.l * a.ev));
  std::vector<float> lse(static_cast<size_t>(a.b * a.h * lse_len), 0.0f);
  std::vector<double> p(a.s);
  for (int64_t bh = 0; bh < a.b * a.h; ++bh) {
    for (int64_t i = 0; i < a.l; ++i) {
      const double m = probs(a, bh, i, p);
      if (i < lse_len) lse[bh * lse_len + i] = static_cast<float>(m);
      for (int64_t x = 0; x < a.ev; ++x) {
        double acc = 0;
        for (int64_t j = 0; j < a.s; ++j)
          acc += p[j] * a.v[(bh * a.s + j) * a.ev + x];
        out[(bh * a.l + i) * a.ev + x] = static_cast<float>(acc);
      }
    }
  }
  HostTensor o = host_empty({a.b, a.h, a.l, a.ev}, out_dtype, out_strides);
  store_f32(o.t, out);
  HostTensor s = host_empty({a.b, a.h, lse_len}, DType::kF32);
  store_f32(s.t, lse);
  return {o, s};
}

std::vector<RtValue> backward(Call& c, const Attn& a, const Tensor& dout_t, const Tensor& out_t) {
  const std::vector<float> dout = load_f32(dout_t), out = load_f32(out_t);
  std::vector<double> dq(a.q.size(), 0.0), dk(a.k.size(), 0.0), dv(a.v.size(), 0.0);
  std::vector<double> p(a.s), dp(a.s);
  for (int64_t bh = 0; bh < a.b * a.h; ++bh) {
    for (int64_t i = 0; i < a.l; ++i) {
      probs(a, bh, i, p);
      const float* doi = &dout[(bh * a.l + i) * a.ev];
      double d = 0;
      for (int64_t x = 0; x < a.ev; ++x)
        d += static_cast<double>(doi[x]) * out[(bh * a.l + i) * a.ev + x];
      for (int64_t j = 0; j < a.s; ++j) {
        double acc = 0;
        for (int64_t x = 0; x < a.ev; ++x) {
          acc += static_cast<double>(doi[x]) * a.v[(bh * a.s + j) * a.ev + x];
          dv[(bh * a.s + j) * a.ev + x] += p[j] * doi[x];
        }
        dp[j] = p[j] * (acc - d);  // dS
      }
      for (int64_t j = 0; j < a.s; ++j) {
        if (dp[j] == 0) continue;
        for (int64_t x = 0; x < a.e; ++x) {
          dq[(bh * a.l + i) * a.e + x] += dp[j] * a.k[(bh * a.s + j) * a.e + x] * a.scale;
          dk[(bh * a.s + j) * a.e + x] += dp[j] * a.q[(bh * a.l + i) * a.e + x] * a.scale;
        }
      }
    }
  }
  std::vector<RtValue> grads;
  const Dims shapes[] = {{a.b, a.h, a.l, a.e}, {a.b, a.h, a.s, a.e}, {a.b, a.h, a.s, a.ev}};
  const std::vector<double>* values[] = {&dq, &dk, &dv};
  for (int g = 0; g < 3; ++g) {
    std::optional<Dims> strides;
    if (c.node().val.kind == Meta::Kind::kTuple &&
        c.node().val.tuple.size() > static_cast<size_t>(g) && c.node().val.tuple[g] &&
        c.node().val.tuple[g]->shape == shapes[g]) {
      strides = c.node().val.tuple[g]->stride;
    }
    HostTensor t = host_empty(shapes[g], dout_t.dtype(), strides);
    store_f32(t.t, std::vector<float>(values[g]->begin(), values[g]->end()));
    grads.push_back(RtValue::of(t));
  }
  return grads;
}

std::optional<Dims> tuple_strides(const Call& c, size_t i) {
  if (c.node().val.kind != Meta::Kind::kTuple || c.node().val.tuple.size() <= i ||
      !c.node().val.tuple[i]) {
    return std::nullopt;
  }
  return c.node().val.tuple[i]->stride;
}

RtValue none() {
  return RtValue{};
}

}  // namespace

void register_attention_kernels(Table& t) {
  // (query, key, value, dropout_p, is_causal, *, attn_mask, scale) -> (out, logsumexp)
  t.emplace_back("aten._scaled_dot_product_flash_attention_for_cpu.default", [](Call& c) {
    const Attn a = load(c, 0, c.boolean_or(4, "is_causal", false), c.number_or(3, "dropout_p", 0),
                        c.kwarg("attn_mask"), c.kwarg("scale"));
    auto [o, lse] = forward(c, a, a.l, c.tensor(0, "query").t.dtype(), tuple_strides(c, 0));
    return RtValue::list({RtValue::of(o), RtValue::of(lse)});
  });
  // (grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask, scale)
  t.emplace_back("aten._scaled_dot_product_flash_attention_for_cpu_backward.default", [](Call& c) {
    const Attn a = load(c, 1, c.boolean_or(7, "is_causal", false), c.number_or(6, "dropout_p", 0),
                        c.kwarg("attn_mask"), c.kwarg("scale"));
    return RtValue::list(backward(c, a, c.tensor(0, "grad_out").t, c.tensor(4, "out").t));
  });
  // (query, key, value, dropout_p, is_causal, return_debug_mask, *, scale) ->
  // (out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused, debug_attn_mask);
  // the bookkeeping entries are None here.
  t.emplace_back("aten._scaled_dot_product_flash_attention.default", [](Call& c) {
    const Attn a = load(c, 0, c.boolean_or(4, "is_causal", false), c.number_or(3, "dropout_p", 0),
                        nullptr, c.kwarg("scale"));
    auto [o, lse] = forward(c, a, a.l, c.tensor(0, "query").t.dtype(), tuple_strides(c, 0));
    return RtValue::list(
        {RtValue::of(o), RtValue::of(lse), none(), none(), none(), none(), none(), none(), none()});
  });
  // (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
  //  is_causal, philox_seed, philox_offset, *, scale) -> (dq, dk, dv)
  t.emplace_back("aten._scaled_dot_product_flash_attention_backward.default", [](Call& c) {
    const Attn a = load(c, 1, c.boolean_or(11, "is_causal", false), c.number_or(10, "dropout_p", 0),
                        nullptr, c.kwarg("scale"));
    return RtValue::list(backward(c, a, c.tensor(0, "grad_out").t, c.tensor(4, "out").t));
  });
  // (query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, *, scale) ->
  // (out, log_sumexp [B, H, L rounded up to 32 (0 when not computed)], philox_seed, philox_offset)
  t.emplace_back("aten._scaled_dot_product_efficient_attention.default", [](Call& c) {
    const Attn a = load(c, 0, c.boolean_or(6, "is_causal", false), c.number_or(5, "dropout_p", 0),
                        c.find(3, "attn_bias"), c.kwarg("scale"));
    const int64_t lse_len = c.boolean_or(4, "compute_log_sumexp", false) ? (a.l + 31) / 32 * 32 : 0;
    auto [o, lse] = forward(c, a, lse_len, c.tensor(0, "query").t.dtype(), tuple_strides(c, 0));
    return RtValue::list({RtValue::of(o), RtValue::of(lse), none(), none()});
  });
  // (grad_out, query, key, value, attn_bias, out, logsumexp, philox_seed, philox_offset,
  //  dropout_p, grad_input_mask, is_causal, *, scale) -> (dq, dk, dv, dbias: None)
  t.emplace_back("aten._scaled_dot_product_efficient_attention_backward.default", [](Call& c) {
    const Attn a = load(c, 1, c.boolean_or(11, "is_causal", false), c.number_or(9, "dropout_p", 0),
                        c.find(4, "attn_bias"), c.kwarg("scale"));
    std::vector<RtValue> grads = backward(c, a, c.tensor(0, "grad_out").t, c.tensor(5, "out").t);
    grads.push_back(none());
    return RtValue::list(std::move(grads));
  });
}

}  // namespace asynctp::graph
