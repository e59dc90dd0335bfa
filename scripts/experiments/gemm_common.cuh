// Shared by the by-hand GEMM experiments in this folder (not part of the build): random bf16
// fill, relative error, cuBLASLt's first heuristic for a row-major bf16 GEMM, medians and the
// idle pause between timed runs (as `asynctp bench --pace 1`).
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "check.cuh"
#include "kernels/kernels.h"

#define CUBLAS_OK(x)                                                                              \
  do {                                                                                            \
    cublasStatus_t s_ = (x);                                                                      \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                            \
      std::fprintf(stderr, "%s:%d: cuBLAS error %d\n", __FILE__, __LINE__, static_cast<int>(s_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

__global__ void fill_random(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16((h & 0xFFFF) / 32768.0f - 1.0f);
  }
}

// sums[0] += (x - y)^2, sums[1] += y^2 over n elements.
__global__ void diff_norms(const __nv_bfloat16* x, const __nv_bfloat16* y, size_t n, double* sums) {
  double d = 0, r = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const double a = __bfloat162float(x[i]), b = __bfloat162float(y[i]);
    d += (a - b) * (a - b);
    r += b * b;
  }
  atomicAdd(&sums[0], d);
  atomicAdd(&sums[1], r);
}

struct Lt {
  cublasLtHandle_t handle{};
  cublasLtMatmulDesc_t desc{};
  cublasLtMatrixLayout_t la{}, lb{}, lc{};
  cublasLtMatmulAlgo_t algo{};
  void* workspace = nullptr;
  size_t workspace_bytes = size_t{64} << 20;

  // Row-major C [m, n] = A [m, k] B [k, n] is column-major C^T = B^T A^T: cuBLAS's (n, m, k)
  // with B as its first operand.
  void init(int64_t m, int64_t k, int64_t n) {
    CUBLAS_OK(cublasLtCreate(&handle));
    CUBLAS_OK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_OK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, n, k, n));
    CUBLAS_OK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, m, k));
    CUBLAS_OK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, m, n));
    CHECK(cudaMalloc(&workspace, workspace_bytes));
    cublasLtMatmulPreference_t pref;
    CUBLAS_OK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &workspace_bytes, sizeof(workspace_bytes)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    CUBLAS_OK(
        cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, lc, lc, pref, 1, &result, &found));
    if (found == 0) {
      std::fprintf(stderr, "cuBLASLt: no algorithm\n");
      std::exit(1);
    }
    algo = result.algo;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  void run(const void* a, const void* b, void* c, cudaStream_t stream) {
    const float one = 1.f, zero = 0.f;
    CUBLAS_OK(cublasLtMatmul(handle, desc, &one, b, la, a, lb, &zero, c, lc, c, lc, &algo,
                             workspace, workspace_bytes, stream));
  }
  ~Lt() {
    if (handle == nullptr) return;
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(handle);
    cudaFree(workspace);
  }
};

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : v[v.size() / 2];
}

inline void spin_for(double ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(ms);
  while (std::chrono::steady_clock::now() < end) {
  }
}

// One GEMM's operands from "MxKxN": bf16 A [m, k] and B [k, n] filled at random (seeds 1 and 2,
// on `stream`), C and a reference C, [m, n] bf16; freed with it. A bad shape exits (status 2).
// Needs -I src (kernels/kernels.h).
struct Problem {
  long long m = 0, k = 0, n = 0;
  __nv_bfloat16 *a = nullptr, *b = nullptr, *c = nullptr, *c_ref = nullptr;

  Problem(const std::string& shape, cudaStream_t stream) {
    if (std::sscanf(shape.c_str(), "%lldx%lldx%lld", &m, &k, &n) != 3 || m <= 0 || k <= 0 ||
        n <= 0) {
      std::fprintf(stderr, "bad shape '%s' (want MxKxN)\n", shape.c_str());
      std::exit(2);
    }
    CHECK(cudaMalloc(&a, sizeof(*a) * m * k));
    CHECK(cudaMalloc(&b, sizeof(*b) * k * n));
    CHECK(cudaMalloc(&c, sizeof(*c) * m * n));
    CHECK(cudaMalloc(&c_ref, sizeof(*c) * m * n));
    fill_random<<<1024, 256, 0, stream>>>(a, m * k, 1);
    fill_random<<<1024, 256, 0, stream>>>(b, k * n, 2);
    CHECK(cudaGetLastError());
  }
  // The native GEMM's arguments for C = A @ B, all row-major (nothing else set).
  asynctp::kernels::NativeGemmParams native_args() const {
    asynctp::kernels::NativeGemmParams args;
    args.a = a;
    args.lda = k;
    args.b = b;
    args.ldb = n;
    args.c = c;
    args.ldc = n;
    args.m = m;
    args.n = n;
    args.k = k;
    return args;
  }
  ~Problem() {
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    cudaFree(c_ref);
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;
};
