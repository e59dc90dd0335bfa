// SymmWorkspace: the per-group symmetric buffer the fused ops and the symmetric-memory
// collectives work in. It grows on demand (never shrinks) up to a limit; growing is collective,
// which is safe because every rank runs the same ops with the same shapes.
#pragma once

#include <memory>

#include "symm/symmetric_memory.h"

namespace asynctp {

class SymmWorkspace {
 public:
  SymmWorkspace(SymmAllocator& allocator, Backend& backend, size_t max_bytes);

  // Why symmetric memory cannot be used in this group (empty when it can).
  const std::string& unavailable_reason() const { return allocator_.unavailable_reason(); }
  size_t max_bytes() const { return max_bytes_; }
  size_t capacity() const { return memory_ ? memory_->size() : 0; }
  bool fits(size_t bytes) const { return bytes <= max_bytes_; }

  // Collective: a symmetric buffer of at least `bytes`. Reallocates (after waiting for all work
  // in flight on this backend) when the current one is too small. Throws if `bytes` is over the
  // limit, or if it would have to grow while the backend is capturing a CUDA graph.
  SymmetricMemory& get(size_t bytes);

 private:
  SymmAllocator& allocator_;
  Backend& backend_;
  size_t max_bytes_;
  std::unique_ptr<SymmetricMemory> memory_;
};

}  // namespace asynctp
