#include "device/cuda/cublaslt_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <unordered_map>
#include <vector>

#include "core/env.h"
#include "core/log.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/ktensor.h"
#include "device/gemm_plan_key.h"

namespace asynctp::cuda {

namespace {

cudaDataType_t data_type(DType d) {
  switch (d) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kF8E4M3:
      return CUDA_R_8F_E4M3;
    case DType::kF8E5M2:
      return CUDA_R_8F_E5M2;
    case DType::kI64:
    case DType::kU64:
    case DType::kBool:
      break;
  }
  ASYNCTP_FAIL("{} tensors are not supported here (only float dtypes)", d);
}

// One matrix operand in cuBLASLt's column-major terms.
struct Operand {
  bool transposed = false;
  int64_t rows = 0, cols = 0, ld = 0, batch_stride = 0;
};

// Our row-major B [k, n] (strides sk, sn) as cuBLASLt's A (op(A) is [n, k]).
Operand as_lt_a(const Tensor& b3) {
  const int64_t k = b3.size(1), n = b3.size(2), sk = b3.stride(1), sn = b3.stride(2);
  Operand o;
  o.batch_stride = b3.size(0) == 1 ? 0 : b3.stride(0);
  if (sn == 1 || n == 1) {  // row-major: column-major [n x k], ld = sk
    o = {false, n, k, std::max<int64_t>(sk, n), o.batch_stride};
  } else {  // column-major [k x n], ld = sn: transposed
    o = {true, k, n, std::max<int64_t>(sn, k), o.batch_stride};
  }
  return o;
}

// Our row-major A [m, k] (strides sm, sk) as cuBLASLt's B (op(B) is [k, m]).
Operand as_lt_b(const Tensor& a3) {
  const int64_t m = a3.size(1), k = a3.size(2), sm = a3.stride(1), sk = a3.stride(2);
  const int64_t bs = a3.stride(0);
  if (sk == 1 || k == 1) return {false, k, m, std::max<int64_t>(sm, k), bs};
  return {true, m, k, std::max<int64_t>(sk, m), bs};
}

Tensor batched(const Tensor& t) {
  return t.dim() == 3 ? t : t.unsqueeze(0);
}

enum class ScaleMode : int { kNone = 0, kScalar = 1, kVector = 2 };

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};

cublasLtMatrixLayout_t make_layout(DType dtype, int64_t rows, int64_t cols, int64_t ld,
                                   int64_t batch, int64_t batch_stride) {
  cublasLtMatrixLayout_t layout;
  ASYNCTP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, data_type(dtype), rows, cols, ld));
  if (batch > 1) {
    int32_t count = static_cast<int32_t>(batch);
    ASYNCTP_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    ASYNCTP_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride, sizeof(batch_stride)));
  }
  return layout;
}

}  // namespace

struct LtGemm::Impl {
  cublasLtHandle_t handle = nullptr;
  size_t workspace_bytes = size_t{64} << 20;
  bool autotune = envvars::kGemmAutotune.flag();
  bool allow_tf32 = envvars::kAllowTf32.flag();
  // Keyed by gemm_plan_key: the descriptors (fast accumulation included), the tuned algorithm.
  std::unordered_map<GemmPlanKey, std::unique_ptr<Plan>, GemmPlanKeyHash> plans;
  // Per workspace key (LtGemm::run; GEMMs under different keys may run at the same time):
  // cuBLASLt's workspace and grow-only scratch for float8 operands staged into cuBLASLt's layout
  // and for the unscaled f32 product of a row-/column-wise scaled GEMM.
  enum Slot { kStagedA, kStagedB, kProduct, kSlots };
  struct PerStream {
    void* workspace = nullptr;
    void* scratch[kSlots] = {};
    size_t scratch_bytes[kSlots] = {};
    // Whether a CUDA graph was captured with GEMMs under this key: its replays read this
    // scratch, so scratch outgrown later is kept (retired) until the end instead of freed.
    bool captured = false;
    std::vector<void*> retired;
  };
  std::unordered_map<const void*, PerStream> streams;
  float* one = nullptr;  // a device 1.0f: the scale of an unscaled float8 product

  Impl() {
    ASYNCTP_CUBLAS_CHECK(cublasLtCreate(&handle));
    ASYNCTP_CUDA_CHECK(cudaMalloc(&one, sizeof(float)));
    const float value = 1.0f;
    ASYNCTP_CUDA_CHECK(cudaMemcpy(one, &value, sizeof(float), cudaMemcpyHostToDevice));
  }
  ~Impl() {
    plans.clear();
    for (auto& [stream, state] : streams) {
      cudaFree(state.workspace);
      for (void* p : state.scratch)
        cudaFree(p);
      for (void* p : state.retired)
        cudaFree(p);
    }
    cudaFree(one);
    cublasLtDestroy(handle);
  }

  PerStream& state_of(const void* key, bool capturing) {
    auto it = streams.find(key);
    if (it != streams.end()) {
      it->second.captured |= capturing;
      return it->second;
    }
    ASYNCTP_CAPTURE_CHECK(!capturing,
                          "a GEMM's first use of a stream is during CUDA-graph capture, where its "
                          "cuBLASLt workspace ({} bytes) cannot be allocated; run the op once on "
                          "this stream before capturing it",
                          workspace_bytes);
    PerStream state;
    ASYNCTP_CUDA_CHECK(cudaMalloc(&state.workspace, workspace_bytes));
    // Zeroed once: cuBLASLt's split-K partials reach the workspace through TMA stores, which
    // compute-sanitizer's initcheck does not see, so its reduce kernel's reads would count as
    // reads of uninitialized memory. (On the legacy stream, waited for: the first GEMM on this
    // stream comes next.)
    ASYNCTP_CUDA_CHECK(cudaMemset(state.workspace, 0, workspace_bytes));
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    return streams.emplace(key, state).first->second;
  }

  void* scratch_for(Slot slot, size_t bytes, const void* key, cudaStream_t stream, bool capturing) {
    PerStream& st = state_of(key, capturing);
    if (bytes <= st.scratch_bytes[slot]) return st.scratch[slot];
    ASYNCTP_CAPTURE_CHECK(!capturing,
                          "the float8 GEMM's staging must grow to {} bytes during CUDA-graph "
                          "capture; run the op once before capturing it",
                          bytes);
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (st.captured) {
      st.retired.push_back(st.scratch[slot]);
    } else {
      cudaFree(st.scratch[slot]);
    }
    st.scratch[slot] = nullptr;
    ASYNCTP_CUDA_CHECK(cudaMalloc(&st.scratch[slot], bytes));
    // All ones when allocated, NaN in f32 and both float8 formats: an element of the first float8
    // product in it that cuBLASLt left unwritten shows as NaN in the scaled result (later calls
    // find earlier products there). It also makes the product initialized in initcheck's eyes,
    // which does not see cuBLASLt's TMA stores into it (as for the workspace above) and would
    // report the scale epilogue's reads of it.
    ASYNCTP_CUDA_CHECK(cudaMemsetAsync(st.scratch[slot], 0xff, bytes, stream));
    st.scratch_bytes[slot] = bytes;
    return st.scratch[slot];
  }

  // Picks (and caches) the algorithm for this problem; times the candidates once. fast_accum:
  // the descriptor lets float8 products accumulate fast (part of `key`).
  Plan& plan(const GemmPlanKey& key, DType a_dt, DType b_dt, DType d_dt, const Operand& la,
             const Operand& lb, int64_t m_rows, int64_t n_cols, int64_t ldd, int64_t batch,
             int64_t d_batch_stride, ScaleMode scale_a, ScaleMode scale_b, bool fast_accum,
             const GemmArgs& args, cudaStream_t stream, const void* ws_key, bool capturing,
             const void* lt_a, const void* lt_b, void* d_ptr, bool* found) {
    auto it = plans.find(key);
    if (it != plans.end()) {
      *found = true;
      return *it->second;
    }
    auto p = std::make_unique<Plan>();
    const bool f32_in = a_dt == DType::kF32;
    const cublasComputeType_t compute =
        f32_in && allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    ASYNCTP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F));
    const cublasOperation_t ta = la.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = lb.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    ASYNCTP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    ASYNCTP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (fast_accum) {
      const int8_t fast = 1;
      ASYNCTP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                                          &fast, sizeof(fast)));
    }
    if (scale_a == ScaleMode::kVector || scale_b == ScaleMode::kVector) {
      const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      ASYNCTP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
          p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
      ASYNCTP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
          p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
    }
    if (scale_a != ScaleMode::kNone) {
      // The call's own scales (reset on every call): tuning runs the candidates with them.
      const void* a_scale_lt = args.b_scale.data();  // cuBLASLt's A is our B
      const void* b_scale_lt = args.a_scale.data();
      ASYNCTP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
          p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale_lt, sizeof(a_scale_lt)));
      ASYNCTP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
          p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale_lt, sizeof(b_scale_lt)));
    }
    p->a = make_layout(b_dt, la.rows, la.cols, la.ld, batch, la.batch_stride);
    p->b = make_layout(a_dt, lb.rows, lb.cols, lb.ld, batch, lb.batch_stride);
    p->d = make_layout(d_dt, n_cols, m_rows, ldd, batch, d_batch_stride);

    cublasLtMatmulPreference_t pref;
    ASYNCTP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    ASYNCTP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes)));
    for (auto [attr, ptr] :
         {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, lt_a},
          std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, lt_b},
          std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<const void*>(d_ptr)},
          std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<const void*>(d_ptr)}}) {
      const uint32_t align = static_cast<uint32_t>(pointer_alignment(ptr));
      ASYNCTP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
    }
    constexpr int kCandidates = 16;
    cublasLtMatmulHeuristicResult_t results[kCandidates];
    int returned = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        handle, p->desc, p->a, p->b, p->d, p->d, pref, kCandidates, results, &returned);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || returned == 0) {
      *found = false;
      static Plan none;
      return none;
    }
    int best = 0;
    if (autotune && !capturing && returned > 1)
      best = tune(*p, results, returned, lt_a, lt_b, args, stream, ws_key);
    p->algo = results[best].algo;
    p->workspace = results[best].workspaceSize;
    *found = true;
    auto& ref = *p;
    plans.emplace(key, std::move(p));
    return ref;
  }

  // Times each candidate (1 warm-up, then the median of kRuns) into a scratch output.
  int tune(Plan& p, const cublasLtMatmulHeuristicResult_t* results, int count, const void* lt_a,
           const void* lt_b, const GemmArgs& args, cudaStream_t stream, const void* ws_key) {
    constexpr int kRuns = 5;
    const size_t d_bytes = args.d.extent_bytes() + 256;
    void* d_tmp = nullptr;
    if (cudaMalloc(&d_tmp, d_bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    cudaEvent_t start, stop;
    ASYNCTP_CUDA_CHECK(cudaEventCreate(&start));
    ASYNCTP_CUDA_CHECK(cudaEventCreate(&stop));
    const float alpha = 1.0f, beta = 0.0f;
    int best = 0;
    float best_ms = 1e30f;
    std::string report;
    for (int c = 0; c < count; ++c) {
      float times[kRuns];
      bool ok = true;
      for (int r = -1; r < kRuns && ok; ++r) {
        ASYNCTP_CUDA_CHECK(cudaEventRecord(start, stream));
        ok = cublasLtMatmul(handle, p.desc, &alpha, lt_a, p.a, lt_b, p.b, &beta, d_tmp, p.d, d_tmp,
                            p.d, &results[c].algo, state_of(ws_key, false).workspace,
                            workspace_bytes, stream) == CUBLAS_STATUS_SUCCESS;
        ASYNCTP_CUDA_CHECK(cudaEventRecord(stop, stream));
        ASYNCTP_CUDA_CHECK(cudaEventSynchronize(stop));
        if (r >= 0) ASYNCTP_CUDA_CHECK(cudaEventElapsedTime(&times[r], start, stop));
      }
      if (!ok) continue;
      std::sort(times, times + kRuns);
      const float median = times[kRuns / 2];
      if (logger().should_log(spdlog::level::debug))
        report += fmt::format(" {}:{:.1f}us", describe(results[c].algo), median * 1e3f);
      if (median < best_ms) {
        best_ms = median;
        best = c;
      }
    }
    ASYNCTP_LOG_DEBUG("gemm {} @ {} -> {}: picked #{} of {}:{}", args.a.describe(),
                      args.b.describe(), args.d.describe(), best, count, report);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaFree(d_tmp);
    return best;
  }

  // "t<tile>s<stages>c<cluster>k<splits>": the algorithm's configuration, for the logs.
  static std::string describe(const cublasLtMatmulAlgo_t& algo) {
    int32_t tile = 0, stages = 0, cluster = 0, splits = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile),
                                         nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                         sizeof(stages), nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                         sizeof(cluster), nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                         sizeof(splits), nullptr);
    return fmt::format("t{}s{}c{}k{}", tile, stages, cluster, splits);
  }
};

LtGemm::LtGemm() : impl_(std::make_unique<Impl>()) {}
LtGemm::~LtGemm() = default;

void LtGemm::prepare(const void* ws_key) {
  impl_->state_of(ws_key, false);
}

void LtGemm::run(const GemmArgs& args, cudaStream_t stream, const void* ws_key, bool capturing) {
  if (ws_key == nullptr) ws_key = stream;
  Tensor a = batched(args.a), b = batched(args.b), d = batched(args.d);
  const int64_t batch = d.size(0), m = d.size(1), n = d.size(2), k = a.size(2);
  if (m == 0 || n == 0) return;
  ASYNCTP_CHECK(d.stride(2) == 1 || n == 1, "the cuda GEMM needs a row-major output, got {}",
                args.d.describe());
  const bool f8 = is_float8(a.dtype());
  const bool rowwise = f8 && args.a_scale.numel() != 1;
  const bool colwise = f8 && args.b_scale.numel() != 1;

  if (f8) {
    // cuBLASLt's float8 kernels take our A row-major and our B column-major: stage otherwise.
    if (!(a.stride(2) == 1 || k == 1)) {
      void* p = impl_->scratch_for(Impl::kStagedA, static_cast<size_t>(a.numel()), ws_key, stream,
                                   capturing);
      const Tensor staged(p, a.dtype(), {batch, m, k}, a.device());
      ASYNCTP_CUDA_CHECK(kernels::copy(to_kernel(staged), to_kernel(a), stream));
      a = staged;
    }
    if (!(b.stride(1) == 1 || k == 1)) {
      const int64_t bb = b.size(0);
      void* p = impl_->scratch_for(Impl::kStagedB, static_cast<size_t>(b.numel()), ws_key, stream,
                                   capturing);
      const Tensor staged(p, b.dtype(), {bb, k, n}, {k * n, 1, k}, b.device());
      ASYNCTP_CUDA_CHECK(kernels::copy(to_kernel(staged), to_kernel(b), stream));
      b = staged;
    }
  }
  // Row- and column-wise scales together, one product: cuBLASLt applies both in its epilogue
  // (outer-vector scale mode), where it has an algorithm for them. Otherwise (one side
  // tensor-wise, batches, or no algorithm) the unscaled product in f32, then one epilogue kernel
  // applies both scales in the CPU backend's order ((acc * a_scale[row]) * b_scale[col]).
  const bool outer_vec = rowwise && colwise && batch == 1 && args.a_scale.stride(-2) == 1 &&
                         args.b_scale.stride(-1) == 1;
  auto scale_after = [&] {
    ASYNCTP_CHECK(!rowwise || args.a_scale.stride(-2) == 1 || m == 1,
                  "row-wise a_scale must be contiguous along the rows, got {}",
                  args.a_scale.describe());
    ASYNCTP_CHECK(!colwise || args.b_scale.stride(1) == 1 || n == 1,
                  "column-wise b_scale must be contiguous, got {}", args.b_scale.describe());
    float* acc = static_cast<float*>(impl_->scratch_for(
        Impl::kProduct, static_cast<size_t>(m * n) * 4, ws_key, stream, capturing));
    const Tensor sa =
        batched(args.a_scale.numel() == 1 ? args.a_scale.view({1, 1, 1}) : args.a_scale);
    for (int64_t bi = 0; bi < batch; ++bi) {
      GemmArgs unscaled;
      unscaled.a = a.narrow(0, bi, 1);
      unscaled.b = b.size(0) == 1 ? b : b.narrow(0, bi, 1);
      unscaled.d = Tensor(acc, DType::kF32, {1, m, n}, d.device());
      unscaled.a_scale = Tensor(impl_->one, DType::kF32, {}, d.device());
      unscaled.b_scale = unscaled.a_scale;
      unscaled.fast_accum = args.fast_accum;  // the product is the whole K-sum: the same permission
      run(unscaled, stream, ws_key, capturing);
      const float* row = static_cast<const float*>(sa.data()) + (rowwise ? bi * sa.stride(0) : 0);
      void* d_i = static_cast<char*>(d.data()) + bi * d.stride(0) * d.element_size();
      ASYNCTP_CUDA_CHECK(kernels::scale_epilogue(
          d_i, d.dtype(), d.stride(1), acc, m, n, row, !rowwise,
          static_cast<const float*>(args.b_scale.data()), !colwise, stream));
    }
  };
  if (f8 && (rowwise || colwise) && !outer_vec) {
    scale_after();
    return;
  }

  const Operand la = as_lt_a(b);
  const Operand lb = as_lt_b(a);
  if (f8) {
    ASYNCTP_CHECK(la.transposed && !lb.transposed, "internal: float8 operands not in TN layout");
  }
  const int64_t ldd = std::max<int64_t>(d.stride(1), n);
  const int64_t d_batch_stride = batch > 1 ? d.stride(0) : 0;
  const ScaleMode sa =
      !f8 ? ScaleMode::kNone : (outer_vec ? ScaleMode::kVector : ScaleMode::kScalar);
  // Fast accumulation is cuBLASLt's for float8 operands only: other calls share one plan.
  const bool fast = f8 && args.fast_accum;
  const GemmPlanKey key = gemm_plan_key(a, b, d, args.accumulate, static_cast<int>(sa), fast);
  bool found = false;
  Plan& p = impl_->plan(key, a.dtype(), b.dtype(), d.dtype(), la, lb, m, n, ldd, batch,
                        d_batch_stride, sa, sa, fast, args, stream, ws_key, capturing, b.data(),
                        a.data(), d.data(), &found);
  if (!found && outer_vec) {
    scale_after();
    return;
  }
  ASYNCTP_CHECK(found, "cuBLASLt has no algorithm for {} @ {} -> {} (m={}, n={}, k={}, batch={})",
                args.a.describe(), args.b.describe(), args.d.describe(), m, n, k, batch);
  if (f8) {
    const void* a_scale_lt = args.b_scale.data();  // cuBLASLt's A is our B
    const void* b_scale_lt = args.a_scale.data();
    ASYNCTP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale_lt, sizeof(a_scale_lt)));
    ASYNCTP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale_lt, sizeof(b_scale_lt)));
  }
  const float alpha = 1.0f, beta = args.accumulate ? 1.0f : 0.0f;
  ASYNCTP_CUBLAS_CHECK(cublasLtMatmul(
      impl_->handle, p.desc, &alpha, b.data(), p.a, a.data(), p.b, &beta, d.data(), p.d, d.data(),
      p.d, &p.algo, impl_->state_of(ws_key, capturing).workspace, impl_->workspace_bytes, stream));
}

}  // namespace asynctp::cuda
