#include "symm/workspace.h"

#include "core/log.h"

namespace asynctp {

SymmWorkspace::SymmWorkspace(SymmAllocator& allocator, Backend& backend, size_t max_bytes,
                             std::string name)
    : allocator_(allocator), backend_(backend), max_bytes_(max_bytes), name_(std::move(name)) {}

SymmetricMemory& SymmWorkspace::get(size_t bytes, Stream& stream) {
  if (memory_ && memory_->size() >= bytes) return *memory_;
  ASYNCTP_CHECK(bytes <= max_bytes_,
                "{} would need {} bytes; its limit is {} (ASYNCTP_MAX_WORKSPACE_MB)", name_, bytes,
                max_bytes_);
  ASYNCTP_CAPTURE_CHECK(
      !backend_.capturing(stream),
      "{} must grow to {} bytes (it has {}) while the op's stream is captured into a CUDA graph, "
      "where nothing may allocate or rendezvous; run the op once or reserve for it before "
      "capturing it",
      name_, bytes, capacity());
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
