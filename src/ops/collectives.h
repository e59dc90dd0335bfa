// The ordinary collectives, on any dim and any strides, through the context's communicator
// (NCCL on CUDA; symmetric memory or the store on CPU). The unfused fallbacks and the baselines
// of the benchmarks use these.
#pragma once

#include <optional>

#include "ops/context.h"

namespace asynctp {

// Inputs first, then outputs, as in the fused ops. `stream`: the caller's native stream for this
// call (see OpContext::set_stream); unset: the context's.
//
// out: in's shape with `dim` multiplied by the world size; rank r's input lands at slice r.
void all_gather(OpContext& ctx, const Tensor& in, const Tensor& out, int dim = 0,
                std::optional<void*> stream = {});
// out: in's shape with `dim` divided by the world size; rank r receives op over every rank's
// slice r.
void reduce_scatter(OpContext& ctx, const Tensor& in, const Tensor& out, ReduceOp op, int dim = 0,
                    std::optional<void*> stream = {});
void all_reduce(OpContext& ctx, const Tensor& inout, ReduceOp op, std::optional<void*> stream = {});

// The local scratch all_gather / reduce_scatter would take for an input like `in` (a descriptor:
// only its shape, strides and dtype are read) on `dim`, into a contiguous output or not: grown
// now (see reserve_all_gather_matmul). Not the communicator's own buffers.
void reserve_all_gather(OpContext& ctx, const Tensor& in, bool out_contiguous, int dim);
void reserve_reduce_scatter(OpContext& ctx, const Tensor& in, bool out_contiguous, int dim);

}  // namespace asynctp
