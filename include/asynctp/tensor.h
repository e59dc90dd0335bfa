// Tensor: a non-owning strided view (pointer, dtype, shape, strides in elements, device), and the
// shape helpers the ops need (narrow, select, transpose, permute, movedim, flatten, view, chunk).
// Views never copy; a helper that cannot express its result as a view of the same memory throws,
// naming the shape and strides, exactly where PyTorch's view() would.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include <asynctp/dims.h>
#include <asynctp/dtype.h>

namespace asynctp {

enum class DeviceKind : uint8_t { kCpu, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;

  static Device cpu() { return {DeviceKind::kCpu, 0}; }
  static Device cuda(int index) { return {DeviceKind::kCuda, index}; }
  bool is_cpu() const { return kind == DeviceKind::kCpu; }
  bool is_cuda() const { return kind == DeviceKind::kCuda; }
  std::string to_string() const;
  friend bool operator==(const Device&, const Device&) = default;
};

// Row-major strides of a shape.
Dims contiguous_strides(const Dims& shape);

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false
  Tensor(void* data, DType dtype, Dims shape, Device device = Device::cpu());
  Tensor(void* data, DType dtype, Dims shape, Dims strides, Device device = Device::cpu());

  bool defined() const { return defined_; }
  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int dim() const { return shape_.size(); }
  const Dims& shape() const { return shape_; }
  const Dims& strides() const { return strides_; }
  int64_t size(int d) const { return shape_[wrap_dim(d)]; }
  int64_t stride(int d) const { return strides_[wrap_dim(d)]; }
  int64_t numel() const { return shape_.product(); }
  size_t element_size() const { return asynctp::element_size(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  bool is_contiguous() const;
  // Bytes from data() to one past the furthest element (0 for an empty tensor): what a backing
  // allocation must hold. Assumes non-negative strides, which every view here has.
  size_t extent_bytes() const;

  // Maps a possibly negative dim into [0, dim()), throwing when it is out of range.
  int wrap_dim(int d) const;

  Tensor narrow(int dim, int64_t start, int64_t length) const;
  Tensor select(int dim, int64_t index) const;
  Tensor transpose(int dim0, int dim1) const;
  Tensor t() const { return transpose(0, 1); }
  Tensor permute(std::span<const int> order) const;
  Tensor permute(std::initializer_list<int> order) const {
    return permute(std::span<const int>(order.begin(), order.size()));
  }
  Tensor movedim(int source, int destination) const;
  Tensor unsqueeze(int dim) const;
  Tensor flatten(int start_dim = 0, int end_dim = -1) const;
  // Like torch's view(): one entry may be -1; throws when the strides don't allow a view.
  Tensor view(Dims shape) const;
  // Like torch's chunk(): chunks of ceil(size/chunks) along dim, the last one possibly smaller.
  std::vector<Tensor> chunk(int chunks, int dim) const;
  // The same view reinterpreted with another pointer (same shape, strides, dtype, device).
  Tensor with_data(void* data) const;

  // "bf16[4, 8] strides [8, 1] on cpu"
  std::string describe() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_{};
  Dims shape_;
  Dims strides_;
  bool defined_ = false;
};

// Strides for `new_shape` viewing memory laid out as (shape, strides), or false if impossible.
bool compute_view_strides(const Dims& shape, const Dims& strides, const Dims& new_shape,
                          Dims* new_strides);

}  // namespace asynctp
