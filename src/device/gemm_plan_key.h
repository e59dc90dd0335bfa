// The key of a backend's cached GEMM plans: a library's descriptors, the algorithm it chose and
// the timing of its candidates (device/cuda/cublaslt_gemm.cpp). Two calls may share a plan only
// when everything a plan depends on is equal: each operand's dtype, sizes, strides and pointer
// alignment, whether D is accumulated into, how the scales are applied, and whether the plan lets
// the library accumulate fast. So a plan made for exact accumulation is never served to a call
// that allows fast accumulation, or the reverse (their descriptors differ, and so may the fastest
// algorithm).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include <asynctp/tensor.h>

namespace asynctp {

struct GemmPlanKey {
  // Per operand (a, b, d): dtype, 3 sizes, 3 strides, alignment; then accumulate, scale mode,
  // fast accumulation.
  static constexpr int kFields = 3 * 8 + 3;
  std::array<int64_t, kFields> fields{};
  bool operator==(const GemmPlanKey&) const = default;
};

struct GemmPlanKeyHash {
  size_t operator()(const GemmPlanKey& key) const;
};

// The largest power of two (up to 256) that divides the address: what a library's alignment
// requirements compare against.
int pointer_alignment(const void* p);

// a [batch, m, k], b [batch or 1, k, n], d [batch, m, n]: the operands as the library is handed
// them (after any staging). scale_mode: the backend's own code for how the scales are applied (0:
// no scales). fast_accum: whether the plan lets the library accumulate fast (GemmArgs::fast_accum
// where the backend honours it for these operands, else false).
GemmPlanKey gemm_plan_key(const Tensor& a, const Tensor& b, const Tensor& d, bool accumulate,
                          int scale_mode, bool fast_accum);

}  // namespace asynctp
