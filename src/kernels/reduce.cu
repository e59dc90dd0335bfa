// The partial-sum reduction: out = sum_j inputs[j] (or the mean), added in f32 in the order the
// inputs are given and rounded once, so every rank and every run gets the same bits (and the same
// bits as the CPU backend, which rounds with the same code).
//
// Fast path (contiguous inputs and output, 16-byte aligned): each thread owns a 16-byte vector of
// the output and reads the matching vector of every input; the inputs are the slots of this
// rank's symmetric buffer, so this runs at local HBM bandwidth.
#include "kernels/device_sync.cuh"
#include "kernels/element_access.cuh"

namespace asynctp::kernels {

namespace {

using detail::load_f32;
using detail::offset_of;
using detail::store_f32;

struct InputPointers {
  const void* ptr[kMaxReduceInputs];
};

constexpr int kThreads = 256;

struct alignas(16) Vec {
  uint8_t b[16];
};

// Elements of dtype D per 16-byte vector.
template <DType D>
__device__ __forceinline__ float vec_load(const uint8_t* v, int k) {
  if constexpr (D == DType::kF32) return reinterpret_cast<const float*>(v)[k];
  if constexpr (D == DType::kBF16)
    return bits::bf16_to_float(reinterpret_cast<const uint16_t*>(v)[k]);
  if constexpr (D == DType::kF16)
    return bits::f16_to_float(reinterpret_cast<const uint16_t*>(v)[k]);
  if constexpr (D == DType::kF8E4M3) return bits::f8e4m3_to_float(v[k]);
  if constexpr (D == DType::kF8E5M2) return bits::f8e5m2_to_float(v[k]);
  return 0.0f;
}

template <DType D>
__device__ __forceinline__ void vec_store(uint8_t* v, int k, float x) {
  if constexpr (D == DType::kF32) reinterpret_cast<float*>(v)[k] = x;
  if constexpr (D == DType::kBF16) reinterpret_cast<uint16_t*>(v)[k] = bits::float_to_bf16(x);
  if constexpr (D == DType::kF16) reinterpret_cast<uint16_t*>(v)[k] = bits::float_to_f16(x);
  if constexpr (D == DType::kF8E4M3) v[k] = bits::float_to_f8e4m3(x, false);
  if constexpr (D == DType::kF8E5M2) v[k] = bits::float_to_f8e5m2(x, false);
}

template <DType D>
constexpr int elem_bytes() {
  return D == DType::kF32 ? 4 : (D == DType::kBF16 || D == DType::kF16) ? 2 : 1;
}

// Thread 0 of every block waits for the flags (the inputs' writers raised them after their
// copies); the block's barrier then orders every thread's loads after that acquire. One timeout
// ends every wait of the launch: a block that finds the error slot already flagged (by another
// block, of this or an earlier wave) stops waiting, so a missing peer costs one timeout, not one
// per wave of blocks and missing flag. The slot is host memory: a block looks at it once per
// kSlotPollNs of waiting, not every spin (a thousand blocks reading it over PCIe at every spin
// made each read take hundreds of microseconds, and every wait as long, at ws 4).
constexpr uint64_t kSlotPollNs = 1'000'000;

__device__ __forceinline__ void wait_for_inputs(const ReduceWait& w) {
  if (w.flags == nullptr) return;
  if (threadIdx.x == 0) {
    bool gave_up = false;
    for (int i = w.first; i < w.count && !gave_up; ++i) {
      auto raised = [&] {
        return detail::flag_raised(detail::load_acquire_sys(w.flags + i), w.value);
      };
      if (i == w.skip || raised()) continue;
      const uint64_t start = detail::global_timer_ns();
      uint64_t next_poll = start + kSlotPollNs;
      while (!raised()) {
        const uint64_t now = detail::global_timer_ns();
        if (now >= next_poll) {
          if (w.slot != nullptr && w.slot->flagged != 0) {
            gave_up = true;
            break;
          }
          next_poll = now + kSlotPollNs;
        }
        if (now - start > w.timeout_ns) {
          detail::report_timeout(w.slot, w.rank, i, w.channel, w.what, w.timeout_ns);
          gave_up = true;
          break;
        }
        __nanosleep(128);
      }
    }
  }
  __syncthreads();
}

__global__ void wait_flags_kernel(ReduceWait wait) {
  wait_for_inputs(wait);
}

// Same dtype in and out, contiguous, 16-byte aligned, numel a multiple of the vector width.
template <DType D>
__global__ void reduce_vec_kernel(void* out, InputPointers in, int count, int64_t vectors, bool avg,
                                  ReduceWait wait) {
  wait_for_inputs(wait);
  constexpr int kPer = 16 / elem_bytes<D>();
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < vectors;
       v += int64_t(gridDim.x) * blockDim.x) {
    // Up to kBatch inputs' vectors are loaded before any is added, so that more loads are in
    // flight per thread (see docs/DECISIONS.md D21); the adds stay in input order.
    constexpr int kBatch = 8;
    float acc[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k)
      acc[k] = 0.0f;
    for (int j0 = 0; j0 < count; j0 += kBatch) {
      Vec x[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (j0 + b < count) x[b] = reinterpret_cast<const Vec*>(in.ptr[j0 + b])[v];
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (j0 + b >= count) break;
#pragma unroll
        for (int k = 0; k < kPer; ++k)
          acc[k] = (j0 + b == 0) ? vec_load<D>(x[b].b, k) : acc[k] + vec_load<D>(x[b].b, k);
      }
    }
    Vec y;
#pragma unroll
    for (int k = 0; k < kPer; ++k)
      vec_store<D>(y.b, k, avg ? acc[k] / static_cast<float>(count) : acc[k]);
    reinterpret_cast<Vec*>(out)[v] = y;
  }
}

__global__ void reduce_generic_kernel(KTensor out, InputPointers in, int count, KTensor layout,
                                      int64_t n, bool avg, ReduceWait wait) {
  wait_for_inputs(wait);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t off = offset_of(layout, i);
    float acc = load_f32(in.ptr[0], layout.dtype, off);
    for (int j = 1; j < count; ++j)
      acc += load_f32(in.ptr[j], layout.dtype, off);
    if (avg) acc /= static_cast<float>(count);
    store_f32(out.data, out.dtype, offset_of(out, i), acc);
  }
}

template <DType D>
void launch_vec(void* out, const InputPointers& in, int count, int64_t vectors, bool avg,
                const ReduceWait& wait, cudaStream_t stream) {
  reduce_vec_kernel<D><<<detail::grid_for(vectors, kThreads), kThreads, 0, stream>>>(
      out, in, count, vectors, avg, wait);
}

}  // namespace

cudaError_t wait_flags(const ReduceWait& w, cudaStream_t stream) {
  if (w.flags == nullptr || w.count <= w.first) return cudaSuccess;
  if (w.timeout_ns == 0) return cudaErrorInvalidValue;
  wait_flags_kernel<<<1, 32, 0, stream>>>(w);
  return cudaGetLastError();
}

cudaError_t reduce(const KTensor& out, const void* const* inputs, int count,
                   const KTensor& in_layout, bool avg, cudaStream_t stream,
                   const ReduceWait& wait) {
  if (count < 1 || count > kMaxReduceInputs) return cudaErrorInvalidValue;
  if (wait.flags != nullptr && (wait.count < 0 || wait.timeout_ns == 0))
    return cudaErrorInvalidValue;
  const int64_t n = out.numel();
  if (n == 0) {
    // Nothing to add, but a wait is still a wait: the caller relies on the flags being up (and
    // consumed) once this returns on the stream.
    return wait_flags(wait, stream);
  }
  InputPointers in{};
  bool aligned = reinterpret_cast<uintptr_t>(out.data) % 16 == 0;
  for (int j = 0; j < count; ++j) {
    in.ptr[j] = inputs[j];
    aligned = aligned && reinterpret_cast<uintptr_t>(inputs[j]) % 16 == 0;
  }
  const int64_t esize = static_cast<int64_t>(element_size(out.dtype));
  const bool vec = aligned && out.dtype == in_layout.dtype && out.contiguous() &&
                   in_layout.contiguous() && (n * esize) % 16 == 0;
  if (vec) {
    const int64_t vectors = n * esize / 16;
    switch (out.dtype) {
      case DType::kF32:
        launch_vec<DType::kF32>(out.data, in, count, vectors, avg, wait, stream);
        break;
      case DType::kBF16:
        launch_vec<DType::kBF16>(out.data, in, count, vectors, avg, wait, stream);
        break;
      case DType::kF16:
        launch_vec<DType::kF16>(out.data, in, count, vectors, avg, wait, stream);
        break;
      case DType::kF8E4M3:
        launch_vec<DType::kF8E4M3>(out.data, in, count, vectors, avg, wait, stream);
        break;
      case DType::kF8E5M2:
        launch_vec<DType::kF8E5M2>(out.data, in, count, vectors, avg, wait, stream);
        break;
      case DType::kI64:
      case DType::kU64:
      case DType::kBool:  // no op reduces them (asynctp/dtype.h)
        return cudaErrorInvalidValue;
    }
  } else {
    reduce_generic_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(
        out, in, count, in_layout, n, avg, wait);
  }
  return cudaGetLastError();
}

}  // namespace asynctp::kernels
