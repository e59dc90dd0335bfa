// Host time of each CUDA call the overlapped ops enqueue, on an idle GPU (each call after the
// stream has drained) and behind a busy one (a spinning kernel at the stream's head). Why: the
// native all_gather_matmul's trace (bench --trace, tenth session) put its kernel's start 15-18 us
// after the op was called on an idle GPU, all of it host time: ~4 us of checks, ~9 us for the
// first push (an event, a stream wait, the copy, a second event and wait, the flag) and ~7.5 us
// for the kernel's launch. This says which calls cost that.
//
// Not part of the build (a measurement, run by hand on a GPU machine with 2 GPUs or more):
//   nvcc -O2 -std=c++17 -arch=sm_90a scripts/experiments/host_costs.cu -lcuda -o host_costs
//   ./host_costs
// Prints one line per call: the median host time over 200 calls, in us, idle and busy.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "check.cuh"

__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

struct Small {
  int x[16];
};
__global__ void small_params(Small s, int* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0 && out != nullptr) *out = s.x[0];
}

// As the native GEMM's: six 128-byte tensor maps and ~300 bytes of scalars.
struct Big {
  CUtensorMap maps[6];
  long long scalars[40];
};
__global__ void big_params_plain(const __grid_constant__ Big b, int* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0 && out != nullptr) *out = static_cast<int>(b.scalars[0]);
}

using Clock = std::chrono::steady_clock;

// Median host time of `call` in us: idle (the streams drained before each call) and busy (a
// kernel spinning ~2 ms at the head of `busy_stream` while 200 calls are enqueued).
void measure(const char* name, cudaStream_t busy_stream, const std::function<void()>& call) {
  constexpr int kCalls = 200;
  std::vector<double> idle, busy;
  for (int i = 0; i < kCalls; ++i) {
    CHECK(cudaDeviceSynchronize());
    const auto t0 = Clock::now();
    call();
    idle.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  CHECK(cudaDeviceSynchronize());
  spin<<<1, 1, 0, busy_stream>>>(4'000'000);
  CHECK(cudaGetLastError());
  for (int i = 0; i < kCalls; ++i) {
    const auto t0 = Clock::now();
    call();
    busy.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  CHECK(cudaDeviceSynchronize());
  auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("%-52s idle %6.2f us   busy %6.2f us\n", name, median(idle), median(busy));
}

int main() {
  int devices = 0;
  CHECK(cudaGetDeviceCount(&devices));
  const bool peer = devices >= 2;
  CHECK(cudaSetDevice(0));
  if (peer) CHECK(cudaDeviceEnablePeerAccess(1, 0));
  cudaStream_t s, side;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t ev;
  CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  cudaEvent_t timed;
  CHECK(cudaEventCreate(&timed));
  constexpr size_t kBytes = 4 << 20;
  void *src = nullptr, *dst = nullptr, *remote = nullptr;
  CHECK(cudaMalloc(&src, kBytes));
  CHECK(cudaMalloc(&dst, kBytes));
  unsigned* flag = nullptr;
  CHECK(cudaMalloc(&flag, 64));
  CHECK(cudaMemset(flag, 0, 64));
  if (peer) {
    CHECK(cudaSetDevice(1));
    CHECK(cudaDeviceEnablePeerAccess(0, 0));
    CHECK(cudaMalloc(&remote, kBytes));
    CHECK(cudaSetDevice(0));
  }
  CU_CHECK(cuInit(0));
  const auto fp = reinterpret_cast<CUdeviceptr>(flag);

  measure("cudaGetDevice", s, [] {
    int d;
    CHECK(cudaGetDevice(&d));
  });
  measure("cudaStreamIsCapturing", s, [&] {
    cudaStreamCaptureStatus st;
    CHECK(cudaStreamIsCapturing(s, &st));
  });
  measure("cudaEventRecord (no timing)", s, [&] { CHECK(cudaEventRecord(ev, s)); });
  measure("cudaEventRecord (timing)", s, [&] { CHECK(cudaEventRecord(timed, s)); });
  measure("cudaEventRecord + cudaStreamWaitEvent", s, [&] {
    CHECK(cudaEventRecord(ev, s));
    CHECK(cudaStreamWaitEvent(side, ev, 0));
  });
  measure("cuStreamWriteValue32", s, [&] { CU_CHECK(cuStreamWriteValue32(s, fp, 1, 0)); });
  measure("cuStreamWaitValue32 (satisfied)", s,
          [&] { CU_CHECK(cuStreamWaitValue32(s, fp, 0, CU_STREAM_WAIT_VALUE_GEQ)); });
  measure("cudaMemcpyAsync 4 MiB local", s,
          [&] { CHECK(cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDefault, s)); });
  if (peer) {
    measure("cudaMemcpyAsync 4 MiB to peer", s,
            [&] { CHECK(cudaMemcpyAsync(remote, src, kBytes, cudaMemcpyDefault, s)); });
    measure("cudaMemcpyPeerAsync 4 MiB to peer", s,
            [&] { CHECK(cudaMemcpyPeerAsync(remote, 1, src, 0, kBytes, s)); });
    measure("cudaMemcpy2DAsync 4 MiB to peer (2 KiB rows)", s, [&] {
      CHECK(cudaMemcpy2DAsync(remote, 2048, src, 2048, 2048, kBytes / 2048, cudaMemcpyDefault, s));
    });
  }
  Small sm{};
  measure("kernel <<<>>>, 64 B of parameters", s, [&] {
    small_params<<<132, 128, 0, s>>>(sm, nullptr);
    CHECK(cudaGetLastError());
  });
  Big big{};
  measure("kernel <<<>>>, 1 KiB of parameters", s, [&] {
    big_params_plain<<<132, 384, 0, s>>>(big, nullptr);
    CHECK(cudaGetLastError());
  });
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(132);
  config.blockDim = dim3(384);
  config.stream = s;
  measure("cudaLaunchKernelEx, 1 KiB, no attributes", s, [&] {
    CHECK(cudaLaunchKernelEx(&config, big_params_plain, big, static_cast<int*>(nullptr)));
  });
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t clustered = config;
  clustered.attrs = attr;
  clustered.numAttrs = 1;
  measure("cudaLaunchKernelEx, 1 KiB, cluster 2", s, [&] {
    CHECK(cudaLaunchKernelEx(&clustered, big_params_plain, big, static_cast<int*>(nullptr)));
  });
  CUtensorMap map;
  const cuuint64_t dims[2] = {2048, kBytes / 4096};  // the 4 MiB of src as bf16 rows of 4 KiB
  const cuuint64_t strides[1] = {2048 * 2};
  const cuuint32_t box[2] = {64, 128};
  const cuuint32_t elem[2] = {1, 1};
  measure("cuTensorMapEncodeTiled", s, [&] {
    CU_CHECK(cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, src, dims, strides,
                                    box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                    CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  });
  CHECK(cudaFree(src));
  CHECK(cudaFree(dst));
  CHECK(cudaFree(flag));
  if (remote != nullptr) CHECK(cudaFree(remote));
  CHECK(cudaEventDestroy(ev));
  CHECK(cudaEventDestroy(timed));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaStreamDestroy(side));
  std::printf("done\n");
  return 0;
}
