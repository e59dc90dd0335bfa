// Strided copy with dtype conversion, fill, unary ops, SwiGLU and the scaled-GEMM epilogue.
// Grid-stride loops over the output's linear index; contiguous tensors skip the N-d offset
// arithmetic.
//
// The common case, contiguous and 16-byte aligned with one dtype on both sides (the glue between
// a block's GEMMs: SiLU over [T, F] bf16), takes vector kernels: 16 bytes per load and store, the
// dtype a template argument (no per-element switch), so that they run at memory bandwidth. They
// round exactly as the generic kernels do (core/float_bits.h).
#include <type_traits>

#include "kernels/activation.h"
#include "kernels/element_access.cuh"

namespace asynctp::kernels {

namespace {

using detail::load_f32;
using detail::offset_of;
using detail::store_f32;

constexpr int kThreads = 256;

__global__ void copy_kernel(KTensor dst, KTensor src, int64_t n, bool dst_contig, bool src_contig) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = load_f32(src.data, src.dtype, src_contig ? i : offset_of(src, i));
    store_f32(dst.data, dst.dtype, dst_contig ? i : offset_of(dst, i), v);
  }
}

// Same dtype: move raw bytes (no rounding), element size 1, 2 or 4.
template <typename T>
__global__ void raw_copy_kernel(KTensor dst, KTensor src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    static_cast<T*>(dst.data)[offset_of(dst, i)] =
        static_cast<const T*>(src.data)[offset_of(src, i)];
  }
}

__global__ void fill_kernel(KTensor dst, float value, int64_t n, bool contig) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    store_f32(dst.data, dst.dtype, contig ? i : offset_of(dst, i), value);
  }
}

__device__ __forceinline__ float apply_unary(int op, float v) {
  switch (op) {
    case 0:
      return silu_f32(v);
    case 1:
      return v > 0.0f ? v : (isnan(v) ? v : 0.0f);
    default:
      return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  }
}

// The storage type of a dtype the vector kernels take, and its f32 conversions.
template <DType D>
struct Elem;
template <>
struct Elem<DType::kF32> {
  using T = float;
  static __device__ __forceinline__ float load(T v) { return v; }
  static __device__ __forceinline__ T store(float v) { return v; }
};
template <>
struct Elem<DType::kBF16> {
  using T = uint16_t;
  static __device__ __forceinline__ float load(T v) { return bits::bf16_to_float(v); }
  static __device__ __forceinline__ T store(float v) { return bits::float_to_bf16(v); }
};
template <>
struct Elem<DType::kF16> {
  using T = uint16_t;
  static __device__ __forceinline__ float load(T v) { return bits::f16_to_float(v); }
  static __device__ __forceinline__ T store(float v) { return bits::float_to_f16(v); }
};

// Whether the vector kernels take dst and src: one dtype they know, both contiguous, both
// 16-byte aligned (so that element i of one is element i of the other in the same lane).
bool vectorizable(const KTensor& dst, const KTensor* src) {
  const bool known =
      dst.dtype == DType::kF32 || dst.dtype == DType::kBF16 || dst.dtype == DType::kF16;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!known || !dst.contiguous() || !aligned(dst.data)) return false;
  return src == nullptr || (src->dtype == dst.dtype && src->contiguous() && aligned(src->data));
}

// f(v) for every element: n elements of dtype D, contiguous, 16-byte aligned. Lanes of 16 bytes
// first, then the n % (16 / sizeof) elements of the tail one per thread.
template <DType D, typename F>
__device__ __forceinline__ void vector_map(void* dst, const void* src, int64_t n, F f) {
  using E = Elem<D>;
  using T = typename E::T;
  constexpr int kLanes = 16 / sizeof(T);
  const int64_t lanes = n / kLanes;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (int64_t i = first; i < lanes; i += stride) {
    uint4 v = src != nullptr ? static_cast<const uint4*>(src)[i] : uint4{};
    T* e = reinterpret_cast<T*>(&v);
#pragma unroll
    for (int k = 0; k < kLanes; ++k)
      e[k] = E::store(f(E::load(e[k])));
    static_cast<uint4*>(dst)[i] = v;
  }
  for (int64_t i = lanes * kLanes + first; i < n; i += stride) {
    const T v = src != nullptr ? static_cast<const T*>(src)[i] : T{};
    static_cast<T*>(dst)[i] = E::store(f(E::load(v)));
  }
}

template <DType D, int Op>
__global__ void unary_vector_kernel(void* dst, const void* src, int64_t n) {
  vector_map<D>(dst, src, n, [](float v) { return apply_unary(Op, v); });
}

template <DType D>
__global__ void fill_vector_kernel(void* dst, float value, int64_t n) {
  vector_map<D>(dst, nullptr, n, [value](float) { return value; });
}

// Raw bytes, 16 at a time (same dtype, both contiguous and aligned): nbytes % 16 == 0.
__global__ void raw_copy_vector_kernel(uint4* dst, const uint4* src, int64_t lanes) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < lanes;
       i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

// f(std::integral_constant<DType, D>{}) for the dtype D of a vector kernel: f32, bf16 or f16, the
// dtypes vectorizable() admits (any other: nothing).
template <typename F>
void with_vector_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      f(std::integral_constant<DType, DType::kF32>{});
      break;
    case DType::kBF16:
      f(std::integral_constant<DType, DType::kBF16>{});
      break;
    case DType::kF16:
      f(std::integral_constant<DType, DType::kF16>{});
      break;
    default:
      break;
  }
}

// The vector kernels' launches, by dtype (CUDA here is C++17: no template lambdas).
template <DType D>
void launch_unary_vector(int op, void* dst, const void* src, int64_t n, int grid,
                         cudaStream_t stream) {
  if (op == 0) unary_vector_kernel<D, 0><<<grid, kThreads, 0, stream>>>(dst, src, n);
  if (op == 1) unary_vector_kernel<D, 1><<<grid, kThreads, 0, stream>>>(dst, src, n);
  if (op == 2) unary_vector_kernel<D, 2><<<grid, kThreads, 0, stream>>>(dst, src, n);
}

// Blocks for n elements at 16 bytes per thread (at most enough to cover every lane once).
int vector_grid(int64_t n, DType dtype) {
  const int64_t lanes = n * static_cast<int64_t>(element_size(dtype)) / 16;
  return detail::grid_for(lanes > 0 ? lanes : 1, kThreads);
}

__global__ void unary_kernel(int op, KTensor dst, KTensor src, int64_t n, bool dst_contig,
                             bool src_contig) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = load_f32(src.data, src.dtype, src_contig ? i : offset_of(src, i));
    store_f32(dst.data, dst.dtype, dst_contig ? i : offset_of(dst, i), apply_unary(op, v));
  }
}

// The SwiGLU vector kernels' loop over 16-byte lanes of dtype D, every operand contiguous and
// 16-byte aligned, n % lanes == 0: f(i, gi, row_lanes) for each lane i of an [rows, n] operand,
// gi being the lane of its gate column in an [rows, 2n] one (the up column's: gi + row_lanes).
template <DType D, typename F>
__device__ __forceinline__ void for_each_gate_up_lane(int64_t rows, int64_t n, F f) {
  constexpr int kLanes = 16 / sizeof(typename Elem<D>::T);
  const int64_t row_lanes = n / kLanes;
  const int64_t lanes = rows * row_lanes;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < lanes;
       i += int64_t(gridDim.x) * blockDim.x) {
    f(i, i / row_lanes * 2 * row_lanes + i % row_lanes, row_lanes);
  }
}

// SwiGLU over rows of dtype D: out [rows, n] from gate_up [rows, 2n]; 16 bytes of out (and of the
// gate and up columns under them) per thread.
template <DType D>
__global__ void swiglu_vector_kernel(void* out, const void* gate_up, int64_t rows, int64_t n) {
  using E = Elem<D>;
  using T = typename E::T;
  constexpr int kLanes = 16 / sizeof(T);
  for_each_gate_up_lane<D>(rows, n, [&](int64_t i, int64_t gi, int64_t row_lanes) {
    uint4 g = static_cast<const uint4*>(gate_up)[gi];
    const uint4 u = static_cast<const uint4*>(gate_up)[gi + row_lanes];
    T* ge = reinterpret_cast<T*>(&g);
    const T* ue = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int k = 0; k < kLanes; ++k)
      ge[k] = E::store(swiglu_f32(E::load(ge[k]), E::load(ue[k])));
    static_cast<uint4*>(out)[i] = g;
  });
}

// Any strides and dtypes: out's element i (row-major) is (row i / n, column i % n); its gate is
// gate_up's element (i / n) * 2n + i % n, its up that plus n.
__global__ void swiglu_kernel(KTensor out, KTensor gate_up, int64_t numel, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < numel;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t g = i / n * 2 * n + i % n;
    const float gate = load_f32(gate_up.data, gate_up.dtype, offset_of(gate_up, g));
    const float up = load_f32(gate_up.data, gate_up.dtype, offset_of(gate_up, g + n));
    store_f32(out.data, out.dtype, offset_of(out, i), swiglu_f32(gate, up));
  }
}

// swiglu's backward over rows of dtype D: 16 bytes of grad_out, and of the gate and up columns
// under them, per thread.
template <DType D>
__global__ void swiglu_backward_vector_kernel(void* grad_gate_up, const void* grad_out,
                                              const void* gate_up, int64_t rows, int64_t n) {
  using E = Elem<D>;
  using T = typename E::T;
  constexpr int kLanes = 16 / sizeof(T);
  for_each_gate_up_lane<D>(rows, n, [&](int64_t i, int64_t gi, int64_t row_lanes) {
    uint4 g = static_cast<const uint4*>(gate_up)[gi];
    uint4 u = static_cast<const uint4*>(gate_up)[gi + row_lanes];
    const uint4 d = static_cast<const uint4*>(grad_out)[i];
    T* ge = reinterpret_cast<T*>(&g);
    T* ue = reinterpret_cast<T*>(&u);
    const T* de = reinterpret_cast<const T*>(&d);
#pragma unroll
    for (int k = 0; k < kLanes; ++k) {
      float dg, du;
      swiglu_backward_f32(E::load(ge[k]), E::load(ue[k]), E::load(de[k]), &dg, &du);
      ge[k] = E::store(dg);
      ue[k] = E::store(du);
    }
    static_cast<uint4*>(grad_gate_up)[gi] = g;
    static_cast<uint4*>(grad_gate_up)[gi + row_lanes] = u;
  });
}

// Any strides and dtypes: grad_out's element i (row-major) is (row i / n, column i % n); its gate
// is element (i / n) * 2n + i % n of gate_up and grad_gate_up, its up that plus n.
__global__ void swiglu_backward_kernel(KTensor grad_gate_up, KTensor grad_out, KTensor gate_up,
                                       int64_t numel, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < numel;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t g = i / n * 2 * n + i % n;
    const float gate = load_f32(gate_up.data, gate_up.dtype, offset_of(gate_up, g));
    const float up = load_f32(gate_up.data, gate_up.dtype, offset_of(gate_up, g + n));
    const float d = load_f32(grad_out.data, grad_out.dtype, offset_of(grad_out, i));
    float dg, du;
    swiglu_backward_f32(gate, up, d, &dg, &du);
    store_f32(grad_gate_up.data, grad_gate_up.dtype, offset_of(grad_gate_up, g), dg);
    store_f32(grad_gate_up.data, grad_gate_up.dtype, offset_of(grad_gate_up, g + n), du);
  }
}

__global__ void scale_epilogue_kernel(void* d, DType d_dtype, int64_t ldd, const float* src,
                                      int64_t rows, int64_t cols, const float* row_scale,
                                      bool row_broadcast, const float* col_scale,
                                      bool col_broadcast) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    float v = src[i];
    if (row_scale != nullptr) v = v * row_scale[row_broadcast ? 0 : r];
    if (col_scale != nullptr) v = v * col_scale[col_broadcast ? 0 : c];
    store_f32(d, d_dtype, r * ldd + c, v);
  }
}

}  // namespace

cudaError_t copy(const KTensor& dst, const KTensor& src, cudaStream_t stream) {
  const int64_t n = dst.numel();
  if (n == 0) return cudaSuccess;
  const int64_t nbytes = n * static_cast<int64_t>(element_size(dst.dtype));
  if (dst.dtype == src.dtype && vectorizable(dst, &src) && nbytes % 16 == 0) {
    raw_copy_vector_kernel<<<vector_grid(n, dst.dtype), kThreads, 0, stream>>>(
        static_cast<uint4*>(dst.data), static_cast<const uint4*>(src.data), nbytes / 16);
    return cudaGetLastError();
  }
  const int grid = detail::grid_for(n, kThreads);
  if (dst.dtype == src.dtype) {
    switch (element_size(dst.dtype)) {
      case 1:
        raw_copy_kernel<uint8_t><<<grid, kThreads, 0, stream>>>(dst, src, n);
        break;
      case 2:
        raw_copy_kernel<uint16_t><<<grid, kThreads, 0, stream>>>(dst, src, n);
        break;
      case 8:  // int64, uint64
        raw_copy_kernel<uint64_t><<<grid, kThreads, 0, stream>>>(dst, src, n);
        break;
      default:
        raw_copy_kernel<uint32_t><<<grid, kThreads, 0, stream>>>(dst, src, n);
        break;
    }
  } else {
    copy_kernel<<<grid, kThreads, 0, stream>>>(dst, src, n, dst.contiguous(), src.contiguous());
  }
  return cudaGetLastError();
}

cudaError_t fill(const KTensor& dst, float value, cudaStream_t stream) {
  const int64_t n = dst.numel();
  if (n == 0) return cudaSuccess;
  if (vectorizable(dst, nullptr)) {
    const int grid = vector_grid(n, dst.dtype);
    with_vector_dtype(dst.dtype, [&](auto d) {
      fill_vector_kernel<decltype(d)::value><<<grid, kThreads, 0, stream>>>(dst.data, value, n);
    });
    return cudaGetLastError();
  }
  fill_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(dst, value, n,
                                                                      dst.contiguous());
  return cudaGetLastError();
}

cudaError_t unary(int op, const KTensor& dst, const KTensor& src, cudaStream_t stream) {
  const int64_t n = dst.numel();
  if (n == 0) return cudaSuccess;
  if (vectorizable(dst, &src) && op >= 0 && op <= 2) {
    const int grid = vector_grid(n, dst.dtype);
    with_vector_dtype(dst.dtype, [&](auto d) {
      launch_unary_vector<decltype(d)::value>(op, dst.data, src.data, n, grid, stream);
    });
    return cudaGetLastError();
  }
  unary_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(
      op, dst, src, n, dst.contiguous(), src.contiguous());
  return cudaGetLastError();
}

cudaError_t swiglu_backward(const KTensor& grad_gate_up, const KTensor& grad_out,
                            const KTensor& gate_up, cudaStream_t stream) {
  const int64_t numel = grad_out.numel();
  if (numel == 0) return cudaSuccess;
  const int64_t n = grad_out.shape[grad_out.ndim - 1];
  const int64_t lanes = 16 / static_cast<int64_t>(element_size(grad_out.dtype));
  if (vectorizable(grad_out, &gate_up) && vectorizable(grad_out, &grad_gate_up) && n % lanes == 0) {
    const int64_t rows = numel / n;
    const int grid = vector_grid(numel, grad_out.dtype);
    with_vector_dtype(grad_out.dtype, [&](auto d) {
      swiglu_backward_vector_kernel<decltype(d)::value>
          <<<grid, kThreads, 0, stream>>>(grad_gate_up.data, grad_out.data, gate_up.data, rows, n);
    });
    return cudaGetLastError();
  }
  swiglu_backward_kernel<<<detail::grid_for(numel, kThreads), kThreads, 0, stream>>>(
      grad_gate_up, grad_out, gate_up, numel, n);
  return cudaGetLastError();
}

cudaError_t swiglu(const KTensor& out, const KTensor& gate_up, cudaStream_t stream) {
  const int64_t numel = out.numel();
  if (numel == 0) return cudaSuccess;
  const int64_t n = out.shape[out.ndim - 1];
  const int64_t lanes = 16 / static_cast<int64_t>(element_size(out.dtype));
  if (vectorizable(out, &gate_up) && n % lanes == 0) {
    const int64_t rows = numel / n;
    const int grid = vector_grid(numel, out.dtype);
    with_vector_dtype(out.dtype, [&](auto d) {
      swiglu_vector_kernel<decltype(d)::value>
          <<<grid, kThreads, 0, stream>>>(out.data, gate_up.data, rows, n);
    });
    return cudaGetLastError();
  }
  swiglu_kernel<<<detail::grid_for(numel, kThreads), kThreads, 0, stream>>>(out, gate_up, numel, n);
  return cudaGetLastError();
}

cudaError_t scale_epilogue(void* d, DType d_dtype, int64_t ldd, const float* src, int64_t rows,
                           int64_t cols, const float* row_scale, bool row_broadcast,
                           const float* col_scale, bool col_broadcast, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  scale_epilogue_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(
      d, d_dtype, ldd, src, rows, cols, row_scale, row_broadcast, col_scale, col_broadcast);
  return cudaGetLastError();
}

}  // namespace asynctp::kernels
