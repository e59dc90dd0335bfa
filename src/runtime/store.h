// A TCP key-value store: how the ranks of a group find each other and exchange small metadata
// (allocation handles, NCCL ids, sizes). Rank 0 runs the StoreServer; every rank, rank 0
// included, talks to it through a Store client.
//
//   set(key, value)   stores a value (overwrites).
//   get(key)          returns the value, waiting until some rank sets it.
//   wait(keys)        waits until every key is set.
//   add(key, delta)   atomically adds to an integer value (missing = 0) and returns the sum.
//   check(keys)       whether every key is set, without waiting.
//   erase(key)        removes a key.
//
// Every call is bounded by a timeout; one that passes throws TimeoutError naming the rank, the
// call and its key. Wire format (both directions): u32 payload length, then the payload
// [u8 command or status][u32 count] followed by count fields [u32 length][bytes].
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/deadline.h"
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

class Store {
 public:
  // `rank` only labels error messages. The connection is made lazily on first use.
  Store(std::string host, int port, Millis timeout, int rank);
  ~Store();

  void set(const std::string& key, const std::string& value);
  std::string get(const std::string& key);
  std::string get(const std::string& key, Millis timeout);
  void wait(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys, Millis timeout);
  int64_t add(const std::string& key, int64_t delta);
  bool check(const std::vector<std::string>& keys);
  // Removes a key (no error if it is missing).
  void erase(const std::string& key);

  Millis timeout() const { return timeout_; }
  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  std::vector<std::string> request(uint8_t command, const std::vector<std::string>& fields,
                                   Millis timeout, const std::string& what);

  std::string host_;
  int port_;
  Millis timeout_;
  int rank_;
  std::mutex mutex_;
  net::Fd fd_;
};

}  // namespace asynctp
