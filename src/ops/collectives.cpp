#include "ops/collectives.h"

#include "device/nvtx.h"
#include "ops/operand_overlap.h"

namespace asynctp {

namespace {

void check_device(OpContext& ctx, const Tensor& t, const char* op, const char* name) {
  ASYNCTP_CHECK(t.defined(), "{}: {} is undefined", op, name);
  ASYNCTP_CHECK(t.device() == ctx.backend().device(), "{}: {} is on {} but the context runs on {}",
                op, name, t.device().to_string(), ctx.backend().device().to_string());
  ASYNCTP_CHECK(is_floating_point(t.dtype()), "{}: {} is {}; the collectives take float dtypes", op,
                name, t.dtype());
}

// A contiguous version of t: t itself, or a copy in the given scratch.
Tensor contiguous(OpContext& ctx, const Tensor& t, Scratch purpose) {
  if (t.is_contiguous()) return t;
  Tensor copy = ctx.scratch(purpose, t.shape(), t.dtype());
  ctx.backend().copy(copy, t, ctx.stream());
  return copy;
}

size_t bytes_of(const Dims& shape, DType dtype) {
  return static_cast<size_t>(shape.product()) * element_size(dtype);
}

// all_gather on another dim than 0, or into a strided output, gathers on dim 0 into this first:
// in's shape with dim 0 multiplied by the world size.
bool ag_staged(bool out_contiguous, int dim) {
  return !(dim == 0 && out_contiguous);
}
Dims ag_staged_shape(const Tensor& in, int ws) {
  Dims shape = in.shape();
  shape[0] *= ws;
  return shape;
}

// reduce_scatter on another dim than 0 rearranges its input so that rank r's slice is the r-th
// block of dim 0: the chunk's shape with dim 0 multiplied by the world size.
Dims rs_staged_shape(const Dims& chunk, int ws) {
  Dims shape = chunk;
  shape[0] *= ws;
  return shape;
}

// The text of the NVTX range of a collective call (device/nvtx.h): "all_gather: bf16[8, 16] dim 0,
// ws 2".
std::string range_text(OpContext& ctx, const char* op, const Tensor& in, std::string_view detail) {
  return fmt::format("{}: {}{} {}, ws {}", op, in.dtype(), in.shape(), detail, ctx.world_size());
}

}  // namespace

void reserve_all_gather(OpContext& ctx, const Tensor& in, bool out_contiguous, int dim) {
  dim = in.wrap_dim(dim);
  if (!in.is_contiguous()) ctx.reserve_scratch(Scratch::kCollectiveIn, in.nbytes());
  if (ag_staged(out_contiguous, dim)) {
    ctx.reserve_scratch(Scratch::kCollectiveOut,
                        bytes_of(ag_staged_shape(in, ctx.world_size()), in.dtype()));
  }
}

void reserve_reduce_scatter(OpContext& ctx, const Tensor& in, bool out_contiguous, int dim) {
  dim = in.wrap_dim(dim);
  const int ws = ctx.world_size();
  Dims chunk = in.shape();
  chunk[dim] /= ws;
  if (dim != 0) {
    ctx.reserve_scratch(Scratch::kCollectiveIn, bytes_of(rs_staged_shape(chunk, ws), in.dtype()));
  } else if (!in.is_contiguous()) {
    ctx.reserve_scratch(Scratch::kCollectiveIn, in.nbytes());
  }
  if (!out_contiguous) ctx.reserve_scratch(Scratch::kCollectiveOut, bytes_of(chunk, in.dtype()));
}

void all_gather(OpContext& ctx, const Tensor& in, const Tensor& out, int dim,
                std::optional<void*> stream) {
  const nvtx::Range range(nvtx::kCollectiveColor, [&] {
    return range_text(ctx, "all_gather", in, fmt::format("dim {}", dim));
  });
  const OpContext::StreamScope scope(ctx, stream);
  check_device(ctx, in, "all_gather", "input");
  check_device(ctx, out, "all_gather", "output");
  ASYNCTP_CHECK(in.dim() >= 1, "all_gather: input must have rank >= 1, got {}", in.describe());
  dim = in.wrap_dim(dim);
  const int ws = ctx.world_size();
  Dims expected = in.shape();
  expected[dim] *= ws;
  ASYNCTP_CHECK(
      out.shape() == expected && out.dtype() == in.dtype(),
      "all_gather: output must be {}{} for input {} gathered on dim {} over {} ranks, got {}",
      in.dtype(), expected, in.describe(), dim, ws, out.describe());
  detail::check_no_overlap("all_gather", {{"input", in}}, {{"output", out}});
  const Tensor src = contiguous(ctx, in, Scratch::kCollectiveIn);
  if (!ag_staged(out.is_contiguous(), dim)) {
    ctx.communicator().all_gather(out, src, ctx.stream());
    return;
  }
  // Gather on dim 0 into [ws * n0, ...], then move each rank's slice into place.
  const Tensor staged = ctx.scratch(Scratch::kCollectiveOut, ag_staged_shape(in, ws), in.dtype());
  ctx.communicator().all_gather(staged, src, ctx.stream());
  const int64_t s = in.size(dim);
  for (int r = 0; r < ws; ++r) {
    ctx.backend().copy(out.narrow(dim, r * s, s), staged.narrow(0, r * in.size(0), in.size(0)),
                       ctx.stream());
  }
}

void reduce_scatter(OpContext& ctx, const Tensor& in, const Tensor& out, ReduceOp op, int dim,
                    std::optional<void*> stream) {
  const nvtx::Range range(nvtx::kCollectiveColor, [&] {
    return range_text(ctx, "reduce_scatter", in,
                      fmt::format("dim {}, {}", dim, reduce_op_name(op)));
  });
  const OpContext::StreamScope scope(ctx, stream);
  check_device(ctx, in, "reduce_scatter", "input");
  check_device(ctx, out, "reduce_scatter", "output");
  ASYNCTP_CHECK(in.dim() >= 1, "reduce_scatter: input must have rank >= 1, got {}", in.describe());
  dim = in.wrap_dim(dim);
  const int ws = ctx.world_size();
  ASYNCTP_CHECK(
      in.size(dim) % ws == 0,
      "reduce_scatter: dim {} of the input (size {}) is not divisible by the world size {}", dim,
      in.size(dim), ws);
  Dims chunk = in.shape();
  chunk[dim] /= ws;
  ASYNCTP_CHECK(out.shape() == chunk && out.dtype() == in.dtype(),
                "reduce_scatter: output must be {}{} for input {} scattered on dim {}, got {}",
                in.dtype(), chunk, in.describe(), dim, out.describe());
  detail::check_no_overlap("reduce_scatter", {{"input", in}}, {{"output", out}});
  Tensor src;
  if (dim == 0) {
    src = contiguous(ctx, in, Scratch::kCollectiveIn);
  } else {
    // Rearrange so that rank r's slice is the r-th block of dim 0: [ws * chunk0, ...].
    src = ctx.scratch(Scratch::kCollectiveIn, rs_staged_shape(chunk, ws), in.dtype());
    const int64_t s = chunk[dim];
    for (int r = 0; r < ws; ++r) {
      ctx.backend().copy(src.narrow(0, r * chunk[0], chunk[0]), in.narrow(dim, r * s, s),
                         ctx.stream());
    }
  }
  const Tensor dst =
      out.is_contiguous() ? out : ctx.scratch(Scratch::kCollectiveOut, chunk, out.dtype());
  ctx.communicator().reduce_scatter(dst, src, op, ctx.stream());
  if (dst.data() != out.data()) ctx.backend().copy(out, dst, ctx.stream());
}

void all_reduce(OpContext& ctx, const Tensor& inout, ReduceOp op, std::optional<void*> stream) {
  const nvtx::Range range(nvtx::kCollectiveColor,
                          [&] { return range_text(ctx, "all_reduce", inout, reduce_op_name(op)); });
  const OpContext::StreamScope scope(ctx, stream);
  check_device(ctx, inout, "all_reduce", "tensor");
  const Tensor t = contiguous(ctx, inout, Scratch::kCollectiveIn);
  ctx.communicator().all_reduce(t, op, ctx.stream());
  if (t.data() != inout.data()) ctx.backend().copy(inout, t, ctx.stream());
}

void barrier(OpContext& ctx, std::optional<void*> stream) {
  const nvtx::Range range(nvtx::kCollectiveColor, [] { return std::string("barrier"); });
  const OpContext::StreamScope scope(ctx, stream);
  ctx.align_ranks();
}

}  // namespace asynctp
