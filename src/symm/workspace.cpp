#include "symm/workspace.h"

#include "core/log.h"

namespace asynctp {

SymmWorkspace::SymmWorkspace(SymmAllocator& allocator, Backend& backend, size_t max_bytes)
    : allocator_(allocator), backend_(backend), max_bytes_(max_bytes) {}

SymmetricMemory& SymmWorkspace::get(size_t bytes) {
  if (memory_ && memory_->size() >= bytes) return *memory_;
  ASYNCTP_CHECK(
      bytes <= max_bytes_,
      "the symmetric workspace would need {} bytes; its limit is {} (ASYNCTP_MAX_WORKSPACE_MB)",
      bytes, max_bytes_);
  ASYNCTP_CHECK(
      !backend_.capturing(),
      "the symmetric workspace must grow to {} bytes (it has {}) during CUDA-graph capture, "
      "where nothing may allocate or rendezvous; run the op once before capturing it",
      bytes, capacity());
  // Grow geometrically so that a sequence of slightly larger requests reallocates rarely.
  constexpr size_t kGranule = size_t{1} << 20;
  size_t target = std::max(bytes, std::min(max_bytes_, capacity() * 2));
  target = std::min(max_bytes_, (target + kGranule - 1) / kGranule * kGranule);
  target = std::max(target, bytes);
  if (memory_) {
    backend_.synchronize();  // nothing in flight may still touch the old buffer
    memory_.reset();
  }
  ASYNCTP_LOG_DEBUG("symmetric workspace grows to {} bytes", target);
  memory_ = allocator_.allocate(target);
  return *memory_;
}

}  // namespace asynctp
