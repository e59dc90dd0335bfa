// The native async-input GEMM's host side: the TMA descriptors, the launch of the kernel
// instantiation for (input dtype, B layout, epilogue, cluster) with its resolved params and plan,
// and the host API of kernels.h. The kernel is in kernels/native/ (kernel.cuh and its parts); its
// contract in params.h, its schedule in schedule.h.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include "kernels/kernels.h"
#include "kernels/native/kernel.cuh"
#include "kernels/native/schedule.h"
#include "kernels/native/validate.h"

namespace asynctp::kernels {

namespace {

using EncodeTiled = decltype(&cuTensorMapEncodeTiled);

EncodeTiled encode_tiled() {
  static EncodeTiled fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault,
                                         &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      return static_cast<EncodeTiled>(nullptr);
    }
    return reinterpret_cast<EncodeTiled>(ptr);
  }();
  return fn;
}

// Everything a map encodes (encode_map's arguments; unused dims zero).
struct MapKey {
  const void* base = nullptr;
  int type = 0;
  int rank = 0;
  cuuint64_t dims[3] = {};
  cuuint64_t strides[2] = {};
  cuuint32_t box[3] = {};
  bool operator==(const MapKey& o) const {  // (the CUDA sources are C++17: no = default)
    return base == o.base && type == o.type && rank == o.rank &&
           std::equal(dims, dims + 3, o.dims) && std::equal(strides, strides + 2, o.strides) &&
           std::equal(box, box + 3, o.box);
  }
};

// Encoded maps, by what they encode. Every launch encodes two to seven maps (and one per peer
// chunk with the kernel's own pushes), each a driver call
// on the host's critical path of an eager op, and a training or serving loop launches over the
// same few buffers (the symmetric slots, the weights, outputs the caching allocator hands out
// again) call after call. Direct-mapped and per thread (no lock): a miss just encodes.
struct MapCache {
  static constexpr size_t kSlots = 64;
  struct Slot {
    MapKey key;
    CUtensorMap map;
    bool valid = false;
  };
  Slot slots[kSlots];

  static size_t slot_of(const MapKey& k) {
    uint64_t h = reinterpret_cast<uintptr_t>(k.base) >> 4;
    for (int d = 0; d < k.rank; ++d)
      h = (h ^ k.dims[d]) * 0x9e3779b97f4a7c15ull;
    return static_cast<size_t>((h ^ static_cast<uint64_t>(k.box[0]) << 7) >> 58) % kSlots;
  }
};
thread_local MapCache map_cache;

// A tiled map of `rank` dims (dims[0] contiguous; strides in bytes for dims 1..), 128-byte
// swizzle, zero fill out of bounds.
bool encode_map(CUtensorMap* map, const void* base, CUtensorMapDataType type, int rank,
                const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box) {
  MapKey key;
  key.base = base;
  key.type = static_cast<int>(type);
  key.rank = rank;
  std::copy(dims, dims + rank, key.dims);
  std::copy(strides, strides + rank - 1, key.strides);
  std::copy(box, box + rank, key.box);
  MapCache::Slot& slot = map_cache.slots[MapCache::slot_of(key)];
  if (slot.valid && slot.key == key) {
    *map = slot.map;
    return true;
  }
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  if (encode_tiled()(map, type, rank, const_cast<void*>(base), dims, strides, box, elem_strides,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    return false;
  }
  slot.key = key;
  slot.map = *map;
  slot.valid = true;
  return true;
}

// The map's element type for a dtype of the kernel (bf16, f16, or float8 as bytes).
CUtensorMapDataType map_type(DType d) {
  if (d == DType::kF8E4M3) return CU_TENSOR_MAP_DATA_TYPE_UINT8;
  return d == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

// A 2-D map: inner dim `inner` (contiguous), outer dim `outer` with row stride `ld` elements of
// `elem` bytes (2: 16-bit, 1: float8), box inner x outer.
bool make_map(CUtensorMap* map, const void* base, CUtensorMapDataType type, int64_t inner,
              int64_t outer, int64_t ld, uint32_t box_inner, uint32_t box_outer, int elem = 2) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld * elem)};
  const cuuint32_t box[2] = {box_inner, box_outer};
  return encode_map(map, base, type, 2, dims, strides, box);
}

// The reduce-scatter epilogue's parts, [count, rows, n] (row stride ld, part stride `stride`
// elements) as a 3-D map: boxes of 64 columns x 128 rows of one part, 128-byte swizzle, zeros
// past n.
bool make_parts_map(CUtensorMap* map, const void* base, CUtensorMapDataType type, int64_t n,
                    int64_t rows, int64_t count, int64_t ld, int64_t stride) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(n), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(count)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(ld * 2),
                                 static_cast<cuuint64_t>(stride * 2)};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(kBM), 1};
  return encode_map(map, base, type, 3, dims, strides, box);
}

// SMs of the current device, asked once per device (several calls per launch need it).
int sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> counts[kMaxDevices] = {};
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (device >= 0 && device < kMaxDevices && (count = counts[device].load()) > 0) return count;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 0;
  if (device >= 0 && device < kMaxDevices) counts[device].store(count);
  return count;
}

template <int kIn, bool kBKMajor, bool kTmaStore, int kCluster>
cudaError_t launch(const CUtensorMap& map_a, const CUtensorMap& map_b, const CUtensorMap& map_c,
                   const CUtensorMap& map_a_own, const CUtensorMap& map_parts,
                   const CUtensorMap& map_sum, const CUtensorMap& map_a_out,
                   const PushMaps& push_maps, KernelParams p, int max_ctas, cudaStream_t stream) {
  auto* kernel = async_gemm_kernel<kIn, kBKMajor, kTmaStore, kCluster>;
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem_bytes<kTmaStore>();
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  // Per function (one process drives one device): the shared-memory opt-in, and how many
  // clusters fit at once (a GPC may not hold an even number of busy SMs).
  static std::once_flag once;
  static cudaError_t attr_status = cudaSuccess;
  static int max_clusters = 0;
  std::call_once(once, [&] {
    attr_status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       smem_bytes<kTmaStore>());
    if (attr_status != cudaSuccess) return;
    config.gridDim = dim3(kCluster * 256);
    attr_status = cudaOccupancyMaxActiveClusters(&max_clusters, kernel, &config);
  });
  if (attr_status != cudaSuccess) return attr_status;
  if (max_clusters <= 0) return cudaErrorInvalidConfiguration;
  // The slots that fit at once on an idle device (with pairs they can be fewer than half the
  // SMs: a GPC with an odd number of SMs), the tail split planned for them, one slot per unit at
  // most (launch_grid). Kernels of other streams may hold SMs beyond reserve_sms: a last part
  // then waits for parts whose slots start later (each part's unit comes before its last
  // part's), bounded by the split wait's timeout.
  if (ctas_per_tile(p) != kCluster) return cudaErrorInvalidValue;  // launch_grid's slots
  const LaunchGrid grid = launch_grid(p, max_clusters, max_ctas, sm_count());
  static_cast<NativeGemmPlan&>(p) = grid.plan;
  const int64_t clusters = grid.slots;
  if (clusters <= 0) return cudaErrorInvalidConfiguration;
  config.gridDim = dim3(static_cast<unsigned>(clusters * kCluster));
  // Single CTAs launch without the cluster attribute (the driver's plain launch path).
  if constexpr (kCluster == 1) config.numAttrs = 0;
  return cudaLaunchKernelEx(&config, kernel, map_a, map_b, map_c, map_a_own, map_parts, map_sum,
                            map_a_out, push_maps, p);
}

// The kernel for (dtype, B layout, epilogue, cluster), with the launch arguments.
struct Launch {
  const CUtensorMap &map_a, &map_b, &map_c, &map_a_own, &map_parts, &map_sum, &map_a_out;
  const PushMaps& push_maps;
  const KernelParams& p;
  int max_ctas;
  cudaStream_t stream;
  template <int kIn, bool kBKMajor, bool kTmaStore, int kCluster>
  cudaError_t run() const {
    return launch<kIn, kBKMajor, kTmaStore, kCluster>(map_a, map_b, map_c, map_a_own, map_parts,
                                                      map_sum, map_a_out, push_maps, p, max_ctas,
                                                      stream);
  }
};

template <int kIn>
cudaError_t launch_layout(bool b_k_major, bool tma_store, int cluster, const Launch& l) {
  if (b_k_major) {
    if (!tma_store) return l.run<kIn, true, false, 1>();
    return cluster == 2 ? l.run<kIn, true, true, 2>() : l.run<kIn, true, true, 1>();
  }
  if (!tma_store) return l.run<kIn, false, false, 1>();
  return cluster == 2 ? l.run<kIn, false, true, 2>() : l.run<kIn, false, true, 1>();
}

// float8: a k-major B only (validate.h).
cudaError_t launch_float8(bool tma_store, int cluster, const Launch& l) {
  if (!tma_store) return l.run<kInE4M3, true, false, 1>();
  return cluster == 2 ? l.run<kInE4M3, true, true, 2>() : l.run<kInE4M3, true, true, 1>();
}

// One thread per element of C: its dot product in f32, in k order, times the float8 scales
// (a_scale_at, b_scale), rounded once.
template <typename In>
__global__ void reference_gemm_kernel(const NativeGemmParams p) {
  const int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t row = blockIdx.y;
  if (col >= p.n || row >= p.m) return;
  const In* a = static_cast<const In*>(p.a);
  const In* b = static_cast<const In*>(p.b);
  float acc = 0.f;
  for (int64_t i = 0; i < p.k; ++i) {
    const In bv = p.b_k_major ? b[col * p.ldb + i] : b[i * p.ldb + col];
    acc += static_cast<float>(a[row * p.lda + i]) * static_cast<float>(bv);
  }
  if (const float* sa = a_scale_at(p, row)) acc *= *sa;
  if (p.b_scale != nullptr) acc *= p.b_scale[col * p.b_scale_stride];
  if (p.c_dtype == DType::kF32) {
    static_cast<float*>(p.c)[row * p.ldc + col] = acc;
  } else if (p.c_dtype == DType::kBF16) {
    static_cast<__nv_bfloat16*>(p.c)[row * p.ldc + col] = __float2bfloat16_rn(acc);
  } else {
    static_cast<__half*>(p.c)[row * p.ldc + col] = __float2half_rn(acc);
  }
}

int ctas_of(const NativeGemmParams& a) {
  return (a.max_ctas > 0 ? a.max_ctas : sm_count()) - a.reserve_sms;
}

}  // namespace

std::string async_gemm_unsupported(const NativeGemmParams& a) {
  if (std::string why = native_gemm_unsupported(a); !why.empty()) return why;
  if (encode_tiled() == nullptr) return "the driver has no cuTensorMapEncodeTiled";
  return "";
}

size_t async_gemm_split_workspace_bytes() {
  return split_workspace_bytes(sm_count());
}

int async_gemm_tail_split(const NativeGemmParams& a) {
  return tail_split_of(a, ctas_of(a), sm_count());
}

cudaError_t async_gemm(const NativeGemmParams& a, cudaStream_t stream) {
  if (!async_gemm_unsupported(a).empty()) return cudaErrorInvalidValue;
  const CUtensorMapDataType type = map_type(a.in_dtype);
  const CUtensorMapDataType c_type = map_type(a.c_dtype);  // 16-bit C only: TMA store, sums
  const bool tma_store = uses_tma_store(a);
  const int cluster = ctas_per_tile(a);
  // A and B in k-blocks of 128 bytes (k_block_of elements of in_bytes each).
  const int in_bytes = float8_inputs(a) ? 1 : 2;
  const auto kblk = static_cast<uint32_t>(k_block_of(a));
  CUtensorMap map_a{}, map_b{};
  if (!make_map(&map_a, a.a, type, a.k, a.m, a.lda, kblk, kBM, in_bytes))
    return cudaErrorInvalidValue;
  // K-major B: one box of the CTA's share of the tile's rows (SwiGLU: two boxes of half the
  // tile's rows, the gate's and the up projection's); N-major: 64 x 64 boxes. B has b_cols(a)
  // columns (2N with the SwiGLU epilogue).
  const uint32_t b_box = a.swiglu ? kBN / 2 : kBN / cluster;
  const bool ok_b = a.b_k_major
                        ? make_map(&map_b, a.b, type, a.k, b_cols(a), a.ldb, kblk, b_box, in_bytes)
                        : make_map(&map_b, a.b, type, b_cols(a), a.k, a.ldb, 64, kBK);
  if (!ok_b) return cudaErrorInvalidValue;
  const int ctas = ctas_of(a);
  if (ctas <= 0) return cudaErrorNoDevice;
  KernelParams p{};
  static_cast<NativeGemmParams&>(p) = resolved(a);
  // The plan (the tail split for the slots that fit at once) is launch<>'s: launch_grid.
  // (With the kernel's own pushes every tile goes to a push map or the reduced output: no C.)
  CUtensorMap map_c{};
  if (tma_store && a.push_chunks == 0) {
    if (!make_map(&map_c, a.c, c_type, a.n, a.m, a.ldc, 64, 64)) return cudaErrorInvalidValue;
  }
  // The own chunk's rows straight from the caller's A: [chunk rows, K] with row stride own_lda.
  CUtensorMap map_a_own{};
  if (p.own_chunk >= 0) {
    const int64_t rows = std::min(p.chunk_rows, a.m - a.own_chunk * p.chunk_rows);
    if (!make_map(&map_a_own, a.own_a, type, a.k, rows, a.own_lda, kblk, kBM, in_bytes))
      return cudaErrorInvalidValue;
  }
  // The reduce-scatter epilogue: the peers' parts (TMA-loaded into sum stages) and, where the
  // TMA can address it, the reduced output (stored like C, through the staging area). The SwiGLU
  // epilogue's pre through the staging area instead: the gate's half [M, N] at pre and the up
  // projection's at pre + N (uses_tma_store: N % 8 == 0, so that base is 16-byte aligned).
  CUtensorMap map_parts{}, map_sum{};
  if (a.swiglu && tma_store && a.pre != nullptr) {
    const CUtensorMapDataType pre_type = map_type(a.pre_dtype);
    const auto* up = static_cast<const uint16_t*>(a.pre) + a.n;
    if (!make_map(&map_parts, a.pre, pre_type, a.n, a.m, a.pre_ld, 64, 64) ||
        !make_map(&map_sum, up, pre_type, a.n, a.m, a.pre_ld, 64, 64)) {
      return cudaErrorInvalidValue;
    }
  } else if (a.sum_chunk >= 0) {
    if (a.sum_count > 1 && !make_parts_map(&map_parts, a.sum_parts, c_type, a.n, p.chunk_rows,
                                           a.sum_count, a.sum_ld, a.sum_part_stride)) {
      return cudaErrorInvalidValue;
    }
    if (sum_tma_store_of(p) &&
        !make_map(&map_sum, a.sum_out, c_type, a.n, p.chunk_rows, a.sum_ldo, 64, 64)) {
      return cudaErrorInvalidValue;
    }
  }
  // The copy of A: boxes of one consumer's 64 rows of an A stage.
  CUtensorMap map_a_out{};
  if (a.a_out != nullptr &&
      !make_map(&map_a_out, a.a_out, type, a.k, a.m, a.a_out_ld, kblk, 64, in_bytes)) {
    return cudaErrorInvalidValue;
  }
  // The kernel's own pushes: each peer chunk's slot on its owner, [chunk rows, n], boxes as C's.
  PushMaps push_maps{};
  for (int c = 0; c < a.push_chunks; ++c) {
    if (c != a.sum_chunk &&
        !make_map(&push_maps.map[c], a.push_c[c], c_type, a.n, p.chunk_rows, a.push_ld, 64, 64)) {
      return cudaErrorInvalidValue;
    }
  }
  const Launch l{map_a,     map_b,     map_c, map_a_own, map_parts, map_sum,
                 map_a_out, push_maps, p,     ctas,      stream};
  if (float8_inputs(a)) return launch_float8(tma_store, cluster, l);
  if (a.in_dtype == DType::kF16) return launch_layout<kInF16>(a.b_k_major, tma_store, cluster, l);
  return launch_layout<kInBF16>(a.b_k_major, tma_store, cluster, l);
}

cudaError_t reference_gemm(const NativeGemmParams& a, cudaStream_t stream) {
  if (a.m <= 0 || a.n <= 0 || a.k <= 0 || a.m > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((a.n + 127) / 128), static_cast<unsigned>(a.m));
  const NativeGemmParams p = resolved(a);
  if (a.in_dtype == DType::kBF16) {
    reference_gemm_kernel<__nv_bfloat16><<<grid, 128, 0, stream>>>(p);
  } else if (a.in_dtype == DType::kF16) {
    reference_gemm_kernel<__half><<<grid, 128, 0, stream>>>(p);
  } else if (a.in_dtype == DType::kF8E4M3) {
    reference_gemm_kernel<__nv_fp8_e4m3><<<grid, 128, 0, stream>>>(p);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace asynctp::kernels
