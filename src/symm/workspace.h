// SymmWorkspace: the per-group symmetric buffer the fused ops and the symmetric-memory
// collectives work in. It grows on demand (never shrinks) up to a limit; growing is collective,
// which is safe because every rank runs the same ops with the same shapes.
#pragma once

#include <memory>
#include <string>

#include "symm/symmetric_memory.h"

namespace asynctp {

class SymmWorkspace {
 public:
  SymmWorkspace(SymmAllocator& allocator, Backend& backend, size_t max_bytes,
                std::string name = "the symmetric workspace");

  // Why symmetric memory cannot be used in this group (empty when it can).
  const std::string& unavailable_reason() const { return allocator_.unavailable_reason(); }
  size_t max_bytes() const { return max_bytes_; }
  size_t capacity() const { return memory_ ? memory_->size() : 0; }
  bool fits(size_t bytes) const { return bytes <= max_bytes_; }

  // Collective: a symmetric buffer of at least `bytes`, for work on `stream`. Reallocates (after
  // waiting for all work in flight on this backend) when the current one is too small. Throws
  // Error if `bytes` is over the limit, CaptureError if it would have to grow while `stream` is
  // being captured into a CUDA graph. `what` names the workspace in those messages.
  SymmetricMemory& get(size_t bytes, Stream& stream);

 private:
  SymmAllocator& allocator_;
  Backend& backend_;
  size_t max_bytes_;
  std::string name_;
  std::unique_ptr<SymmetricMemory> memory_;
};

}  // namespace asynctp
