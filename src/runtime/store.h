// StoreServer: the TCP server behind TcpStore (asynctp/store.h), which one process (rank 0, or
// the test harness) runs. The protocol, its handshake and its limits: runtime/store_protocol.h.
// The server never blocks on a client: sockets are non-blocking, replies queue per connection,
// and a connection that has not authenticated within the handshake timeout is closed.
#pragma once

#include <cstddef>
#include <string>
#include <thread>

#include <asynctp/store.h>

#include "runtime/socket.h"

namespace asynctp {

struct StoreServerOptions {
  // Connections beyond this many are accepted and closed at once (the client retries until its
  // deadline), so that the listen backlog never fills with them.
  size_t max_connections = 1024;
  // A connection that has not authenticated within this long is closed.
  Millis handshake_timeout{10'000};
};

class StoreServer {
 public:
  // Serves on a socket that is already listening (see net::tcp_listen), on a background thread,
  // to the clients that prove they know `secret` (at least 16 bytes).
  StoreServer(net::Fd listener, std::string secret, StoreServerOptions options = {});
  // Binds host:port (0: any free port) and serves.
  StoreServer(const std::string& host, int port, std::string secret,
              StoreServerOptions options = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }

 private:
  void serve();

  net::Fd listener_;
  std::string secret_;
  StoreServerOptions options_;
  net::Fd wake_read_;
  net::Fd wake_write_;
  int port_ = 0;
  std::thread thread_;
};

// The job's store secret from ASYNCTP_STORE_SECRET: 32 to 128 hex digits (128 to 512 bits).
// Unset: a fresh random one when world_size is 1 (no other client), else an Error that says how
// to set it (torchrun and other launchers than `asynctp launch` do not).
std::string store_secret_from_env(int world_size);

}  // namespace asynctp
