#include "runtime/socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "core/error.h"

namespace asynctp::net {

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {
struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list != nullptr) freeaddrinfo(list);
  }
};

void resolve(const std::string& host, int port, bool passive, AddrInfo* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string service = std::to_string(port);
  const char* node = (host.empty() || (passive && host == "0.0.0.0")) ? nullptr : host.c_str();
  const int rc = getaddrinfo(node, service.c_str(), &hints, &out->list);
  ASYNCTP_CHECK(rc == 0, "cannot resolve '{}:{}': {}", host, port, gai_strerror(rc));
}
}  // namespace

Fd tcp_listen(const std::string& host, int port, int* bound_port) {
  AddrInfo info;
  // Only the given address: MASTER_ADDR is loopback for a single-node job, and the interface the
  // other nodes reach otherwise; "" or "0.0.0.0" (asked for explicitly) is every interface.
  resolve(host, port, /*passive=*/true, &info);
  std::string last_error = "no address";
  int last_errno = 0;
  for (addrinfo* ai = info.list; ai != nullptr; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) continue;
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6) {
      int zero = 0;  // dual-stack: accept IPv4 clients too
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    }
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), 512) != 0) {
      last_errno = errno;
      last_error = std::strerror(errno);
      continue;
    }
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    ASYNCTP_SYSCHECK(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len),
                     "getsockname");
    *bound_port = addr.ss_family == AF_INET
                      ? ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port)
                      : ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    return fd;
  }
  const std::string where = fmt::format("{}:{}", host.empty() ? "*" : host, port);
  ASYNCTP_CHECK(last_errno != EADDRINUSE,
                "cannot listen on {}: port {} is taken (another job or program holds it); give "
                "this job another MASTER_PORT (`asynctp launch --master-port`)",
                where, port);
  ASYNCTP_CHECK(last_errno != EADDRNOTAVAIL,
                "cannot listen on {}: '{}' is not an address of this host (MASTER_ADDR must be "
                "this node's loopback for a single-node job, or the address of its interface that "
                "the other nodes reach)",
                where, host);
  ASYNCTP_FAIL("cannot listen on {}: {}", where, last_error);
}

Fd tcp_connect(const std::string& host, int port, const Deadline& deadline,
               const std::string& what) {
  std::string last_error;
  auto backoff = std::chrono::milliseconds(10);
  while (true) {
    AddrInfo info;
    resolve(host, port, /*passive=*/false, &info);
    for (addrinfo* ai = info.list; ai != nullptr; ai = ai->ai_next) {
      Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
      if (!fd.valid()) continue;
      if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0) {
        int one = 1;
        ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return fd;
      }
      last_error = std::strerror(errno);
    }
    if (deadline.expired()) {
      ASYNCTP_TIMEOUT("{}: could not connect to the store at {}:{} within {} (last error: {})",
                      what, host, port, deadline.describe(), last_error);
    }
    std::this_thread::sleep_for(std::min<Millis>(backoff, Millis(deadline.remaining_ms() + 1)));
    backoff = std::min<Millis>(backoff * 2, Millis(200));
  }
}

void send_all(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    ASYNCTP_CHECK(n > 0, "socket send failed: {}", n < 0 ? std::strerror(errno) : "closed");
    p += n;
    size -= static_cast<size_t>(n);
  }
}

bool recv_all(int fd, void* data, size_t size, const Deadline& deadline) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    pollfd pfd{fd, POLLIN, 0};
    const int rc = ::poll(&pfd, 1, deadline.remaining_ms());
    if (rc < 0 && errno == EINTR) continue;
    ASYNCTP_SYSCHECK(rc, "poll on store socket");
    if (rc == 0) return false;
    const ssize_t n = ::recv(fd, p, size, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    ASYNCTP_CHECK(n > 0, "store connection closed by the server ({})",
                  n < 0 ? std::strerror(errno) : "end of stream");
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

namespace {
// The lowest of the kernel's ephemeral ports, those it hands to bind(0) and to outgoing
// connections.
int lowest_ephemeral_port() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0;
  if (in >> lo && lo > 0) return lo;
  return 32768;  // Linux's default, where the file cannot be read
}
}  // namespace

int pick_free_port() {
  // The port is picked now and listened on later (by rank 0, after the launcher's fork and exec):
  // one below the ephemeral range cannot be handed, in between, to another program's bind(0) or
  // outgoing connection. Only another program picking explicitly can take it, and it draws from
  // ~20,000 ports. Where the range leaves no such ports, the kernel picks.
  constexpr int kLowest = 10000, kAttempts = 32;
  const int below = lowest_ephemeral_port();
  if (below - kLowest >= 1000) {
    std::mt19937 rng(std::random_device{}());
    std::uniform_int_distribution<int> ports(kLowest, below - 1);
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
      const int port = ports(rng);
      try {
        int bound = 0;
        Fd fd = tcp_listen("", port, &bound);
        return bound;
      } catch (const Error&) {
        // taken: draw another
      }
    }
  }
  int port = 0;
  Fd fd = tcp_listen("", 0, &port);
  return port;
}

PeerCredentials peer_credentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  ASYNCTP_SYSCHECK(::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len),
                   "getsockopt(SO_PEERCRED) on socket {}", fd);
  return {cred.pid, cred.uid, cred.gid};
}

std::optional<int> rank_of_peer(const PeerCredentials& peer, uid_t my_uid,
                                std::span<const int64_t> rank_pids, int my_rank, int expected_rank,
                                std::string* problem) {
  ASYNCTP_CHECK(problem != nullptr, "rank_of_peer needs somewhere to put the problem");
  ASYNCTP_CHECK(my_rank >= 0 && static_cast<size_t>(my_rank) < rank_pids.size(),
                "rank_of_peer: my rank {} is outside the {} ranks", my_rank, rank_pids.size());
  ASYNCTP_CHECK(expected_rank < 0 || static_cast<size_t>(expected_rank) < rank_pids.size(),
                "rank_of_peer: expected rank {} is outside the {} ranks", expected_rank,
                rank_pids.size());
  if (peer.uid != my_uid) {
    *problem = fmt::format("the peer (pid {}) runs as user {}, not as this job's user {}", peer.pid,
                           peer.uid, my_uid);
    return std::nullopt;
  }
  int found = -1;
  for (size_t r = 0; r < rank_pids.size(); ++r) {
    if (static_cast<int>(r) != my_rank && peer.pid > 0 && rank_pids[r] == peer.pid) {
      found = static_cast<int>(r);
    }
  }
  if (found < 0) {
    *problem =
        fmt::format("the peer (pid {}, user {}) is no rank of this group", peer.pid, peer.uid);
    return std::nullopt;
  }
  if (expected_rank >= 0 && found != expected_rank) {
    *problem =
        fmt::format("the peer (pid {}) is rank {}, not rank {}", peer.pid, found, expected_rank);
    return std::nullopt;
  }
  return found;
}

}  // namespace asynctp::net
