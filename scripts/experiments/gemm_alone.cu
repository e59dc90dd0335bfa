// The native GEMM alone (kernels::async_gemm, one chunk, every row present) beside cuBLASLt on
// one GPU, for comparing builds of the kernel: bf16 A [M, K] and B [K, N] row-major, bf16 C.
// Why: `asynctp bench` validates and times whole ops; an experiment on the kernel (a variant
// source file, compiled with -D switches) needs only the kernel, timed beside cuBLASLt's first
// heuristic in one loop, the two alternating, each run followed by an idle pause as long as it
// took (as `asynctp bench --pace 1`: off the power cap), median of the runs.
//
// Not part of the build (a measurement, run by hand on a GPU machine):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I src \
//     scripts/experiments/gemm_alone.cu src/kernels/async_gemm.cu -lcuda -lcublasLt -o gemm_alone
//   ./gemm_alone [--iters N] [--cluster 1|2] [--sum N] [--no-cublas] MxKxN [MxKxN ...]
// Prints per shape: cuBLASLt and native medians (us), their ratio, and the relative error of the
// native C against cuBLASLt's (both bf16; 0 to ~1e-4 when right: both sum in f32, often in the
// same order; with --sum N the last chunk's rows differ: they hold the reduced sums). With
// -DEXP_TRACE, compiled against the copy of the kernel that
// scripts/experiments/trace_units.py writes, also the kernel's main loop and epilogue per unit
// and the SM clock they ran at.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gemm_common.cuh"
#include "kernels/kernels.h"

#ifdef EXP_TRACE
namespace asynctp::kernels {
cudaError_t exp_set_trace(void* p);  // defined by the source trace_units.py writes
}
constexpr int kTraceUnits = 256;  // trace_units.py's TRACE_UNITS
#endif

int main(int argc, char** argv) {
  int iters = 20;
  int cluster = 1;
  int sum = 0;
  bool cublas = true;
  std::vector<std::string> shapes;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--sum") && i + 1 < argc) {
      sum = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--cluster") && i + 1 < argc) {
      cluster = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--no-cublas")) {
      cublas = false;
    } else {
      shapes.emplace_back(argv[i]);
    }
  }
  if (shapes.empty() || iters < 1) {
    std::fprintf(
        stderr, "usage: %s [--iters N] [--cluster 1|2] [--sum N] [--no-cublas] MxKxN [MxKxN ...]\n",
        argv[0]);
    return 2;
  }
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  void* split_ws = nullptr;
  CHECK(cudaMalloc(&split_ws, asynctp::kernels::async_gemm_split_workspace_bytes()));
  CHECK(cudaMemset(split_ws, 0, asynctp::kernels::async_gemm_split_workspace_bytes()));
  double* sums = nullptr;
  CHECK(cudaMalloc(&sums, 2 * sizeof(double)));
  std::printf("%-18s %10s %10s %8s %10s\n", "MxKxN", "cublas_us", "native_us", "nat/cub",
              "rel_err");
  for (const auto& s : shapes) {
    const Problem problem(s, stream);
    const long long m = problem.m, k = problem.k, n = problem.n;
    __nv_bfloat16 *a = problem.a, *b = problem.b, *c = problem.c, *c_ref = problem.c_ref;

    asynctp::kernels::NativeGemmParams args = problem.native_args();
    args.split_workspace = split_ws;
    args.cluster = cluster;
    // --sum N: the native matmul_reduce_scatter's kernel at world size N, every peer's part
    // landed: M in N chunks walked from chunk 0, the last one (rank N - 1's own) adding the other
    // N - 1 chunks' parts (random) in its epilogue and stored into sum_out instead of C.
    __nv_bfloat16 *parts = nullptr, *sum_out = nullptr;
    uint32_t* flags = nullptr;
    if (sum > 1) {
      const int64_t rows = m / sum;
      if (m % sum != 0 || rows % 128 != 0) {
        std::fprintf(stderr, "--sum %d: M / N must be a multiple of 128\n", sum);
        return 2;
      }
      CHECK(cudaMalloc(&parts, sizeof(*parts) * sum * rows * n));
      CHECK(cudaMalloc(&sum_out, sizeof(*sum_out) * rows * n));
      CHECK(cudaMalloc(&flags, sizeof(uint32_t) * sum));
      fill_random<<<1024, 256, 0, stream>>>(parts, sum * rows * n, 3);
      CHECK(cudaGetLastError());
      const std::vector<uint32_t> up(sum, 1u);
      CHECK(cudaMemcpy(flags, up.data(), sizeof(uint32_t) * sum, cudaMemcpyHostToDevice));
      args.chunk_rows = rows;
      args.sum_chunk = sum - 1;
      args.sum_parts = parts;
      args.sum_part_stride = rows * n;
      args.sum_ld = n;
      args.sum_out = sum_out;
      args.sum_ldo = n;
      args.sum_count = sum;
      args.sum_self = sum - 1;
      args.sum_flags = flags;
      args.sum_flag_stride = sum;
      args.timeout_ns = 10'000'000'000ull;
    }
    if (const char* why = asynctp::kernels::async_gemm_unsupported(args)) {
      std::fprintf(stderr, "%s: native GEMM unsupported: %s\n", s.c_str(), why);
      return 1;
    }
    Lt lt;
    if (cublas) lt.init(m, k, n);

    auto native = [&] { CHECK(asynctp::kernels::async_gemm(args, stream)); };
    auto timed = [&](auto&& fn) {
      CHECK(cudaEventRecord(start, stream));
      fn();
      CHECK(cudaEventRecord(stop, stream));
      CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, start, stop));
      spin_for(ms);  // pace 1
      return static_cast<double>(ms);
    };
    double err = NAN;
    if (cublas) {
      lt.run(a, b, c_ref, stream);
      native();
      CHECK(cudaMemsetAsync(sums, 0, 2 * sizeof(double), stream));
      diff_norms<<<512, 256, 0, stream>>>(c, c_ref, m * n, sums);
      double h[2];
      CHECK(cudaMemcpyAsync(h, sums, sizeof(h), cudaMemcpyDeviceToHost, stream));
      CHECK(cudaStreamSynchronize(stream));
      err = std::sqrt(h[0] / h[1]);
    }
    std::vector<double> tn, tc;
    for (int i = -3; i < iters; ++i) {
      // Alternate which goes first, so that neither always follows the other.
      const bool native_first = (i & 1) != 0;
      double x = NAN, y = NAN;
      if (native_first) x = timed(native);
      if (cublas) y = timed([&] { lt.run(a, b, c_ref, stream); });
      if (!native_first) x = timed(native);
      if (i >= 0) {
        tn.push_back(x * 1e3);
        if (cublas) tc.push_back(y * 1e3);
      }
    }
#ifdef EXP_TRACE
    {
      // One more run with each unit stamped by consumer 0 of every CTA (trace_units.py): the
      // main loop's duration, the time from its end to the next unit's start (the epilogue and
      // the unit's bookkeeping) and the SM clock, over every unit followed by another.
      int sms = 0;
      CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
      const size_t entries = static_cast<size_t>(sms) * kTraceUnits * 4;
      unsigned long long* tr = nullptr;
      CHECK(cudaMalloc(&tr, entries * 8));
      CHECK(cudaMemset(tr, 0, entries * 8));
      CHECK(asynctp::kernels::exp_set_trace(tr));
      native();
      CHECK(cudaStreamSynchronize(stream));
      CHECK(asynctp::kernels::exp_set_trace(nullptr));
      std::vector<unsigned long long> h(entries);
      CHECK(cudaMemcpy(h.data(), tr, entries * 8, cudaMemcpyDeviceToHost));
      CHECK(cudaFree(tr));
      // With --sum, units in the last chunk (the tiles that add the parts: last in the walk)
      // are summed apart: unit i of CTA b is tile b + i * sms (whole tiles, one CTA per SM).
      const int64_t tiles = ((m + 127) / 128) * ((n + 255) / 256);
      const int64_t first_sum = sum > 1 ? tiles / sum * (sum - 1) : tiles;
      std::vector<double> loop, gap, ghz;
      double sum_loop = 0, sum_gap = 0, plain_loop = 0, plain_gap = 0;
      int sums = 0, plains = 0;
      for (int b = 0; b < sms; ++b) {
        for (int i = 0; i + 1 < kTraceUnits; ++i) {
          const unsigned long long* t = &h[(static_cast<size_t>(b) * kTraceUnits + i) * 4];
          const unsigned long long* next = t + 4;
          if (t[0] == 0 || t[1] == 0 || next[0] == 0) break;
          const double l = (t[1] - t[0]) * 1e-3, g = (next[0] - t[1]) * 1e-3;
          loop.push_back(l);
          gap.push_back(g);
          ghz.push_back(static_cast<double>(t[3] - t[2]) / static_cast<double>(t[1] - t[0]));
          if (b + static_cast<int64_t>(i) * sms >= first_sum) {
            sum_loop += l, sum_gap += g, ++sums;
          } else {
            plain_loop += l, plain_gap += g, ++plains;
          }
        }
      }
      std::printf(
          "  trace: %zu units, main loop median %.2f us, to the next unit median %.3f us, "
          "SM clock median %.3f GHz",
          loop.size(), median(loop), median(gap), median(ghz));
      if (sum > 1 && sums > 0 && plains > 0) {
        std::printf("; means: %d plain units %.2f + %.3f us, %d sum units %.2f + %.3f us", plains,
                    plain_loop / plains, plain_gap / plains, sums, sum_loop / sums, sum_gap / sums);
      }
      std::printf("\n");
    }
#endif
    const double mn = median(tn), mc = median(tc);
    std::printf("%-18s %10.1f %10.1f %8.3f %10.2e\n", s.c_str(), mc, mn, mn / mc, err);
    std::fflush(stdout);
    cudaFree(parts);
    cudaFree(sum_out);
    cudaFree(flags);
  }
  cudaFree(sums);
  cudaFree(split_ws);
  return 0;
}
