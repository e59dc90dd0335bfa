// The ordinary collectives on the engine (OpContext) of a Context, through its communicator (NCCL
// on CUDA; symmetric memory or the store on CPU). Each is the op of the same name in
// asynctp/ops.h, which documents it and forwards to it; the unfused fallbacks and the baselines of
// the benchmarks call these directly.
#pragma once

#include <optional>
#include <span>

#include <asynctp/ops.h>

#include "ops/context.h"

namespace asynctp {

void all_gather(OpContext& ctx, const Tensor& in, const Tensor& out, int dim = 0,
                std::optional<void*> stream = {});
void reduce_scatter(OpContext& ctx, const Tensor& in, const Tensor& out, ReduceOp op, int dim = 0,
                    std::optional<void*> stream = {});
void all_reduce(OpContext& ctx, const Tensor& inout, ReduceOp op, std::optional<void*> stream = {});
void barrier(OpContext& ctx, std::optional<void*> stream = {});

void reserve_all_gather(OpContext& ctx, const Tensor& in, bool out_contiguous, int dim);
void reserve_reduce_scatter(OpContext& ctx, const Tensor& in, bool out_contiguous, int dim);

}  // namespace asynctp
