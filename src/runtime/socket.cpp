#include "runtime/socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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
  // Listen on every interface so that ranks on other nodes can reach rank 0 by its name.
  resolve("", port, /*passive=*/true, &info);
  std::string last_error = "no address";
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
  ASYNCTP_FAIL("cannot listen on port {} (for host '{}'): {}", port, host, last_error);
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

int pick_free_port() {
  int port = 0;
  Fd fd = tcp_listen("", 0, &port);
  return port;
}

}  // namespace asynctp::net
