// Collectives through symmetric memory: each rank stages its data in its symmetric buffer, a
// barrier, then every rank reads what it needs from its peers' buffers. Inputs larger than the
// workspace limit are processed in pieces. Reductions add in f32 in rank order.
#pragma once

#include <memory>

#include "device/communicator.h"
#include "symm/workspace.h"

namespace asynctp {

std::unique_ptr<Communicator> make_symm_communicator(Backend& backend, SymmWorkspace& workspace,
                                                     int rank, int world_size);

}  // namespace asynctp
