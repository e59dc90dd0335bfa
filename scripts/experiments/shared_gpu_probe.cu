// What ranks sharing one GPU (ASYNCTP_SHARED_GPUS, src/device/cuda/cuda_backend.h) can count on
// while a kernel spins on every SM, as the native GEMM does waiting for chunks or parts:
//   1. in one process, does a copy on another stream progress (a copy engine), or does it wait
//      for an SM (a copy kernel)? With the spinning kernel leaving room on each SM for other
//      blocks, and with it taking every thread slot (as the native GEMM takes every register).
//   2. from a second process, does a write to the spinning kernel's flag get through, from a
//      kernel of one block or from a stream memory write, with the spinning kernel on every SM
//      or on half of them?
// Why: with two ranks on one H100 the native ops deadlocked on large problems (the GEMM on every
// SM) and passed on small ones, and passed everywhere once each GEMM took its share of the SMs.
//
// Not part of the build (a measurement, run by hand on the GPU machine):
//   nvcc -O2 -std=c++17 -arch=sm_90a scripts/experiments/shared_gpu_probe.cu -lcuda \
//        -o shared_gpu_probe && ./shared_gpu_probe
// Prints one line per case: released (and after how long) or timed out (3 s).
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "check.cuh"

namespace {

constexpr unsigned long long kLimitNs = 3'000'000'000ull;
constexpr int kSmem = 200 * 1024;  // one block per SM

// Every block spins (thread 0) until *flag != 0 or the limit; then the block ends.
__global__ void spin(const volatile unsigned* flag, int* timed_out) {
  extern __shared__ char smem[];
  unsigned long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  if (threadIdx.x == 0) {
    while (*flag == 0) {
      unsigned long long t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      if (t - t0 > kLimitNs) {
        atomicExch(timed_out, 1);
        break;
      }
    }
  }
  smem[threadIdx.x] = 0;
  __syncthreads();
}

__global__ void raise(unsigned* flag) {
  *flag = 1;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void same_process() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaFuncSetAttribute(spin, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  cudaStream_t a, b;
  CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  unsigned* flag;
  int* timed_out;
  CHECK(cudaMalloc(&flag, 4));
  CHECK(cudaMallocManaged(&timed_out, 4));
  const size_t bytes = 64 << 20;
  char *src, *dst, *host;
  CHECK(cudaMalloc(&src, bytes));
  CHECK(cudaMalloc(&dst, bytes));
  CHECK(cudaMallocHost(&host, bytes));
  // The spinning kernel as one block of 128 threads per SM (200 KiB of shared memory: room left
  // for other blocks' threads and registers), or as two of 1024 threads (every thread slot taken,
  // as the native GEMM's 384 threads take every register).
  const struct {
    const char* name;
    int blocks_per_sm, threads, smem;
  } spinners[] = {{"1 x 128 threads", 1, 128, kSmem}, {"2 x 1024 threads", 2, 1024, kSmem / 2}};
  const char* names[] = {"1-D copy", "2-D copy (half of each 8 KiB row)", "host-to-device copy",
                         "1-D batch copy, prefer overlap", "no copy"};
  for (const auto& sp : spinners) {
    for (int kind = 0; kind < 5; ++kind) {
      CHECK(cudaMemset(flag, 0, 4));
      *timed_out = 0;
      CHECK(cudaDeviceSynchronize());
      const auto t0 = std::chrono::steady_clock::now();
      spin<<<sms * sp.blocks_per_sm, sp.threads, sp.smem, a>>>(flag, timed_out);
      if (kind == 0) CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, b));
      if (kind == 1) {
        CHECK(cudaMemcpy2DAsync(dst, 8192, src, 8192, 4096, bytes / 8192, cudaMemcpyDeviceToDevice,
                                b));
      }
      if (kind == 2) CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, b));
      if (kind == 3) {
        // cudaMemcpyFlagPreferOverlapWithCompute: a hint to take a copy engine (CUDA 13 form).
        cudaMemcpyAttributes attr{};
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
        void* dsts[] = {dst};
        const void* srcs[] = {src};
        size_t sizes[] = {bytes}, attr_index = 0;
        CHECK(cudaMemcpyBatchAsync(dsts, srcs, sizes, 1, &attr, &attr_index, 1, b));
      }
      CU_CHECK(cuStreamWriteValue32(b, reinterpret_cast<CUdeviceptr>(flag), 1, 0));
      CHECK(cudaDeviceSynchronize());
      std::printf(
          "one process, kernel on all %d SMs (%s), %-34s then a stream write: %s (%.1f ms)\n", sms,
          sp.name, names[kind], *timed_out ? "TIMED OUT" : "released", ms_since(t0));
    }
  }
  CHECK(cudaFreeHost(host));
}

// Parent: spins; child: raises the parent's flag (shared through cudaIpc) while it spins.
void two_processes() {
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) std::exit(1);
  const pid_t pid = fork();
  if (pid == 0) {
    cudaIpcMemHandle_t handle;
    if (read(to_child[0], &handle, sizeof handle) != sizeof handle) std::_Exit(1);
    unsigned* flag = nullptr;
    CHECK(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&flag), handle,
                               cudaIpcMemLazyEnablePeerAccess));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    char how = 0;
    while (read(to_child[0], &how, 1) == 1 && how != 'q') {
      if (how == 'k') raise<<<1, 1, 0, s>>>(flag);
      if (how == 'w') CU_CHECK(cuStreamWriteValue32(s, reinterpret_cast<CUdeviceptr>(flag), 1, 0));
      CHECK(cudaStreamSynchronize(s));
      if (write(to_parent[1], &how, 1) != 1) std::_Exit(1);
    }
    std::_Exit(0);
  }
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaFuncSetAttribute(spin, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  cudaStream_t a;
  CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  unsigned* flag;
  int* timed_out;
  CHECK(cudaMalloc(&flag, 4));
  CHECK(cudaMallocManaged(&timed_out, 4));
  cudaIpcMemHandle_t handle;
  CHECK(cudaIpcGetMemHandle(&handle, flag));
  if (write(to_child[1], &handle, sizeof handle) != sizeof handle) std::exit(1);
  for (const int blocks : {sms, sms / 2}) {
    for (const char how : {'k', 'w'}) {
      CHECK(cudaMemset(flag, 0, 4));
      *timed_out = 0;
      CHECK(cudaDeviceSynchronize());
      spin<<<blocks, 128, kSmem, a>>>(flag, timed_out);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the kernel is spinning
      const auto t0 = std::chrono::steady_clock::now();
      if (write(to_child[1], &how, 1) != 1) std::exit(1);
      char done = 0;
      if (read(to_parent[0], &done, 1) != 1) std::exit(1);
      const double child_ms = ms_since(t0);
      CHECK(cudaDeviceSynchronize());
      std::printf(
          "two processes, kernel on %3d of %d SMs, the other raises the flag with %-19s: %s "
          "(the other's write took %.1f ms, the kernel ended after %.1f ms)\n",
          blocks, sms, how == 'k' ? "a one-block kernel" : "a stream write",
          *timed_out ? "TIMED OUT" : "released", child_ms, ms_since(t0));
    }
  }
  const char quit = 'q';
  if (write(to_child[1], &quit, 1) != 1) std::exit(1);
  waitpid(pid, nullptr, 0);
}

}  // namespace

int main() {
  // The child must not inherit an initialized CUDA context: fork first.
  const pid_t pid = fork();
  if (pid == 0) {
    two_processes();
    return 0;
  }
  waitpid(pid, nullptr, 0);
  same_process();
  return 0;
}
