// Communicator: the ordinary collectives (all-gather, reduce-scatter, all-reduce) on dim 0 of
// contiguous tensors, used by the unfused fallback and by the baseline the benchmarks compare
// against. Implementations: NCCL (CUDA backend), symmetric memory (symm/, one node), and the
// store (CPU backend across nodes). Reductions add in f32 in rank order where the implementation
// controls the order (all but NCCL), so their results are bitwise reproducible.
#pragma once

#include <memory>
#include <string_view>

#include "device/backend.h"

namespace asynctp {

class Group;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string_view name() const = 0;
  // out [world * n, ...] <- every rank's in [n, ...], in rank order.
  virtual void all_gather(const Tensor& out, const Tensor& in, Stream& stream) = 0;
  // out [n, ...] <- op over ranks of in[rank * n : (rank + 1) * n].
  virtual void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op, Stream& stream) = 0;
  virtual void all_reduce(const Tensor& inout, ReduceOp op, Stream& stream) = 0;
};

// Checks shared by every implementation: contiguity, dtypes, and the dim-0 sizes.
void validate_all_gather(const Tensor& out, const Tensor& in, int world_size);
void validate_reduce_scatter(const Tensor& out, const Tensor& in, int world_size);

// Collectives through the TCP store: slow, but work between any ranks that reach the store.
// Host memory only (CPU backend).
std::unique_ptr<Communicator> make_store_communicator(Backend& backend, Group& group);

}  // namespace asynctp
