// The fused operators and the collectives: descriptors checked and converted, then one call of
// the C++ op.
#include <cstring>

#include "capi/internal.h"
#include "ops/collectives.h"
#include "ops/fused_matmul.h"

using namespace asynctp;
using namespace asynctp::capi;

namespace {

// The stream an op runs on: unset for ASYNCTP_CONTEXT_STREAM (the context's), else the caller's
// handle (a cudaStream_t; NULL is the legacy default stream).
std::optional<void*> stream_of(void* stream) {
  if (stream == ASYNCTP_CONTEXT_STREAM) return std::nullopt;
  return stream;
}

void check_dim_arg(int32_t dim, std::string_view arg) {
  if (dim < -ASYNCTP_MAX_DIMS || dim >= ASYNCTP_MAX_DIMS)
    invalid("{} is {}, outside -{}..{}", arg, dim, ASYNCTP_MAX_DIMS, ASYNCTP_MAX_DIMS - 1);
}

AllGatherMatmulOptions ag_options(int32_t gather_dim, int32_t path, void* stream) {
  check_dim_arg(gather_dim, "gather_dim");
  AllGatherMatmulOptions options;
  options.gather_dim = gather_dim;
  options.path = path_of(path);
  options.stream = stream_of(stream);
  return options;
}

// A C flag (0 or 1) as a bool; anything else is an invalid argument naming `arg`.
bool flag_of(int32_t value, ArgName arg) {
  if (value != 0 && value != 1) invalid("{} is {}, expected 0 or 1", arg, value);
  return value == 1;
}

MatmulReduceScatterOptions rs_options(int32_t reduce_op, int32_t scatter_dim, int32_t path,
                                      void* stream) {
  check_dim_arg(scatter_dim, "scatter_dim");
  MatmulReduceScatterOptions options;
  options.reduce_op = reduce_op_of(reduce_op);
  options.scatter_dim = scatter_dim;
  options.path = path_of(path);
  options.stream = stream_of(stream);
  return options;
}

}  // namespace

extern "C" {

asynctp_status asynctp_context_set_stream(asynctp_context ctx, void* stream) {
  return guarded(__func__, [&] {
    OpContext& c = *context_of(ctx, "ctx").ctx;
    if (stream == ASYNCTP_CONTEXT_STREAM)
      invalid("stream is ASYNCTP_CONTEXT_STREAM, which only op calls may pass");
    c.set_stream(stream);
  });
}

asynctp_status asynctp_reserve_all_gather_matmul(asynctp_context ctx, const asynctp_tensor* a_shard,
                                                 const asynctp_tensor* bs, int32_t num_bs,
                                                 int32_t gather_dim, int32_t return_a,
                                                 void* stream) {
  return guarded(__func__, [&] {
    OpContext& c = *context_of(ctx, "ctx").ctx;
    const Tensor a = shape_only_tensor_of(a_shard, "a_shard", c);
    if (num_bs < 1 || num_bs > kMaxTensorList)
      invalid("num_bs is {}, outside 1..{}", num_bs, kMaxTensorList);
    if (bs == nullptr) invalid("bs is NULL but num_bs is {}", num_bs);
    std::vector<Tensor> b;
    for (int32_t i = 0; i < num_bs; ++i)
      b.push_back(shape_only_tensor_of(&bs[i], ArgName("bs", static_cast<int64_t>(i)), c));
    if (return_a != 0 && return_a != 1) invalid("return_a is {}, expected 0 or 1", return_a);
    reserve_all_gather_matmul(c, a, b, return_a != 0,
                              ag_options(gather_dim, ASYNCTP_PATH_DEFAULT, stream));
  });
}

asynctp_status asynctp_reserve_all_gather_matmul_swiglu(asynctp_context ctx,
                                                        const asynctp_tensor* a_shard,
                                                        const asynctp_tensor* b_gate_up,
                                                        int32_t gather_dim, int32_t return_a,
                                                        void* stream) {
  return guarded(__func__, [&] {
    OpContext& c = *context_of(ctx, "ctx").ctx;
    const Tensor a = shape_only_tensor_of(a_shard, "a_shard", c);
    const Tensor b = shape_only_tensor_of(b_gate_up, "b_gate_up", c);
    if (return_a != 0 && return_a != 1) invalid("return_a is {}, expected 0 or 1", return_a);
    reserve_all_gather_matmul_swiglu(c, a, b, return_a != 0,
                                     ag_options(gather_dim, ASYNCTP_PATH_DEFAULT, stream));
  });
}

asynctp_status asynctp_reserve_matmul_reduce_scatter(asynctp_context ctx, const asynctp_tensor* as,
                                                     const asynctp_tensor* bs, int32_t num_products,
                                                     int32_t scatter_dim, void* stream) {
  return guarded(__func__, [&] {
    OpContext& c = *context_of(ctx, "ctx").ctx;
    if (num_products < 1 || num_products > kMaxTensorList)
      invalid("num_products is {}, outside 1..{}", num_products, kMaxTensorList);
    if (as == nullptr) invalid("as is NULL but num_products is {}", num_products);
    if (bs == nullptr) invalid("bs is NULL but num_products is {}", num_products);
    std::vector<Tensor> a;
    std::vector<Tensor> b;
    for (int32_t i = 0; i < num_products; ++i) {
      a.push_back(shape_only_tensor_of(&as[i], ArgName("as", static_cast<int64_t>(i)), c));
      b.push_back(shape_only_tensor_of(&bs[i], ArgName("bs", static_cast<int64_t>(i)), c));
    }
    reserve_matmul_reduce_scatter(
        c, a, b, rs_options(ASYNCTP_REDUCE_SUM, scatter_dim, ASYNCTP_PATH_DEFAULT, stream));
  });
}

asynctp_status asynctp_all_gather_matmul(asynctp_context ctx, const asynctp_tensor* a_shard,
                                         const asynctp_tensor* bs, int32_t num_bs,
                                         const asynctp_tensor* outs, const asynctp_tensor* a_out,
                                         int32_t gather_dim, int32_t path, void* stream) {
  return guarded(__func__, [&] {
    OpContext& c = *context_of(ctx, "ctx").ctx;
    const HostProfile::Call profiled(c.host_profile());  // from here: the descriptors' checks
    const Tensor a = tensor_of(a_shard, "a_shard", c);
    const std::vector<Tensor> b = tensors_of(bs, num_bs, "bs", "num_bs", c);
    const std::vector<Tensor> o = tensors_of(outs, num_bs, "outs", "num_bs", c);
    const Tensor ao = optional_tensor_of(a_out, "a_out", c);
    all_gather_matmul(c, a, b, o, ao, ag_options(gather_dim, path, stream));
  });
}

asynctp_status asynctp_all_gather_matmul_swiglu(asynctp_context ctx, const asynctp_tensor* a_shard,
                                                const asynctp_tensor* b_gate_up,
                                                const asynctp_tensor* out,
                                                const asynctp_tensor* pre_out,
                                                const asynctp_tensor* a_out, int32_t gather_dim,
                                                int32_t path, void* stream) {
  return guarded(__func__, [&] {
    OpContext& c = *context_of(ctx, "ctx").ctx;
    const Tensor a = tensor_of(a_shard, "a_shard", c);
    const Tensor b = tensor_of(b_gate_up, "b_gate_up", c);
    const Tensor o = tensor_of(out, "out", c);
    const Tensor pre = optional_tensor_of(pre_out, "pre_out", c);
    const Tensor ao = optional_tensor_of(a_out, "a_out", c);
    all_gather_matmul_swiglu(c, a, b, o, pre, ao, ag_options(gather_dim, path, stream));
  });
}

asynctp_status asynctp_swiglu_backward(asynctp_context ctx, const asynctp_tensor* grad_out,
                                       const asynctp_tensor* gate_up,
                                       const asynctp_tensor* grad_gate_up, void* stream) {
  return guarded(__func__, [&] {
    OpContext& c = *context_of(ctx, "ctx").ctx;
    swiglu_backward(c, tensor_of(grad_out, "grad_out", c), tensor_of(gate_up, "gate_up", c),
                    tensor_of(grad_gate_up, "grad_gate_up", c), stream_of(stream));
  });
}

asynctp_status asynctp_all_gather_scaled_matmul(
    asynctp_context ctx, const asynctp_tensor* a_shard, const asynctp_tensor* a_scale,
    const asynctp_tensor* bs, const asynctp_tensor* b_scales, int32_t num_bs,
    const asynctp_tensor* outs, const asynctp_tensor* a_out, int32_t gather_dim,
    const int32_t* fast_accum, int32_t path, void* stream) {
  return guarded(__func__, [&] {
    OpContext& c = *context_of(ctx, "ctx").ctx;
    const HostProfile::Call profiled(c.host_profile());  // from here: the descriptors' checks
    const Tensor a = tensor_of(a_shard, "a_shard", c);
    const Tensor as = tensor_of(a_scale, "a_scale", c);
    const std::vector<Tensor> b = tensors_of(bs, num_bs, "bs", "num_bs", c);
    const std::vector<Tensor> bsc = tensors_of(b_scales, num_bs, "b_scales", "num_bs", c);
    const std::vector<Tensor> o = tensors_of(outs, num_bs, "outs", "num_bs", c);
    const Tensor ao = optional_tensor_of(a_out, "a_out", c);
    // A valid request the op cannot serve (asynctp/ops.h): each shard of the contraction
    // dim would carry its own scale.
    if (a.dim() >= 1 && (gather_dim == a.dim() - 1 || gather_dim == -1))
      unsupported(
          "gather_dim {} is a_shard's contraction dim, which the scaled form cannot "
          "gather",
          gather_dim);
    AllGatherMatmulOptions options = ag_options(gather_dim, path, stream);
    if (fast_accum != nullptr) {
      for (int32_t i = 0; i < num_bs; ++i)
        options.fast_accum.push_back(
            flag_of(fast_accum[i], ArgName("fast_accum", static_cast<int64_t>(i))));
    }
    all_gather_scaled_matmul(c, a, as, b, bsc, o, ao, options);
  });
}

asynctp_status asynctp_matmul_reduce_scatter(asynctp_context ctx, const asynctp_tensor* as,
                                             const asynctp_tensor* bs, int32_t num_products,
                                             const asynctp_tensor* out, int32_t reduce_op,
                                             int32_t scatter_dim, int32_t path, void* stream) {
  return guarded(__func__, [&] {
    OpContext& c = *context_of(ctx, "ctx").ctx;
    const HostProfile::Call profiled(c.host_profile());  // from here: the descriptors' checks
    const std::vector<Tensor> a = tensors_of(as, num_products, "as", "num_products", c);
    const std::vector<Tensor> b = tensors_of(bs, num_products, "bs", "num_products", c);
    const Tensor o = tensor_of(out, "out", c);
    matmul_reduce_scatter(c, a, b, o, rs_options(reduce_op, scatter_dim, path, stream));
  });
}

asynctp_status asynctp_scaled_matmul_reduce_scatter(
    asynctp_context ctx, const asynctp_tensor* a, const asynctp_tensor* a_scale,
    const asynctp_tensor* b, const asynctp_tensor* b_scale, const asynctp_tensor* out,
    int32_t reduce_op, int32_t scatter_dim, int32_t fast_accum, int32_t path, void* stream) {
  return guarded(__func__, [&] {
    OpContext& c = *context_of(ctx, "ctx").ctx;
    const HostProfile::Call profiled(c.host_profile());  // from here: the descriptors' checks
    MatmulReduceScatterOptions options = rs_options(reduce_op, scatter_dim, path, stream);
    options.fast_accum = flag_of(fast_accum, "fast_accum");
    scaled_matmul_reduce_scatter(c, tensor_of(a, "a", c), tensor_of(a_scale, "a_scale", c),
                                 tensor_of(b, "b", c), tensor_of(b_scale, "b_scale", c),
                                 tensor_of(out, "out", c), options);
  });
}

asynctp_status asynctp_all_gather(asynctp_context ctx, const asynctp_tensor* in,
                                  const asynctp_tensor* out, int32_t dim, void* stream) {
  return guarded(__func__, [&] {
    OpContext& c = *context_of(ctx, "ctx").ctx;
    check_dim_arg(dim, "dim");
    all_gather(c, tensor_of(in, "in", c), tensor_of(out, "out", c), dim, stream_of(stream));
  });
}

asynctp_status asynctp_reduce_scatter(asynctp_context ctx, const asynctp_tensor* in,
                                      const asynctp_tensor* out, int32_t reduce_op, int32_t dim,
                                      void* stream) {
  return guarded(__func__, [&] {
    OpContext& c = *context_of(ctx, "ctx").ctx;
    check_dim_arg(dim, "dim");
    const ReduceOp op = reduce_op_of(reduce_op);
    reduce_scatter(c, tensor_of(in, "in", c), tensor_of(out, "out", c), op, dim, stream_of(stream));
  });
}

asynctp_status asynctp_all_reduce(asynctp_context ctx, const asynctp_tensor* inout,
                                  int32_t reduce_op, void* stream) {
  return guarded(__func__, [&] {
    OpContext& c = *context_of(ctx, "ctx").ctx;
    const ReduceOp op = reduce_op_of(reduce_op);
    all_reduce(c, tensor_of(inout, "inout", c), op, stream_of(stream));
  });
}

asynctp_status asynctp_barrier(asynctp_context ctx, void* stream) {
  return guarded(__func__, [&] { barrier(*context_of(ctx, "ctx").ctx, stream_of(stream)); });
}

asynctp_status asynctp_memory_stats_get(asynctp_context ctx, asynctp_memory_stats* out) {
  return guarded(__func__, [&] {
    OpContext& c = *context_of(ctx, "ctx").ctx;
    if (out == nullptr) invalid("out is NULL");
    if (out->struct_size < static_cast<int32_t>(sizeof(int32_t)) ||
        out->struct_size > static_cast<int32_t>(sizeof(asynctp_memory_stats)))
      invalid("out->struct_size is {}, expected {}", out->struct_size,
              sizeof(asynctp_memory_stats));
    const MemoryStats stats = c.memory_stats();
    asynctp_memory_stats full{};
    full.struct_size = out->struct_size;
    full.symmetric_bytes = stats.symmetric_bytes;
    full.symmetric_limit = stats.symmetric_limit;
    full.local_bytes = stats.local_bytes;
    // A caller compiled against an older header gets the fields its struct has.
    std::memcpy(out, &full, out->struct_size);
  });
}

}  // extern "C"
