// The ordinary collectives through NCCL (the CUDA backend's Communicator): the engine of the
// unfused fallback and of the cuBLAS+NCCL baseline. NVLink multicast (NVLS) is switched off
// unless the user set NCCL_NVLS_ENABLE explicitly.
#pragma once

#include <memory>

#include "device/communicator.h"

namespace asynctp {

std::unique_ptr<Communicator> make_nccl_communicator(Backend& backend, Group& group);

}  // namespace asynctp
