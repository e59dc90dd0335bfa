// Elementwise kernels on host memory: arithmetic with broadcasting and PyTorch's type promotion
// (float dtypes only), unary math, casts, constructors. Every op loads f32, computes in f32 and
// rounds once into the result dtype, which is what PyTorch's bf16/f16 kernels do too.
#include <cmath>

#include "core/error.h"
#include "graph/kernel.h"

namespace asynctp::graph {

namespace {

using Table = std::vector<std::pair<std::string, Kernel>>;

// The dtype of a binary op's result over float dtypes: equal dtypes stay; f32 wins; bf16 with
// f16 gives f32; float8 mixes with nothing (PyTorch refuses it too).
DType promote(DType a, DType b, const Call& call) {
  if (a == b) return a;
  ASYNCTP_CHECK(!is_float8(a) && !is_float8(b), "{}: no type promotion between {} and {}",
                call.where(), a, b);
  return DType::kF32;
}

// Operand of a binary op: a tensor or a number.
struct Operand {
  const HostTensor* tensor = nullptr;
  double scalar = 0;
};

Operand operand(const Call& call, size_t index, std::string_view key) {
  const RtValue& v = call.value(index, key);
  if (v.is_tensor()) return {&v.tensor, 0};
  return {nullptr, call.number(index, key)};
}

// Binary elementwise op with broadcasting; the scalar overloads share it. add and sub take
// `alpha` (other is scaled by it), the others have no such argument.
template <typename Fn>
RtValue binary(Call& call, Fn&& fn, bool has_alpha = false) {
  const Operand a = operand(call, 0, "self");
  const Operand b = operand(call, 1, "other");
  ASYNCTP_CHECK(a.tensor != nullptr || b.tensor != nullptr, "{}: needs at least one tensor operand",
                call.where());
  const double alpha = has_alpha ? call.number_or(2, "alpha", 1.0) : 1.0;
  DType dtype;
  Dims shape;
  if (a.tensor && b.tensor) {
    const Tensor &ta = a.tensor->t, &tb = b.tensor->t;
    // A 0-d tensor does not promote a higher-dim tensor of the same category (PyTorch's rule).
    if (ta.dim() == 0 && tb.dim() > 0)
      dtype = tb.dtype();
    else if (tb.dim() == 0 && ta.dim() > 0)
      dtype = ta.dtype();
    else
      dtype = promote(ta.dtype(), tb.dtype(), call);
    shape = broadcast_shapes(ta.shape(), tb.shape());
  } else {
    const Tensor& t = (a.tensor ? a.tensor : b.tensor)->t;
    dtype = t.dtype();
    shape = t.shape();
  }
  const size_t n = static_cast<size_t>(shape.product());
  std::vector<float> va =
      a.tensor ? load_f32(a.tensor->t, shape) : std::vector<float>(n, static_cast<float>(a.scalar));
  const std::vector<float> vb =
      b.tensor ? load_f32(b.tensor->t, shape) : std::vector<float>(n, static_cast<float>(b.scalar));
  const float alpha_f = static_cast<float>(alpha);
  for (size_t i = 0; i < n; ++i)
    va[i] = fn(va[i], alpha_f == 1.0f ? vb[i] : alpha_f * vb[i]);
  HostTensor out = call.alloc(shape, dtype);
  store_f32(out.t, va);
  return RtValue::of(out);
}

template <typename Fn>
RtValue unary(Call& call, Fn&& fn) {
  const HostTensor& x = call.tensor(0, "self");
  std::vector<float> v = load_f32(x.t);
  for (float& e : v)
    e = fn(e);
  HostTensor out = call.alloc(x.t.shape(), x.t.dtype());
  store_f32(out.t, v);
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
    // PyTorch infers int64 from an integer fill value, which the executor does not support.
    const RtValue& v = call.value(1, "fill_value");
    ASYNCTP_CHECK(!(v.kind == RtValue::Kind::kLiteral && v.literal.is_int()),
                  "{}: an integer fill value without a dtype makes an int64 tensor, which is not "
                  "supported",
                  call.where());
    dtype = DType::kF32;
  }
  HostTensor out = call.alloc(Dims(std::span<const int64_t>(size)), *dtype);
  store_f32(out.t,
            std::vector<float>(static_cast<size_t>(out.t.numel()), static_cast<float>(value)));
  return RtValue::of(out);
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
    t.emplace_back(fmt::format("aten.div.{}", o), [=](Call& c) { return binary(c, div); });
  }
  t.emplace_back("aten.rsub.Scalar",
                 [=](Call& c) { return binary(c, [](float a, float b) { return b - a; }); });
  t.emplace_back("aten.pow.Tensor_Scalar", [=](Call& c) { return binary(c, pow); });
  t.emplace_back("aten.pow.Tensor_Tensor", [=](Call& c) { return binary(c, pow); });
  t.emplace_back("aten.pow.Scalar", [=](Call& c) { return binary(c, pow); });
  t.emplace_back("aten.maximum.default", [=](Call& c) {
    return binary(c, [](float a, float b) { return std::isnan(a) || a > b ? a : b; });
  });
  t.emplace_back("aten.minimum.default", [=](Call& c) {
    return binary(c, [](float a, float b) { return std::isnan(a) || a < b ? a : b; });
  });

  const std::pair<const char*, float (*)(float)> unaries[] = {
      {"aten.neg.default", [](float x) { return -x; }},
      {"aten.exp.default", [](float x) { return std::exp(x); }},
      {"aten.log.default", [](float x) { return std::log(x); }},
      {"aten.erf.default", [](float x) { return std::erf(x); }},
      {"aten.relu.default", [](float x) { return x > 0.0f || std::isnan(x) ? x : 0.0f; }},
      {"aten.reciprocal.default", [](float x) { return 1.0f / x; }},
      {"aten.rsqrt.default", [](float x) { return 1.0f / std::sqrt(x); }},
      {"aten.sqrt.default", [](float x) { return std::sqrt(x); }},
      {"aten.abs.default", [](float x) { return std::fabs(x); }},
      {"aten.tanh.default", [](float x) { return std::tanh(x); }},
      {"aten.sigmoid.default", [](float x) { return sigmoid(x); }},
      {"aten.silu.default", [](float x) { return x * sigmoid(x); }},
  };
  for (const auto& [name, fn] : unaries) {
    t.emplace_back(name, [fn = fn](Call& c) { return unary(c, fn); });
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
  t.emplace_back("aten.scalar_tensor.default", [](Call& c) {
    return full(c, {}, c.number(0, "s"), c.dtype_or(1, "dtype").value_or(DType::kF32));
  });
}

}  // namespace asynctp::graph
