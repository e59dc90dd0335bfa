// The CUDA driver functions the project uses, resolved at run time through the runtime's
// cudaGetDriverEntryPointByVersion: nothing links libcuda, so binaries built with the CUDA
// backend still start (and skip their GPU work) on machines without a GPU driver.
#pragma once

#include <cuda.h>

namespace asynctp::cuda {

struct DriverApi {
  decltype(&::cuGetErrorString) get_error_string;
  decltype(&::cuMemCreate) mem_create;
  decltype(&::cuMemRelease) mem_release;
  decltype(&::cuMemExportToShareableHandle) mem_export;
  decltype(&::cuMemImportFromShareableHandle) mem_import;
  decltype(&::cuMemAddressReserve) mem_address_reserve;
  decltype(&::cuMemAddressFree) mem_address_free;
  decltype(&::cuMemMap) mem_map;
  decltype(&::cuMemUnmap) mem_unmap;
  decltype(&::cuMemSetAccess) mem_set_access;
  decltype(&::cuMemGetAllocationGranularity) mem_get_granularity;
  decltype(&::cuDeviceGetAttribute) device_get_attribute;
  decltype(&::cuStreamWriteValue32) stream_write_value32;
  decltype(&::cuStreamWaitValue32) stream_wait_value32;
  decltype(&::cuStreamBatchMemOp) stream_batch_mem_op;
};

// Resolves every entry point once (throws naming a missing one).
const DriverApi& driver();

}  // namespace asynctp::cuda
