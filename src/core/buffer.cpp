#include "core/buffer.h"
#include "core/error.h"

#include <cstdlib>

namespace asynctp {

Buffer Buffer::host(size_t bytes) {
  constexpr size_t kAlign = 4096;
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  void* data = std::aligned_alloc(kAlign, rounded);
  ASYNCTP_CHECK(data != nullptr, "host allocation of {} bytes failed", bytes);
  return Buffer(data, bytes, Device::cpu(), [](void* p) { std::free(p); });
}

Tensor Buffer::view(Dims shape, DType dtype, size_t byte_offset) const {
  ASYNCTP_CHECK(data_ != nullptr || shape.product() == 0, "view of an empty buffer");
  const size_t bytes = static_cast<size_t>(shape.product()) * element_size(dtype);
  ASYNCTP_CHECK(byte_offset + bytes <= bytes_,
                "a {}{} view at byte offset {} needs {} bytes but the buffer holds {}", dtype,
                shape, byte_offset, byte_offset + bytes, bytes_);
  return Tensor(static_cast<char*>(data_) + byte_offset, dtype, shape, device_);
}

OwnedTensor empty_host(Dims shape, DType dtype) {
  Buffer buffer = Buffer::host(static_cast<size_t>(shape.product()) * element_size(dtype));
  Tensor view = buffer.view(shape, dtype);
  return {std::move(buffer), view};
}

}  // namespace asynctp
