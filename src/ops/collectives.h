// The ordinary collectives, on any dim and any strides, through the context's communicator
// (NCCL on CUDA; symmetric memory or the store on CPU). The unfused fallbacks and the baselines
// of the benchmarks use these.
#pragma once

#include "ops/context.h"

namespace asynctp {

// out: in's shape with `dim` multiplied by the world size; rank r's input lands at slice r.
void all_gather(Context& ctx, const Tensor& out, const Tensor& in, int dim = 0);
// out: in's shape with `dim` divided by the world size; rank r receives op over every rank's
// slice r.
void reduce_scatter(Context& ctx, const Tensor& out, const Tensor& in, ReduceOp op, int dim = 0);
void all_reduce(Context& ctx, const Tensor& inout, ReduceOp op);

}  // namespace asynctp
