// The key-value store through which the ranks of a group find each other and exchange small
// metadata (allocation handles, NCCL ids, sizes). `Store` is the interface; a group works over
// any implementation of it:
//   TcpStore       a client of the TCP store server that rank 0 of a group made from a
//                  RendezvousInfo runs (asynctp/group.h): the store of torchrun-style jobs and
//                  `asynctp launch`. Client and server prove to each other that they know the
//                  job's secret (ASYNCTP_STORE_SECRET) before anything else is said, so that
//                  no outside client reads or writes a key, and a rank never talks to the store
//                  of another job that holds its port.
//   PrefixStore    every key of another store under a prefix: one namespace per group, so that
//                  several groups (the TP and DP groups of a 2-D mesh) share one store.
//   CallbackStore  a host framework's store (PyTorch's c10d store) reached through callbacks.
//
//   set(key, value)   stores a value (overwrites).
//   get(key)          returns the value, waiting until some rank sets it.
//   wait(keys)        waits until every key is set.
//   add(key, delta)   atomically adds to an integer value (missing = 0) and returns the sum.
//   check(keys)       whether every key is set, without waiting.
//   erase(key)        removes a key (no error if it is missing).
//
// Every waiting call is bounded by a timeout (the store's own, or the one given); one that passes
// throws TimeoutError naming the rank, the call and its key.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <asynctp/errors.h>

namespace asynctp {

namespace net {
class Fd;
}
class Deadline;

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  std::string get(const std::string& key) { return get(key, timeout()); }
  virtual std::string get(const std::string& key, Millis timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual bool check(const std::vector<std::string>& keys) = 0;
  virtual void erase(const std::string& key) = 0;
  // The bound of get(key) and wait(keys).
  virtual Millis timeout() const = 0;
};

class TcpStore final : public Store {
 public:
  // `rank` only labels error messages. `secret`: the job's store secret (at least 16 bytes; the
  // server's). The connection is made and authenticated lazily on first use; a server that
  // does not know the secret (another job's store on that port) is an Error at once, naming the
  // port.
  TcpStore(std::string host, int port, Millis timeout, int rank, std::string secret);
  ~TcpStore() override;

  using Store::get;
  using Store::wait;
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Millis timeout) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void erase(const std::string& key) override;
  Millis timeout() const override { return timeout_; }

  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  std::vector<std::string> request(uint8_t command, const std::vector<std::string>& fields,
                                   Millis timeout, const std::string& what);
  // Connects (retrying until the deadline) and authenticates: fd_ is then valid.
  void connect(const Deadline& deadline, const std::string& who);
  // The handshake on a fresh connection; false when the server closed it before greeting (a
  // full or stopping server: retry).
  bool handshake(int fd, const Deadline& deadline, const std::string& who);

  std::string host_;
  int port_;
  Millis timeout_;
  int rank_;
  std::string secret_;
  std::mutex mutex_;
  std::unique_ptr<net::Fd> fd_;  // the connection, made on first use
};

// Every key of `inner` under `prefix`: key "k" is "<prefix>/k" there. The inner store is shared
// (several prefixes over one store) and kept alive.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> inner, std::string prefix);

  using Store::get;
  using Store::wait;
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Millis timeout) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void erase(const std::string& key) override;
  Millis timeout() const override { return inner_->timeout(); }

  const std::string& prefix() const { return prefix_; }

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> full(const std::vector<std::string>& keys) const;

  std::shared_ptr<Store> inner_;
  std::string prefix_;
};

// A host framework's store, reached through callbacks (the C ABI adapts its C callbacks to
// these). Every callback must be set. get waits up to the timeout it is given for the key to be
// set and returns nullopt when it passes; the other callbacks do not wait.
struct StoreCallbacks {
  std::function<void(const std::string& key, const std::string& value)> set;
  std::function<std::optional<std::string>(const std::string& key, Millis timeout)> get;
  std::function<int64_t(const std::string& key, int64_t delta)> add;
  std::function<bool(const std::string& key)> check;
  std::function<void(const std::string& key)> erase;
};

class CallbackStore final : public Store {
 public:
  // `rank` only labels error messages.
  CallbackStore(StoreCallbacks callbacks, Millis timeout, int rank);

  using Store::get;
  using Store::wait;
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Millis timeout) override;
  // Gets each key in turn, within one deadline for all of them.
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void erase(const std::string& key) override;
  Millis timeout() const override { return timeout_; }

 private:
  StoreCallbacks callbacks_;
  Millis timeout_;
  int rank_;
};

}  // namespace asynctp
