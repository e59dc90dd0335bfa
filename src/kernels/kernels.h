// Host launchers of the project's CUDA kernels. Each enqueues on the given stream and returns the
// launch status (callers wrap it in ASYNCTP_CUDA_CHECK). Plain C++: includable without nvcc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include <asynctp/dtype.h>
#include "kernels/native/params.h"

namespace asynctp::kernels {

// A strided tensor as the kernels see it.
struct KTensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i)
      n *= shape[i];
    return n;
  }
  bool contiguous() const {
    int64_t expected = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != expected) return false;
      expected *= shape[i];
    }
    return true;
  }
};

// Where a timed-out device wait reports what it waited for. The record lives in host-mapped
// memory, which the host polls without a synchronization; the first timeout wins it by an atomic
// on `claim`, a word in device memory: host memory takes no device atomics where the host has no
// native atomics for it (PCIe hosts; compute-sanitizer rejects them everywhere). The winner writes
// the fields, fences, then sets `flagged` (0 -> 1 once); the host reads `flagged` first, then the
// fields, and zeroes `claim` after it has taken the record.
struct DeviceErrorSlot {
  volatile int flagged;
  int rank;
  int peer;
  int channel;
  // 0 put_signal, 1 wait_signal, 2 barrier, 3 async GEMM waiting for a chunk, 4 async GEMM
  // waiting for its own split tiles, 5 reduction waiting for a peer's partial
  int what;
  unsigned long long timeout_ns;
  int* claim;  // device memory, 0 until a timeout claims the slot
};

struct SignalSite {
  int rank;
  int peer;
  int channel;
};

// *flag: 0 -> 1 once it is 0 (release, system scope). See NOTE [signal pads and channels].
cudaError_t put_signal(uint32_t* flag, SignalSite site, uint64_t timeout_ns, DeviceErrorSlot* slot,
                       cudaStream_t stream);
// *flag: 1 -> 0 once it is 1 (acquire, system scope).
cudaError_t wait_signal(uint32_t* flag, SignalSite site, uint64_t timeout_ns, DeviceErrorSlot* slot,
                        cudaStream_t stream);
// One thread that holds the stream for `cycles` SM clock cycles (clock64), as torch.cuda._sleep
// does: a measurement's device delay (asynctp bench --hide-launch).
cudaError_t spin(int64_t cycles, cudaStream_t stream);
// pads: device array of every rank's signal pad (kNumChannels x world_size u32 flags each).
// reset (optional): `reset_count` u32 flags set to 0 first, visible to every peer past the barrier.
cudaError_t barrier(uint32_t* const* pads, int rank, int world_size, int channel,
                    uint64_t timeout_ns, DeviceErrorSlot* slot, cudaStream_t stream,
                    uint32_t* reset = nullptr, int reset_count = 0);

// dst <- src (same shape, any strides, dtype conversion as the CPU backend does it).
cudaError_t copy(const KTensor& dst, const KTensor& src, cudaStream_t stream);
cudaError_t fill(const KTensor& dst, float value, cudaStream_t stream);
// op: 0 silu, 1 relu, 2 gelu (erf).
cudaError_t unary(int op, const KTensor& dst, const KTensor& src, cudaStream_t stream);
// out[.., j] = swiglu_f32(gate_up[.., j], gate_up[.., n + j]) (kernels/activation.h), rounded
// once: out [.., n], gate_up [.., 2n] with out's leading dims; any strides, f32, bf16 or f16.
// Contiguous, 16-byte aligned operands of one dtype with n a multiple of 16 bytes take the
// vector kernel.
cudaError_t swiglu(const KTensor& out, const KTensor& gate_up, cudaStream_t stream);
// swiglu's backward in one pass (kernels::swiglu_backward_f32): grad_gate_up [.., 2n] (d_gate,
// then d_up) from grad_out [.., n] and gate_up [.., 2n], each rounded once; any strides, f32,
// bf16 or f16. The three contiguous, 16-byte aligned and of one dtype with n a multiple of 16
// bytes take the vector kernel: 48 bytes read and 32 written a thread.
cudaError_t swiglu_backward(const KTensor& grad_gate_up, const KTensor& grad_out,
                            const KTensor& gate_up, cudaStream_t stream);

inline constexpr int kMaxReduceInputs = 64;
// Flags a reduction (or wait_flags) waits for: flags[i] up for op `value` (flag - value is 0 or
// 1, mod 2^32; acquire, system scope) for every i in [first, count) but `skip`; bounded by
// timeout_ns, a timeout recorded in `slot` with peer = i and `what`.
struct ReduceWait {
  const uint32_t* flags = nullptr;  // null: no wait
  uint32_t value = 1;               // the op's number (1 for 0/1 flags)
  int first = 0;                    // flags [first, count) but skip
  int count = 0;
  int skip = -1;
  uint64_t timeout_ns = 0;
  DeviceErrorSlot* slot = nullptr;
  int rank = 0;
  int channel = -1;
  int what = 5;  // the error slot's code on timeout: 5 a reduction's inputs, 6 a shard (wait_flags)
};
// Holds later work of the stream until w's flags are raised: one block that spins (bounded by
// w.timeout_ns; a timeout is recorded in w.slot with what = w.what). It needs an SM.
cudaError_t wait_flags(const ReduceWait& w, cudaStream_t stream);
// out = sum (avg: mean) of count inputs that all share `in_layout`'s shape, strides and dtype,
// added in f32 in the order given and rounded once; first (every block) the wait, if any, which
// also takes place for an empty output.
cudaError_t reduce(const KTensor& out, const void* const* inputs, int count,
                   const KTensor& in_layout, bool avg, cudaStream_t stream,
                   const ReduceWait& wait = {});

// d[i, j] = src[i, j] * row_scale[i] * col_scale[j] over a [rows, cols] f32 source (contiguous),
// written to d (row-major with leading dim ldd, dtype d_dtype). Scales: null = 1, or a single
// element when the matching *_broadcast is true.
cudaError_t scale_epilogue(void* d, DType d_dtype, int64_t ldd, const float* src, int64_t rows,
                           int64_t cols, const float* row_scale, bool row_broadcast,
                           const float* col_scale, bool col_broadcast, cudaStream_t stream);

// ---- The async-input GEMM (async_gemm.cu; the kernel in native/) ----
//
// C[M, N] = A[M, K] @ B, f32 accumulation, in one persistent warp-specialized sm_90a kernel
// (TMA loads, wgmma, 128x256x64 tiles, 4-stage pipeline) that follows A's row chunks as they
// land. Its contract is NativeGemmParams (native/params.h); its schedule (walk, done counters,
// own edge rows) the functions of native/schedule.h.

// Why the kernel cannot run these params (dtype, alignment, strides, naming the values), or "".
std::string async_gemm_unsupported(const NativeGemmParams& params);
cudaError_t async_gemm(const NativeGemmParams& params, cudaStream_t stream);
// Bytes of the tail-split workspace for the current device.
size_t async_gemm_split_workspace_bytes();
// The number of K-ranges each tile of the last wave is cut into for these params on the current
// device (1: none), for a grid of every CTA; a launch on pairs plans it for the clusters that fit
// at once, which on a device whose free SMs cannot all pair up are fewer.
int async_gemm_tail_split(const NativeGemmParams& params);
// The obviously-correct reference for the tests: one thread per output, f32 accumulation.
cudaError_t reference_gemm(const NativeGemmParams& params, cudaStream_t stream);

}  // namespace asynctp::kernels
