// Passing file descriptors between the ranks of one node: every rank listens on an abstract Unix
// socket and hands its descriptor (SCM_RIGHTS) to each peer that connects. Used to share CUDA VMM
// allocations exported as POSIX file descriptors.
#pragma once

#include <string>
#include <vector>

#include "core/deadline.h"

namespace asynctp {

class Group;

// Collective over the group: returns fds[peer] = a descriptor of peer's `my_fd` in this process
// (owned by the caller), and -1 at this rank's own index. `tag` must be the same on every rank
// and unique per exchange.
std::vector<int> exchange_fds(Group& group, const std::string& tag, int my_fd);

}  // namespace asynctp
