// The micro-pipeline-TP pass: replaces all-gather -> matmul and matmul -> reduce-scatter with the
// project's fused targets (docs/GRAPH.md), so that the collective overlaps the GEMMs.
//
// Patterns (ws = world size, G = the gathered tensor, P = the reduce-scatter's input):
//   G = all_gather(A_shard, d) feeding mm(G, B), _scaled_mm(G, B, ..), or (3-D+ activations)
//     mm(reshape(G, [M, K]), B) followed by reshape(.., [.., N]): every such matmul of one G goes
//     into one asynctp.fused_all_gather_matmul with several Bs; other uses of G read the op's A.
//     A row-wise scale_a that is itself an all-gather of the shard's scale goes with it (that
//     gather disappears). d = last (the contraction dim) only with enable_last_dim: each rank's
//     product is then a partial sum, a different schedule that stays opt-in until measured.
//   mm(X, permute(G)) (the gathered tensor as transposed right-hand operand), rewritten through
//     (G @ X^T)^T: only with enable_transpose.
//   P = mm / _scaled_mm, optionally through reshape(.., [.., N]) (the scatter dim is carried to
//     the N-d product), or P = a sum (add.Tensor tree) of such matmuls (the backward of Q/K/V or
//     gate/up): one asynctp.fused_matmul_reduce_scatter over every product, accumulated in f32
//     before the scatter. Scattering on the last (output) dim (B is sharded by columns instead)
//     unless enable_last_dim_scatter is off: PyTorch 2.11 fuses it by default too. A matmul (or
//     sum) whose result has other users is left alone.
//   Then, with enable_swiglu, a fused gather of one B [K, 2N] whose product [g | u] feeds
//     silu(g) * u (the gate/up projection of a SwiGLU MLP) becomes
//     asynctp.fused_all_gather_matmul_swiglu, with the SwiGLU in the GEMM's epilogue. Opt-in: in
//     the compiled layer it has not yet measured faster than Inductor's own SwiGLU kernel.
// The fused node is placed where the collective was; producers of B that came later are moved up
// (never past the collective's own inputs); the graph stays topologically sorted. Every
// collective gets a report entry.
#pragma once

#include "graph/ir.h"
#include "passes/report.h"

namespace asynctp::passes {

struct MicroPipelineOptions {
  bool enable_last_dim = false;         // gather on the contraction dim
  bool enable_last_dim_scatter = true;  // scatter on the output dim
  bool enable_transpose = false;        // mm(A, all_gather(B).t())
  bool enable_swiglu = false;           // silu(g) * u of a fused gather's [g | u] into its epilogue
};

void micro_pipeline_tp(graph::Graph& g, const MicroPipelineOptions& options, FusionReport& report);

// Parts of the pass (micro_pipeline_tp runs reduce-scatters first, then all-gathers, as PyTorch).
void fuse_reduce_scatters(graph::Graph& g, const MicroPipelineOptions& options,
                          FusionReport& report);
void fuse_all_gathers(graph::Graph& g, const MicroPipelineOptions& options, FusionReport& report);
// After fuse_all_gathers: a fused all-gather matmul of one B [K, 2N] whose product [g | u] feeds
// silu(g) * u becomes asynctp.fused_all_gather_matmul_swiglu (fuse_swiglu.cpp).
void fuse_swiglu_epilogues(graph::Graph& g, FusionReport& report);

}  // namespace asynctp::passes
