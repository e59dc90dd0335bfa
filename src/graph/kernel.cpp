#include "graph/kernel.h"

#include <mutex>
#include <unordered_map>

#include "core/error.h"

namespace asynctp::graph {

std::string RtValue::describe() const {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kTensor:
      return tensor.t.describe();
    case Kind::kList:
      return fmt::format("list of {}", items.size());
    case Kind::kLiteral:
      return literal.describe();
  }
  return "?";
}

std::optional<DType> dtype_from_torch(std::string_view name) {
  if (name == "float32") return DType::kF32;
  if (name == "bfloat16") return DType::kBF16;
  if (name == "float16") return DType::kF16;
  if (name == "float8_e4m3fn") return DType::kF8E4M3;
  if (name == "float8_e5m2") return DType::kF8E5M2;
  if (name == "int64") return DType::kI64;
  if (name == "uint64") return DType::kU64;
  if (name == "bool") return DType::kBool;
  return std::nullopt;
}

std::string Call::where() const {
  return fmt::format("node {} ({})", node_.name, node_.target);
}

std::string Call::arg_name(size_t index, std::string_view key) const {
  return fmt::format("argument {} ('{}')", index, key);
}

const RtValue* Call::find(size_t index, std::string_view key) const {
  if (index < args_.size()) return &args_[index];
  for (const auto& [k, v] : kwargs_) {
    if (k == key) return &v;
  }
  return nullptr;
}

const RtValue* Call::kwarg(std::string_view key) const {
  for (const auto& [k, v] : kwargs_) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool Call::has(size_t index, std::string_view key) const {
  const RtValue* v = find(index, key);
  return v != nullptr && !v->is_none();
}

const RtValue& Call::value(size_t index, std::string_view key) const {
  const RtValue* v = find(index, key);
  ASYNCTP_CHECK(v != nullptr, "{}: missing {}", where(), arg_name(index, key));
  return *v;
}

const HostTensor& Call::tensor(size_t index, std::string_view key) const {
  const RtValue& v = value(index, key);
  ASYNCTP_CHECK(v.is_tensor(), "{}: {} must be a tensor, got {}", where(), arg_name(index, key),
                v.describe());
  return v.tensor;
}

double Call::number(size_t index, std::string_view key) const {
  const RtValue& v = value(index, key);
  ASYNCTP_CHECK(v.kind == RtValue::Kind::kLiteral &&
                    (v.literal.is_number() || v.literal.kind == Value::Kind::kBool),
                "{}: {} must be a number, got {}", where(), arg_name(index, key), v.describe());
  return v.literal.as_double();
}

double Call::number_or(size_t index, std::string_view key, double fallback) const {
  return has(index, key) ? number(index, key) : fallback;
}

int64_t Call::integer(size_t index, std::string_view key) const {
  const RtValue& v = value(index, key);
  ASYNCTP_CHECK(v.kind == RtValue::Kind::kLiteral && v.literal.is_int(),
                "{}: {} must be an integer, got {}", where(), arg_name(index, key), v.describe());
  return v.literal.i;
}

int64_t Call::integer_or(size_t index, std::string_view key, int64_t fallback) const {
  return has(index, key) ? integer(index, key) : fallback;
}

bool Call::boolean_or(size_t index, std::string_view key, bool fallback) const {
  if (!has(index, key)) return fallback;
  const RtValue& v = value(index, key);
  ASYNCTP_CHECK(v.kind == RtValue::Kind::kLiteral && v.literal.kind == Value::Kind::kBool,
                "{}: {} must be a bool, got {}", where(), arg_name(index, key), v.describe());
  return v.literal.b;
}

std::string Call::string(size_t index, std::string_view key) const {
  const RtValue& v = value(index, key);
  ASYNCTP_CHECK(v.kind == RtValue::Kind::kLiteral && v.literal.kind == Value::Kind::kString,
                "{}: {} must be a string, got {}", where(), arg_name(index, key), v.describe());
  return v.literal.s;
}

std::vector<int64_t> Call::int_list(size_t index, std::string_view key) const {
  const RtValue& v = value(index, key);
  std::vector<int64_t> out;
  if (v.kind == RtValue::Kind::kLiteral && v.literal.is_int())
    return {v.literal.i};  // int for [int]
  ASYNCTP_CHECK(v.kind == RtValue::Kind::kLiteral && v.literal.is_list(),
                "{}: {} must be a list of integers, got {}", where(), arg_name(index, key),
                v.describe());
  for (const auto& item : v.literal.list) {
    ASYNCTP_CHECK(item.is_int(), "{}: {} must hold integers, got {}", where(), arg_name(index, key),
                  item.describe());
    out.push_back(item.i);
  }
  return out;
}

std::vector<HostTensor> Call::tensor_list(size_t index, std::string_view key) const {
  const RtValue& v = value(index, key);
  ASYNCTP_CHECK(v.kind == RtValue::Kind::kList, "{}: {} must be a list of tensors, got {}", where(),
                arg_name(index, key), v.describe());
  std::vector<HostTensor> out;
  for (size_t i = 0; i < v.items.size(); ++i) {
    ASYNCTP_CHECK(v.items[i].is_tensor(), "{}: {}[{}] must be a tensor, got {}", where(),
                  arg_name(index, key), i, v.items[i].describe());
    out.push_back(v.items[i].tensor);
  }
  return out;
}

std::optional<DType> Call::dtype_or(size_t index, std::string_view key) const {
  if (!has(index, key)) return std::nullopt;
  const RtValue& v = value(index, key);
  ASYNCTP_CHECK(v.kind == RtValue::Kind::kLiteral && v.literal.kind == Value::Kind::kDType,
                "{}: {} must be a dtype, got {}", where(), arg_name(index, key), v.describe());
  auto d = dtype_from_torch(v.literal.s);
  ASYNCTP_CHECK(d.has_value(),
                "{}: dtype {} is not supported (float32, bfloat16, float16, "
                "float8_e4m3fn, float8_e5m2, int64, uint64, bool)",
                where(), v.literal.s);
  return d;
}

std::optional<DType> Call::meta_dtype() const {
  if (!node_.val.is_tensor()) return std::nullopt;
  return dtype_from_torch(node_.val.tensor.dtype);
}

std::optional<Dims> Call::meta_strides() const {
  if (!node_.val.is_tensor()) return std::nullopt;
  return node_.val.tensor.stride;
}

HostTensor Call::alloc(const Dims& shape, DType dtype) const {
  std::optional<Dims> strides;
  if (node_.val.is_tensor() && node_.val.tensor.shape == shape) strides = node_.val.tensor.stride;
  return host_empty(shape, dtype, strides);
}

namespace {
const std::unordered_map<std::string, Kernel>& registry() {
  static const std::unordered_map<std::string, Kernel> table = [] {
    std::vector<std::pair<std::string, Kernel>> entries;
    register_pointwise_kernels(entries);
    register_compare_kernels(entries);
    register_shape_kernels(entries);
    register_reduction_kernels(entries);
    register_attention_kernels(entries);
    register_device_kernels(entries);
    std::unordered_map<std::string, Kernel> out;
    for (auto& [name, kernel] : entries) {
      ASYNCTP_CHECK(out.emplace(name, std::move(kernel)).second, "kernel {} registered twice",
                    name);
    }
    return out;
  }();
  return table;
}
}  // namespace

const Kernel* find_kernel(std::string_view target) {
  const auto& table = registry();
  auto it = table.find(std::string(target));
  return it == table.end() ? nullptr : &it->second;
}

std::vector<std::string> kernel_targets() {
  std::vector<std::string> out;
  for (const auto& [name, kernel] : registry())
    out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace asynctp::graph
