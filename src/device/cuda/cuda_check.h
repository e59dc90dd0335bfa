// Checks for CUDA runtime, driver, cuBLASLt and NCCL calls: on failure they throw asynctp::Error
// naming the call, its error string and where it was made.
#pragma once

#include <cublasLt.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "core/error.h"

namespace asynctp::cuda {
const char* driver_error_string(CUresult result);
}  // namespace asynctp::cuda

#define ASYNCTP_CUDA_CHECK(expr)                                                                 \
  do {                                                                                           \
    const cudaError_t err_ = (expr);                                                             \
    if (err_ != cudaSuccess) [[unlikely]] {                                                      \
      ::asynctp::detail::throw_check_failure(                                                    \
          __FILE__, __LINE__, #expr,                                                             \
          ::fmt::format("CUDA error {}: {}", cudaGetErrorName(err_), cudaGetErrorString(err_))); \
    }                                                                                            \
  } while (0)

#define ASYNCTP_CU_CHECK(expr)                                              \
  do {                                                                      \
    const CUresult res_ = (expr);                                           \
    if (res_ != CUDA_SUCCESS) [[unlikely]] {                                \
      ::asynctp::detail::throw_check_failure(                               \
          __FILE__, __LINE__, #expr,                                        \
          ::fmt::format("CUDA driver error {}: {}", static_cast<int>(res_), \
                        ::asynctp::cuda::driver_error_string(res_)));       \
    }                                                                       \
  } while (0)

#define ASYNCTP_CUBLAS_CHECK(expr)                                      \
  do {                                                                  \
    const cublasStatus_t st_ = (expr);                                  \
    if (st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                    \
      ::asynctp::detail::throw_check_failure(                           \
          __FILE__, __LINE__, #expr,                                    \
          ::fmt::format("cuBLASLt error {}: {}", static_cast<int>(st_), \
                        cublasLtGetStatusString(st_)));                 \
    }                                                                   \
  } while (0)

#define ASYNCTP_NCCL_CHECK(expr)                                                               \
  do {                                                                                         \
    const ncclResult_t nr_ = (expr);                                                           \
    if (nr_ != ncclSuccess) [[unlikely]] {                                                     \
      ::asynctp::detail::throw_check_failure(                                                  \
          __FILE__, __LINE__, #expr,                                                           \
          ::fmt::format("NCCL error {}: {}", static_cast<int>(nr_), ncclGetErrorString(nr_))); \
    }                                                                                          \
  } while (0)
