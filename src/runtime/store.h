// StoreServer: the TCP server behind TcpStore (asynctp/store.h), which one process (rank 0, or
// the test harness) runs. Wire format (both directions): u32 payload length, then the payload
// [u8 command or status][u32 count] followed by count fields [u32 length][bytes].
#pragma once

#include <string>
#include <thread>

#include <asynctp/store.h>

#include "runtime/socket.h"

namespace asynctp {

class StoreServer {
 public:
  // Serves on a socket that is already listening (see net::tcp_listen), on a background thread.
  explicit StoreServer(net::Fd listener);
  // Binds host:port (0: any free port) and serves.
  StoreServer(const std::string& host, int port);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }

 private:
  void serve();

  net::Fd listener_;
  net::Fd wake_read_;
  net::Fd wake_write_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace asynctp
