// Strided copy with dtype conversion, fill, unary ops and the scaled-GEMM epilogue. Grid-stride
// loops over the output's linear index; contiguous tensors skip the N-d offset arithmetic.
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
      return v / (1.0f + expf(-v));
    case 1:
      return v > 0.0f ? v : (isnan(v) ? v : 0.0f);
    default:
      return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  }
}

__global__ void unary_kernel(int op, KTensor dst, KTensor src, int64_t n, bool dst_contig,
                             bool src_contig) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = load_f32(src.data, src.dtype, src_contig ? i : offset_of(src, i));
    store_f32(dst.data, dst.dtype, dst_contig ? i : offset_of(dst, i), apply_unary(op, v));
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
  fill_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(dst, value, n,
                                                                      dst.contiguous());
  return cudaGetLastError();
}

cudaError_t unary(int op, const KTensor& dst, const KTensor& src, cudaStream_t stream) {
  const int64_t n = dst.numel();
  if (n == 0) return cudaSuccess;
  unary_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(
      op, dst, src, n, dst.contiguous(), src.contiguous());
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
