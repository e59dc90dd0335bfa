// GEMMs through cuBLASLt. The row-major problem D[m,n] = A[m,k] B[k,n] is handed to cuBLASLt as
// the column-major D^T = B^T A^T (cuBLASLt's "A" is our B and its "B" our A), so no operand is
// ever copied for its layout, except float8 operands whose layout cuBLASLt cannot take (it wants
// our A row-major and our B column-major; others are staged). For each distinct problem
// (dtypes, layouts, sizes, strides, scale modes, fast accumulation: device/gemm_plan_key.h) the
// heuristic's candidates are timed once on first use and the fastest is cached; under CUDA-graph
// capture an uncached problem takes the heuristic's first choice without timing. A float8 call
// with GemmArgs::fast_accum gets a descriptor with CUBLASLT_MATMUL_DESC_FAST_ACCUM set, also for
// its unscaled f32 product where the scales are applied afterwards.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "device/backend.h"

namespace asynctp::cuda {

class LtGemm {
 public:
  LtGemm();
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Runs on `stream`, with the workspace (and float8 staging) kept under `ws_key`: GEMMs that
  // may run at the same time need different keys; nullptr: the stream itself.
  void run(const GemmArgs& args, cudaStream_t stream, const void* ws_key, bool capturing);
  // Allocates the workspace of `ws_key` now (not capturing), for GEMMs that will first use it
  // during a CUDA-graph capture.
  void prepare(const void* ws_key);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace asynctp::cuda
