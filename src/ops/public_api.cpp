// The public C++ API (asynctp/context.h, asynctp/ops.h) over the engine of this layer: a Context
// owns an OpContext, and each op forwards to the op of the same name on it.
#include <asynctp/context.h>
#include <asynctp/ops.h>

#include "core/error.h"
#include "ops/collectives.h"
#include "ops/context.h"
#include "ops/fused_matmul.h"

namespace asynctp {
namespace {

OpContext& engine(Context& ctx) {
  return detail::ContextAccess::engine(ctx);
}

}  // namespace

std::unique_ptr<Context> Context::create(std::shared_ptr<Group> group, ContextOptions options) {
  ASYNCTP_CHECK(group != nullptr, "Context::create needs a group");
  return std::unique_ptr<Context>(
      new Context(OpContext::create(std::move(group), std::move(options))));
}

Context::Context(std::unique_ptr<OpContext> engine) : engine_(std::move(engine)) {}

Context::~Context() = default;

Group& Context::group() {
  return engine_->group();
}

int Context::rank() const {
  return engine_->rank();
}

int Context::world_size() const {
  return engine_->world_size();
}

const ContextOptions& Context::options() const {
  return engine_->options();
}

Device Context::device() const {
  return engine_->backend().device();
}

void Context::set_stream(void* handle) {
  engine_->set_stream(handle);
}

void Context::synchronize() {
  engine_->stream().synchronize();
}

MemoryStats Context::memory_stats() const {
  return engine_->memory_stats();
}

Usage& Context::usage() {
  return engine_->usage();
}

void all_gather_matmul(Context& ctx, const Tensor& a_shard, std::span<const Tensor> bs,
                       std::span<const Tensor> outs, const Tensor& a_out,
                       const AllGatherMatmulOptions& options) {
  all_gather_matmul(engine(ctx), a_shard, bs, outs, a_out, options);
}

void all_gather_matmul(Context& ctx, const Tensor& a_shard, const Tensor& b, const Tensor& out,
                       const Tensor& a_out, const AllGatherMatmulOptions& options) {
  all_gather_matmul(engine(ctx), a_shard, b, out, a_out, options);
}

void all_gather_matmul_swiglu(Context& ctx, const Tensor& a_shard, const Tensor& b_gate_up,
                              const Tensor& out, const Tensor& pre_out, const Tensor& a_out,
                              const AllGatherMatmulOptions& options) {
  all_gather_matmul_swiglu(engine(ctx), a_shard, b_gate_up, out, pre_out, a_out, options);
}

void all_gather_scaled_matmul(Context& ctx, const Tensor& a_shard, const Tensor& a_scale,
                              std::span<const Tensor> bs, std::span<const Tensor> b_scales,
                              std::span<const Tensor> outs, const Tensor& a_out,
                              const AllGatherMatmulOptions& options) {
  all_gather_scaled_matmul(engine(ctx), a_shard, a_scale, bs, b_scales, outs, a_out, options);
}

void all_gather_scaled_matmul(Context& ctx, const Tensor& a_shard, const Tensor& a_scale,
                              const Tensor& b, const Tensor& b_scale, const Tensor& out,
                              const Tensor& a_out, const AllGatherMatmulOptions& options) {
  all_gather_scaled_matmul(engine(ctx), a_shard, a_scale, b, b_scale, out, a_out, options);
}

void matmul_reduce_scatter(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& out,
                           const MatmulReduceScatterOptions& options) {
  matmul_reduce_scatter(engine(ctx), a, b, out, options);
}

void matmul_reduce_scatter(Context& ctx, std::span<const Tensor> as, std::span<const Tensor> bs,
                           const Tensor& out, const MatmulReduceScatterOptions& options) {
  matmul_reduce_scatter(engine(ctx), as, bs, out, options);
}

void scaled_matmul_reduce_scatter(Context& ctx, const Tensor& a, const Tensor& a_scale,
                                  const Tensor& b, const Tensor& b_scale, const Tensor& out,
                                  const MatmulReduceScatterOptions& options) {
  scaled_matmul_reduce_scatter(engine(ctx), a, a_scale, b, b_scale, out, options);
}

void reserve_all_gather_matmul(Context& ctx, const Tensor& a_shard, std::span<const Tensor> bs,
                               bool return_a, const AllGatherMatmulOptions& options) {
  reserve_all_gather_matmul(engine(ctx), a_shard, bs, return_a, options);
}

void reserve_all_gather_matmul_swiglu(Context& ctx, const Tensor& a_shard, const Tensor& b_gate_up,
                                      bool return_a, const AllGatherMatmulOptions& options) {
  reserve_all_gather_matmul_swiglu(engine(ctx), a_shard, b_gate_up, return_a, options);
}

void reserve_matmul_reduce_scatter(Context& ctx, std::span<const Tensor> as,
                                   std::span<const Tensor> bs,
                                   const MatmulReduceScatterOptions& options,
                                   std::optional<DType> out_dtype) {
  reserve_matmul_reduce_scatter(engine(ctx), as, bs, options, out_dtype);
}

void all_gather(Context& ctx, const Tensor& in, const Tensor& out, int dim,
                std::optional<void*> stream) {
  all_gather(engine(ctx), in, out, dim, stream);
}

void reduce_scatter(Context& ctx, const Tensor& in, const Tensor& out, ReduceOp op, int dim,
                    std::optional<void*> stream) {
  reduce_scatter(engine(ctx), in, out, op, dim, stream);
}

void swiglu_backward(Context& ctx, const Tensor& grad_out, const Tensor& gate_up,
                     const Tensor& grad_gate_up, std::optional<void*> stream) {
  swiglu_backward(engine(ctx), grad_out, gate_up, grad_gate_up, stream);
}

void all_reduce(Context& ctx, const Tensor& inout, ReduceOp op, std::optional<void*> stream) {
  all_reduce(engine(ctx), inout, op, stream);
}

void barrier(Context& ctx, std::optional<void*> stream) {
  barrier(engine(ctx), stream);
}

void reserve_all_gather(Context& ctx, const Tensor& in, bool out_contiguous, int dim) {
  reserve_all_gather(engine(ctx), in, out_contiguous, dim);
}

void reserve_reduce_scatter(Context& ctx, const Tensor& in, bool out_contiguous, int dim) {
  reserve_reduce_scatter(engine(ctx), in, out_contiguous, dim);
}

}  // namespace asynctp
