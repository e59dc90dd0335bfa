// Thin RAII wrappers over TCP sockets for the store. Every blocking call takes a Deadline.
#pragma once

#include <sys/types.h>

#include <optional>
#include <span>
#include <string>
#include <utility>

#include "core/deadline.h"

namespace asynctp::net {

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset();

 private:
  int fd_ = -1;
};

// Listens on host:port only (port 0 picks a free one; host "" or "0.0.0.0" means every
// interface). A taken port is an Error that says so.
Fd tcp_listen(const std::string& host, int port, int* bound_port);

// Connects to host:port, retrying while the server is not up yet, until the deadline.
// `what` names the caller in the timeout message.
Fd tcp_connect(const std::string& host, int port, const Deadline& deadline,
               const std::string& what);

// Writes all bytes (blocking socket); throws on a closed peer.
void send_all(int fd, const void* data, size_t size);

// Reads exactly size bytes before the deadline. Returns false on timeout; throws if the peer
// closed the connection.
bool recv_all(int fd, void* data, size_t size, const Deadline& deadline);

// A TCP port that was free a moment ago (bound, closed), below the kernel's ephemeral range where
// that range leaves room, so that nothing the kernel numbers takes it before it is listened on.
int pick_free_port();

// The process at the other end of a connected Unix socket, as the kernel saw it when the
// connection was made (SO_PEERCRED): it cannot be forged by the peer.
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
PeerCredentials peer_credentials(int fd);

// Which rank of a group the peer is, by its credentials: it must run as `my_uid` and have the
// pid a rank published (rank_pids[r], r != my_rank). With expected_rank >= 0 it must be that
// rank. Returns the rank, or nullopt and the reason in *problem (naming the peer's pid and uid).
std::optional<int> rank_of_peer(const PeerCredentials& peer, uid_t my_uid,
                                std::span<const int64_t> rank_pids, int my_rank, int expected_rank,
                                std::string* problem);

}  // namespace asynctp::net
