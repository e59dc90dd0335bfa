// Thin RAII wrappers over TCP sockets for the store. Every blocking call takes a Deadline.
#pragma once

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

// Listens on host:port (port 0 picks a free one; host "" or "0.0.0.0" means every interface).
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

// A TCP port that was free a moment ago (bound, read, closed).
int pick_free_port();

}  // namespace asynctp::net
