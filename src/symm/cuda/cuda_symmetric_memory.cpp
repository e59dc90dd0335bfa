#include "symm/cuda/cuda_symmetric_memory.h"

#include <unistd.h>

#include <vector>

#include <asynctp/group.h>
#include "core/log.h"
#include "device/cuda/cuda_backend.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/driver_api.h"
#include "kernels/kernels.h"
#include "runtime/store_protocol.h"
#include "symm/cuda/fd_exchange.h"

namespace asynctp {

namespace {

cudaStream_t raw(Stream& s) {
  return static_cast<cudaStream_t>(s.native_handle());
}

struct Mapping {
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr ptr = 0;
};

class CudaSymmetricMemory final : public SymmetricMemory {
 public:
  CudaSymmetricMemory(CudaBackendInternals& backend, int rank, int world_size, size_t size,
                      size_t mapped_bytes, std::vector<Mapping> maps, uint32_t** pads_device,
                      Millis timeout)
      : SymmetricMemory(rank, world_size, size, Device::cuda(backend.device_index())),
        backend_(backend),
        mapped_bytes_(mapped_bytes),
        maps_(std::move(maps)),
        pads_device_(pads_device),
        timeout_ns_(static_cast<uint64_t>(timeout.count()) * 1'000'000ull) {}

  ~CudaSymmetricMemory() override {
    cudaDeviceSynchronize();  // nothing in flight may still touch the mappings
    const auto& drv = cuda::driver();
    for (auto& m : maps_) {
      if (m.ptr != 0) {
        drv.mem_unmap(m.ptr, mapped_bytes_);
        drv.mem_address_free(m.ptr, mapped_bytes_);
      }
      if (m.handle != 0) drv.mem_release(m.handle);
    }
    cudaFree(pads_device_);
  }

  void* buffer_ptr(int peer) override {
    check_peer(peer, "buffer_ptr");
    return reinterpret_cast<char*>(maps_[peer].ptr) + signal_pad_bytes(world_size_);
  }
  uint32_t* signal_pad_ptr(int peer) override {
    check_peer(peer, "signal_pad_ptr");
    return reinterpret_cast<uint32_t*>(maps_[peer].ptr);
  }

  void put_signal(int peer, int channel, Stream& stream) override {
    check_peer(peer, "put_signal");
    check_channel(channel, "put_signal");
    backend_.check_device_errors();
    ASYNCTP_CUDA_CHECK(kernels::put_signal(signal_pad_ptr(peer) + channel * world_size_ + rank_,
                                           {rank_, peer, channel}, timeout_ns_,
                                           backend_.device_error_slot(), raw(stream)));
  }

  void wait_signal(int peer, int channel, Stream& stream) override {
    check_peer(peer, "wait_signal");
    check_channel(channel, "wait_signal");
    backend_.check_device_errors();
    ASYNCTP_CUDA_CHECK(kernels::wait_signal(signal_pad_ptr(rank_) + channel * world_size_ + peer,
                                            {rank_, peer, channel}, timeout_ns_,
                                            backend_.device_error_slot(), raw(stream)));
  }

  void barrier(int channel, Stream& stream) override {
    reset_and_barrier(nullptr, 0, channel, stream);
  }

  void reset_and_barrier(uint32_t* flags, int count, int channel, Stream& stream) override {
    check_channel(channel, "barrier");
    check_reset(flags, count);
    backend_.check_device_errors();
    if (world_size_ == 1) {
      if (count > 0)
        ASYNCTP_CUDA_CHECK(cudaMemsetAsync(flags, 0, count * sizeof(uint32_t), raw(stream)));
      return;
    }
    ASYNCTP_CUDA_CHECK(kernels::barrier(pads_device_, rank_, world_size_, channel, timeout_ns_,
                                        backend_.device_error_slot(), raw(stream), flags, count));
  }

 private:
  CudaBackendInternals& backend_;
  size_t mapped_bytes_;
  std::vector<Mapping> maps_;
  uint32_t** pads_device_;
  uint64_t timeout_ns_;
};

class CudaSymmAllocator final : public SymmAllocator {
 public:
  CudaSymmAllocator(Backend& backend, Group& group)
      : backend_(CudaBackendInternals::of(backend)), group_(group) {
    device_ = backend_.device_index();
    reason_ = check_capabilities();
    if (!reason_.empty()) ASYNCTP_LOG_INFO("symmetric memory unavailable: {}", reason_);
  }

  const std::string& unavailable_reason() const override { return reason_; }

  std::unique_ptr<SymmetricMemory> allocate(size_t bytes) override {
    ASYNCTP_CHECK(reason_.empty(), "cannot allocate symmetric memory: {}", reason_);
    const auto& drv = cuda::driver();
    const int rank = group_.rank();
    const int ws = group_.world_size();
    const std::string key = group_.next_key("symm/cuda");
    const std::string tag = key.substr(key.rfind('/') + 1);

    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device_;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t granularity = 0;
    ASYNCTP_CU_CHECK(
        drv.mem_get_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    const size_t mapped = (signal_pad_bytes(ws) + std::max<size_t>(bytes, 1) + granularity - 1) /
                          granularity * granularity;

    // Every rank must ask for the same size (the store says who differs).
    group_.store().set(fmt::format("{}/size/{}", key, rank), std::to_string(bytes));
    for (int peer = 0; peer < ws; ++peer) {
      const std::string size_key = fmt::format("{}/size/{}", key, peer);
      const std::string size_text = group_.store().get(size_key);
      const auto parsed = store_protocol::parse_int64(size_text);
      ASYNCTP_CHECK(parsed.has_value() && *parsed >= 0,
                    "symmetric allocation {}: the size rank {} published under '{}' is '{}', not "
                    "a byte count",
                    key, peer, size_key, store_protocol::printable(size_text));
      const size_t peer_bytes = static_cast<size_t>(*parsed);
      ASYNCTP_CHECK(
          peer_bytes == bytes,
          "symmetric allocation {}: rank {} asked for {} bytes but rank {} for {}; every rank "
          "must allocate the same sizes in the same order",
          key, rank, bytes, peer, peer_bytes);
    }

    std::vector<Mapping> maps(ws);
    uint32_t** pads_device = nullptr;
    auto release_all = [&] {
      for (auto& m : maps) {
        if (m.ptr != 0) {
          drv.mem_unmap(m.ptr, mapped);
          drv.mem_address_free(m.ptr, mapped);
        }
        if (m.handle != 0) drv.mem_release(m.handle);
      }
      cudaFree(pads_device);
    };
    try {
      ASYNCTP_CU_CHECK(drv.mem_create(&maps[rank].handle, mapped, &prop, 0));
      int my_fd = -1;
      ASYNCTP_CU_CHECK(
          drv.mem_export(&my_fd, maps[rank].handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
      std::vector<int> fds;
      try {
        fds = exchange_fds(group_, tag, my_fd);
      } catch (...) {
        ::close(my_fd);
        throw;
      }
      ::close(my_fd);
      for (int peer = 0; peer < ws; ++peer) {
        if (peer == rank) continue;
        const CUresult res = drv.mem_import(
            &maps[peer].handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fds[peer])),
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        ::close(fds[peer]);
        fds[peer] = -1;
        ASYNCTP_CU_CHECK(res);
      }
      CUmemAccessDesc access{};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = device_;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      for (int peer = 0; peer < ws; ++peer) {
        ASYNCTP_CU_CHECK(drv.mem_address_reserve(&maps[peer].ptr, mapped, granularity, 0, 0));
        ASYNCTP_CU_CHECK(drv.mem_map(maps[peer].ptr, mapped, 0, maps[peer].handle, 0));
        ASYNCTP_CU_CHECK(drv.mem_set_access(maps[peer].ptr, mapped, &access, 1));
      }
      // Zero this rank's signal pad before anyone can signal into it.
      ASYNCTP_CUDA_CHECK(
          cudaMemset(reinterpret_cast<void*>(maps[rank].ptr), 0, signal_pad_bytes(ws)));
      std::vector<uint32_t*> pads(ws);
      for (int peer = 0; peer < ws; ++peer)
        pads[peer] = reinterpret_cast<uint32_t*>(maps[peer].ptr);
      ASYNCTP_CUDA_CHECK(
          cudaMalloc(reinterpret_cast<void**>(&pads_device), ws * sizeof(uint32_t*)));
      ASYNCTP_CUDA_CHECK(
          cudaMemcpy(pads_device, pads.data(), ws * sizeof(uint32_t*), cudaMemcpyHostToDevice));
      ASYNCTP_CUDA_CHECK(cudaDeviceSynchronize());
      group_.barrier(key + "/mapped");
    } catch (...) {
      release_all();
      throw;
    }
    return std::make_unique<CudaSymmetricMemory>(backend_, rank, ws, bytes, mapped, std::move(maps),
                                                 pads_device, group_.timeout());
  }

 private:
  // Empty when symmetric memory works for this group, else the reason (the same on every rank).
  std::string check_capabilities() {
    const int rank = group_.rank();
    const int ws = group_.world_size();
    if (!group_.single_node())
      return "the group spans several nodes; NVLink symmetric memory reaches one node only";
    std::string mine;
    int vmm = 0, posix = 0;
    const auto& drv = cuda::driver();
    drv.device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                             device_);
    drv.device_get_attribute(
        &posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device_);
    if (!vmm || !posix)
      mine =
          fmt::format("cuda:{} supports no VMM allocations exported as file descriptors", device_);
    // Every rank publishes its GPU by PCI bus id (device ordinals are per process: ranks that
    // each see one GPU through CUDA_VISIBLE_DEVICES all call theirs cuda:0); each checks that it
    // can reach every other rank's GPU.
    char bus[32] = {};
    ASYNCTP_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, device_));
    const std::string key = group_.next_key("symm/cuda/caps");
    group_.store().set(fmt::format("{}/gpu/{}", key, rank), bus);
    const int per_gpu = cuda_ranks_per_gpu();
    int sharing = 1;  // ranks on this GPU, this one included
    for (int peer = 0; peer < ws && mine.empty(); ++peer) {
      if (peer == rank) continue;
      const std::string peer_bus = group_.store().get(fmt::format("{}/gpu/{}", key, peer));
      if (peer_bus == bus) {
        if (++sharing > per_gpu) {
          mine = per_gpu == 1 ? fmt::format(
                                    "ranks {} and {} share GPU {} (cuda:{} of rank {}); "
                                    "ASYNCTP_SHARED_GPUS=N lets up to N ranks share one GPU, for "
                                    "tests",
                                    rank, peer, bus, device_, rank)
                              : fmt::format("more than ASYNCTP_SHARED_GPUS={} ranks share GPU {}",
                                            per_gpu, bus);
        }
        continue;
      }
      int peer_device = -1;
      if (cudaDeviceGetByPCIBusId(&peer_device, peer_bus.c_str()) != cudaSuccess) {
        (void)cudaGetLastError();
        mine = fmt::format("rank {}'s GPU {} is not visible to rank {} (CUDA_VISIBLE_DEVICES?)",
                           peer, peer_bus, rank);
        break;
      }
      int can = 0;
      ASYNCTP_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device_, peer_device));
      if (!can)
        mine = fmt::format("cuda:{} (rank {}) has no peer access to cuda:{} (rank {})", device_,
                           rank, peer_device, peer);
    }
    group_.store().set(fmt::format("{}/verdict/{}", key, rank), mine);
    for (int peer = 0; peer < ws; ++peer) {
      std::string verdict = group_.store().get(fmt::format("{}/verdict/{}", key, peer));
      if (!verdict.empty()) return verdict;
    }
    return "";
  }

  CudaBackendInternals& backend_;
  Group& group_;
  int device_ = 0;
  std::string reason_;
};

}  // namespace

std::unique_ptr<SymmAllocator> make_cuda_symm_allocator(Backend& backend, Group& group) {
  return std::make_unique<CudaSymmAllocator>(backend, group);
}

}  // namespace asynctp
