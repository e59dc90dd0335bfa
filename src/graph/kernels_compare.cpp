// Comparisons, logical ops, value tests and `where`: the bool-valued side of PyTorch's
// elementwise ops (ReLU's backward is where(le(x, 0), 0, grad); masks; causal attention built by
// hand). A comparison casts both operands to their common dtype first (graph/pointwise.h), as
// PyTorch does: bf16 x == 0.1 compares x with 0.1 rounded to bf16. Results are bool (one byte).
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "graph/kernel.h"
#include "graph/pointwise.h"

namespace asynctp::graph {

namespace {

using Table = std::vector<std::pair<std::string, Kernel>>;

template <typename Fn>
RtValue compare(Call& call, Fn&& fn) {
  const Operand ops[] = {operand(call, 0, "self"), operand(call, 1, "other")};
  ASYNCTP_CHECK(ops[0].tensor != nullptr || ops[1].tensor != nullptr,
                "{}: needs at least one tensor operand", call.where());
  const DType common = result_type(ops, call);
  const Dims shape = broadcast_operands(ops);
  std::vector<float> a = load_operand(ops[0], shape), b = load_operand(ops[1], shape);
  round_to(a, common);
  round_to(b, common);
  std::vector<float> out(a.size());
  for (size_t i = 0; i < a.size(); ++i)
    out[i] = fn(a[i], b[i]) ? 1.0f : 0.0f;
  HostTensor result = call.alloc(shape, DType::kBool);
  store_f32(result.t, out);
  return RtValue::of(result);
}

// Logical ops read any dtype as "nonzero" (NaN is true) and give bool.
template <typename Fn>
RtValue logical(Call& call, Fn&& fn) {
  const Operand ops[] = {operand(call, 0, "self"), operand(call, 1, "other")};
  const Dims shape = broadcast_operands(ops);
  const std::vector<float> a = load_operand(ops[0], shape), b = load_operand(ops[1], shape);
  std::vector<float> out(a.size());
  for (size_t i = 0; i < a.size(); ++i)
    out[i] = fn(a[i] != 0.0f, b[i] != 0.0f) ? 1.0f : 0.0f;
  HostTensor result = call.alloc(shape, DType::kBool);
  store_f32(result.t, out);
  return RtValue::of(result);
}

template <typename Fn>
RtValue test(Call& call, Fn&& fn) {
  const HostTensor& x = call.tensor(0, "self");
  std::vector<float> v = load_f32(x.t);
  for (float& e : v)
    e = fn(e) ? 1.0f : 0.0f;
  HostTensor result = call.alloc(x.t.shape(), DType::kBool);
  store_f32(result.t, v);
  return RtValue::of(result);
}

// where(condition, self, other): self where condition is true, else other; the result takes
// self's and other's promoted dtype and the broadcast shape of all three.
RtValue where(Call& call) {
  const HostTensor& cond = call.tensor(0, "condition");
  const Operand ops[] = {operand(call, 1, "self"), operand(call, 2, "other")};
  const DType dtype = result_type(ops, call);
  const Dims shape = broadcast_shapes(cond.t.shape(), broadcast_operands(ops));
  const std::vector<float> c = load_f32(cond.t, shape);
  std::vector<float> a = load_operand(ops[0], shape);
  const std::vector<float> b = load_operand(ops[1], shape);
  for (size_t i = 0; i < a.size(); ++i) {
    if (c[i] == 0.0f) a[i] = b[i];
  }
  HostTensor result = call.alloc(shape, dtype);
  store_f32(result.t, a);
  return RtValue::of(result);
}

}  // namespace

void register_compare_kernels(Table& t) {
  struct Comparison {
    const char* name;
    bool (*fn)(float, float);
  };
  // IEEE comparisons: every one but ne is false when an operand is NaN.
  const Comparison comparisons[] = {
      {"eq", [](float a, float b) { return a == b; }},
      {"ne", [](float a, float b) { return a != b; }},
      {"lt", [](float a, float b) { return a < b; }},
      {"le", [](float a, float b) { return a <= b; }},
      {"gt", [](float a, float b) { return a > b; }},
      {"ge", [](float a, float b) { return a >= b; }},
  };
  for (const Comparison& cmp : comparisons) {
    for (const char* overload : {"Tensor", "Scalar"}) {
      t.emplace_back(fmt::format("aten.{}.{}", cmp.name, overload),
                     [fn = cmp.fn](Call& c) { return compare(c, fn); });
    }
  }

  t.emplace_back("aten.logical_and.default",
                 [](Call& c) { return logical(c, [](bool a, bool b) { return a && b; }); });
  t.emplace_back("aten.logical_or.default",
                 [](Call& c) { return logical(c, [](bool a, bool b) { return a || b; }); });
  t.emplace_back("aten.logical_xor.default",
                 [](Call& c) { return logical(c, [](bool a, bool b) { return a != b; }); });
  t.emplace_back("aten.logical_not.default",
                 [](Call& c) { return test(c, [](float x) { return x == 0.0f; }); });
  // The bitwise ops on bool tensors are the logical ones (PyTorch writes masks with ~, &, |).
  const std::pair<const char*, bool (*)(bool, bool)> bitwise[] = {
      {"and", [](bool a, bool b) { return a && b; }},
      {"or", [](bool a, bool b) { return a || b; }},
      {"xor", [](bool a, bool b) { return a != b; }},
  };
  for (const auto& [name, fn] : bitwise) {
    for (const char* overload : {"Tensor", "Scalar"}) {
      t.emplace_back(fmt::format("aten.bitwise_{}.{}", name, overload), [fn = fn](Call& c) {
        const HostTensor& x = c.tensor(0, "self");
        ASYNCTP_CHECK(x.t.dtype() == DType::kBool,
                      "{}: bitwise ops are supported on bool tensors only, got {}", c.where(),
                      x.t.describe());
        return logical(c, fn);
      });
    }
  }
  t.emplace_back("aten.bitwise_not.default", [](Call& c) {
    const HostTensor& x = c.tensor(0, "self");
    ASYNCTP_CHECK(x.t.dtype() == DType::kBool,
                  "{}: bitwise_not is supported on bool tensors only, got {}", c.where(),
                  x.t.describe());
    return test(c, [](float v) { return v == 0.0f; });
  });

  t.emplace_back("aten.isnan.default",
                 [](Call& c) { return test(c, [](float x) { return std::isnan(x); }); });
  t.emplace_back("aten.isinf.default",
                 [](Call& c) { return test(c, [](float x) { return std::isinf(x); }); });
  t.emplace_back("aten.isfinite.default",
                 [](Call& c) { return test(c, [](float x) { return std::isfinite(x); }); });

  for (const char* overload : {"self", "ScalarSelf", "ScalarOther", "Scalar"}) {
    t.emplace_back(fmt::format("aten.where.{}", overload), where);
  }
}

}  // namespace asynctp::graph
