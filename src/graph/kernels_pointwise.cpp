// Elementwise kernels on host memory: arithmetic with broadcasting and PyTorch's type promotion
// (graph/pointwise.h), unary math, the activations' backward ops, casts, constructors. Every op
// loads f32, computes in f32 and rounds once into the result dtype, which is what PyTorch's
// bf16/f16 kernels do too; integer results are exact or an error (graph/host_tensor.h).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "graph/kernel.h"
#include "graph/pointwise.h"

namespace asynctp::graph {

namespace {

using Table = std::vector<std::pair<std::string, Kernel>>;

// Binary elementwise op with broadcasting and PyTorch's type promotion (graph/pointwise.h); the
// scalar overloads share it. add and sub take `alpha` (other is scaled by it), the others have no
// such argument. A true division of integers gives f32, as PyTorch's div does.
template <typename Fn>
RtValue binary(Call& call, Fn&& fn, bool has_alpha = false, bool true_division = false) {
  const Operand ops[] = {operand(call, 0, "self"), operand(call, 1, "other")};
  ASYNCTP_CHECK(ops[0].tensor != nullptr || ops[1].tensor != nullptr,
                "{}: needs at least one tensor operand", call.where());
  const double alpha = has_alpha ? call.number_or(2, "alpha", 1.0) : 1.0;
  DType dtype = result_type(ops, call);
  if (true_division && !is_floating_point(dtype)) dtype = DType::kF32;
  const Dims shape = broadcast_operands(ops);
  std::vector<float> va = load_operand(ops[0], shape);
  const std::vector<float> vb = load_operand(ops[1], shape);
  const float alpha_f = static_cast<float>(alpha);
  for (size_t i = 0; i < va.size(); ++i)
    va[i] = fn(va[i], alpha_f == 1.0f ? vb[i] : alpha_f * vb[i]);
  HostTensor out = call.alloc(shape, dtype);
  store_f32(out.t, va);
  return RtValue::of(out);
}

// Unary elementwise op. `keeps_integers`: an integer or bool input keeps its dtype (neg, abs,
// floor, ...); otherwise (exp, sin, sigmoid, ...) such an input gives f32, as in PyTorch.
template <typename Fn>
RtValue unary(Call& call, Fn&& fn, bool keeps_integers = false) {
  const HostTensor& x = call.tensor(0, "self");
  std::vector<float> v = load_f32(x.t);
  for (float& e : v)
    e = fn(e);
  const DType dtype = is_floating_point(x.t.dtype()) || keeps_integers ? x.t.dtype() : DType::kF32;
  HostTensor out = call.alloc(x.t.shape(), dtype);
  store_f32(out.t, v);
  return RtValue::of(out);
}

// (grad_output, `key`) -> grad_input of grad_output's shape and dtype; fn(grad, value).
template <typename Fn>
RtValue activation_backward(Call& call, std::string_view key, Fn&& fn) {
  const HostTensor& g = call.tensor(0, "grad_output");
  const HostTensor& x = call.tensor(1, key);
  std::vector<float> vg = load_f32(g.t);
  const std::vector<float> vx = load_f32(x.t, g.t.shape());
  for (size_t i = 0; i < vg.size(); ++i)
    vg[i] = fn(vg[i], vx[i]);
  HostTensor out = call.alloc(g.t.shape(), g.t.dtype());
  store_f32(out.t, vg);
  return RtValue::of(out);
}

RtValue cast(Call& call, const HostTensor& x, DType dtype) {
  HostTensor out = call.alloc(x.t.shape(), dtype);
  store_f32(out.t, load_f32(x.t));
  return RtValue::of(out);
}

RtValue full(Call& call, const std::vector<int64_t>& size, double value,
             std::optional<DType> dtype) {
  if (!dtype) {
    // PyTorch infers the dtype from the fill value: int64 for an int, bool for a bool.
    const RtValue& v = call.value(1, "fill_value");
    const bool literal = v.kind == RtValue::Kind::kLiteral;
    dtype = literal && v.literal.is_int()                     ? DType::kI64
            : literal && v.literal.kind == Value::Kind::kBool ? DType::kBool
                                                              : DType::kF32;
  }
  HostTensor out = call.alloc(Dims(std::span<const int64_t>(size)), *dtype);
  store_f32(out.t,
            std::vector<float>(static_cast<size_t>(out.t.numel()), static_cast<float>(value)));
  return RtValue::of(out);
}

// [start, start + step, ...] of `length` elements.
RtValue sequence(Call& call, int64_t length, double start, double step, DType dtype) {
  HostTensor out = call.alloc(Dims{length}, dtype);
  std::vector<float> v(static_cast<size_t>(length));
  for (int64_t i = 0; i < length; ++i)
    v[static_cast<size_t>(i)] = static_cast<float>(start + step * static_cast<double>(i));
  store_f32(out.t, v);
  return RtValue::of(out);
}

RtValue arange(Call& call, const RtValue* start, size_t end_index, const RtValue* step) {
  const RtValue& end = call.value(end_index, "end");
  bool integral = true;
  for (const RtValue* v : {start, &end, step}) {
    if (v == nullptr) continue;
    ASYNCTP_CHECK(v->kind == RtValue::Kind::kLiteral && v->literal.is_number(),
                  "{}: arange bounds must be numbers, got {}", call.where(), v->describe());
    integral = integral && v->literal.is_int();
  }
  const double lo = start ? start->literal.as_double() : 0.0;
  const double hi = end.literal.as_double();
  const double by = step ? step->literal.as_double() : 1.0;
  ASYNCTP_CHECK(by != 0 && std::isfinite(lo) && std::isfinite(hi),
                "{}: arange({}, {}, {}) is not a finite range", call.where(), lo, hi, by);
  const auto length = static_cast<int64_t>(std::max(0.0, std::ceil((hi - lo) / by)));
  const DType dtype = call.kwarg("dtype") != nullptr && !call.kwarg("dtype")->is_none()
                          ? *call.dtype_or(99, "dtype")
                          : (integral ? DType::kI64 : DType::kF32);
  return sequence(call, length, lo, by, dtype);
}

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

}  // namespace

void register_pointwise_kernels(Table& t) {
  auto add = [](float a, float b) { return a + b; };
  auto sub = [](float a, float b) { return a - b; };
  auto mul = [](float a, float b) { return a * b; };
  auto div = [](float a, float b) { return a / b; };
  auto pow = [](float a, float b) { return std::pow(a, b); };
  for (const char* o : {"Tensor", "Scalar"}) {
    t.emplace_back(fmt::format("aten.add.{}", o), [=](Call& c) { return binary(c, add, true); });
    t.emplace_back(fmt::format("aten.sub.{}", o), [=](Call& c) { return binary(c, sub, true); });
    t.emplace_back(fmt::format("aten.mul.{}", o), [=](Call& c) { return binary(c, mul); });
    t.emplace_back(fmt::format("aten.div.{}", o),
                   [=](Call& c) { return binary(c, div, false, true); });
  }
  for (const char* o : {"Tensor", "Scalar"}) {
    // rsub(self, other, alpha) = other - alpha * self.
    t.emplace_back(fmt::format("aten.rsub.{}", o), [](Call& c) {
      const float alpha = static_cast<float>(c.number_or(2, "alpha", 1.0));
      return binary(c, [alpha](float a, float b) { return b - alpha * a; });
    });
  }
  t.emplace_back("aten.pow.Tensor_Scalar", [=](Call& c) { return binary(c, pow); });
  t.emplace_back("aten.pow.Tensor_Tensor", [=](Call& c) { return binary(c, pow); });
  t.emplace_back("aten.pow.Scalar", [=](Call& c) { return binary(c, pow); });
  t.emplace_back("aten.maximum.default", [=](Call& c) {
    return binary(c, [](float a, float b) { return std::isnan(a) || a > b ? a : b; });
  });
  t.emplace_back("aten.minimum.default", [=](Call& c) {
    return binary(c, [](float a, float b) { return std::isnan(a) || a < b ? a : b; });
  });
  for (const char* o : {"Tensor", "Scalar"}) {
    // fmod takes the dividend's sign, remainder the divisor's (Python's %).
    t.emplace_back(fmt::format("aten.fmod.{}", o), [=](Call& c) {
      return binary(c, [](float a, float b) { return std::fmod(a, b); });
    });
    t.emplace_back(fmt::format("aten.remainder.{}", o), [=](Call& c) {
      return binary(c, [](float a, float b) {
        const float r = std::fmod(a, b);
        return r != 0.0f && (r < 0.0f) != (b < 0.0f) ? r + b : r;
      });
    });
  }

  // The activations' backward ops: (grad_output, self or output) -> grad_input, in grad's dtype.
  t.emplace_back("aten.threshold_backward.default", [](Call& c) {
    const float threshold = static_cast<float>(c.number(2, "threshold"));
    return activation_backward(c, "self", [=](float g, float x) { return x <= threshold ? 0 : g; });
  });
  t.emplace_back("aten.sigmoid_backward.default", [](Call& c) {
    return activation_backward(c, "output", [](float g, float y) { return g * y * (1.0f - y); });
  });
  t.emplace_back("aten.tanh_backward.default", [](Call& c) {
    return activation_backward(c, "output", [](float g, float y) { return g * (1.0f - y * y); });
  });
  t.emplace_back("aten.silu_backward.default", [](Call& c) {
    return activation_backward(c, "self", [](float g, float x) {
      const float s = sigmoid(x);
      return g * s * (1.0f + x * (1.0f - s));
    });
  });
  t.emplace_back("aten.gelu_backward.default", [](Call& c) {
    const bool tanh_form = c.has(2, "approximate") && c.string(2, "approximate") == "tanh";
    return activation_backward(c, "self", [tanh_form](float g, float x) {
      if (!tanh_form) {
        const float cdf = 0.5f * (1.0f + std::erf(x * 0.70710678118654752f));
        const float pdf = 0.3989422804014327f * std::exp(-0.5f * x * x);
        return g * (cdf + x * pdf);
      }
      const float k = 0.7978845608028654f, inner = k * (x + 0.044715f * x * x * x);
      const float th = std::tanh(inner);
      const float d_inner = k * (1.0f + 3.0f * 0.044715f * x * x);
      return g * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * d_inner);
    });
  });

  struct Unary {
    const char* name;
    float (*fn)(float);
    bool keeps_integers;
  };
  const Unary unaries[] = {
      {"aten.neg.default", [](float x) { return -x; }, true},
      {"aten.abs.default", [](float x) { return std::fabs(x); }, true},
      {"aten.relu.default", [](float x) { return x > 0.0f || std::isnan(x) ? x : 0.0f; }, true},
      {"aten.sign.default",
       [](float x) { return x > 0.0f   ? 1.0f
                            : x < 0.0f ? -1.0f
                                       : x; },  // 0 and NaN stay
       true},
      {"aten.floor.default", [](float x) { return std::floor(x); }, true},
      {"aten.ceil.default", [](float x) { return std::ceil(x); }, true},
      {"aten.trunc.default", [](float x) { return std::trunc(x); }, true},
      {"aten.round.default", [](float x) { return std::nearbyint(x); }, true},  // ties to even
      {"aten.exp.default", [](float x) { return std::exp(x); }, false},
      {"aten.exp2.default", [](float x) { return std::exp2(x); }, false},
      {"aten.expm1.default", [](float x) { return std::expm1(x); }, false},
      {"aten.log.default", [](float x) { return std::log(x); }, false},
      {"aten.log2.default", [](float x) { return std::log2(x); }, false},
      {"aten.log10.default", [](float x) { return std::log10(x); }, false},
      {"aten.log1p.default", [](float x) { return std::log1p(x); }, false},
      {"aten.erf.default", [](float x) { return std::erf(x); }, false},
      {"aten.reciprocal.default", [](float x) { return 1.0f / x; }, false},
      {"aten.rsqrt.default", [](float x) { return 1.0f / std::sqrt(x); }, false},
      {"aten.sqrt.default", [](float x) { return std::sqrt(x); }, false},
      {"aten.sin.default", [](float x) { return std::sin(x); }, false},
      {"aten.cos.default", [](float x) { return std::cos(x); }, false},
      {"aten.tanh.default", [](float x) { return std::tanh(x); }, false},
      {"aten.sigmoid.default", [](float x) { return sigmoid(x); }, false},
      {"aten.silu.default", [](float x) { return x * sigmoid(x); }, false},
  };
  for (const Unary& u : unaries) {
    t.emplace_back(u.name, [u](Call& c) { return unary(c, u.fn, u.keeps_integers); });
  }
  t.emplace_back("aten.gelu.default", [](Call& c) {
    const bool tanh_form = c.has(1, "approximate") && c.string(1, "approximate") == "tanh";
    return unary(c, [tanh_form](float x) {
      if (!tanh_form) return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
      return 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    });
  });
  t.emplace_back("aten.clamp_min.default", [](Call& c) {
    const float lo = static_cast<float>(c.number(1, "min"));
    return unary(c, [lo](float x) { return std::isnan(x) || x > lo ? x : lo; });
  });
  t.emplace_back("aten.clamp_max.default", [](Call& c) {
    const float hi = static_cast<float>(c.number(1, "max"));
    return unary(c, [hi](float x) { return std::isnan(x) || x < hi ? x : hi; });
  });
  t.emplace_back("aten.clamp.default", [](Call& c) {
    const bool has_lo = c.has(1, "min"), has_hi = c.has(2, "max");
    const float lo = has_lo ? static_cast<float>(c.number(1, "min")) : 0.0f;
    const float hi = has_hi ? static_cast<float>(c.number(2, "max")) : 0.0f;
    return unary(c, [=](float x) {
      if (std::isnan(x)) return x;
      if (has_lo && x < lo) x = lo;
      if (has_hi && x > hi) x = hi;
      return x;
    });
  });

  t.emplace_back("prims.convert_element_type.default", [](Call& c) {
    auto dtype = c.dtype_or(1, "dtype");
    ASYNCTP_CHECK(dtype.has_value(), "{}: missing the target dtype", c.where());
    return cast(c, c.tensor(0, "a"), *dtype);
  });
  t.emplace_back("aten._to_copy.default", [](Call& c) {
    const HostTensor& x = c.tensor(0, "self");
    return cast(c, x, c.dtype_or(1, "dtype").value_or(x.t.dtype()));
  });
  t.emplace_back("aten.clone.default", [](Call& c) {
    const HostTensor& x = c.tensor(0, "self");
    return cast(c, x, x.t.dtype());
  });
  t.emplace_back("aten.full.default", [](Call& c) {
    return full(c, c.int_list(0, "size"), c.number(1, "fill_value"), c.dtype_or(2, "dtype"));
  });
  t.emplace_back("aten.full_like.default", [](Call& c) {
    const HostTensor& x = c.tensor(0, "self");
    return full(c, {x.t.shape().begin(), x.t.shape().end()}, c.number(1, "fill_value"),
                c.dtype_or(2, "dtype").value_or(x.t.dtype()));
  });
  for (const auto& [name, value] : {std::pair{"zeros", 0.0}, std::pair{"ones", 1.0}}) {
    t.emplace_back(fmt::format("aten.{}.default", name), [value = value](Call& c) {
      return full(c, c.int_list(0, "size"), value, c.dtype_or(1, "dtype").value_or(DType::kF32));
    });
    t.emplace_back(fmt::format("aten.{}_like.default", name), [value = value](Call& c) {
      const HostTensor& x = c.tensor(0, "self");
      return full(c, {x.t.shape().begin(), x.t.shape().end()}, value,
                  c.dtype_or(1, "dtype").value_or(x.t.dtype()));
    });
  }
  // arange(end) / arange.start(start, end) / arange.start_step(start, end, step): integers give
  // int64 unless a dtype is given, any float bound gives f32; prims.iota(length, *, start, step).
  t.emplace_back("aten.arange.default", [](Call& c) { return arange(c, nullptr, 0, nullptr); });
  t.emplace_back("aten.arange.start",
                 [](Call& c) { return arange(c, &c.value(0, "start"), 1, nullptr); });
  t.emplace_back("aten.arange.start_step",
                 [](Call& c) { return arange(c, &c.value(0, "start"), 1, &c.value(2, "step")); });
  t.emplace_back("prims.iota.default", [](Call& c) {
    const int64_t length = c.integer(0, "length");
    const auto* start = c.kwarg("start");
    const auto* step = c.kwarg("step");
    ASYNCTP_CHECK(start != nullptr && step != nullptr, "{}: needs start and step", c.where());
    ASYNCTP_CHECK(length >= 0, "{}: negative length {}", c.where(), length);
    const DType dtype = c.dtype_or(99, "dtype").value_or(DType::kI64);
    return sequence(c, length, start->literal.as_double(), step->literal.as_double(), dtype);
  });
  t.emplace_back("aten.scalar_tensor.default", [](Call& c) {
    return full(c, {}, c.number(0, "s"), c.dtype_or(1, "dtype").value_or(DType::kF32));
  });
}

}  // namespace asynctp::graph
