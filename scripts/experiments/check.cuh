// Error checks for the by-hand CUDA probes in this folder (not part of the build): print the
// failing call with its file and line, then exit.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                                                                 \
  do {                                                                                           \
    cudaError_t err_ = (x);                                                                      \
    if (err_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)
#define CU_CHECK(x)                                                                          \
  do {                                                                                       \
    CUresult r_ = (x);                                                                       \
    if (r_ != CUDA_SUCCESS) {                                                                \
      std::fprintf(stderr, "%s:%d: %s: %d\n", __FILE__, __LINE__, #x, static_cast<int>(r_)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)
