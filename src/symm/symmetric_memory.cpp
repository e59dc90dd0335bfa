#include "symm/symmetric_memory.h"

#include <asynctp/group.h>
#include "symm/cpu_symmetric_memory.h"
#ifdef ASYNCTP_WITH_CUDA
#include "symm/cuda/cuda_symmetric_memory.h"
#endif

namespace asynctp {

Tensor SymmetricMemory::buffer(int peer, Dims shape, DType dtype, size_t byte_offset) {
  check_peer(peer, "buffer");
  const size_t bytes = static_cast<size_t>(shape.product()) * element_size(dtype);
  ASYNCTP_CHECK(byte_offset + bytes <= size_,
                "symmetric buffer view {}{} at offset {} needs {} bytes; the allocation has {}",
                dtype, shape, byte_offset, byte_offset + bytes, size_);
  return Tensor(static_cast<char*>(buffer_ptr(peer)) + byte_offset, dtype, shape, device_);
}

void SymmetricMemory::check_peer(int peer, const char* what) const {
  ASYNCTP_CHECK(peer >= 0 && peer < world_size_, "{}: peer {} out of range [0, {})", what, peer,
                world_size_);
}

void SymmetricMemory::check_channel(int channel, const char* what) const {
  ASYNCTP_CHECK(channel >= 0 && channel < kNumChannels, "{}: channel {} out of range [0, {})", what,
                channel, kNumChannels);
}

void SymmetricMemory::check_reset(const uint32_t* flags, int count) const {
  ASYNCTP_CHECK(count >= 0 && (count == 0 || flags != nullptr), "reset_and_barrier: {} flags at {}",
                count, static_cast<const void*>(flags));
}

std::unique_ptr<SymmAllocator> make_symm_allocator(Backend& backend, Group& group) {
  if (backend.device().is_cpu()) return make_cpu_symm_allocator(group);
#ifdef ASYNCTP_WITH_CUDA
  if (backend.device().is_cuda()) return make_cuda_symm_allocator(backend, group);
#endif
  ASYNCTP_FAIL("no symmetric memory for backend '{}'", backend.name());
}

}  // namespace asynctp
