// Copy-engine throughput between two GPUs while cuBLAS GEMMs run on neither, the source, the
// destination or both, pushed (the source's stream copies) or pulled (the destination's stream
// copies), on one or two streams; then pushes shaped as the native matmul_reduce_scatter's
// (column pieces: pitched copies) with its stream memory operations around each piece (wait for
// a counter, raise the owner's flag, reset the counter). Why: beside that op's GEMM one copy
// stream landed a 4 MiB piece every ~25 us (~170 GB/s) and two streams only reached ~185 GB/s
// together (docs/PERFORMANCE.md, ninth session); this says where the time goes.
//
// Not part of the build (a measurement, run by hand on the GPU machine):
//   nvcc -O2 -std=c++17 -arch=sm_90a scripts/experiments/ce_under_load.cu -lcublas -lcuda \
//        -o ce_under_load && ./ce_under_load
// Prints one line per case: median over 7 runs of 8 pieces' total time, and GB/s.
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.cuh"

namespace {

constexpr int kDim = 8192;  // GEMM load: 8192^3 bf16, ~1.4 ms on an H200
constexpr int kPieces = 8;
constexpr int kRuns = 7;

struct Gpu {
  int dev;
  cudaStream_t gemm, copy[2];
  cublasHandle_t blas;
  __nv_bfloat16 *a, *b, *c;
  char* buf;  // source and destination of the copies
};

void setup(Gpu& g, int dev, size_t buf_bytes) {
  g.dev = dev;
  CHECK(cudaSetDevice(dev));
  CHECK(cudaStreamCreateWithFlags(&g.gemm, cudaStreamNonBlocking));
  for (auto& s : g.copy)
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (cublasCreate(&g.blas) != CUBLAS_STATUS_SUCCESS) std::exit(2);
  cublasSetStream(g.blas, g.gemm);
  const size_t n = size_t{kDim} * kDim;
  CHECK(cudaMalloc(&g.a, n * 2));
  CHECK(cudaMalloc(&g.b, n * 2));
  CHECK(cudaMalloc(&g.c, n * 2));
  CHECK(cudaMemset(g.a, 0, n * 2));
  CHECK(cudaMemset(g.b, 0, n * 2));
  CHECK(cudaMalloc(&g.buf, buf_bytes));
  CHECK(cudaMemset(g.buf, 1, buf_bytes));
}

void gemm(Gpu& g) {
  const float one = 1, zero = 0;
  const cublasStatus_t st = cublasGemmEx(
      g.blas, CUBLAS_OP_N, CUBLAS_OP_N, kDim, kDim, kDim, &one, g.a, CUDA_R_16BF, kDim, g.b,
      CUDA_R_16BF, kDim, &zero, g.c, CUDA_R_16BF, kDim, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasGemmEx failed: %d\n", static_cast<int>(st));
    std::exit(2);
  }
}

// How the pieces go: shape (0 contiguous, else pitched with rows of `row` bytes out of a matrix
// with rows 4x as long, as a column piece of a row-major product), and whether the op's stream
// memory operations go around each one.
// flags: 0 none; 1 wait + landed write + reset write (the op's, on the copy stream); 2 the wait
// only; 3 the landed write only; 4 wait + landed write (no reset); 5 the wait on the copy
// stream, the landed write and reset on a side stream behind an event recorded after the copy.
struct Shape {
  size_t row = 0;
  int flags = 0;
};
uint32_t* g_counter = nullptr;  // on the source GPU: a satisfied counter, a reset target
uint32_t* g_flag = nullptr;     // on the destination GPU: the owner's landed flag
cudaStream_t g_side[2];         // on the source GPU: flag-writing streams (flags 5)
cudaEvent_t g_copied[kPieces + 1];

// One run: GEMMs start on the loaded GPUs; the copies start behind the first GEMM of each
// (so they overlap the second and third) and their time is taken on the copying GPU.
float run(Gpu& src, Gpu& dst, bool load_src, bool load_dst, bool pull, int streams, size_t piece,
          Shape shape = {}) {
  Gpu& engine = pull ? dst : src;
  std::vector<cudaEvent_t> after_first;
  for (Gpu* g : {&src, &dst}) {
    if (!((g == &src && load_src) || (g == &dst && load_dst))) continue;
    CHECK(cudaSetDevice(g->dev));
    gemm(*g);
    cudaEvent_t e;
    CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CHECK(cudaEventRecord(e, g->gemm));
    after_first.push_back(e);
    gemm(*g);
    gemm(*g);
  }
  CHECK(cudaSetDevice(engine.dev));
  cudaEvent_t start, stop[2];
  CHECK(cudaEventCreate(&start));
  for (auto& e : stop)
    CHECK(cudaEventCreate(&e));
  for (int s = 0; s < streams; ++s)
    for (cudaEvent_t e : after_first)
      CHECK(cudaStreamWaitEvent(engine.copy[s], e));
  CHECK(cudaEventRecord(start, engine.copy[0]));
  if (streams > 1) CHECK(cudaStreamWaitEvent(engine.copy[1], start));
  for (int i = 0; i < kPieces; ++i) {
    cudaStream_t s = engine.copy[i % streams];
    const bool wait = shape.flags == 1 || shape.flags == 2 || shape.flags == 4 || shape.flags == 5;
    const bool land = shape.flags == 1 || shape.flags == 3 || shape.flags == 4 || shape.flags == 5;
    const bool reset = shape.flags == 1 || shape.flags == 5;
    CHECK(cudaSetDevice(engine.dev));
    if (wait) {
      if (cuStreamWaitValue32(s, reinterpret_cast<CUdeviceptr>(g_counter), 1,
                              CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS)
        std::exit(3);
    }
    if (shape.row == 0) {
      CHECK(cudaMemcpyPeerAsync(dst.buf + i * piece, dst.dev, src.buf + i * piece, src.dev, piece,
                                s));
    } else {
      // Piece i: columns [i % 4 * row, +row) of a block of 4 * piece bytes with rows of 4 * row.
      const size_t pitch = 4 * shape.row, rows = piece / shape.row;
      const size_t base = (i / 4) * 4 * piece + (i % 4) * shape.row;
      CHECK(cudaMemcpy2DAsync(dst.buf + base, pitch, src.buf + base, pitch, shape.row, rows,
                              cudaMemcpyDefault, s));
    }
    cudaStream_t w = s;
    if (shape.flags == 5) {
      // The writes wait for this copy on the side stream; the copy stream goes on at once.
      CHECK(cudaEventRecord(g_copied[i], s));
      w = g_side[i % streams];
      CHECK(cudaStreamWaitEvent(w, g_copied[i]));
    }
    if (land &&
        cuStreamWriteValue32(w, reinterpret_cast<CUdeviceptr>(g_flag), i + 1, 0) != CUDA_SUCCESS)
      std::exit(3);
    if (reset &&
        cuStreamWriteValue32(w, reinterpret_cast<CUdeviceptr>(g_counter + 1), 0, 0) != CUDA_SUCCESS)
      std::exit(3);
  }
  for (int s = 0; s < streams; ++s) {
    if (shape.flags == 5) {
      // The last flag is up when the side stream is through.
      CHECK(cudaEventRecord(g_copied[kPieces], g_side[s]));
      CHECK(cudaStreamWaitEvent(engine.copy[s], g_copied[kPieces]));
    }
    CHECK(cudaEventRecord(stop[s], engine.copy[s]));
  }
  for (int s = 0; s < streams; ++s)
    CHECK(cudaEventSynchronize(stop[s]));
  float ms = 0;
  for (int s = 0; s < streams; ++s) {
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, start, stop[s]));
    ms = std::max(ms, t);
  }
  for (Gpu* g : {&src, &dst}) {
    CHECK(cudaSetDevice(g->dev));
    CHECK(cudaDeviceSynchronize());
  }
  for (cudaEvent_t e : after_first)
    cudaEventDestroy(e);
  cudaEventDestroy(start);
  for (auto& e : stop)
    cudaEventDestroy(e);
  return ms;
}

}  // namespace

int main() {
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  if (count < 2) {
    std::printf("needs 2 GPUs, found %d\n", count);
    return 1;
  }
  const size_t max_piece = size_t{16} << 20;
  Gpu g0{}, g1{};
  setup(g0, 0, kPieces * max_piece);
  setup(g1, 1, kPieces * max_piece);
  CHECK(cudaSetDevice(0));
  CHECK(cudaDeviceEnablePeerAccess(1, 0));
  CHECK(cudaSetDevice(1));
  CHECK(cudaDeviceEnablePeerAccess(0, 0));
  CHECK(cudaSetDevice(0));
  CHECK(cudaMalloc(&g_counter, 2 * sizeof(uint32_t)));
  for (auto& st : g_side)
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (auto& e : g_copied)
    CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const uint32_t one = 1;
  CHECK(cudaMemcpy(g_counter, &one, sizeof(one), cudaMemcpyHostToDevice));
  CHECK(cudaSetDevice(1));
  CHECK(cudaMalloc(&g_flag, sizeof(uint32_t)));
  {
    // The GEMM load itself, to show it runs: three GEMMs on GPU 0.
    CHECK(cudaSetDevice(0));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    gemm(g0);
    CHECK(cudaEventRecord(a, g0.gemm));
    gemm(g0);
    gemm(g0);
    gemm(g0);
    CHECK(cudaEventRecord(b, g0.gemm));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    std::printf("GEMM load: %.1f us per 8192^3 bf16 GEMM\n", ms * 1e3f / 3);
  }
  const char* loads[] = {"idle", "src busy", "dst busy", "both busy"};
  std::printf("%-9s %-10s %-7s %5s %10s %8s\n", "piece", "load", "engine", "strm", "8 pieces",
              "GB/s");
  for (size_t piece : {size_t{4} << 20, size_t{16} << 20}) {
    for (int load = 0; load < 4; load += 3) {
      for (bool pull : {false, true}) {
        for (int streams : {1, 2}) {
          std::vector<float> ms;
          run(g0, g1, load & 1, load & 2, pull, streams, piece);  // warm-up
          for (int r = 0; r < kRuns; ++r)
            ms.push_back(run(g0, g1, load & 1, load & 2, pull, streams, piece));
          std::sort(ms.begin(), ms.end());
          const float med = ms[kRuns / 2];
          std::printf("%3zu MiB   %-10s %-7s %5d %8.1f us %8.1f\n", piece >> 20, loads[load],
                      pull ? "pull" : "push", streams, med * 1e3f,
                      kPieces * piece / (med * 1e-3) / 1e9);
        }
      }
    }
  }
  // Pushes shaped as the op's, both GPUs busy.
  std::printf("\npushes as the op's, both GPUs busy:\n%-9s %-12s %-6s %5s %10s %8s\n", "piece",
              "shape", "flags", "strm", "8 pieces", "GB/s");
  for (size_t piece : {size_t{4} << 20, size_t{8} << 20}) {
    for (size_t row : {size_t{0}, size_t{2048}}) {
      for (int flags = 0; flags <= 5; ++flags) {
        for (int streams : {1, 2}) {
          const Shape shape{row, flags};
          std::vector<float> ms;
          run(g0, g1, true, true, false, streams, piece, shape);
          for (int r = 0; r < kRuns; ++r)
            ms.push_back(run(g0, g1, true, true, false, streams, piece, shape));
          std::sort(ms.begin(), ms.end());
          const float med = ms[kRuns / 2];
          char what[32];
          std::snprintf(what, sizeof(what), row == 0 ? "contiguous" : "rows %zu B", row);
          std::printf("%3zu MiB   %-12s %-6d %5d %8.1f us %8.1f\n", piece >> 20, what, flags,
                      streams, med * 1e3f, kPieces * piece / (med * 1e-3) / 1e9);
        }
      }
    }
  }
  return 0;
}
