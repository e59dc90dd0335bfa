#include "device/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>
#ifdef ASYNCTP_WITH_NVTX
#include <nvtx3/nvToolsExtCudaRt.h>
#endif

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/env.h"
#include "core/log.h"
#include "device/cuda/cublaslt_gemm.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/driver_api.h"
#include "device/cuda/ktensor.h"
#include "device/native_params.h"
#include "kernels/native/schedule.h"

namespace asynctp {

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

int cuda_ranks_per_gpu() {
  return static_cast<int>(envvars::kSharedGpus.integer());
}

namespace {

// Names `stream` in NVTX tools (device/nvtx.h): nsys shows the stream's row by the name. A no-op
// without a tool, or where the build has no NVTX.
void name_stream(cudaStream_t stream, std::string_view name) {
#ifdef ASYNCTP_WITH_NVTX
  if (!name.empty()) nvtxNameCudaStreamA(stream, std::string(name).c_str());
#endif
}

// Shape and strides of a same-shape pair with size-1 dims dropped and dims merged wherever both
// tensors are contiguous across them. Innermost last. (Fixed arrays: every copy of an op makes
// one, and an allocation is host time.)
struct CopyPlan {
  std::array<int64_t, kMaxDims> sizes{}, dst_strides{}, src_strides{};
  size_t dims = 0;
};

CopyPlan coalesce(const Tensor& dst, const Tensor& src) {
  CopyPlan p;
  for (int d = 0; d < dst.dim(); ++d) {
    if (dst.size(d) == 1) continue;
    if (p.dims > 0 && p.dst_strides[p.dims - 1] == dst.stride(d) * dst.size(d) &&
        p.src_strides[p.dims - 1] == src.stride(d) * src.size(d)) {
      p.sizes[p.dims - 1] *= dst.size(d);
      p.dst_strides[p.dims - 1] = dst.stride(d);
      p.src_strides[p.dims - 1] = src.stride(d);
      continue;
    }
    p.sizes[p.dims] = dst.size(d);
    p.dst_strides[p.dims] = dst.stride(d);
    p.src_strides[p.dims] = src.stride(d);
    ++p.dims;
  }
  return p;
}

// A wait's bound as the kernels take it (%globaltimer nanoseconds).
uint64_t timeout_ns(std::chrono::milliseconds timeout) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count());
}

// The native GEMM's CTAs where ranks share a GPU: each rank's share of the SMs. Beside a kernel
// spinning on every SM another process's kernel does not start promptly, and the native ops'
// ranks wait on each other's GEMMs many times per op; between ranks of one GPU the pushes are
// copies within the GPU, which are kernels too and need SMs the GEMMs leave free (see
// docs/DECISIONS.md D25, D3).
// 0 (one CTA per SM) where every rank has a GPU of its own.
int shared_gpu_ctas() {
  static const int ctas = [] {
    const int per_gpu = cuda_ranks_per_gpu();
    int device = 0, sms = 0;
    if (per_gpu == 1 || cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      return 0;
    }
    return std::max(sms / per_gpu, 1);
  }();
  return ctas;
}

// The launcher's view of a ChunkedGemmArgs: the contract's (to_native_params) on this
// device's share of the SMs; "" or why it cannot be expressed.
std::string to_async_gemm(const ChunkedGemmArgs& args, kernels::NativeGemmParams* k) {
  std::string why = to_native_params(args, k);
  k->max_ctas = shared_gpu_ctas();
  return why;
}

class CudaStream final : public Stream {
 public:
  CudaStream(cudaStream_t stream, CudaBackendInternals* owner, bool owned)
      : stream_(stream), owner_(owner), owned_(owned) {}
  ~CudaStream() override {
    owner_->forget_stream(stream_);
    if (owned_) cudaStreamDestroy(stream_);
  }
  void synchronize() override {
    ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    owner_->check_device_errors();
  }
  void* native_handle() const override { return stream_; }
  cudaStream_t get() const { return stream_; }
  bool owned() const { return owned_; }

 private:
  cudaStream_t stream_;
  CudaBackendInternals* owner_;
  bool owned_;
};

cudaStream_t raw(Stream& s) {
  return static_cast<cudaStream_t>(s.native_handle());
}

class CudaEvent final : public Event {
 public:
  CudaEvent(bool timing, CudaBackendInternals* owner) : owner_(owner) {
    ASYNCTP_CUDA_CHECK(
        cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~CudaEvent() override { cudaEventDestroy(event_); }
  void record(Stream& stream) override { ASYNCTP_CUDA_CHECK(cudaEventRecord(event_, raw(stream))); }
  void block(Stream& stream) override {
    ASYNCTP_CUDA_CHECK(cudaStreamWaitEvent(raw(stream), event_, 0));
  }
  void synchronize() override {
    ASYNCTP_CUDA_CHECK(cudaEventSynchronize(event_));
    owner_->check_device_errors();
  }
  float elapsed_ms(const Event& start) const override {
    float ms = 0;
    ASYNCTP_CUDA_CHECK(
        cudaEventElapsedTime(&ms, dynamic_cast<const CudaEvent&>(start).event_, event_));
    return ms;
  }

 private:
  cudaEvent_t event_{};
  CudaBackendInternals* owner_;
};

class CudaBackend final : public Backend, public CudaBackendInternals {
 public:
  explicit CudaBackend(int device) : device_(device) {
    ASYNCTP_CUDA_CHECK(cudaSetDevice(device));
    ASYNCTP_CUDA_CHECK(cudaFree(nullptr));  // create the primary context now
    cudaStream_t s;
    ASYNCTP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    name_stream(s, fmt::format("asynctp compute cuda:{}", device));
    stream_ = std::make_unique<CudaStream>(s, this, true);
    ASYNCTP_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&error_slot_host_),
                                     sizeof(kernels::DeviceErrorSlot), cudaHostAllocMapped));
    *error_slot_host_ = kernels::DeviceErrorSlot{};
    ASYNCTP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&error_claim_), sizeof(int)));
    ASYNCTP_CUDA_CHECK(cudaMemset(error_claim_, 0, sizeof(int)));
    error_slot_host_->claim = error_claim_;
    ASYNCTP_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&error_slot_device_),
                                                error_slot_host_, 0));
    gemm_ = std::make_unique<cuda::LtGemm>();
    // Asked once: part of the key of every dispatched op call (cudaGetDeviceProperties is slow).
    cudaDeviceProp prop{};
    hardware_ =
        cudaGetDeviceProperties(&prop, device_) == cudaSuccess ? std::string(prop.name) : "cuda";
    // Timings of ranks sharing a GPU say nothing about ranks with a GPU each: the dispatcher's
    // keys (and its disk cache) keep them apart.
    if (ranks_per_gpu_ > 1) hardware_ += fmt::format(", shared by up to {} ranks", ranks_per_gpu_);
  }

  ~CudaBackend() override {
    cudaDeviceSynchronize();
    gemm_.reset();
    stream_.reset();
    cudaFreeHost(error_slot_host_);
    cudaFree(error_claim_);
  }

  std::string_view name() const override { return "cuda"; }
  std::string hardware() const override { return hardware_; }
  Device device() const override { return Device::cuda(device_); }

  Buffer allocate(size_t bytes) override {
    void* p = nullptr;
    if (bytes > 0) {
      const cudaError_t err = cudaMalloc(&p, bytes);
      ASYNCTP_CHECK(err == cudaSuccess, "cuda:{}: cannot allocate {} bytes: {}", device_, bytes,
                    cudaGetErrorString(err));
    }
    return Buffer(p, bytes, device(), [](void* ptr) { cudaFree(ptr); });
  }

  Stream& compute_stream() override { return *stream_; }
  std::unique_ptr<Stream> create_stream(std::string_view name) override {
    cudaStream_t s;
    ASYNCTP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    name_stream(s, name);
    return std::make_unique<CudaStream>(s, this, true);
  }
  std::unique_ptr<Event> create_event(bool timing) override {
    return std::make_unique<CudaEvent>(timing, this);
  }
  bool times_paths() const override { return true; }

  std::unique_ptr<Stream> wrap_stream(void* handle) override {
    auto stream = std::make_unique<CudaStream>(static_cast<cudaStream_t>(handle), this, false);
    // A caller's stream met outside capture (a warm-up, a reserve) makes the caller streams'
    // GEMM workspaces, so that a capture on a stream never seen before finds them (see gemm()).
    if (!capturing(*stream)) prepare_caller_workspaces();
    return stream;
  }

  bool capturing(Stream& stream) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    ASYNCTP_CUDA_CHECK(cudaStreamIsCapturing(raw(stream), &status));
    return status != cudaStreamCaptureStatusNone;
  }

  void copy(const Tensor& dst, const Tensor& src, Stream& stream) override {
    ASYNCTP_CHECK(dst.shape() == src.shape(), "copy: destination {} and source {} differ in shape",
                  dst.describe(), src.describe());
    if (dst.numel() == 0) return;
    const cudaStream_t s = raw(stream);
    const bool host_side = dst.device().is_cpu() || src.device().is_cpu();
    if (dst.dtype() == src.dtype()) {
      const size_t esize = dst.element_size();
      const CopyPlan p = coalesce(dst, src);
      const size_t dims = p.dims;
      if (dims == 0 || (dims == 1 && p.dst_strides[0] == 1 && p.src_strides[0] == 1)) {
        ASYNCTP_CUDA_CHECK(
            cudaMemcpyAsync(dst.data(), src.data(), dst.nbytes(), cudaMemcpyDefault, s));
        return;
      }
      // Pitched copies (a copy engine's to a peer; within one GPU a copy kernel's, as are the 1-D
      // ones): [outer..., rows, width] with unit inner strides.
      if (p.dst_strides[dims - 1] == 1 && p.src_strides[dims - 1] == 1 && dims <= 3) {
        const size_t width = p.sizes[dims - 1] * esize;
        const size_t rows = dims >= 2 ? p.sizes[dims - 2] : 1;
        const size_t dpitch = dims >= 2 ? p.dst_strides[dims - 2] * esize : width;
        const size_t spitch = dims >= 2 ? p.src_strides[dims - 2] * esize : width;
        const int64_t outer = dims == 3 ? p.sizes[0] : 1;
        if (outer <= 64) {
          for (int64_t o = 0; o < outer; ++o) {
            char* d =
                static_cast<char*>(dst.data()) + (dims == 3 ? o * p.dst_strides[0] * esize : 0);
            const char* sp = static_cast<const char*>(src.data()) +
                             (dims == 3 ? o * p.src_strides[0] * esize : 0);
            ASYNCTP_CUDA_CHECK(
                cudaMemcpy2DAsync(d, dpitch, sp, spitch, width, rows, cudaMemcpyDefault, s));
          }
          return;
        }
      }
    }
    ASYNCTP_CHECK(!host_side,
                  "copy between {} and {} needs a kernel, which cannot touch host memory: "
                  "make the host side contiguous and of the same dtype",
                  dst.describe(), src.describe());
    ASYNCTP_CUDA_CHECK(kernels::copy(cuda::to_kernel(dst), cuda::to_kernel(src), s));
  }

  void fill(const Tensor& dst, float value, Stream& stream) override {
    ASYNCTP_CUDA_CHECK(kernels::fill(cuda::to_kernel(dst), value, raw(stream)));
  }

  void gemm(const GemmArgs& args, Stream& stream) override {
    validate_gemm(args);
    // GEMMs on the caller's streams (wrapped, not owned) take one of two workspace keys: one
    // for eager calls, one for calls captured into CUDA graphs. Eager ops never overlap each
    // other (an op waits on its stream for the op before it, OpContext::StreamScope), nor do the
    // replays of graphs that hold GEMMs (like the native GEMM's split workspace, below); a graph
    // replayed beside eager ops on another stream has a workspace of its own. A stream first
    // seen during capture (torch.cuda.graph's own) finds the captured key's workspace, made as
    // soon as any caller stream was met outside capture (a warm-up or a reserve).
    const bool capturing_now = capturing(stream);
    const void* ws_key = nullptr;
    if (!static_cast<const CudaStream&>(stream).owned()) {
      ws_key = capturing_now ? static_cast<const void*>(&captured_ws_key_)
                             : static_cast<const void*>(this);
      if (!capturing_now) prepare_caller_workspaces();
    }
    gemm_->run(args, raw(stream), ws_key, capturing_now);
  }

  void reduce(const Tensor& out, std::span<const Tensor> inputs, ReduceOp op,
              Stream& stream) override {
    reduce_waiting(out, inputs, op, kernels::ReduceWait{}, stream);
  }

  void reduce_when_flagged(const Tensor& out, std::span<const Tensor> inputs, ReduceOp op,
                           const FlagWait& wait, Stream& stream) override {
    if (ranks_per_gpu_ > 1) {
      // Where ranks share a GPU, a push to a peer on the same GPU is a copy within the GPU, which
      // is a kernel (see docs/DECISIONS.md D3). The reduction's blocks, each
      // spinning on the flags, take every thread slot of the GPU, so that copy, queued on this
      // rank's copy stream behind a push to another GPU, could start only once the reduction
      // ended, which waits (through the peers) for it: with 2 ranks on each of 2 GPUs the ws-4
      // split reduce-scatter deadlocked. One block waits instead and the reduction follows; with
      // a GPU per rank every push takes a copy engine and the one launch stays.
      wait_flags(wait, stream);
      reduce(out, inputs, op, stream);
      return;
    }
    reduce_waiting(out, inputs, op, kernel_wait(wait), stream);
  }

  void wait_flags(const FlagWait& wait, Stream& stream) override {
    ASYNCTP_CUDA_CHECK(kernels::wait_flags(kernel_wait(wait), raw(stream)));
  }

  void unary(UnaryOp op, const Tensor& out, const Tensor& in, Stream& stream) override {
    ASYNCTP_CHECK(out.shape() == in.shape(), "unary: output {} and input {} differ in shape",
                  out.describe(), in.describe());
    ASYNCTP_CUDA_CHECK(kernels::unary(static_cast<int>(op), cuda::to_kernel(out),
                                      cuda::to_kernel(in), raw(stream)));
  }

  void swiglu(const Tensor& out, const Tensor& gate_up, Stream& stream) override {
    check_swiglu(out, gate_up);
    ASYNCTP_CUDA_CHECK(
        kernels::swiglu(cuda::to_kernel(out), cuda::to_kernel(gate_up), raw(stream)));
  }

  void swiglu_backward(const Tensor& grad_gate_up, const Tensor& grad_out, const Tensor& gate_up,
                       Stream& stream) override {
    check_swiglu_backward(grad_gate_up, grad_out, gate_up);
    ASYNCTP_CUDA_CHECK(kernels::swiglu_backward(cuda::to_kernel(grad_gate_up),
                                                cuda::to_kernel(grad_out), cuda::to_kernel(gate_up),
                                                raw(stream)));
  }

  void synchronize() override {
    ASYNCTP_CUDA_CHECK(cudaDeviceSynchronize());
    check_device_errors();
  }

  std::string native_gemm_unsupported(const ChunkedGemmArgs& args) override {
    kernels::NativeGemmParams k;
    if (std::string why = to_async_gemm(args, &k); !why.empty()) return why;
    return kernels::async_gemm_unsupported(k);
  }

  void native_gemm(const ChunkedGemmArgs& args, Stream& stream) override {
    kernels::NativeGemmParams k;
    const std::string why = to_async_gemm(args, &k);
    ASYNCTP_CHECK(why.empty(), "native GEMM of a {} by b {} into d {}: {}", args.a.describe(),
                  args.b.describe(), args.d.describe(), why);
    const std::string unsupported = kernels::async_gemm_unsupported(k);
    ASYNCTP_CHECK(unsupported.empty(), "native GEMM of a {} by b {} into d {}: {}",
                  args.a.describe(), args.b.describe(), args.d.describe(), unsupported);
    k.slot = error_slot_device_;
    k.split_workspace = split_workspace(raw(stream));
    ASYNCTP_CUDA_CHECK(kernels::async_gemm(k, raw(stream)));
  }

  void spin(int64_t cycles, Stream& stream) override {
    ASYNCTP_CHECK(cycles >= 0, "spin: cycles is {}, must be >= 0", cycles);
    ASYNCTP_CUDA_CHECK(kernels::spin(cycles, raw(stream)));
  }

  // The SM's peak clock in MHz: the spin counts SM cycles, at that clock or below it.
  double spin_cycles_per_us() const override {
    if (peak_clock_mhz_ == 0.0) {
      int khz = 0;
      ASYNCTP_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device_));
      peak_clock_mhz_ = khz > 0 ? khz / 1000.0 : 2000.0;
    }
    return peak_clock_mhz_;
  }

  void write_flag(uint32_t* flag, uint32_t value, Stream& stream) override {
    ASYNCTP_CU_CHECK(cuda::driver().stream_write_value32(
        raw(stream), reinterpret_cast<CUdeviceptr>(flag), value, CU_STREAM_WRITE_VALUE_DEFAULT));
  }

  // The writes as one batch of stream memory operations (each a write_flag: the same flags, so
  // each makes the stream's earlier writes visible first), kBatch a driver call.
  void write_flags(std::span<const FlagWrite> writes, Stream& stream) override {
    if (writes.size() == 1) {
      write_flag(writes[0].flag, writes[0].value, stream);
      return;
    }
    constexpr size_t kBatch = 16;  // the driver takes up to 256 a call
    std::array<CUstreamBatchMemOpParams, kBatch> ops{};
    for (size_t i = 0; i < writes.size(); i += kBatch) {
      const size_t n = std::min(kBatch, writes.size() - i);
      for (size_t j = 0; j < n; ++j) {
        ops[j] = CUstreamBatchMemOpParams{};
        ops[j].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
        ops[j].writeValue.address = reinterpret_cast<CUdeviceptr>(writes[i + j].flag);
        ops[j].writeValue.value = writes[i + j].value;
        ops[j].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
      }
      ASYNCTP_CU_CHECK(
          cuda::driver().stream_batch_mem_op(raw(stream), static_cast<unsigned>(n), ops.data(), 0));
    }
  }

  // One batch: the writes, then the wait (ops of a batch take effect in order, as separate
  // stream memory operations would).
  void write_flags_then_wait(std::span<const FlagWrite> writes, const uint32_t* flag,
                             uint32_t value, const FlagSite& site, Stream& stream) override {
    constexpr size_t kBatch = 16;
    if (writes.size() >= kBatch) {
      CudaBackend::write_flags(writes, stream);
      wait_flag(flag, value, site, stream);
      return;
    }
    std::array<CUstreamBatchMemOpParams, kBatch> ops{};
    for (size_t j = 0; j < writes.size(); ++j) {
      ops[j].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
      ops[j].writeValue.address = reinterpret_cast<CUdeviceptr>(writes[j].flag);
      ops[j].writeValue.value = writes[j].value;
      ops[j].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
    }
    CUstreamBatchMemOpParams& wait = ops[writes.size()];
    wait.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    wait.waitValue.address = reinterpret_cast<CUdeviceptr>(flag);
    wait.waitValue.value = value;
    wait.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    ASYNCTP_CU_CHECK(cuda::driver().stream_batch_mem_op(
        raw(stream), static_cast<unsigned>(writes.size() + 1), ops.data(), 0));
  }

  // Unbounded (site unused): a stream memory wait has no timeout. The ops wait this way only for
  // what their own GEMM produces (done counters), which a timed-out GEMM still completes.
  void wait_flag(const uint32_t* flag, uint32_t value, const FlagSite&, Stream& stream) override {
    ASYNCTP_CU_CHECK(cuda::driver().stream_wait_value32(
        raw(stream), reinterpret_cast<CUdeviceptr>(flag), value, CU_STREAM_WAIT_VALUE_GEQ));
  }

  void zero_flags(uint32_t* flags, size_t count, Stream& stream) override {
    // A few flags (an op's, one per rank): stream memory writes, no memset kernel to launch
    // and schedule between the op's GEMM and its closing barrier.
    if (count <= 16) {
      std::array<FlagWrite, 16> zeros{};
      for (size_t i = 0; i < count; ++i)
        zeros[i] = {flags + i, 0};
      write_flags(std::span<const FlagWrite>(zeros.data(), count), stream);
      return;
    }
    ASYNCTP_CUDA_CHECK(cudaMemsetAsync(flags, 0, count * sizeof(uint32_t), raw(stream)));
  }

  void forget_stream(cudaStream_t stream) override {
    auto it = split_workspaces_.find(stream);
    if (it == split_workspaces_.end()) return;
    cudaStreamSynchronize(stream);  // a GEMM still running there may use it
    split_workspaces_.erase(it);
  }

  int device_index() const override { return device_; }
  kernels::DeviceErrorSlot* device_error_slot() override { return error_slot_device_; }

  void check_errors() override { check_device_errors(); }

  void check_device_errors() override {
    if (error_slot_host_->flagged == 0) return;
    const kernels::DeviceErrorSlot slot = *const_cast<kernels::DeviceErrorSlot*>(error_slot_host_);
    error_slot_host_->flagged = 0;
    // Free the slot for the next timeout: in order after whatever the stream still runs (every
    // wait there is bounded), before the error reaches the caller.
    cudaMemsetAsync(error_claim_, 0, sizeof(int), raw(*stream_));
    cudaStreamSynchronize(raw(*stream_));
    // A native GEMM that gave up may have left tail-split counters off 0 (a part counted after
    // the last one stopped waiting): zero them, in order on each workspace's stream, so that
    // later GEMMs of this backend start clean.
    for (auto& [stream, buf] : split_workspaces_)
      cudaMemsetAsync(buf.data(), 0, buf.size(), stream);
    if (!captured_split_.empty()) {
      // Replayed on streams this backend does not know: after the whole device (every wait is
      // bounded), and done before any later replay.
      cudaDeviceSynchronize();
      cudaMemsetAsync(captured_split_.data(), 0, captured_split_.size(), raw(*stream_));
      cudaStreamSynchronize(raw(*stream_));
    }
    if (slot.what == 4) {
      ASYNCTP_TIMEOUT(
          "rank {}: the native GEMM on cuda:{} waited {:g} s for the partial sums of its own "
          "split tiles (an internal error: CTAs of one launch that should all be running)",
          slot.rank, device_, static_cast<double>(slot.timeout_ns) / 1e9);
    }
    if (slot.what == 5) {
      ASYNCTP_TIMEOUT(
          "rank {}: the reduction on cuda:{} waited {:g} s for the partial of rank {} on channel "
          "{} (is that peer alive and in the same op?)",
          slot.rank, device_, static_cast<double>(slot.timeout_ns) / 1e9, slot.peer, slot.channel);
    }
    if (slot.what == 6) {
      ASYNCTP_TIMEOUT(
          "rank {}: waited {:g} s on cuda:{} for the shard of peer {} on channel {} (is that peer "
          "alive and in the same op?)",
          slot.rank, static_cast<double>(slot.timeout_ns) / 1e9, device_, slot.peer, slot.channel);
    }
    if (slot.what == 3) {
      ASYNCTP_TIMEOUT(
          "rank {}: the native GEMM waited {:g} s on cuda:{} for chunk {} of A (piece {}) to "
          "land (the copy of rank {}'s shard never completed: is that peer alive and in the same "
          "op?)",
          slot.rank, static_cast<double>(slot.timeout_ns) / 1e9, device_, slot.peer, slot.channel,
          slot.peer);
    }
    static constexpr const char* kWhat[] = {"put_signal to", "wait_signal from", "barrier with"};
    ASYNCTP_TIMEOUT(
        "rank {}: {} peer {} on channel {} timed out after {:g} s on cuda:{} (is the peer "
        "alive and in the same op?)",
        slot.rank, kWhat[slot.what < 0 || slot.what > 2 ? 1 : slot.what], slot.peer, slot.channel,
        static_cast<double>(slot.timeout_ns) / 1e9, device_);
  }

 private:
  kernels::ReduceWait kernel_wait(const FlagWait& wait) {
    check_flag_wait(wait);
    kernels::ReduceWait w;
    w.flags = wait.count > 0 ? wait.flags : nullptr;
    w.value = wait.value;
    w.first = wait.first;
    w.count = wait.count;
    w.skip = wait.skip;
    w.timeout_ns = std::max<uint64_t>(1, timeout_ns(wait.timeout));
    w.slot = error_slot_device_;
    w.rank = wait.rank;
    w.channel = wait.channel;
    w.what = wait.of == FlagWait::Of::kShard ? 6 : 5;
    return w;
  }

  // reduce() and reduce_when_flagged(): one launch, with or without the flag wait.
  void reduce_waiting(const Tensor& out, std::span<const Tensor> inputs, ReduceOp op,
                      const kernels::ReduceWait& wait, Stream& stream) {
    ASYNCTP_CHECK(!inputs.empty() && inputs.size() <= kernels::kMaxReduceInputs,
                  "reduce takes 1 to {} inputs, got {}", kernels::kMaxReduceInputs, inputs.size());
    std::vector<const void*> ptrs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      ASYNCTP_CHECK(inputs[i].shape() == out.shape(), "reduce input {} is {} but the output is {}",
                    i, inputs[i].describe(), out.describe());
      ASYNCTP_CHECK(
          inputs[i].strides() == inputs[0].strides() && inputs[i].dtype() == inputs[0].dtype(),
          "reduce inputs must share strides and dtype: input {} is {}, input 0 is {}", i,
          inputs[i].describe(), inputs[0].describe());
      ptrs.push_back(inputs[i].data());
    }
    ASYNCTP_CUDA_CHECK(kernels::reduce(cuda::to_kernel(out), ptrs.data(),
                                       static_cast<int>(ptrs.size()), cuda::to_kernel(inputs[0]),
                                       op == ReduceOp::kAvg, raw(stream), wait));
  }

  // The native GEMM's tail-split workspace of `stream` (one per stream: launches on different
  // streams may overlap), allocated and zeroed on the stream's first launch outside capture and
  // freed with the stream. A CUDA graph keeps using the workspace of the stream it was captured
  // on: replays must not overlap native GEMMs launched on that stream (replaying on it does
  // that). A stream first seen during capture (torch.cuda.graph's own capture stream, which
  // never ran anything eagerly) takes the captured workspace, made and zeroed (the host waiting,
  // since its replays go on streams not ordered after this one) beside the first stream's, so
  // that its replays keep the tail split (docs/PERFORMANCE.md, "From torch" on 2 x H200): the
  // replays of graphs that hold native GEMMs must not overlap each other, as gemm()'s captured
  // key requires. Null, the GEMM then running without the split, only when captured before any
  // native GEMM ran outside capture (a reserve alone does not make it).
  void prepare_caller_workspaces() {
    if (caller_workspaces_ready_) return;
    gemm_->prepare(this);
    gemm_->prepare(&captured_ws_key_);
    caller_workspaces_ready_ = true;
  }

  void* split_workspace(cudaStream_t stream) {
    if (auto it = split_workspaces_.find(stream); it != split_workspaces_.end())
      return it->second.data();
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    ASYNCTP_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
    if (status != cudaStreamCaptureStatusNone)
      return captured_split_.empty() ? nullptr : captured_split_.data();
    const size_t bytes = kernels::async_gemm_split_workspace_bytes();
    if (captured_split_.empty()) {
      captured_split_ = allocate(bytes);
      ASYNCTP_CUDA_CHECK(cudaMemsetAsync(captured_split_.data(), 0, bytes, stream));
      ASYNCTP_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    Buffer buf = allocate(bytes);
    ASYNCTP_CUDA_CHECK(cudaMemsetAsync(buf.data(), 0, buf.size(), stream));
    return split_workspaces_.emplace(stream, std::move(buf)).first->second.data();
  }

  int device_;
  mutable double peak_clock_mhz_ = 0.0;  // spin_cycles_per_us(), asked once
  // ASYNCTP_SHARED_GPUS, read once (the reduction asks it on every call).
  const int ranks_per_gpu_ = cuda_ranks_per_gpu();
  std::string hardware_;
  std::unordered_map<cudaStream_t, Buffer> split_workspaces_;
  // The split workspace of native GEMMs captured on streams without their own (see above).
  Buffer captured_split_;
  // The workspace key of GEMMs captured on caller streams (its address; see gemm()).
  char captured_ws_key_ = 0;
  bool caller_workspaces_ready_ = false;
  std::unique_ptr<CudaStream> stream_;
  kernels::DeviceErrorSlot* error_slot_host_ = nullptr;
  kernels::DeviceErrorSlot* error_slot_device_ = nullptr;
  int* error_claim_ = nullptr;  // DeviceErrorSlot::claim
  std::unique_ptr<cuda::LtGemm> gemm_;
};

}  // namespace

CudaBackendInternals& CudaBackendInternals::of(Backend& backend) {
  auto* internals = dynamic_cast<CudaBackendInternals*>(&backend);
  ASYNCTP_CHECK(internals != nullptr, "backend '{}' is not the CUDA backend", backend.name());
  return *internals;
}

std::unique_ptr<Backend> make_cuda_backend(int local_rank, int device_index) {
  const int count = cuda_device_count();
  ASYNCTP_CHECK(count > 0,
                "the cuda backend needs a GPU, but none is visible (no driver, or "
                "CUDA_VISIBLE_DEVICES hides them)");
  ASYNCTP_CHECK(device_index < count, "device_index {} is out of range: {} GPU(s) are visible",
                device_index, count);
  return std::make_unique<CudaBackend>(device_index >= 0 ? device_index : local_rank % count);
}

}  // namespace asynctp
