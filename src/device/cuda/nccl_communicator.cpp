#include "device/cuda/nccl_communicator.h"

#include <cstdlib>
#include <cstring>

#include <asynctp/group.h>
#include "device/cuda/cuda_backend.h"
#include "device/cuda/cuda_check.h"

namespace asynctp {

namespace {

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kF8E4M3:
      return ncclFloat8e4m3;
    case DType::kF8E5M2:
      return ncclFloat8e5m2;
    case DType::kI64:
    case DType::kU64:
    case DType::kBool:
      break;
  }
  ASYNCTP_FAIL("{} tensors are not supported here (only float dtypes)", d);
}

cudaStream_t raw(Stream& s) {
  return static_cast<cudaStream_t>(s.native_handle());
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Backend& backend, Group& group)
      : backend_(backend), world_size_(group.world_size()) {
    ASYNCTP_CHECK(backend.device().is_cuda(), "NCCL needs the cuda backend, not {}",
                  backend.name());
    ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // never NVLink multicast unless asked
    ncclUniqueId id;
    const std::string key = group.next_key("nccl/unique_id");
    if (group.rank() == 0) {
      ASYNCTP_NCCL_CHECK(ncclGetUniqueId(&id));
      group.store().set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    } else {
      const std::string bytes = group.store().get(key);
      ASYNCTP_CHECK(bytes.size() == sizeof(id), "malformed NCCL unique id ({} bytes)",
                    bytes.size());
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    ASYNCTP_CUDA_CHECK(cudaSetDevice(backend.device().index));
    ASYNCTP_NCCL_CHECK(ncclCommInitRank(&comm_, group.world_size(), id, group.rank()));
  }

  ~NcclCommunicator() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }

  std::string_view name() const override { return "nccl"; }

  void all_gather(const Tensor& out, const Tensor& in, Stream& stream) override {
    validate_all_gather(out, in, world_size_);
    ASYNCTP_NCCL_CHECK(ncclAllGather(in.data(), out.data(), static_cast<size_t>(in.numel()),
                                     nccl_type(in.dtype()), comm_, raw(stream)));
  }

  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op, Stream& stream) override {
    validate_reduce_scatter(out, in, world_size_);
    ASYNCTP_CHECK(!is_float8(in.dtype()), "NCCL does not reduce {}", in.dtype());
    ASYNCTP_NCCL_CHECK(ncclReduceScatter(
        in.data(), out.data(), static_cast<size_t>(out.numel()), nccl_type(in.dtype()),
        op == ReduceOp::kSum ? ncclSum : ncclAvg, comm_, raw(stream)));
  }

  void all_reduce(const Tensor& inout, ReduceOp op, Stream& stream) override {
    ASYNCTP_CHECK(inout.is_contiguous(), "all_reduce: tensor {} must be contiguous",
                  inout.describe());
    ASYNCTP_CHECK(!is_float8(inout.dtype()), "NCCL does not reduce {}", inout.dtype());
    ASYNCTP_NCCL_CHECK(ncclAllReduce(inout.data(), inout.data(), static_cast<size_t>(inout.numel()),
                                     nccl_type(inout.dtype()),
                                     op == ReduceOp::kSum ? ncclSum : ncclAvg, comm_, raw(stream)));
  }

 private:
  Backend& backend_;
  int world_size_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Backend& backend, Group& group) {
  return std::make_unique<NcclCommunicator>(backend, group);
}

}  // namespace asynctp
