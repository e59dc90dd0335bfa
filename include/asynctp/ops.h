// The ops: all-gather + matmul and matmul + reduce-scatter, overlapping the communication with
// the GEMMs through symmetric memory, their float8 (scaled) forms, and the ordinary collectives.
// Each runs on one rank of the Context's group (every rank calls it) on the caller's stream.
// Outputs are written into tensors the caller allocates (so that the ops can be captured in a
// CUDA graph); the *_shape helpers give their shapes.
//
// Aliasing: no output may share a byte with an input or with another output, since the
// overlapped paths read the inputs and write the outputs on several streams at once. Every op
// checks this on every call (from the data pointers, shapes and strides: a few comparisons) and
// throws an argument error naming both operands, their descriptions and byte ranges. None works in
// place, not even with an output exactly over an input (no output has its input's shape; all_reduce
// takes its one tensor in place). Inputs may overlap each other, and broadcast (stride 0) inputs
// are fine.
//
// Shape algebra (ws = world size, g = gather/scatter dim):
//   all_gather_matmul:     A_shard [.., s@g, .., k]  -AG(g)->  A [.., ws*s@g, .., K]
//                          out_i = A @ B_i : A's shape with the last dim N_i
//                          (g = last: A_shard's last dim is K/ws, and each shard's product is a
//                          partial sum over its slice of K)
//   matmul_reduce_scatter: P = A [.., K] @ B [K, N] : A's shape with the last dim N
//                          out = RS(g)(P) : P's shape with dim g divided by ws
//                          (g = last: each rank's chunk of P comes from a column block of B)
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include <asynctp/context.h>
#include <asynctp/tensor.h>

namespace asynctp {

// kAvg: the sum divided by the world size.
enum class ReduceOp : uint8_t { kSum, kAvg };
// "sum", "avg".
std::string_view reduce_op_name(ReduceOp op);
ReduceOp parse_reduce_op(std::string_view text);

struct AllGatherMatmulOptions {
  int gather_dim = 0;
  std::optional<PathChoice> path = std::nullopt;  // unset: the context's default
  // The native path's push pieces for this call (see ContextOptions::push_piece_bytes); unset:
  // the context's.
  std::optional<size_t> push_piece_bytes = std::nullopt;
  // The caller's native stream for this call (see Context::set_stream); unset: the context's.
  std::optional<void*> stream = std::nullopt;
  // all_gather_scaled_matmul only: fast_accum[i] allows the GEMMs of Bs[i] to accumulate faster
  // and less exactly (torch._scaled_mm's use_fast_accum); one value: the same for every B; empty:
  // exact f32 accumulation. A permission (see GemmArgs::fast_accum): the CUDA backend lets
  // cuBLASLt accumulate the float8 products fast, and only with it may the native path run them
  // (the native kernel has no exact float8 accumulation); the CPU backend accumulates in f32
  // either way. The unscaled forms (all_gather_matmul, all_gather_matmul_swiglu) refuse it.
  std::vector<bool> fast_accum = {};
};

struct MatmulReduceScatterOptions {
  ReduceOp reduce_op = ReduceOp::kSum;
  int scatter_dim = 0;
  std::optional<PathChoice> path;
  // The caller's native stream for this call (see Context::set_stream); unset: the context's.
  std::optional<void*> stream = std::nullopt;
  // scaled_matmul_reduce_scatter only: allows its GEMMs to accumulate faster and less exactly (as
  // AllGatherMatmulOptions::fast_accum). The unscaled matmul_reduce_scatter refuses it.
  bool fast_accum = false;
};

// The gathered shape of A_shard.
Dims all_gather_shape(const Tensor& a_shard, int gather_dim, int world_size);
// The shape of out_i for B_i.
Dims all_gather_matmul_out_shape(const Tensor& a_shard, const Tensor& b, int gather_dim,
                                 int world_size);
// The shape of matmul_reduce_scatter's output.
Dims matmul_reduce_scatter_out_shape(const Tensor& a, const Tensor& b, int scatter_dim,
                                     int world_size);

// outs[i] = all_gather(A_shard, gather_dim) @ Bs[i], for one or several Bs sharing the gathered
// A (Q/K/V, gate/up). A_shard: f32/bf16/f16, rank >= 2, any strides. Bs[i]: [K, N_i], A's
// dtype. outs[i]: contiguous, f32/bf16/f16. a_out: where to return the gathered A (contiguous,
// A's dtype), or undefined to not return it. outs and a_out overlap no input and each other (see
// Aliasing above).
void all_gather_matmul(Context& ctx, const Tensor& a_shard, std::span<const Tensor> bs,
                       std::span<const Tensor> outs, const Tensor& a_out = {},
                       const AllGatherMatmulOptions& options = {});

// One B: out = all_gather(A_shard, gather_dim) @ B.
void all_gather_matmul(Context& ctx, const Tensor& a_shard, const Tensor& b, const Tensor& out,
                       const Tensor& a_out = {}, const AllGatherMatmulOptions& options = {});

// The gate/up projection of a SwiGLU MLP with its activation in the GEMM's epilogue:
//   A = all_gather(A_shard, gather_dim);  [g | u] = A @ B_gate_up;  out = silu(g) * u
// B_gate_up: [K, 2N], the gate's N columns then the up projection's N (torch.cat([W_gate,
// W_up]).t(); a column-major B, the transposed-RHS form, is taken as it is), A's dtype (f32, bf16,
// f16). out: A's shape with the last dim N, contiguous, f32/bf16/f16. The products are
// accumulated in f32 and the SwiGLU is applied to them in f32, rounded once into out: the native
// path reads the [.., 2N] products only in its epilogue; the split and fallback paths write them
// into an f32 workspace first (so that every path, on the CPU backend, gives the same bits).
// pre_out: where to return the products [g | u] themselves (A's shape with the last dim 2N,
// contiguous, f32/bf16/f16, each rounded once), for a backward that needs them; undefined: not
// written. a_out as in all_gather_matmul. out, pre_out and a_out overlap no input and each other.
// The usage counters name it "all_gather_matmul_swiglu".
void all_gather_matmul_swiglu(Context& ctx, const Tensor& a_shard, const Tensor& b_gate_up,
                              const Tensor& out, const Tensor& pre_out = {},
                              const Tensor& a_out = {}, const AllGatherMatmulOptions& options = {});

// all_gather_matmul_swiglu's backward, elementwise on this rank alone (nothing is exchanged):
// from the products P = [g | u] (gate_up, [.., 2N], as pre_out returns them) and out's gradient
// (grad_out, [.., N], the same leading dims), grad_gate_up ([.., 2N]) receives
// [d * u * s * (1 + g * (1 - s)) | d * silu(g)], s = sigmoid(g), computed in f32 and rounded
// once. One pass: it reads P and grad_out once and writes grad_gate_up once. Any strides; f32,
// bf16 or f16, each operand its own. grad_gate_up overlaps neither input. `stream` as in the
// collectives below.
void swiglu_backward(Context& ctx, const Tensor& grad_out, const Tensor& gate_up,
                     const Tensor& grad_gate_up, std::optional<void*> stream = {});

// float8 form: A_shard and Bs in f8e4m3/f8e5m2. a_scale (f32): one element (tensor-wise; the
// same on every rank) or A_shard's shape with the last dim 1 (row-wise; gathered with A).
// b_scales[i] (f32): one element or [1, N_i]. Gathering on the contraction dim is not supported
// here, since each shard would carry its own scale. outs and a_out overlap no input (scales
// included) and each other.
void all_gather_scaled_matmul(Context& ctx, const Tensor& a_shard, const Tensor& a_scale,
                              std::span<const Tensor> bs, std::span<const Tensor> b_scales,
                              std::span<const Tensor> outs, const Tensor& a_out = {},
                              const AllGatherMatmulOptions& options = {});

// One B: out = (all_gather(A_shard, gather_dim) @ B) * scales.
void all_gather_scaled_matmul(Context& ctx, const Tensor& a_shard, const Tensor& a_scale,
                              const Tensor& b, const Tensor& b_scale, const Tensor& out,
                              const Tensor& a_out = {}, const AllGatherMatmulOptions& options = {});

// out = reduce_scatter(A @ B, reduce_op, scatter_dim). Partial products are added in f32 in rank
// order and rounded once, so every run (and every path on the CPU backend) gives the same bits.
// A: rank >= 2, any strides; B: [K, N]; out: any strides, f32/bf16/f16, overlapping neither A
// nor B.
void matmul_reduce_scatter(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& out,
                           const MatmulReduceScatterOptions& options = {});

// out = reduce_scatter(sum_i as[i] @ bs[i]): several products of the same output shape (the
// backward of Q/K/V or gate/up projections) accumulated in f32 before one scatter. The as[i]
// share every dim but the last (K_i); bs[i] is [K_i, N]. out overlaps no as[i] or bs[i].
void matmul_reduce_scatter(Context& ctx, std::span<const Tensor> as, std::span<const Tensor> bs,
                           const Tensor& out, const MatmulReduceScatterOptions& options = {});

// float8 form: a_scale one element or A's shape with the last dim 1; b_scale one element or
// [1, N]. The output dtype is out's. out overlaps no input, scales included.
void scaled_matmul_reduce_scatter(Context& ctx, const Tensor& a, const Tensor& a_scale,
                                  const Tensor& b, const Tensor& b_scale, const Tensor& out,
                                  const MatmulReduceScatterOptions& options = {});

// Reserve: collective (every rank calls it with the same shapes). Sizes what a call of the op
// with these operands and options would need: both symmetric workspaces, the chunk flags and
// the local scratch, for every path the call could take (the options' path, else each one the
// context's choice could pick), without running anything. A call within those sizes allocates
// nothing, so it can
// be captured into a CUDA graph; one that would have to grow a buffer while its stream is
// capturing throws CaptureError instead. Where the workspace limit is too small for the
// overlapped paths, the fallback's buffers are reserved (the call takes the fallback). Only
// shapes, strides, dtypes and devices are read, never the data: descriptors at any address do
// (a Tensor cannot hold a null pointer; the C ABI gives null-data descriptors one).
//
// all_gather_matmul / all_gather_scaled_matmul with these A_shard and Bs, returning the
// gathered A (a_out given) or not. A float8 A_shard is sized for a row-wise scale (which needs
// more than a tensor-wise one).
void reserve_all_gather_matmul(Context& ctx, const Tensor& a_shard, std::span<const Tensor> bs,
                               bool return_a, const AllGatherMatmulOptions& options = {});
// all_gather_matmul_swiglu with this A_shard and B_gate_up, returning the gathered A or not.
void reserve_all_gather_matmul_swiglu(Context& ctx, const Tensor& a_shard, const Tensor& b_gate_up,
                                      bool return_a, const AllGatherMatmulOptions& options = {});
// matmul_reduce_scatter (one or several products) / scaled_matmul_reduce_scatter, into an
// output of out_dtype (unset: A's dtype, or bf16 for float8 As).
void reserve_matmul_reduce_scatter(Context& ctx, std::span<const Tensor> as,
                                   std::span<const Tensor> bs,
                                   const MatmulReduceScatterOptions& options = {},
                                   std::optional<DType> out_dtype = std::nullopt);

// The ordinary collectives, on any dim and any strides (NCCL on CUDA; symmetric memory or the
// store on CPU). Inputs first, then outputs, as in the fused ops. `stream`: the caller's native
// stream for this call (see Context::set_stream); unset: the context's.
//
// out: in's shape with `dim` multiplied by the world size; rank r's input lands at slice r. out
// may not hold `in`, not even as its own slice r (no in-place gather).
void all_gather(Context& ctx, const Tensor& in, const Tensor& out, int dim = 0,
                std::optional<void*> stream = {});
// out: in's shape with `dim` divided by the world size; rank r receives op over every rank's
// slice r. out overlaps no byte of `in`.
void reduce_scatter(Context& ctx, const Tensor& in, const Tensor& out, ReduceOp op, int dim = 0,
                    std::optional<void*> stream = {});
void all_reduce(Context& ctx, const Tensor& inout, ReduceOp op, std::optional<void*> stream = {});
// A device barrier: what follows it on any rank's stream runs after every rank's stream has
// reached it. Through the symmetric workspace's signal pads, where the host does not wait; a
// context's first call without a workspace makes one (the smaller of 1 MiB and the limit),
// collectively, which does wait for every rank. Without symmetric memory, a one-element
// all-reduce through the communicator: with NCCL the host does not wait, with the store's
// communicator (CPU ranks on several nodes) it does. It can be captured into a CUDA graph once
// an earlier call outside capture has made what it needs (else CaptureError). What
// `asynctp bench` and the dispatcher line the ranks up with before each timed run.
void barrier(Context& ctx, std::optional<void*> stream = {});

// The local scratch all_gather / reduce_scatter would take for an input like `in` (a descriptor:
// only its shape, strides and dtype are read) on `dim`, into a contiguous output or not: grown
// now (see reserve_all_gather_matmul). Not the communicator's own buffers.
void reserve_all_gather(Context& ctx, const Tensor& in, bool out_contiguous, int dim);
void reserve_reduce_scatter(Context& ctx, const Tensor& in, bool out_contiguous, int dim);

}  // namespace asynctp
