#include <asynctp/tensor.h>

#include <numeric>

#include "core/error.h"

namespace asynctp {

std::string Device::to_string() const {
  return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index);
}

Dims contiguous_strides(const Dims& shape) {
  Dims strides = Dims::filled(shape.size(), 1);
  int64_t running = 1;
  for (int i = shape.size() - 1; i >= 0; --i) {
    strides[i] = running;
    running *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

Tensor::Tensor(void* data, DType dtype, Dims shape, Device device)
    : Tensor(data, dtype, shape, contiguous_strides(shape), device) {}

Tensor::Tensor(void* data, DType dtype, Dims shape, Dims strides, Device device)
    : data_(data),
      dtype_(dtype),
      device_(device),
      shape_(shape),
      strides_(strides),
      defined_(true) {
  ASYNCTP_CHECK(shape.size() == strides.size(), "shape {} and strides {} differ in rank", shape,
                strides);
  for (int i = 0; i < shape.size(); ++i) {
    ASYNCTP_CHECK(shape[i] >= 0, "negative size {} in dim {} of shape {}", shape[i], i, shape);
    ASYNCTP_CHECK(strides[i] >= 0, "negative stride {} in dim {} (strides {})", strides[i], i,
                  strides);
  }
  ASYNCTP_CHECK(data != nullptr || numel() == 0, "null data pointer for a tensor of shape {}",
                shape);
}

int Tensor::wrap_dim(int d) const {
  const int n = dim();
  ASYNCTP_CHECK(d >= -n && d < n && n > 0, "dim {} out of range for a tensor of rank {} ({})", d, n,
                describe());
  return d < 0 ? d + n : d;
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // as in torch: no element is out of place
  int64_t expected = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

size_t Tensor::extent_bytes() const {
  if (numel() == 0) return 0;
  int64_t last = 0;
  for (int i = 0; i < dim(); ++i)
    last += (shape_[i] - 1) * strides_[i];
  return static_cast<size_t>(last + 1) * element_size();
}

Tensor Tensor::narrow(int d, int64_t start, int64_t length) const {
  d = wrap_dim(d);
  ASYNCTP_CHECK(start >= 0 && length >= 0 && start + length <= shape_[d],
                "narrow(dim={}, start={}, length={}) out of range for {}", d, start, length,
                describe());
  Tensor out = *this;
  out.shape_[d] = length;
  if (length > 0) out.data_ = static_cast<char*>(data_) + start * strides_[d] * element_size();
  return out;
}

Tensor Tensor::select(int d, int64_t index) const {
  d = wrap_dim(d);
  ASYNCTP_CHECK(index >= 0 && index < shape_[d], "select(dim={}, index={}) out of range for {}", d,
                index, describe());
  Tensor out = narrow(d, index, 1);
  out.shape_.erase(d);
  out.strides_.erase(d);
  return out;
}

Tensor Tensor::transpose(int d0, int d1) const {
  d0 = wrap_dim(d0);
  d1 = wrap_dim(d1);
  Tensor out = *this;
  std::swap(out.shape_[d0], out.shape_[d1]);
  std::swap(out.strides_[d0], out.strides_[d1]);
  return out;
}

Tensor Tensor::permute(std::span<const int> order) const {
  ASYNCTP_CHECK(static_cast<int>(order.size()) == dim(), "permute order of {} dims for {}",
                order.size(), describe());
  Tensor out = *this;
  std::array<bool, kMaxDims> seen{};
  for (int i = 0; i < dim(); ++i) {
    const int src = wrap_dim(order[i]);
    ASYNCTP_CHECK(!seen[src], "permute order repeats dim {}", src);
    seen[src] = true;
    out.shape_[i] = shape_[src];
    out.strides_[i] = strides_[src];
  }
  return out;
}

Tensor Tensor::movedim(int source, int destination) const {
  source = wrap_dim(source);
  destination = wrap_dim(destination);
  Tensor out = *this;
  const int64_t size = out.shape_[source];
  const int64_t stride = out.strides_[source];
  out.shape_.erase(source);
  out.strides_.erase(source);
  out.shape_.insert(destination, size);
  out.strides_.insert(destination, stride);
  return out;
}

Tensor Tensor::unsqueeze(int d) const {
  const int n = dim();
  ASYNCTP_CHECK(d >= -(n + 1) && d <= n, "unsqueeze dim {} out of range for rank {}", d, n);
  if (d < 0) d += n + 1;
  Tensor out = *this;
  const int64_t stride = d < n ? shape_[d] * strides_[d] : 1;
  out.shape_.insert(d, 1);
  out.strides_.insert(d, stride);
  return out;
}

Tensor Tensor::flatten(int start_dim, int end_dim) const {
  if (dim() == 0) return view(Dims{1});
  start_dim = wrap_dim(start_dim);
  end_dim = wrap_dim(end_dim);
  ASYNCTP_CHECK(start_dim <= end_dim, "flatten start_dim {} > end_dim {}", start_dim, end_dim);
  Dims shape;
  for (int i = 0; i < start_dim; ++i)
    shape.push_back(shape_[i]);
  int64_t merged = 1;
  for (int i = start_dim; i <= end_dim; ++i)
    merged *= shape_[i];
  shape.push_back(merged);
  for (int i = end_dim + 1; i < dim(); ++i)
    shape.push_back(shape_[i]);
  return view(shape);
}

bool compute_view_strides(const Dims& shape, const Dims& strides, const Dims& new_shape,
                          Dims* new_strides) {
  *new_strides = Dims::filled(new_shape.size(), 1);
  if (shape.product() == 0 || shape.size() == 0) {
    *new_strides = contiguous_strides(new_shape);
    return shape.product() == new_shape.product();
  }
  // Walk the old dims from the innermost, grouping runs that are mutually contiguous ("chunks");
  // each chunk must be covered exactly by a run of new dims.
  int view_d = new_shape.size() - 1;
  int64_t chunk_base_stride = strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int tensor_d = shape.size() - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= shape[tensor_d];
    const bool chunk_ends =
        tensor_d == 0 ||
        (shape[tensor_d - 1] != 1 && strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
      (*new_strides)[view_d] = view_numel * chunk_base_stride;
      view_numel *= new_shape[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return false;
    if (tensor_d > 0) {
      chunk_base_stride = strides[tensor_d - 1];
      tensor_numel = 1;
      view_numel = 1;
    }
  }
  return view_d == -1;
}

Tensor Tensor::view(Dims shape) const {
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      ASYNCTP_CHECK(infer < 0, "view shape {} has more than one -1", shape);
      infer = i;
    } else {
      ASYNCTP_CHECK(shape[i] >= 0, "view shape {} has negative size {}", shape, shape[i]);
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    ASYNCTP_CHECK(known != 0 && numel() % known == 0, "cannot view {} as {}", describe(), shape);
    shape[infer] = numel() / known;
  }
  ASYNCTP_CHECK(shape.product() == numel(), "cannot view {} ({} elements) as {} ({} elements)",
                describe(), numel(), shape, shape.product());
  Dims strides;
  ASYNCTP_CHECK(compute_view_strides(shape_, strides_, shape, &strides),
                "cannot view {} as {}: its strides are not compatible (copy it first)", describe(),
                shape);
  Tensor out = *this;
  out.shape_ = shape;
  out.strides_ = strides;
  return out;
}

std::vector<Tensor> Tensor::chunk(int chunks, int d) const {
  ASYNCTP_CHECK(chunks > 0, "chunk count must be positive, got {}", chunks);
  d = wrap_dim(d);
  const int64_t size = shape_[d];
  // An empty dim gives `chunks` empty chunks, as torch's chunk() does (through split_with_sizes),
  // so that a caller indexing chunk r of every rank finds one.
  if (size == 0) return std::vector<Tensor>(chunks, *this);
  const int64_t step = (size + chunks - 1) / chunks;
  std::vector<Tensor> out;
  for (int64_t start = 0; start < size; start += step) {
    out.push_back(narrow(d, start, std::min(step, size - start)));
  }
  return out;
}

Tensor Tensor::with_data(void* data) const {
  Tensor out = *this;
  out.data_ = data;
  return out;
}

std::string Tensor::describe() const {
  if (!defined_) return "undefined tensor";
  return fmt::format("{}{} strides {} on {}", dtype_, shape_, strides_, device_.to_string());
}

}  // namespace asynctp
