// Symmetric memory over NVLink: each rank allocates with cuMemCreate (exportable as a POSIX file
// descriptor, granularity-aligned), the descriptors are passed to every peer of the node
// (fd_exchange), and every rank maps every peer's allocation into its own address space with
// cuMemMap/cuMemSetAccess. Layout per rank: [signal pad | data], as on the CPU backend. The signal
// kernels (src/kernels/signal.cu) bound every wait with the group's timeout. No NVLink multicast
// object is ever created.
//
// Capability check at construction: every rank on one node, every pair of GPUs with peer access,
// VMM and POSIX-descriptor export supported; otherwise unavailable_reason() says what failed and
// the fused ops take the fallback.
#pragma once

#include <memory>

#include "symm/symmetric_memory.h"

namespace asynctp {

std::unique_ptr<SymmAllocator> make_cuda_symm_allocator(Backend& backend, Group& group);

}  // namespace asynctp
