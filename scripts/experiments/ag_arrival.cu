// The native all-gather matmul's GEMM on one GPU with its chunks landing as they would at world
// size W: an emulation of the ws-W arrival for when no machine with several GPUs is lent.
//
// Rank R's view (--rank, default 0): A [M, K] in W chunks of M/W rows, chunk R its own shard
// (read in place, no wait), chunks R+1, R+2, ... landing in that order (at ws W every rank
// receives one push at a time: from r+1, then r+2, ...; see src/ops/all_gather_matmul.cpp), each
// in P pieces with a ready flag per piece. The peers' rows are in place from the start (what is
// emulated is when their flags rise); the own chunk's rows in A are NaN but for the edge rows
// that the op copies there (below). A piece of B bytes is modelled as taking
//   latency + B / rate                         (defaults 10 us, 330 GB/s)
// on one copy stream, the fit to the eighth session's ws-4 traces (4 MiB pieces every ~25 us,
// 8 MiB every ~37 us; docs/PERFORMANCE.md). The copy stream spends that time on a host-to-device
// copy from pinned memory, sized by a calibration of such copies made first (so no SM and
// little HBM are taken from the GEMM), then raises the piece's flag (cuStreamWriteValue32).
// The stream starts at the op's start, before the GEMM's launch, as the op's first push does.
//
// Per shape it prints (us, medians, each run followed by an idle pause as long as it took):
//   cublas   cuBLASLt's GEMM of the whole [M, K] x [K, N], alone
//   ready    the native GEMM with every flag up before it starts (the bench's ngsig)
//   landing  the native GEMM with the flags rising as modelled, from the op's start to the
//            GEMM's end (the copy stream joined)
//   last     when the last flag rose, measured (and as modelled)
//   floor    max(cublas, the modelled arrival of everything)
// and the relative error of `landing`'s C against cuBLASLt's.
//
// Not part of the build (a measurement, run by hand on a GPU machine):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I src \
//     scripts/experiments/ag_arrival.cu src/kernels/async_gemm.cu -lcuda -lcublasLt -o ag_arrival
//   ./ag_arrival [--ws W] [--pieces P] [--gbps G] [--latency-us L] [--iters N]
//                [--rank R] [--own-edges-late] MxKxN ...
// Where M / W is off the 128-row tile grid, the tiles over the own chunk's edges read its edge
// rows from A: they are copied there (within the GPU) and the own flags raised on the compute
// stream before the GEMM, as the op does, or with --own-edges-late on the copy stream after the
// other chunks, as it did before the sixteenth session.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <vector>

#include "gemm_common.cuh"
#include "kernels/kernels.h"
#include "kernels/native/schedule.h"

namespace {

// Host-to-device copies from pinned memory timed alone: duration = a + bytes * b (least squares
// over sizes from 64 KiB to 8 MiB).
struct H2dModel {
  double a_us = 0, us_per_byte = 0;
  size_t bytes_for(double us) const {
    if (us <= a_us) return 4096;
    const double bytes = (us - a_us) / us_per_byte;
    return std::max<size_t>(4096, static_cast<size_t>(bytes) / 4096 * 4096);
  }
};

H2dModel calibrate(void* dst, const void* src, cudaStream_t stream, cudaEvent_t e0,
                   cudaEvent_t e1) {
  std::vector<double> xs, ys;
  for (size_t bytes = size_t{64} << 10; bytes <= size_t{8} << 20; bytes *= 2) {
    std::vector<double> t;
    for (int i = 0; i < 11; ++i) {
      CHECK(cudaEventRecord(e0, stream));
      CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
      CHECK(cudaEventRecord(e1, stream));
      CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      t.push_back(ms * 1e3);
    }
    xs.push_back(static_cast<double>(bytes));
    ys.push_back(median(t));
  }
  double mx = 0, my = 0;
  for (size_t i = 0; i < xs.size(); ++i)
    mx += xs[i], my += ys[i];
  mx /= xs.size(), my /= ys.size();
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    sxy += (xs[i] - mx) * (ys[i] - my);
    sxx += (xs[i] - mx) * (xs[i] - mx);
  }
  H2dModel m;
  m.us_per_byte = sxy / sxx;
  m.a_us = my - m.us_per_byte * mx;
  std::printf("h2d calibration: %.2f us + %.1f GB/s", m.a_us, 1e-3 / m.us_per_byte);
  for (size_t i = 0; i < xs.size(); ++i)
    std::printf("%s%.0f KiB %.1f", i ? ", " : " (", xs[i] / 1024, ys[i]);
  std::printf(" us)\n");
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20, ws = 4, pieces = 1, rank = 0;
  double gbps = 330, latency_us = 10;
  bool edges_late = false;
  std::vector<std::string> shapes;
  for (int i = 1; i < argc; ++i) {
    const bool more = i + 1 < argc;
    if (!std::strcmp(argv[i], "--iters") && more) {
      iters = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--ws") && more) {
      ws = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--pieces") && more) {
      pieces = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--gbps") && more) {
      gbps = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--latency-us") && more) {
      latency_us = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--rank") && more) {
      rank = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--own-edges-late")) {
      edges_late = true;
    } else {
      shapes.emplace_back(argv[i]);
    }
  }
  if (shapes.empty() || iters < 1 || ws < 2 || pieces < 1 || gbps <= 0 || latency_us < 0 ||
      rank < 0 || rank >= ws) {
    std::fprintf(stderr,
                 "usage: %s [--ws W>=2] [--pieces P] [--gbps G] [--latency-us L] [--iters N] "
                 "[--rank R] [--own-edges-late] "
                 "MxKxN [MxKxN ...]\n",
                 argv[0]);
    return 2;
  }
  cudaStream_t compute, copy;
  CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
  cudaEvent_t start, stop, copied, e0, e1;
  for (cudaEvent_t* e : {&start, &stop, &copied, &e0, &e1})
    CHECK(cudaEventCreate(e));
  const size_t pinned_bytes = size_t{64} << 20;
  void *pinned = nullptr, *sink = nullptr;
  CHECK(cudaMallocHost(&pinned, pinned_bytes));
  std::memset(pinned, 0, pinned_bytes);
  CHECK(cudaMalloc(&sink, pinned_bytes));
  const H2dModel h2d = calibrate(sink, pinned, copy, e0, e1);

  void* split_ws = nullptr;
  CHECK(cudaMalloc(&split_ws, asynctp::kernels::async_gemm_split_workspace_bytes()));
  CHECK(cudaMemset(split_ws, 0, asynctp::kernels::async_gemm_split_workspace_bytes()));
  double* sums = nullptr;
  CHECK(cudaMalloc(&sums, 2 * sizeof(double)));
  std::printf("ws %d, %d piece(s) per chunk, %.1f us + bytes / %.0f GB/s per piece%s\n", ws, pieces,
              latency_us, gbps, edges_late ? ", own edge rows landed late (copy stream)" : "");
  std::printf("%-18s %9s %9s %9s %8s %15s %9s %8s %8s %10s %s\n", "MxKxN", "cublas", "ready",
              "landing", "lnd-rdy", "last (model)", "floor", "lnd/flr", "split", "rel_err",
              "own edge rows");
  uint32_t op = 0;  // the flags carry op numbers: no reset between runs
  for (const auto& s : shapes) {
    const Problem problem(s, compute);
    const long long m = problem.m, k = problem.k, n = problem.n;
    __nv_bfloat16 *a = problem.a, *b = problem.b, *c = problem.c, *c_ref = problem.c_ref;
    const int64_t rows = m / ws;
    if (m % ws != 0 || rows % pieces != 0 || (pieces > 1 && (rows / pieces) % 128 != 0)) {
      std::fprintf(stderr, "%s: M / ws / pieces must be a multiple of 128 (with pieces)\n",
                   s.c_str());
      return 2;
    }
    // The own shard as the op holds it (chunk R's rows). In A (the gathered buffer) those rows
    // are NaN but for what the edge copies land, so a wrong edge shows in the check below; the
    // reference (cuBLASLt) multiplies a_ref, A as it should be.
    __nv_bfloat16 *own = nullptr, *a_ref = nullptr;
    const size_t row_bytes = sizeof(*a) * k;
    CHECK(cudaMalloc(&own, rows * row_bytes));
    CHECK(cudaMalloc(&a_ref, m * row_bytes));
    CHECK(cudaMemcpyAsync(a_ref, a, m * row_bytes, cudaMemcpyDeviceToDevice, compute));
    CHECK(cudaMemcpyAsync(own, a + rank * rows * k, rows * row_bytes, cudaMemcpyDeviceToDevice,
                          compute));
    CHECK(cudaMemsetAsync(a + rank * rows * k, 0xFF, rows * row_bytes, compute));
    uint32_t* ready = nullptr;  // piece q of chunk c: ready[q * ws + c]
    CHECK(cudaMalloc(&ready, sizeof(uint32_t) * pieces * ws));
    CHECK(cudaMemset(ready, 0, sizeof(uint32_t) * pieces * ws));

    asynctp::kernels::NativeGemmParams args = problem.native_args();
    args.chunk_rows = rows;
    args.first_chunk = rank;
    args.ready = ready;
    args.ready_rows = rows / pieces;
    args.ready_stride = ws;
    args.own_a = own;
    args.own_lda = k;
    args.own_chunk = rank;
    args.timeout_ns = 10'000'000'000ull;
    args.split_workspace = split_ws;
    if (const char* why = asynctp::kernels::async_gemm_unsupported(args)) {
      std::fprintf(stderr, "%s: native GEMM unsupported: %s\n", s.c_str(), why);
      return 1;
    }
    Lt lt;
    lt.init(m, k, n);

    const size_t piece_bytes = static_cast<size_t>(rows / pieces) * k * sizeof(__nv_bfloat16);
    const double piece_us = latency_us + static_cast<double>(piece_bytes) / (gbps * 1e3);
    const size_t delay_bytes = std::min(h2d.bytes_for(piece_us), pinned_bytes);
    const double model_last = piece_us * (ws - 1) * pieces;
    // Rows of the own chunk off the tile grid: the edge tiles read them from A, landed by a copy
    // within the GPU (a kernel), then the own flags (see src/ops/all_gather_matmul.cpp).
    const asynctp::kernels::NativeGemmOwnEdges edges = asynctp::kernels::own_edge_rows(args);
    auto land_own_edges = [&](cudaStream_t stream) {
      if (edges.head > 0) {
        CHECK(cudaMemcpyAsync(a + rank * rows * k, own, edges.head * row_bytes,
                              cudaMemcpyDeviceToDevice, stream));
      }
      if (edges.tail > 0) {
        const int64_t begin = rows - edges.tail;
        CHECK(cudaMemcpyAsync(a + (rank * rows + begin) * k, own + begin * k,
                              edges.tail * row_bytes, cudaMemcpyDeviceToDevice, stream));
      }
      for (int q = 0; q < pieces; ++q)
        CU_CHECK(cuStreamWriteValue32(stream, reinterpret_cast<CUdeviceptr>(ready + q * ws + rank),
                                      op, 0));
    };

    // One op: the flags of this op's number rise either all before the GEMM (landed) or one
    // piece after another on the copy stream, which starts at the op's start.
    double last_us = 0;
    auto native = [&](bool landed) {
      ++op;
      args.ready_value = op;
      CHECK(cudaEventRecord(start, compute));
      if (landed) {
        for (int i = 0; i < pieces * ws; ++i)
          CU_CHECK(cuStreamWriteValue32(compute, reinterpret_cast<CUdeviceptr>(ready + i), op, 0));
      } else {
        if (edges.head + edges.tail > 0 && !edges_late) land_own_edges(compute);
        CHECK(cudaStreamWaitEvent(copy, start));
        for (int i = 1; i < ws; ++i) {
          const int ch = (rank + i) % ws;
          for (int q = 0; q < pieces; ++q) {
            CHECK(cudaMemcpyAsync(sink, pinned, delay_bytes, cudaMemcpyHostToDevice, copy));
            CU_CHECK(cuStreamWriteValue32(copy, reinterpret_cast<CUdeviceptr>(ready + q * ws + ch),
                                          op, 0));
          }
        }
        if (edges.head + edges.tail > 0 && edges_late) land_own_edges(copy);
        CHECK(cudaEventRecord(copied, copy));
      }
      CHECK(asynctp::kernels::async_gemm(args, compute));
      if (!landed) CHECK(cudaStreamWaitEvent(compute, copied));
      CHECK(cudaEventRecord(stop, compute));
      CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (!landed) {
        float last = 0;
        CHECK(cudaEventElapsedTime(&last, start, copied));
        last_us = last * 1e3;
      }
      spin_for(ms);  // pace 1
      return ms * 1e3;
    };
    auto cublas = [&] {
      CHECK(cudaEventRecord(start, compute));
      lt.run(a_ref, b, c_ref, compute);
      CHECK(cudaEventRecord(stop, compute));
      CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, start, stop));
      spin_for(ms);
      return ms * 1e3;
    };

    // Correct first: the landing run's C against cuBLASLt's.
    cublas();
    native(false);
    CHECK(cudaMemsetAsync(sums, 0, 2 * sizeof(double), compute));
    diff_norms<<<512, 256, 0, compute>>>(c, c_ref, m * n, sums);
    double h[2];
    CHECK(cudaMemcpyAsync(h, sums, sizeof(h), cudaMemcpyDeviceToHost, compute));
    CHECK(cudaStreamSynchronize(compute));
    const double err = std::sqrt(h[0] / h[1]);
    if (!(err < 1e-2)) {
      std::fprintf(stderr, "%s: wrong result, relative error %.3e\n", s.c_str(), err);
      return 1;
    }
    std::vector<double> tc, tr, tl, last;
    for (int i = -3; i < iters; ++i) {
      // The three in a rotating order, so that none always follows another.
      double x[3];
      for (int j = 0; j < 3; ++j) {
        const int which = (i + 3 + j) % 3;
        x[which] = which == 0 ? cublas() : native(which == 2);
        if (which == 1) last.push_back(last_us);
      }
      if (i >= 0) tc.push_back(x[0]), tl.push_back(x[1]), tr.push_back(x[2]);
    }
    const double mc = median(tc), mr = median(tr), ml = median(tl);
    const double floor = std::max(mc, model_last);
    std::printf("%-18s %9.1f %9.1f %9.1f %8.1f %7.1f (%5.1f) %9.1f %8.3f %8d %10.2e %lld+%lld\n",
                s.c_str(), mc, mr, ml, ml - mr, median(last), model_last, floor, ml / floor,
                asynctp::kernels::async_gemm_tail_split(args), err,
                static_cast<long long>(edges.head), static_cast<long long>(edges.tail));
    std::fflush(stdout);
    cudaFree(ready);
    cudaFree(own);
    cudaFree(a_ref);
  }
  cudaFree(sums);
  cudaFree(split_ws);
  cudaFree(sink);
  cudaFreeHost(pinned);
  return 0;
}
