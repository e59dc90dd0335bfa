#include "symm/cpu_symmetric_memory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <regex>
#include <string_view>
#include <vector>

#include <asynctp/group.h>

#include "core/deadline.h"
#include "core/log.h"
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

// ---------------------------------------------------------------------------------------------
// NOTE [cpu symmetric memory segments]: who created a segment, and whether it is alive.

template <typename T>
bool parse_number(std::string_view text, T* value) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return ec == std::errc() && end == text.data() + text.size() && !text.empty();
}

// What /proc says of process `pid`: whether it could be read at all, whether the process exists,
// and if so its state (field 3 of /proc/<pid>/stat) and start time (field 22).
struct ProcessState {
  bool known = false;
  bool exists = false;
  char state = 0;
  uint64_t start_ticks = 0;
};

ProcessState process_state(pid_t pid) {
  ProcessState ps;
  const int fd = ::open(fmt::format("/proc/{}/stat", pid).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    ps.known = errno == ENOENT || errno == ESRCH;
    return ps;
  }
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof(buf));
  ::close(fd);
  if (n <= 0) return ps;  // gone between open and read, or unreadable: not known either way
  const std::string_view text(buf, static_cast<size_t>(n));
  // The command (field 2) is in parentheses and may hold spaces and ')': split after the last.
  size_t pos = text.rfind(')');
  if (pos == std::string_view::npos) return ps;
  pos += 2;
  for (int field = 3; field <= 22 && pos < text.size(); ++field) {
    const size_t end = std::min(text.find(' ', pos), text.size());
    const std::string_view value = text.substr(pos, end - pos);
    if (field == 3 && value.size() == 1) ps.state = value[0];
    if (field == 22 && parse_number(value, &ps.start_ticks)) ps.known = ps.exists = true;
    pos = end + 1;
  }
  return ps;
}

// The inode of this process's pid namespace; 0 where /proc does not show it (then no creator can
// be proven dead, and nothing is swept).
uint64_t own_pid_namespace() {
  struct stat st;
  return ::stat("/proc/self/ns/pid", &st) == 0 ? st.st_ino : 0;
}

// Provably dead: no process has the pid, or it is a zombie (it never runs again), or the process
// with that pid started at another time (the pid was reused). Unreadable means alive.
bool creator_dead(pid_t pid, uint64_t start_ticks) {
  const ProcessState ps = process_state(pid);
  if (!ps.known) return false;
  if (!ps.exists) return true;
  if (ps.state == 'Z' || ps.state == 'X') return true;
  return ps.start_ticks != start_ticks;
}

// "p<pid>-t<start>-n<pid namespace>", the end of every segment name.
const std::regex& owner_suffix_re() {
  static const std::regex re(R"(p(\d+)-t(\d+)-n(\d+))");
  return re;
}

// Checks that a peer's segment is one this backend created for that peer, then maps it.
// `total` is the allocation's size with its signal pad.
void* map_peer_segment(int rank, int peer, const std::string& name, size_t total) {
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
  ASYNCTP_SYSCHECK(fd, "rank {}: opening peer {}'s shared memory '{}'", rank, peer, name);
  struct stat st;
  std::string problem;
  if (::fstat(fd, &st) != 0) {
    problem = fmt::format("fstat failed: {}", std::strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    problem = "it is not a regular file";
  } else if (st.st_uid != ::geteuid()) {
    problem =
        fmt::format("it belongs to uid {}, not to this process's uid {}", st.st_uid, ::geteuid());
  } else if ((st.st_mode & 077) != 0) {
    problem = fmt::format("its mode {:04o} lets other users at it (segments are created 0600)",
                          st.st_mode & 07777);
  } else if (st.st_size < 0 || static_cast<size_t>(st.st_size) != total) {
    problem =
        fmt::format("it has {} bytes where the allocation's segments have {}", st.st_size, total);
  }
  if (!problem.empty()) {
    ::close(fd);
    ASYNCTP_FAIL("rank {}: refusing peer {}'s shared memory '{}': {}", rank, peer, name, problem);
  }
  void* base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  ASYNCTP_CHECK(base != MAP_FAILED, "rank {}: mmap of peer {}'s '{}' failed: {}", rank, peer, name,
                std::strerror(err));
  return base;
}

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
    const std::string allocation = key.substr(key.rfind('/') + 1);
    const std::string name = cpu_segment_name(group_.run_id(), allocation, rank);
    sweep_dead_segments();

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
        const std::string peer_key = fmt::format("{}/{}", key, peer);
        const std::string info = group_.store().get(peer_key);
        // "<segment name> <bytes>", the name one of this allocation and this peer.
        const auto space = info.rfind(' ');
        const std::string prefix =
            fmt::format("/asynctp-{}-{}-r{}-", group_.run_id(), allocation, peer);
        size_t peer_bytes = 0;
        const bool well_formed =
            space != std::string::npos && info.compare(0, prefix.size(), prefix) == 0 &&
            prefix.size() <= space &&
            std::regex_match(info.begin() + static_cast<std::ptrdiff_t>(prefix.size()),
                             info.begin() + static_cast<std::ptrdiff_t>(space),
                             owner_suffix_re()) &&
            parse_number(std::string_view(info).substr(space + 1), &peer_bytes);
        ASYNCTP_CHECK(well_formed,
                      "symmetric allocation {}: rank {} got '{}' for peer {} (key '{}'), which "
                      "is not '{}p<pid>-t<start>-n<pid namespace> <bytes>'",
                      key, rank, info.substr(0, 200), peer, peer_key, prefix);
        peer_names[peer] = info.substr(0, space);
        ASYNCTP_CHECK(
            peer_bytes == bytes,
            "symmetric allocation {}: rank {} asked for {} bytes but rank {} for {}; every "
            "rank must allocate the same sizes in the same order",
            key, rank, bytes, peer, peer_bytes);
      }
      for (int peer = 0; peer < ws; ++peer) {
        if (peer == rank) continue;
        maps[peer] = {map_peer_segment(rank, peer, peer_names[peer], total), total};
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

std::string cpu_segment_name(const std::string& run_id, const std::string& allocation, int rank) {
  const ProcessState self = process_state(::getpid());
  ASYNCTP_CHECK(self.exists, "cannot read this process's start time from /proc/{}/stat",
                ::getpid());
  return fmt::format("/asynctp-{}-{}-r{}-p{}-t{}-n{}", run_id, allocation, rank, ::getpid(),
                     self.start_ticks, own_pid_namespace());
}

int sweep_dead_segments() {
  static const std::regex name_re(R"(asynctp-.+-r\d+-p(\d+)-t(\d+)-n(\d+))");
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  const uint64_t pid_ns = own_pid_namespace();
  int removed = 0;
  while (const dirent* e = ::readdir(dir)) {
    std::cmatch m;
    if (!std::regex_match(e->d_name, m, name_re)) continue;
    pid_t pid = 0;
    uint64_t start_ticks = 0, ns = 0;
    if (!parse_number(std::string_view(m[1].first, m[1].second), &pid) || pid <= 0 ||
        !parse_number(std::string_view(m[2].first, m[2].second), &start_ticks) ||
        !parse_number(std::string_view(m[3].first, m[3].second), &ns) || ns != pid_ns || ns == 0) {
      continue;
    }
    struct stat st;
    if (::fstatat(::dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != ::geteuid() || !creator_dead(pid, start_ticks)) {
      continue;
    }
    if (::unlinkat(::dirfd(dir), e->d_name, 0) == 0) ++removed;
  }
  ::closedir(dir);
  if (removed > 0) {
    ASYNCTP_LOG_INFO(
        "removed {} shared-memory segment(s) of processes that died before unlinking "
        "them",
        removed);
  }
  return removed;
}

}  // namespace asynctp
