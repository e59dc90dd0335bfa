#include "device/cuda/driver_api.h"

#include <cuda_runtime_api.h>

#include "device/cuda/cuda_check.h"

namespace asynctp::cuda {

namespace {

template <typename Fn>
void resolve(const char* symbol, Fn* out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &status);
  ASYNCTP_CHECK(err == cudaSuccess && status == cudaDriverEntryPointSuccess && fn != nullptr,
                "cannot resolve the CUDA driver function {} ({}, status {})", symbol,
                cudaGetErrorString(err), static_cast<int>(status));
  *out = reinterpret_cast<Fn>(fn);
}

DriverApi load() {
  DriverApi api{};
  resolve("cuGetErrorString", &api.get_error_string);
  resolve("cuMemCreate", &api.mem_create);
  resolve("cuMemRelease", &api.mem_release);
  resolve("cuMemExportToShareableHandle", &api.mem_export);
  resolve("cuMemImportFromShareableHandle", &api.mem_import);
  resolve("cuMemAddressReserve", &api.mem_address_reserve);
  resolve("cuMemAddressFree", &api.mem_address_free);
  resolve("cuMemMap", &api.mem_map);
  resolve("cuMemUnmap", &api.mem_unmap);
  resolve("cuMemSetAccess", &api.mem_set_access);
  resolve("cuMemGetAllocationGranularity", &api.mem_get_granularity);
  resolve("cuDeviceGetAttribute", &api.device_get_attribute);
  resolve("cuStreamWriteValue32", &api.stream_write_value32);
  resolve("cuStreamWaitValue32", &api.stream_wait_value32);
  resolve("cuStreamBatchMemOp", &api.stream_batch_mem_op);
  return api;
}

}  // namespace

const DriverApi& driver() {
  static const DriverApi api = load();
  return api;
}

const char* driver_error_string(CUresult result) {
  const char* text = nullptr;
  try {
    if (driver().get_error_string(result, &text) == CUDA_SUCCESS && text != nullptr) return text;
  } catch (...) {
  }
  return "unknown driver error";
}

}  // namespace asynctp::cuda
