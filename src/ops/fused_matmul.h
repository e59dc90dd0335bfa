// The fused operators on the engine (OpContext) of a Context. Each is the op of the same name in
// asynctp/ops.h, which documents it (shapes, dtypes, options) and forwards to it; the rest of the
// library (the C ABI, the graph executor, the tools) calls these directly.
#pragma once

#include <optional>
#include <span>

#include <asynctp/ops.h>

#include "ops/context.h"

namespace asynctp {

void all_gather_matmul(OpContext& ctx, const Tensor& a_shard, std::span<const Tensor> bs,
                       std::span<const Tensor> outs, const Tensor& a_out = {},
                       const AllGatherMatmulOptions& options = {});

void all_gather_matmul(OpContext& ctx, const Tensor& a_shard, const Tensor& b, const Tensor& out,
                       const Tensor& a_out = {}, const AllGatherMatmulOptions& options = {});

void all_gather_matmul_swiglu(OpContext& ctx, const Tensor& a_shard, const Tensor& b_gate_up,
                              const Tensor& out, const Tensor& pre_out = {},
                              const Tensor& a_out = {}, const AllGatherMatmulOptions& options = {});

void swiglu_backward(OpContext& ctx, const Tensor& grad_out, const Tensor& gate_up,
                     const Tensor& grad_gate_up, std::optional<void*> stream = {});

void all_gather_scaled_matmul(OpContext& ctx, const Tensor& a_shard, const Tensor& a_scale,
                              std::span<const Tensor> bs, std::span<const Tensor> b_scales,
                              std::span<const Tensor> outs, const Tensor& a_out = {},
                              const AllGatherMatmulOptions& options = {});

void all_gather_scaled_matmul(OpContext& ctx, const Tensor& a_shard, const Tensor& a_scale,
                              const Tensor& b, const Tensor& b_scale, const Tensor& out,
                              const Tensor& a_out = {}, const AllGatherMatmulOptions& options = {});

void matmul_reduce_scatter(OpContext& ctx, const Tensor& a, const Tensor& b, const Tensor& out,
                           const MatmulReduceScatterOptions& options = {});

void matmul_reduce_scatter(OpContext& ctx, std::span<const Tensor> as, std::span<const Tensor> bs,
                           const Tensor& out, const MatmulReduceScatterOptions& options = {});

void scaled_matmul_reduce_scatter(OpContext& ctx, const Tensor& a, const Tensor& a_scale,
                                  const Tensor& b, const Tensor& b_scale, const Tensor& out,
                                  const MatmulReduceScatterOptions& options = {});

void reserve_all_gather_matmul(OpContext& ctx, const Tensor& a_shard, std::span<const Tensor> bs,
                               bool return_a, const AllGatherMatmulOptions& options = {});
void reserve_all_gather_matmul_swiglu(OpContext& ctx, const Tensor& a_shard,
                                      const Tensor& b_gate_up, bool return_a,
                                      const AllGatherMatmulOptions& options = {});
void reserve_matmul_reduce_scatter(OpContext& ctx, std::span<const Tensor> as,
                                   std::span<const Tensor> bs,
                                   const MatmulReduceScatterOptions& options = {},
                                   std::optional<DType> out_dtype = std::nullopt);

}  // namespace asynctp
