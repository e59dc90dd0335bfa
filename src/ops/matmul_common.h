// Internals shared by the fused ops: GEMM operand views, input checks, path choice.
#pragma once

#include <optional>
#include <string>

#include "ops/context.h"

namespace asynctp::detail {

// t viewed as [batch, m, last] where batch = product of dims [0, split) and m = product of dims
// [split, rank-1); nullopt if t's strides do not allow that view.
std::optional<Tensor> as_gemm_3d(const Tensor& t, int split);

// Like as_gemm_3d, but throws (naming `what`) instead of returning nullopt.
Tensor gemm_view(const Tensor& t, int split, const char* what);

struct PathDecision {
  Path path;
  std::string reason;
  bool requested = false;  // the caller forced this path
};

// Fused when possible (and not refused by the caller), else the fallback with the reason; throws
// if the caller insisted on the fused path and it is not possible.
PathDecision choose_path(Context& ctx, std::optional<PathChoice> requested, size_t symm_bytes,
                         const char* op);

void check_on_device(Context& ctx, const Tensor& t, const char* op, const std::string& name);
void check_gemm_dtype(const Tensor& t, const char* op, const std::string& name, bool scaled);
void check_out_dtype(const Tensor& t, const char* op, const std::string& name);
// Row-wise: `like`'s shape with the last dim 1 (even when that is one element: a one-row shard's
// row-wise scale is still its own). Anything else with one element is tensor-wise.
bool is_rowwise_scale(const Tensor& scale, const Tensor& like);
// a_scale: one element, or `like`'s shape with the last dim 1. b_scale: one element or [1, n].
void check_a_scale(const Tensor& scale, const Tensor& like, const char* op, const std::string& name);
void check_b_scale(const Tensor& scale, int64_t n, const char* op, const std::string& name);

inline size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Enqueues D (+)= A @ B with optional float8 scales on `stream` (see GemmArgs).
void gemm(Context& ctx, Tensor a, Tensor b, Tensor d, bool accumulate, Tensor a_scale, Tensor b_scale,
          Stream& stream);

}  // namespace asynctp::detail
