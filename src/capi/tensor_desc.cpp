// asynctp_tensor -> Tensor, every field checked with a message that names the C argument.
#include <limits>

#include "capi/internal.h"

namespace asynctp::capi {

namespace {

DType dtype_of(int32_t code, const ArgName& arg) {
  switch (code) {
    case ASYNCTP_F32:
      return DType::kF32;
    case ASYNCTP_BF16:
      return DType::kBF16;
    case ASYNCTP_F16:
      return DType::kF16;
    case ASYNCTP_F8E4M3:
      return DType::kF8E4M3;
    case ASYNCTP_F8E5M2:
      return DType::kF8E5M2;
    default:
      invalid("{}.dtype is {}, not an asynctp_dtype (0 f32, 1 bf16, 2 f16, 3 f8e4m3, 4 f8e5m2)",
              arg, code);
  }
}

// The device the context's backend runs on: CPU tensors for the CPU backend, CUDA tensors of the
// backend's GPU for the CUDA backend.
Device device_of(const asynctp_tensor& desc, const ArgName& arg, const OpContext& ctx) {
  const Device want = const_cast<OpContext&>(ctx).backend().device();
  switch (desc.device_type) {
    case ASYNCTP_DEVICE_CPU:
      // torch's CPU tensors carry index -1 or 0; there is one CPU device.
      if (desc.device_index != 0 && desc.device_index != -1)
        invalid("{}.device_index is {} for a CPU tensor (0 or -1 expected)", arg,
                desc.device_index);
      if (!want.is_cpu())
        invalid("{} is a CPU tensor, but the context runs on {}", arg, want.to_string());
      return Device::cpu();
    case ASYNCTP_DEVICE_CUDA: {
      if (desc.device_index < 0)
        invalid("{}.device_index is {} for a CUDA tensor (>= 0 expected)", arg, desc.device_index);
      const Device got = Device::cuda(desc.device_index);
      if (got != want)
        invalid("{} is on {}, but the context runs on {}", arg, got.to_string(), want.to_string());
      return got;
    }
    default:
      invalid("{}.device_type is {}, not an asynctp_device_type (0 cpu, 1 cuda)", arg,
              desc.device_type);
  }
}

Tensor convert(const asynctp_tensor* desc, const ArgName& arg, const OpContext& ctx,
               bool need_data) {
  if (desc == nullptr) invalid("{} is NULL", arg);
  if (desc->ndim == -1) invalid("{} is required, but its ndim is -1 (no tensor)", arg);
  if (desc->ndim < 0 || desc->ndim > ASYNCTP_MAX_DIMS)
    invalid("{}.ndim is {}, outside 0..{}", arg, desc->ndim, ASYNCTP_MAX_DIMS);
  const DType dtype = dtype_of(desc->dtype, arg);
  const Device device = device_of(*desc, arg, ctx);
  Dims shape;
  Dims strides;
  int64_t numel = 1;
  for (int d = 0; d < desc->ndim; ++d) {
    if (desc->shape[d] < 0) invalid("{}.shape[{}] is {} (negative)", arg, d, desc->shape[d]);
    if (desc->strides[d] < 0)
      invalid("{}.strides[{}] is {} (negative strides are not supported)", arg, d,
              desc->strides[d]);
    if (__builtin_mul_overflow(numel, desc->shape[d], &numel))
      invalid("{}'s shape overflows int64 elements", arg);
    shape.push_back(desc->shape[d]);
    strides.push_back(desc->strides[d]);
  }
  // The furthest element's offset must be addressable: sum of (size - 1) * stride, in bytes.
  if (numel > 0) {
    int64_t last = 0;
    for (int d = 0; d < desc->ndim; ++d) {
      int64_t step = 0;
      if (__builtin_mul_overflow(desc->shape[d] - 1, desc->strides[d], &step) ||
          __builtin_add_overflow(last, step, &last))
        invalid("{}'s strides overflow int64 elements", arg);
    }
    int64_t bytes = 0;
    if (__builtin_mul_overflow(last + 1, static_cast<int64_t>(element_size(dtype)), &bytes))
      invalid("{}'s extent overflows int64 bytes", arg);
  }
  void* data = desc->data;
  if (data == nullptr && numel > 0) {
    if (need_data) invalid("{}.data is NULL but the tensor has {} elements", arg, numel);
    // A Tensor of elements holds an address; reserve reads none, so any aligned one serves.
    alignas(256) static char unread_address[1];
    data = unread_address;
  }
  return Tensor(data, dtype, std::move(shape), std::move(strides), device);
}

}  // namespace

Tensor tensor_of(const asynctp_tensor* desc, ArgName arg, const OpContext& ctx) {
  return convert(desc, arg, ctx, /*need_data=*/true);
}

Tensor optional_tensor_of(const asynctp_tensor* desc, ArgName arg, const OpContext& ctx) {
  if (desc == nullptr || desc->ndim == -1) {
    if (desc != nullptr && desc->data != nullptr)
      invalid("{}.ndim is -1 (no tensor) but its data is not NULL", arg);
    return Tensor();
  }
  return tensor_of(desc, arg, ctx);
}

Tensor shape_only_tensor_of(const asynctp_tensor* desc, ArgName arg, const OpContext& ctx) {
  return convert(desc, arg, ctx, /*need_data=*/false);
}

std::vector<Tensor> tensors_of(const asynctp_tensor* descs, int32_t count, std::string_view arg,
                               std::string_view count_arg, const OpContext& ctx) {
  if (count < 1 || count > kMaxTensorList)
    invalid("{} is {}, outside 1..{}", count_arg, count, kMaxTensorList);
  if (descs == nullptr) invalid("{} is NULL but {} is {}", arg, count_arg, count);
  std::vector<Tensor> out;
  out.reserve(count);
  for (int32_t i = 0; i < count; ++i)
    out.push_back(tensor_of(&descs[i], ArgName(arg, i), ctx));
  return out;
}

std::optional<PathChoice> path_of(int32_t path) {
  switch (path) {
    case ASYNCTP_PATH_DEFAULT:
      return std::nullopt;
    case ASYNCTP_PATH_AUTO:
      return PathChoice::kAuto;
    case ASYNCTP_PATH_SPLIT:
      return PathChoice::kSplit;
    case ASYNCTP_PATH_FALLBACK:
      return PathChoice::kFallback;
    case ASYNCTP_PATH_NATIVE:
      return PathChoice::kNative;
    default:
      invalid("path is {}, not an asynctp_path (-1 default, 0 auto, 1 split, 2 fallback, 3 native)",
              path);
  }
}

ReduceOp reduce_op_of(int32_t op) {
  switch (op) {
    case ASYNCTP_REDUCE_SUM:
      return ReduceOp::kSum;
    case ASYNCTP_REDUCE_AVG:
      return ReduceOp::kAvg;
    default:
      invalid("reduce_op is {}, not an asynctp_reduce_op (0 sum, 1 avg)", op);
  }
}

}  // namespace asynctp::capi
