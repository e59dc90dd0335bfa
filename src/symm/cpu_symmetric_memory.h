// Symmetric memory in POSIX shared memory, one process per rank. Each rank creates a segment,
// publishes its name through the store, maps every peer's segment, and unlinks its own once every
// rank has mapped it: from then on nothing of it is left in /dev/shm, whatever happens to the
// processes. Waits sleep on futexes in the shared pages, so idle ranks cost no CPU even with more
// ranks than cores.
//
// NOTE [cpu symmetric memory segments]
// A segment is named after the allocation and the process that creates it:
//   /asynctp-<run id>-<allocation>-r<rank>-p<pid>-t<start>-n<pid namespace>
// with the creator's pid, its start time (clock ticks after boot, field 22 of /proc/<pid>/stat)
// and the inode of its pid namespace. Two checks rest on it:
// - A peer's segment is opened only if its name is one of this allocation and this peer, it is a
//   regular file of this user with no permission for anyone else (segments are created 0600),
//   and its size is the allocation's; else the allocation fails naming the segment and the peer.
//   A store client that publishes another file, or a file planted under the right name, is
//   refused before it is mapped.
// - A rank killed between creating its segment and the unlink (under torchrun, with no launcher
//   to remove the run's segments) leaves it in /dev/shm. Every allocation first sweeps the
//   segments of this user whose creator is provably dead: no process has its pid, or that process
//   is a zombie or started at another time. A creator in another pid namespace cannot be looked
//   up, so its segments are left alone: a live job's segment is never removed.
#pragma once

#include <memory>
#include <string>

#include "symm/symmetric_memory.h"

namespace asynctp {

std::unique_ptr<SymmAllocator> make_cpu_symm_allocator(Group& group);

// The name (with its leading '/') of the segment this process creates for `rank` in allocation
// `allocation` of run `run_id` (NOTE [cpu symmetric memory segments]).
std::string cpu_segment_name(const std::string& run_id, const std::string& allocation, int rank);

// Removes the /dev/shm segments of this user whose creator is provably dead (NOTE [cpu symmetric
// memory segments]); returns how many.
int sweep_dead_segments();

}  // namespace asynctp
