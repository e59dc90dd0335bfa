// Dims: a small fixed-capacity vector of int64 for shapes and strides (no heap allocation, so
// views are cheap to make on the hot path of an op).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include <asynctp/dtype.h>

namespace asynctp {

namespace detail {
// Throws asynctp::Error naming `size`: a Dims holds 0 to kMaxDims values.
[[noreturn]] void throw_too_many_dims(int64_t size);
}  // namespace detail

class Dims {
 public:
  Dims() = default;
  Dims(std::initializer_list<int64_t> values)
      : Dims(std::span<const int64_t>(values.begin(), values.size())) {}
  explicit Dims(std::span<const int64_t> values) {
    if (values.size() > kMaxDims) detail::throw_too_many_dims(values.size());
    size_ = static_cast<int>(values.size());
    std::copy(values.begin(), values.end(), data_.begin());
  }
  static Dims filled(int size, int64_t value) {
    if (size < 0 || size > kMaxDims) detail::throw_too_many_dims(size);
    Dims d;
    d.size_ = size;
    std::fill_n(d.data_.begin(), size, value);
    return d;
  }

  int size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t& operator[](int i) { return data_[i]; }
  int64_t operator[](int i) const { return data_[i]; }
  int64_t back() const { return data_[size_ - 1]; }
  const int64_t* begin() const { return data_.data(); }
  const int64_t* end() const { return data_.data() + size_; }
  int64_t* begin() { return data_.data(); }
  int64_t* end() { return data_.data() + size_; }
  std::span<const int64_t> span() const { return {data_.data(), static_cast<size_t>(size_)}; }

  void push_back(int64_t v) {
    if (size_ == kMaxDims) detail::throw_too_many_dims(size_ + 1);
    data_[size_++] = v;
  }
  void insert(int pos, int64_t v) {
    if (size_ == kMaxDims) detail::throw_too_many_dims(size_ + 1);
    std::copy_backward(data_.begin() + pos, data_.begin() + size_, data_.begin() + size_ + 1);
    data_[pos] = v;
    ++size_;
  }
  void erase(int pos) {
    std::copy(data_.begin() + pos + 1, data_.begin() + size_, data_.begin() + pos);
    --size_;
  }

  int64_t product() const {
    int64_t p = 1;
    for (int i = 0; i < size_; ++i)
      p *= data_[i];
    return p;
  }
  // "[4, 8]"
  std::string to_string() const;

  friend bool operator==(const Dims& a, const Dims& b) {
    return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
  }

 private:
  std::array<int64_t, kMaxDims> data_{};
  int size_ = 0;
};

}  // namespace asynctp
