#include "graph/pointwise.h"

#include <cmath>
#include <optional>

#include "core/error.h"

namespace asynctp::graph {

Operand operand(const Call& call, size_t index, std::string_view key) {
  const RtValue& v = call.value(index, key);
  if (v.is_tensor()) return {&v.tensor, 0, DType::kF32};
  const double x = call.number(index, key);
  const DType category = v.literal.kind == Value::Kind::kBool ? DType::kBool
                         : v.literal.is_int()                 ? DType::kI64
                                                              : DType::kF32;
  return {nullptr, x, category};
}

DType promote_types(DType a, DType b, const Call& call) {
  if (a == b) return a;
  if (a == DType::kBool) return b;
  if (b == DType::kBool) return a;
  if (!is_floating_point(a) || !is_floating_point(b)) {
    ASYNCTP_CHECK(is_floating_point(a) || is_floating_point(b),
                  "{}: no type promotion between {} and {}", call.where(), a, b);
    return is_floating_point(a) ? a : b;
  }
  ASYNCTP_CHECK(!is_float8(a) && !is_float8(b), "{}: no type promotion between {} and {}",
                call.where(), a, b);
  return DType::kF32;
}

namespace {

// PyTorch's combine_categories: a lower priority level counts only through a higher category.
std::optional<DType> combine(std::optional<DType> higher, std::optional<DType> lower,
                             const Call& call) {
  if (!higher) return lower;
  if (!lower) return higher;
  if (is_floating_point(*higher)) return higher;
  if (*higher == DType::kBool || is_floating_point(*lower))
    return promote_types(*higher, *lower, call);
  return higher;
}

}  // namespace

DType result_type(std::span<const Operand> operands, const Call& call) {
  std::optional<DType> dims, zero_dim, numbers;
  auto update = [&](std::optional<DType>& level, DType d) {
    level = level ? promote_types(*level, d, call) : d;
  };
  for (const Operand& op : operands) {
    if (op.tensor == nullptr)
      update(numbers, op.scalar_dtype);
    else if (op.tensor->t.dim() == 0)
      update(zero_dim, op.tensor->t.dtype());
    else
      update(dims, op.tensor->t.dtype());
  }
  const auto result = combine(dims, combine(zero_dim, numbers, call), call);
  ASYNCTP_CHECK(result.has_value(), "{}: no operands", call.where());
  return *result;
}

Dims broadcast_operands(std::span<const Operand> operands) {
  Dims shape;
  for (const Operand& op : operands) {
    if (op.tensor != nullptr) shape = broadcast_shapes(shape, op.tensor->t.shape());
  }
  return shape;
}

std::vector<float> load_operand(const Operand& op, const Dims& shape) {
  if (op.tensor != nullptr) return load_f32(op.tensor->t, shape);
  return std::vector<float>(static_cast<size_t>(shape.product()), static_cast<float>(op.scalar));
}

void round_to(std::vector<float>& values, DType dtype) {
  if (dtype == DType::kF32) return;
  if (dtype == DType::kBool) {
    for (float& v : values)
      v = v != 0.0f ? 1.0f : 0.0f;
    return;
  }
  if (!is_floating_point(dtype)) {
    for (float& v : values)
      v = std::trunc(v);
    return;
  }
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    for (float& v : values)
      v = to_float(from_float<T>(v));
  });
}

}  // namespace asynctp::graph
