#include "symm/cpu_symmetric_memory.h"
#include "core/deadline.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <vector>

#include <asynctp/group.h>

#include "device/cpu_futex.h"
#include "device/cpu_streams.h"

namespace asynctp {

namespace {

using cpu::futex_wait;
using cpu::futex_wake;

// Moves *flag from `from` to `to` once it holds `from`; false if the deadline passes first.
bool transition(uint32_t* flag, uint32_t from, uint32_t to, const Deadline& deadline) {
  std::atomic_ref<uint32_t> ref(*flag);
  for (int spin = 0;; ++spin) {
    uint32_t expected = from;
    if (ref.compare_exchange_strong(expected, to, std::memory_order_acq_rel)) {
      futex_wake(flag);
      return true;
    }
    if (deadline.expired()) return false;
    if (spin < 64) continue;
    futex_wait(flag, expected, std::min(deadline.remaining_ms() + 1, 50));
  }
}

struct Mapping {
  void* base = nullptr;
  size_t bytes = 0;
};

class CpuSymmetricMemory final : public SymmetricMemory {
 public:
  CpuSymmetricMemory(int rank, int world_size, size_t size, std::vector<Mapping> maps,
                     Millis timeout)
      : SymmetricMemory(rank, world_size, size, Device::cpu()),
        maps_(std::move(maps)),
        timeout_(timeout) {}

  ~CpuSymmetricMemory() override {
    for (auto& m : maps_) {
      if (m.base != nullptr) ::munmap(m.base, m.bytes);
    }
  }

  void* buffer_ptr(int peer) override {
    check_peer(peer, "buffer_ptr");
    return static_cast<char*>(maps_[peer].base) + signal_pad_bytes(world_size_);
  }
  uint32_t* signal_pad_ptr(int peer) override {
    check_peer(peer, "signal_pad_ptr");
    return static_cast<uint32_t*>(maps_[peer].base);
  }

  // Each call is checked now and carried out in stream order by the stream's worker (NOTE [cpu
  // streams]); its deadline starts when the worker reaches it, as a GPU wait's does.
  void put_signal(int peer, int channel, Stream& stream) override {
    check_peer(peer, "put_signal");
    check_channel(channel, "put_signal");
    cpu::as_cpu(stream, "put_signal").enqueue("put_signal", [this, peer, channel] {
      put(peer, channel, Deadline(timeout_));
    });
  }
  void wait_signal(int peer, int channel, Stream& stream) override {
    check_peer(peer, "wait_signal");
    check_channel(channel, "wait_signal");
    cpu::as_cpu(stream, "wait_signal").enqueue("wait_signal", [this, peer, channel] {
      wait(peer, channel, Deadline(timeout_));
    });
  }

  void reset_and_barrier(uint32_t* flags, int count, int channel, Stream& stream) override {
    check_reset(flags, count);
    check_channel(channel, "barrier");
    cpu::as_cpu(stream, "reset_and_barrier")
        .enqueue("reset_and_barrier", [this, flags, count, channel] {
          // Peers read these flags from their own processes, through the shared mapping.
          for (int i = 0; i < count; ++i)
            std::atomic_ref<uint32_t>(flags[i]).store(0, std::memory_order_release);
          run_barrier(channel);
        });
  }

  void barrier(int channel, Stream& stream) override {
    check_channel(channel, "barrier");
    cpu::as_cpu(stream, "barrier").enqueue("barrier", [this, channel] { run_barrier(channel); });
  }

 private:
  // One deadline for the whole barrier: it never blocks longer than the group's timeout.
  void run_barrier(int channel) {
    const Deadline deadline(timeout_);
    for (int i = 1; i < world_size_; ++i)
      put((rank_ + i) % world_size_, channel, deadline);
    for (int i = 1; i < world_size_; ++i)
      wait((rank_ + i) % world_size_, channel, deadline);
  }

  void put(int peer, int channel, const Deadline& deadline) {
    if (!transition(flag(peer, channel, rank_), 0, 1, deadline)) {
      ASYNCTP_TIMEOUT(
          "rank {}: put_signal to peer {} on channel {} timed out after {}: the peer "
          "never consumed the previous signal (is it alive and in the same op?)",
          rank_, peer, channel, deadline.describe());
    }
  }

  void wait(int peer, int channel, const Deadline& deadline) {
    if (!transition(flag(rank_, channel, peer), 1, 0, deadline)) {
      ASYNCTP_TIMEOUT(
          "rank {}: wait_signal from peer {} on channel {} timed out after {}: the "
          "peer never signalled (is it alive and in the same op?)",
          rank_, peer, channel, deadline.describe());
    }
  }

  // Flag [channel][src] in rank `owner`'s pad.
  uint32_t* flag(int owner, int channel, int src) {
    return signal_pad_ptr(owner) + channel * world_size_ + src;
  }

  std::vector<Mapping> maps_;
  Millis timeout_;
};

class CpuSymmAllocator final : public SymmAllocator {
 public:
  explicit CpuSymmAllocator(Group& group) : group_(group) {
    if (!group.single_node()) {
      int nodes = 0;
      for (int r = 0; r < group.world_size(); ++r)
        nodes = std::max(nodes, group.node_of(r) + 1);
      reason_ = fmt::format("the group spans {} nodes; shared memory reaches one node only", nodes);
    }
  }

  const std::string& unavailable_reason() const override { return reason_; }

  std::unique_ptr<SymmetricMemory> allocate(size_t bytes) override {
    ASYNCTP_CHECK(reason_.empty(), "cannot allocate symmetric memory: {}", reason_);
    const int rank = group_.rank();
    const int ws = group_.world_size();
    const std::string key = group_.next_key("symm/cpu");
    const size_t total = signal_pad_bytes(ws) + std::max<size_t>(bytes, 1);
    const std::string name =
        fmt::format("/asynctp-{}-{}-r{}", group_.run_id(), key.substr(key.rfind('/') + 1), rank);

    std::vector<Mapping> maps(ws);
    auto cleanup = [&] {
      for (auto& m : maps) {
        if (m.base != nullptr) ::munmap(m.base, m.bytes);
      }
    };
    {
      const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
      ASYNCTP_SYSCHECK(fd, "rank {}: shm_open('{}')", rank, name);
      if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
        const int err = errno;
        ::close(fd);
        ::shm_unlink(name.c_str());
        ASYNCTP_FAIL("rank {}: cannot size shared memory '{}' to {} bytes: {}", rank, name, total,
                     std::strerror(err));
      }
      void* base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      ::close(fd);
      if (base == MAP_FAILED) {
        ::shm_unlink(name.c_str());
        ASYNCTP_FAIL("rank {}: mmap of '{}' ({} bytes) failed: {}", rank, name, total,
                     std::strerror(errno));
      }
      maps[rank] = {base, total};
    }
    try {
      group_.store().set(fmt::format("{}/{}", key, rank), fmt::format("{} {}", name, bytes));
      // Every peer's size is checked before any segment is opened: a rank that finds a mismatch
      // unlinks its segment at once, and a peer still about to open it would otherwise fail with
      // a bare ENOENT instead of the mismatch.
      std::vector<std::string> peer_names(ws);
      for (int peer = 0; peer < ws; ++peer) {
        if (peer == rank) continue;
        const std::string info = group_.store().get(fmt::format("{}/{}", key, peer));
        const auto space = info.rfind(' ');
        peer_names[peer] = info.substr(0, space);
        const size_t peer_bytes = std::stoull(info.substr(space + 1));
        ASYNCTP_CHECK(
            peer_bytes == bytes,
            "symmetric allocation {}: rank {} asked for {} bytes but rank {} for {}; every "
            "rank must allocate the same sizes in the same order",
            key, rank, bytes, peer, peer_bytes);
      }
      for (int peer = 0; peer < ws; ++peer) {
        if (peer == rank) continue;
        const std::string& peer_name = peer_names[peer];
        const int fd = ::shm_open(peer_name.c_str(), O_RDWR | O_CLOEXEC, 0600);
        ASYNCTP_SYSCHECK(fd, "rank {}: opening peer {}'s shared memory '{}'", rank, peer,
                         peer_name);
        void* base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        ::close(fd);
        ASYNCTP_CHECK(base != MAP_FAILED, "rank {}: mmap of peer {}'s '{}' failed: {}", rank, peer,
                      peer_name, std::strerror(errno));
        maps[peer] = {base, total};
      }
      // Everyone has mapped everyone: the names are no longer needed.
      group_.barrier(key + "/mapped");
    } catch (...) {
      ::shm_unlink(name.c_str());
      cleanup();
      throw;
    }
    ::shm_unlink(name.c_str());
    return std::make_unique<CpuSymmetricMemory>(rank, ws, bytes, std::move(maps), group_.timeout());
  }

 private:
  Group& group_;
  std::string reason_;
};

}  // namespace

std::unique_ptr<SymmAllocator> make_cpu_symm_allocator(Group& group) {
  return std::make_unique<CpuSymmAllocator>(group);
}

}  // namespace asynctp
