// Symmetric memory in POSIX shared memory, one process per rank. Each rank creates a segment
// "/asynctp-<run id>-<allocation>-r<rank>", publishes its name through the store, maps every
// peer's segment, and unlinks its own once every rank has mapped it: from then on nothing of it
// is left in /dev/shm, whatever happens to the processes. Waits sleep on futexes in the shared
// pages, so idle ranks cost no CPU even with more ranks than cores.
#pragma once

#include <memory>

#include "symm/symmetric_memory.h"

namespace asynctp {

std::unique_ptr<SymmAllocator> make_cpu_symm_allocator(Group& group);

}  // namespace asynctp
