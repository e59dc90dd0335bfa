#include "graph/host_tensor.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>

#include "core/error.h"

namespace asynctp::graph {

namespace {

// Calls fn(offset) for every element of (shape, strides) in row-major order.
template <typename Fn>
void for_each_offset(const Dims& shape, const Dims& strides, Fn&& fn) {
  const int rank = shape.size();
  if (shape.product() == 0) return;
  std::array<int64_t, kMaxDims> index{};
  int64_t offset = 0;
  while (true) {
    fn(offset);
    int d = rank - 1;
    for (; d >= 0; --d) {
      ++index[d];
      offset += strides[d];
      if (index[d] < shape[d]) break;
      offset -= strides[d] * shape[d];
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

// f32 holds every integer up to 2^24 exactly.
constexpr int64_t kExactIntLimit = int64_t{1} << 24;

// Calls fn(T{}) with T the element type of dtype: the float storage types of core/dtype.h,
// int64_t, uint64_t, or uint8_t for bool (one byte, 0 or 1, as PyTorch stores it).
template <typename Fn>
void dispatch_host(DType dtype, Fn&& fn) {
  if (dtype == DType::kI64) return fn(int64_t{});
  if (dtype == DType::kU64) return fn(uint64_t{});
  if (dtype == DType::kBool) return fn(uint8_t{});
  dispatch_dtype(dtype, fn);
}

template <typename T>
float element_to_f32(T v) {
  if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>) {
    ASYNCTP_CHECK((std::is_unsigned_v<T> || static_cast<int64_t>(v) >= -kExactIntLimit) &&
                      v <= static_cast<T>(kExactIntLimit),
                  "integer value {} is beyond +-2^24, which the host kernels' f32 arithmetic "
                  "holds exactly",
                  v);
    return static_cast<float>(v);
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    return v != 0 ? 1.0f : 0.0f;
  } else {
    return to_float(v);
  }
}

template <typename T>
T element_from_f32(float v) {
  if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>) {
    ASYNCTP_CHECK(std::isfinite(v) && std::fabs(v) <= static_cast<float>(kExactIntLimit) &&
                      (std::is_signed_v<T> || v > -1.0f),
                  "{} does not convert to an exact {} in the host kernels (finite, within "
                  "+-2^24)",
                  v, std::is_signed_v<T> ? "int64" : "uint64");
    return static_cast<T>(v);  // toward zero, as PyTorch's float -> integer casts
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    return v != 0.0f ? 1 : 0;  // NaN != 0: true
  } else {
    return from_float<T>(v);
  }
}

}  // namespace

bool is_dense_layout(const Dims& shape, const Dims& strides) {
  if (shape.size() != strides.size()) return false;
  std::vector<int> order(shape.size());
  std::iota(order.begin(), order.end(), 0);
  // Innermost first: smallest stride, ties broken towards the later dim (as PyTorch orders them).
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return strides[a] != strides[b] ? strides[a] < strides[b] : a > b;
  });
  int64_t expected = 1;
  for (int d : order) {
    if (shape[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

HostTensor host_empty(const Dims& shape, DType dtype, const std::optional<Dims>& strides) {
  const Dims s = strides && is_dense_layout(shape, *strides) ? *strides : contiguous_strides(shape);
  const size_t bytes =
      std::max<size_t>(static_cast<size_t>(shape.product()) * element_size(dtype), 1);
  auto storage = std::make_shared<Buffer>(Buffer::host(bytes));
  return {storage, Tensor(storage->data(), dtype, shape, s, Device::cpu())};
}

HostTensor host_contiguous(const HostTensor& t) {
  if (t.t.is_contiguous()) return t;
  HostTensor out = host_empty(t.t.shape(), t.t.dtype());
  copy_elements(out.t, t.t);
  return out;
}

std::vector<float> load_f32(const Tensor& t) {
  return load_f32(t, t.shape());
}

std::vector<float> load_f32(const Tensor& t, const Dims& shape) {
  const Tensor v = expand_view(t, shape);
  std::vector<float> out;
  out.reserve(static_cast<size_t>(shape.product()));
  dispatch_host(v.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(v.data());
    for_each_offset(v.shape(), v.strides(),
                    [&](int64_t off) { out.push_back(element_to_f32(p[off])); });
  });
  return out;
}

void store_f32(const Tensor& t, const std::vector<float>& values) {
  ASYNCTP_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "store of {} values into {}",
                values.size(), t.describe());
  size_t i = 0;
  dispatch_host(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.data());
    for_each_offset(t.shape(), t.strides(),
                    [&](int64_t off) { p[off] = element_from_f32<T>(values[i++]); });
  });
}

void copy_elements(const Tensor& dst, const Tensor& src) {
  ASYNCTP_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype(),
                "copy of {} into {}: shapes and dtypes must match", src.describe(), dst.describe());
  std::vector<uint8_t> bytes;
  const size_t size = element_size(src.dtype());
  bytes.reserve(static_cast<size_t>(src.numel()) * size);
  const auto* from = static_cast<const uint8_t*>(src.data());
  for_each_offset(src.shape(), src.strides(), [&](int64_t off) {
    bytes.insert(bytes.end(), from + off * static_cast<int64_t>(size),
                 from + (off + 1) * static_cast<int64_t>(size));
  });
  auto* to = static_cast<uint8_t*>(dst.data());
  size_t i = 0;
  for_each_offset(dst.shape(), dst.strides(), [&](int64_t off) {
    std::memcpy(to + off * static_cast<int64_t>(size), &bytes[i], size);
    i += size;
  });
}

Dims broadcast_shapes(const Dims& a, const Dims& b) {
  const int rank = std::max(a.size(), b.size());
  Dims out = Dims::filled(rank, 1);
  for (int i = 0; i < rank; ++i) {
    const int ia = a.size() - rank + i, ib = b.size() - rank + i;
    const int64_t sa = ia >= 0 ? a[ia] : 1, sb = ib >= 0 ? b[ib] : 1;
    ASYNCTP_CHECK(sa == sb || sa == 1 || sb == 1, "shapes {} and {} do not broadcast", a, b);
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

Tensor expand_view(const Tensor& t, const Dims& shape) {
  if (t.shape() == shape) return t;
  ASYNCTP_CHECK(shape.size() >= t.dim(), "cannot expand {} to {}", t.describe(), shape);
  Dims strides = Dims::filled(shape.size(), 0);
  const int lead = shape.size() - t.dim();
  for (int i = 0; i < t.dim(); ++i) {
    const int64_t s = t.shape()[i];
    ASYNCTP_CHECK(s == shape[lead + i] || s == 1, "cannot expand {} to {}", t.describe(), shape);
    strides[lead + i] = s == 1 && shape[lead + i] != 1 ? 0 : t.strides()[i];
  }
  void* data = t.data();
  if (data == nullptr) {  // an empty tensor: any pointer will do, nothing is read
    static char dummy;
    data = &dummy;
  }
  return Tensor(data, t.dtype(), shape, strides, t.device());
}

}  // namespace asynctp::graph
