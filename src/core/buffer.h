// Buffer: owning memory (host or device) released by the deleter its allocator supplied.
// Tensors are views into buffers; a buffer must outlive every view of it.
#pragma once

#include <cstddef>
#include <functional>
#include <utility>

#include <asynctp/tensor.h>

#include "core/dtype.h"

namespace asynctp {

class Buffer {
 public:
  using Deleter = std::function<void(void*)>;

  Buffer() = default;
  Buffer(void* data, size_t bytes, Device device, Deleter deleter)
      : data_(data), bytes_(bytes), device_(device), deleter_(std::move(deleter)) {}
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
      device_ = other.device_;
      deleter_ = std::move(other.deleter_);
      other.deleter_ = nullptr;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  // Page-aligned host memory (uninitialised).
  static Buffer host(size_t bytes);

  void reset() {
    if (data_ != nullptr && deleter_) deleter_(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  Device device() const { return device_; }
  bool empty() const { return data_ == nullptr; }

  // A view of `shape` (contiguous) starting `byte_offset` bytes in; throws if it does not fit.
  Tensor view(Dims shape, DType dtype, size_t byte_offset = 0) const;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_{};
  Deleter deleter_;
};

// A buffer together with one contiguous view of all of it: what allocating helpers return.
struct OwnedTensor {
  Buffer buffer;
  Tensor tensor;

  operator const Tensor&() const { return tensor; }  // NOLINT(google-explicit-constructor)
  const Tensor* operator->() const { return &tensor; }
};

OwnedTensor empty_host(Dims shape, DType dtype);

}  // namespace asynctp
