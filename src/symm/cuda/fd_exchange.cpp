#include "symm/cuda/fd_exchange.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include <asynctp/group.h>
#include "core/error.h"
#include "core/log.h"
#include "runtime/socket.h"
#include "runtime/store_protocol.h"

namespace asynctp {

namespace {

sockaddr_un abstract_address(const std::string& name, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // Abstract namespace: a leading NUL, no file to clean up. The name carries the group's run id,
  // which is what keeps the sockets of different groups apart: cutting it could merge two.
  ASYNCTP_CHECK(name.size() <= sizeof(addr.sun_path) - 2,
                "socket name '{}' is {} bytes, over the {} a socket address holds (groups nested "
                "too deep?)",
                name, name.size(), sizeof(addr.sun_path) - 2);
  const size_t n = name.size();
  std::memcpy(addr.sun_path + 1, name.data(), n);
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return addr;
}

std::string socket_name(Group& group, const std::string& tag, int rank) {
  return fmt::format("asynctp-{}-{}-{}", group.run_id(), tag, rank);
}

void send_fd(int conn, int fd, int my_rank) {
  msghdr msg{};
  iovec iov{&my_rank, sizeof(my_rank)};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  ASYNCTP_SYSCHECK(::sendmsg(conn, &msg, MSG_NOSIGNAL), "sending a file descriptor to a peer");
}

// Returns the received fd and sets *sender.
int recv_fd(int conn, int* sender, const Deadline& deadline) {
  pollfd p{conn, POLLIN, 0};
  ASYNCTP_CHECK(::poll(&p, 1, deadline.remaining_ms()) == 1, "no file descriptor arrived within {}",
                deadline.describe());
  msghdr msg{};
  iovec iov{sender, sizeof(*sender)};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);
  ASYNCTP_CHECK(n == sizeof(*sender), "malformed file-descriptor message ({} bytes)", n);
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  ASYNCTP_CHECK(cmsg != nullptr && cmsg->cmsg_type == SCM_RIGHTS,
                "message carried no file descriptor");
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(cmsg), sizeof(int));
  return fd;
}

}  // namespace

std::vector<int> exchange_fds(Group& group, const std::string& tag, int my_fd) {
  const int rank = group.rank();
  const int ws = group.world_size();
  std::vector<int> fds(ws, -1);
  if (ws == 1) return fds;
  const Deadline deadline(group.timeout());

  // Abstract socket names are visible to every user of the host: each side checks the other's
  // credentials (SO_PEERCRED: this user, and the pid that rank published), so that no other
  // process is handed a descriptor of our GPU memory or can hand us one.
  group.store().set(fmt::format("{}/pid/{}", tag, rank), std::to_string(::getpid()));
  net::Fd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASYNCTP_SYSCHECK(listener.get(), "socket(AF_UNIX)");
  socklen_t len = 0;
  const sockaddr_un addr = abstract_address(socket_name(group, tag, rank), &len);
  ASYNCTP_SYSCHECK(::bind(listener.get(), reinterpret_cast<const sockaddr*>(&addr), len),
                   "rank {}: binding the descriptor-exchange socket", rank);
  ASYNCTP_SYSCHECK(::listen(listener.get(), ws), "listen");
  group.barrier(tag + "/listening");
  std::vector<int64_t> pids(ws);
  for (int r = 0; r < ws; ++r) {
    const std::string key = fmt::format("{}/pid/{}", tag, r);
    const std::string value = group.store().get(key);
    const auto pid = store_protocol::parse_int64(value);
    ASYNCTP_CHECK(pid.has_value() && *pid > 0,
                  "rank {}: the pid rank {} published under '{}' is "
                  "'{}', not a process id",
                  rank, r, key, store_protocol::printable(value));
    pids[r] = *pid;
  }
  const uid_t uid = ::getuid();

  // Serve every peer our descriptor while we fetch theirs.
  std::string serve_error;
  std::thread server([&] {
    try {
      // Each peer is served once; a connection from anything else is refused and not counted.
      std::vector<bool> served(ws, false);
      for (int count = 0; count < ws - 1;) {
        pollfd p{listener.get(), POLLIN, 0};
        ASYNCTP_CHECK(::poll(&p, 1, deadline.remaining_ms()) == 1,
                      "rank {}: only {} of {} peers fetched the descriptor within {}", rank, count,
                      ws - 1, deadline.describe());
        net::Fd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
        ASYNCTP_SYSCHECK(conn.get(), "accept");
        std::string problem;
        const auto peer =
            net::rank_of_peer(net::peer_credentials(conn.get()), uid, pids, rank, -1, &problem);
        if (!peer || served[*peer]) {
          ASYNCTP_LOG_WARN("rank {}: refused a connection to its descriptor socket: {}", rank,
                           peer ? fmt::format("rank {} connected twice", *peer) : problem);
          continue;
        }
        send_fd(conn.get(), my_fd, rank);
        served[*peer] = true;
        ++count;
      }
    } catch (const std::exception& e) {
      serve_error = e.what();
    }
  });
  try {
    for (int i = 1; i < ws; ++i) {
      const int peer = (rank + i) % ws;
      net::Fd conn(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
      socklen_t plen = 0;
      const sockaddr_un paddr = abstract_address(socket_name(group, tag, peer), &plen);
      ASYNCTP_SYSCHECK(::connect(conn.get(), reinterpret_cast<const sockaddr*>(&paddr), plen),
                       "rank {}: connecting to peer {}'s descriptor socket", rank, peer);
      std::string problem;
      ASYNCTP_CHECK(
          net::rank_of_peer(net::peer_credentials(conn.get()), uid, pids, rank, peer, &problem),
          "rank {}: the descriptor socket of rank {} is not held by that rank: {}", rank, peer,
          problem);
      int sender = -1;
      const int fd = recv_fd(conn.get(), &sender, deadline);
      ASYNCTP_CHECK(sender == peer, "expected a descriptor from rank {}, got one from {}", peer,
                    sender);
      fds[peer] = fd;
    }
  } catch (...) {
    server.join();
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
    throw;
  }
  server.join();
  ASYNCTP_CHECK(serve_error.empty(), "{}", serve_error);
  return fds;
}

}  // namespace asynctp
