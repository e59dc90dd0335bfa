#include "runtime/store.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string_view>
#include <thread>

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/hmac.h"
#include "runtime/store_protocol.h"

namespace asynctp {

namespace sp = store_protocol;

namespace {

// The socket side of the server: non-blocking accepts, reads and writes, all state in the
// StoreEngine. Lives on the serving thread; nothing here is shared.
class ServerLoop {
 public:
  ServerLoop(int listener, int wake, const std::string& secret, const StoreServerOptions& options)
      : listener_(listener),
        wake_(wake),
        options_(options),
        engine_(secret, [] { return random_bytes(sp::kNonceBytes); }) {}

  ~ServerLoop() {
    for (const auto& [fd, since] : clients_)
      ::close(fd);
  }

  void run() {
    std::vector<pollfd> fds;
    while (true) {
      fds.clear();
      fds.push_back({wake_, POLLIN, 0});
      fds.push_back({listener_, POLLIN, 0});
      for (const auto& [fd, since] : clients_) {
        short events = engine_.wants_input(fd) ? POLLIN : 0;
        if (!engine_.pending(fd).empty()) events |= POLLOUT;
        fds.push_back({fd, events, 0});
      }
      const int rc = ::poll(fds.data(), fds.size(), next_handshake_deadline_ms());
      if (rc < 0) {
        if (errno == EINTR) continue;
        ASYNCTP_LOG_ERROR("store server: poll failed: {}", std::strerror(errno));
        return;
      }
      if (fds[0].revents != 0) return;  // shutdown
      for (size_t i = 2; i < fds.size(); ++i) {
        const int fd = fds[i].fd;
        if (fds[i].revents == 0 || clients_.count(fd) == 0) continue;
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_client(fd);
      }
      // Replies to one client may have been queued by another's request (a set that wakes a
      // get): flush every connection that has output, then close those the engine is done with.
      std::vector<int> done;
      for (const auto& [fd, since] : clients_) {
        if (!flush(fd) || engine_.closing(fd)) done.push_back(fd);
      }
      for (const int fd : done)
        drop_client(fd);
      drop_late_handshakes();
      if (fds[1].revents & POLLIN) accept_client();
    }
  }

 private:
  void accept_client() {
    const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    if (clients_.size() >= options_.max_connections) {
      if (!warned_full_) {
        ASYNCTP_LOG_WARN("store server: {} connections open, the limit; refusing more",
                         clients_.size());
        warned_full_ = true;
      }
      ::close(fd);
      return;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    clients_[fd] = Clock::now();
    engine_.open(fd);
    flush(fd);
  }

  void drop_client(int fd) {
    // Best effort: a refusal the engine queued (wrong secret, oversize frame) tells the client
    // why before the connection closes.
    const std::string_view left = engine_.pending(fd);
    if (!left.empty()) {
      [[maybe_unused]] ssize_t n = ::send(fd, left.data(), left.size(), MSG_NOSIGNAL);
    }
    engine_.close(fd);
    ::close(fd);
    clients_.erase(fd);
  }

  void read_client(int fd) {
    char chunk[65536];
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      drop_client(fd);
      return;
    }
    engine_.receive(fd, std::string_view(chunk, static_cast<size_t>(n)));
  }

  // Sends what the engine has for fd without blocking, and lets it handle the requests it held
  // back while the output was full. False when the connection failed.
  bool flush(int fd) {
    while (true) {
      const std::string_view out = engine_.pending(fd);
      if (out.empty()) return true;
      const ssize_t n = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n <= 0) return false;
      engine_.consumed(fd, static_cast<size_t>(n));
      if (engine_.wants_input(fd)) engine_.process(fd);
    }
  }

  void drop_late_handshakes() {
    const auto now = Clock::now();
    std::vector<int> late;
    for (const auto& [fd, since] : clients_) {
      if (!engine_.authenticated(fd) && now - since >= options_.handshake_timeout)
        late.push_back(fd);
    }
    for (const int fd : late)
      drop_client(fd);
  }

  // poll's timeout: until the first unauthenticated connection's handshake runs out (-1: none).
  int next_handshake_deadline_ms() const {
    std::optional<Clock::time_point> first;
    for (const auto& [fd, since] : clients_) {
      if (engine_.authenticated(fd)) continue;
      const auto end = since + options_.handshake_timeout;
      if (!first || end < *first) first = end;
    }
    if (!first) return -1;
    const auto left = std::chrono::duration_cast<Millis>(*first - Clock::now()).count() + 1;
    return static_cast<int>(std::clamp<int64_t>(left, 0, 60'000));
  }

  int listener_;
  int wake_;
  StoreServerOptions options_;
  sp::StoreEngine engine_;
  std::map<int, Clock::time_point> clients_;  // fd -> when it was accepted
  bool warned_full_ = false;
};

bool is_hex(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  });
}

}  // namespace

std::string store_secret_from_env(int world_size) {
  const std::string_view name = envvars::kStoreSecret.name;
  auto secret = envvars::kStoreSecret.text();
  if (!secret) {
    ASYNCTP_CHECK(world_size == 1,
                  "{} is not set, and this job has {} ranks: asynctp's store admits only the "
                  "clients that know the job's secret. `asynctp launch` sets it; with torchrun, "
                  "srun, mpirun or by hand, give every rank the same one, e.g. `export {}=$(od "
                  "-An -tx1 -N32 /dev/urandom | tr -d ' \\n')` before starting them (asynctp's "
                  "C++ store cannot reach torchrun's own store to hand one out; the Python "
                  "package, asynctp.torch, rendezvouses through torchrun's store and needs "
                  "none)",
                  name, world_size, name);
    return random_hex_secret(32);
  }
  ASYNCTP_CHECK(secret->size() >= 32 && secret->size() <= 128 && is_hex(*secret),
                "{} must be 32 to 128 hexadecimal digits (128 to 512 random bits), got {} "
                "characters{}",
                name, secret->size(), is_hex(*secret) ? "" : " that are not all hex digits");
  return *secret;
}

StoreServer::StoreServer(net::Fd listener, std::string secret, StoreServerOptions options)
    : listener_(std::move(listener)), secret_(std::move(secret)), options_(options) {
  ASYNCTP_CHECK(secret_.size() >= 16, "the store's secret is {} bytes; at least 16 expected",
                secret_.size());
  ASYNCTP_CHECK(options_.max_connections >= 1, "the store's max_connections must be positive");
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ASYNCTP_SYSCHECK(::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &len),
                   "getsockname on the store listener");
  port_ = addr.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port)
                                    : ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  int pipe_fds[2];
  ASYNCTP_SYSCHECK(::pipe2(pipe_fds, O_CLOEXEC), "pipe for the store server");
  wake_read_ = net::Fd(pipe_fds[0]);
  wake_write_ = net::Fd(pipe_fds[1]);
  thread_ = std::thread([this] { serve(); });
}

StoreServer::StoreServer(const std::string& host, int port, std::string secret,
                         StoreServerOptions options)
    : StoreServer(
          [&] {
            int bound = 0;
            return net::tcp_listen(host, port, &bound);
          }(),
          std::move(secret), options) {}

StoreServer::~StoreServer() {
  const char byte = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_write_.get(), &byte, 1);
  if (thread_.joinable()) thread_.join();
}

void StoreServer::serve() {
  try {
    ServerLoop loop(listener_.get(), wake_read_.get(), secret_, options_);
    loop.run();
  } catch (const std::exception& e) {
    ASYNCTP_LOG_ERROR("store server stopped: {}", e.what());
  }
}

// ---- TcpStore ----

namespace {

// The payload of the next frame on fd, at most max_len bytes; nullopt when the deadline passes
// first. Throws Error when the peer closes or announces a longer frame.
std::optional<std::string> read_frame(int fd, uint32_t max_len, const Deadline& deadline) {
  uint32_t len = 0;
  if (!net::recv_all(fd, &len, 4, deadline)) return std::nullopt;
  ASYNCTP_CHECK(len <= max_len, "the peer announced a frame of {} bytes, over the limit of {}", len,
                max_len);
  std::string payload(len, '\0');
  if (!net::recv_all(fd, payload.data(), len, deadline)) return std::nullopt;
  return payload;
}

// How long a client waits for the server's greeting before it concludes that what listens on
// the port is not an asynctp store.
constexpr Millis kGreetingTimeout{10'000};

}  // namespace

TcpStore::TcpStore(std::string host, int port, Millis timeout, int rank, std::string secret)
    : host_(std::move(host)),
      port_(port),
      timeout_(timeout),
      rank_(rank),
      secret_(std::move(secret)),
      fd_(std::make_unique<net::Fd>()) {
  ASYNCTP_CHECK(secret_.size() >= 16,
                "rank {}: the store secret is {} bytes; at least 16 expected (see "
                "ASYNCTP_STORE_SECRET)",
                rank, secret_.size());
}

TcpStore::~TcpStore() = default;

bool TcpStore::handshake(int fd, const Deadline& deadline, const std::string& who) {
  const std::string where = fmt::format("{}:{}", host_, port_);
  const Deadline greeting_deadline(
      std::min<Millis>(Millis(deadline.remaining_ms()), kGreetingTimeout));
  // The greeting's length first, by hand: a peer that closes before it is a full or stopping
  // store (the caller retries), while one that sends something else is not an asynctp store.
  uint32_t len = 0;
  bool arrived = false;
  try {
    arrived = net::recv_all(fd, &len, 4, greeting_deadline);
  } catch (const Error&) {
    return false;
  }
  std::optional<std::string> hello;
  if (arrived) {
    hello = std::string(reinterpret_cast<const char*>(&len), 4);
    if (len <= sp::kMaxHandshakeFrameBytes) {
      std::string payload(len, '\0');
      hello = net::recv_all(fd, payload.data(), len, greeting_deadline)
                  ? std::optional<std::string>(std::move(payload))
                  : std::nullopt;
    }
  }
  if (!hello) {
    if (deadline.expired()) {
      ASYNCTP_TIMEOUT("{}: the store at {} sent no greeting within {}", who, where,
                      deadline.describe());
    }
    ASYNCTP_FAIL(
        "what listens on {} sent no asynctp store greeting within {} s: port {} "
        "is held by another program",
        where, kGreetingTimeout.count() / 1000, port_);
  }
  uint8_t status = 0;
  std::vector<std::string> fields;
  ASYNCTP_CHECK(sp::decode_payload(*hello, &status, &fields) && status == sp::kHello &&
                    fields.size() == 2 && fields[0] == sp::kGreeting &&
                    fields[1].size() == sp::kNonceBytes,
                "what listens on {} is not an asynctp store (its greeting is '{}'): port {} "
                "is held by another program",
                where, sp::printable(*hello), port_);
  const std::string client_nonce = random_bytes(sp::kNonceBytes);
  const std::string frame = sp::encode_frame(
      sp::kAuth,
      {client_nonce, std::string(as_bytes(sp::client_proof(secret_, fields[1], client_nonce)))});
  net::send_all(fd, frame.data(), frame.size());
  std::optional<std::string> answer;
  try {
    answer = read_frame(fd, sp::kMaxHandshakeFrameBytes, deadline);
  } catch (const Error& e) {
    ASYNCTP_FAIL(
        "the store at {} closed the connection during authentication ({}): port {} "
        "is held by another job's store, or this job's ranks were given different {} "
        "values",
        where, e.what(), port_, envvars::kStoreSecret.name);
  }
  if (!answer) {
    ASYNCTP_TIMEOUT("{}: the store at {} did not answer the authentication within {}", who, where,
                    deadline.describe());
  }
  std::vector<std::string> reply;
  const bool well_formed = sp::decode_payload(*answer, &status, &reply) && reply.size() == 1;
  ASYNCTP_CHECK(well_formed && status == sp::kOk,
                "the store at {} refused this rank ({}): port {} is held by another job's "
                "store, or this job's ranks were given different {} values",
                where, well_formed ? sp::printable(reply[0], 1024) : "malformed reply", port_,
                envvars::kStoreSecret.name);
  ASYNCTP_CHECK(
      constant_time_equal(as_bytes(sp::server_proof(secret_, fields[1], client_nonce)), reply[0]),
      "the store at {} does not know this job's secret: port {} is held by another job's "
      "store",
      where, port_);
  return true;
}

void TcpStore::connect(const Deadline& deadline, const std::string& who) {
  auto backoff = Millis(10);
  while (true) {
    net::Fd fd = net::tcp_connect(host_, port_, deadline, who);
    if (handshake(fd.get(), deadline, who)) {
      *fd_ = std::move(fd);
      return;
    }
    if (deadline.expired()) {
      ASYNCTP_TIMEOUT(
          "{}: the store at {}:{} kept closing the connection before greeting "
          "(full?) for {}",
          who, host_, port_, deadline.describe());
    }
    std::this_thread::sleep_for(std::min<Millis>(backoff, Millis(deadline.remaining_ms() + 1)));
    backoff = std::min<Millis>(backoff * 2, Millis(200));
  }
}

std::vector<std::string> TcpStore::request(uint8_t command, const std::vector<std::string>& fields,
                                           Millis timeout, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Deadline deadline(timeout);
  const std::string who = fmt::format("rank {}: store {}", rank_, what);
  uint8_t status = 0;
  std::vector<std::string> reply;
  try {
    if (!fd_->valid()) connect(deadline, who);
    const std::string frame = sp::encode_frame(command, fields);
    net::send_all(fd_->get(), frame.data(), frame.size());
    const auto payload = read_frame(fd_->get(), sp::kMaxFrameBytes, deadline);
    if (!payload) {
      // The server may still answer later; drop the connection so that a late reply can never
      // be mistaken for the answer to the next request.
      fd_->reset();
      ASYNCTP_TIMEOUT("{} timed out after {} (store at {}:{})", who, deadline.describe(), host_,
                      port_);
    }
    ASYNCTP_CHECK(sp::decode_payload(*payload, &status, &reply), "malformed reply");
  } catch (const TimeoutError&) {
    throw;
  } catch (const Error& e) {
    fd_->reset();
    throw Error(fmt::format("{} failed: {}", who, e.what()));
  }
  // The server refused this request (a bad value, an overflowing add): the connection stays.
  if (status != sp::kOk) {
    throw Error(
        fmt::format("{} failed: {}", who, reply.empty() ? "" : sp::printable(reply[0], 1024)));
  }
  return reply;
}

void TcpStore::set(const std::string& key, const std::string& value) {
  ASYNCTP_CHECK(key.size() <= sp::kMaxKeyBytes && value.size() <= sp::kMaxValueBytes,
                "rank {}: store set('{}'): a key of {} bytes and a value of {} bytes; the store "
                "holds keys up to {} bytes and values up to {} bytes",
                rank_, sp::printable(key), key.size(), value.size(), sp::kMaxKeyBytes,
                sp::kMaxValueBytes);
  request(sp::kSet, {key, value}, timeout_, fmt::format("set('{}')", sp::printable(key)));
}

std::string TcpStore::get(const std::string& key, Millis timeout) {
  const std::string what = fmt::format("get('{}')", sp::printable(key));
  auto reply = request(sp::kGet, {key}, timeout, what);
  ASYNCTP_CHECK(reply.size() == 1, "rank {}: store {}: malformed reply", rank_, what);
  return std::move(reply[0]);
}

void TcpStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  ASYNCTP_CHECK(!keys.empty(), "store wait() needs at least one key");
  request(sp::kWait, keys, timeout,
          fmt::format("wait('{}'{})", sp::printable(keys[0]),
                      keys.size() > 1 ? fmt::format(" and {} more", keys.size() - 1) : ""));
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  const std::string what = fmt::format("add('{}')", sp::printable(key));
  auto reply = request(sp::kAdd, {key, std::to_string(delta)}, timeout_, what);
  ASYNCTP_CHECK(reply.size() == 1, "rank {}: store {}: malformed reply", rank_, what);
  const auto sum = sp::parse_int64(reply[0]);
  ASYNCTP_CHECK(sum.has_value(), "rank {}: store {}: the reply '{}' is not a 64-bit integer", rank_,
                what, sp::printable(reply[0]));
  return *sum;
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  auto reply = request(sp::kCheck, keys, timeout_, "check");
  return reply.size() == 1 && reply[0] == "1";
}

void TcpStore::erase(const std::string& key) {
  request(sp::kErase, {key}, timeout_, fmt::format("erase('{}')", sp::printable(key)));
}

// ---- PrefixStore ----

PrefixStore::PrefixStore(std::shared_ptr<Store> inner, std::string prefix)
    : inner_(std::move(inner)), prefix_(std::move(prefix)) {
  ASYNCTP_CHECK(inner_ != nullptr, "PrefixStore('{}') needs an inner store, got null", prefix_);
  ASYNCTP_CHECK(!prefix_.empty(), "PrefixStore needs a non-empty prefix");
}

std::vector<std::string> PrefixStore::full(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys)
    out.push_back(full(k));
  return out;
}

void PrefixStore::set(const std::string& key, const std::string& value) {
  inner_->set(full(key), value);
}

std::string PrefixStore::get(const std::string& key, Millis timeout) {
  return inner_->get(full(key), timeout);
}

void PrefixStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  ASYNCTP_CHECK(!keys.empty(), "store wait() needs at least one key");
  inner_->wait(full(keys), timeout);
}

int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return inner_->add(full(key), delta);
}

bool PrefixStore::check(const std::vector<std::string>& keys) {
  return inner_->check(full(keys));
}

void PrefixStore::erase(const std::string& key) {
  inner_->erase(full(key));
}

// ---- CallbackStore ----

namespace {

// Runs a host callback; an exception from it becomes an Error naming the rank, call and key
// (an asynctp::Error, a TimeoutError among them, stays what it is: the callbacks' adapter says
// what failed, and callers tell the kinds apart by class).
template <typename F>
auto call_host(int rank, const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(
        fmt::format("rank {}: store {} failed in the host store: {}", rank, what, e.what()));
  }
}

}  // namespace

CallbackStore::CallbackStore(StoreCallbacks callbacks, Millis timeout, int rank)
    : callbacks_(std::move(callbacks)), timeout_(timeout), rank_(rank) {
  ASYNCTP_CHECK(
      callbacks_.set && callbacks_.get && callbacks_.add && callbacks_.check && callbacks_.erase,
      "rank {}: CallbackStore needs every callback (set {}, get {}, add {}, check {}, "
      "erase {})",
      rank, static_cast<bool>(callbacks_.set), static_cast<bool>(callbacks_.get),
      static_cast<bool>(callbacks_.add), static_cast<bool>(callbacks_.check),
      static_cast<bool>(callbacks_.erase));
  ASYNCTP_CHECK(timeout.count() >= 0, "rank {}: CallbackStore timeout {} ms is negative", rank,
                timeout.count());
}

void CallbackStore::set(const std::string& key, const std::string& value) {
  call_host(rank_, fmt::format("set('{}')", key), [&] { callbacks_.set(key, value); });
}

std::string CallbackStore::get(const std::string& key, Millis timeout) {
  const std::string what = fmt::format("get('{}')", key);
  auto value = call_host(rank_, what, [&] { return callbacks_.get(key, timeout); });
  if (!value) {
    ASYNCTP_TIMEOUT("rank {}: store {} timed out after {} (host store)", rank_, what,
                    Deadline(timeout).describe());
  }
  return std::move(*value);
}

void CallbackStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  ASYNCTP_CHECK(!keys.empty(), "rank {}: store wait() needs at least one key", rank_);
  const Deadline deadline(timeout);
  for (const auto& key : keys) {
    const std::string what =
        fmt::format("wait('{}'{})", key,
                    keys.size() > 1 ? fmt::format(" of {} keys", keys.size()) : std::string());
    if (call_host(rank_, what, [&] { return callbacks_.check(key); })) continue;
    auto value = call_host(rank_, what,
                           [&] { return callbacks_.get(key, Millis(deadline.remaining_ms())); });
    if (!value) {
      ASYNCTP_TIMEOUT("rank {}: store {} timed out after {} (host store)", rank_, what,
                      deadline.describe());
    }
  }
}

int64_t CallbackStore::add(const std::string& key, int64_t delta) {
  return call_host(rank_, fmt::format("add('{}')", key),
                   [&] { return callbacks_.add(key, delta); });
}

bool CallbackStore::check(const std::vector<std::string>& keys) {
  for (const auto& key : keys) {
    if (!call_host(rank_, fmt::format("check('{}')", key), [&] { return callbacks_.check(key); }))
      return false;
  }
  return true;
}

void CallbackStore::erase(const std::string& key) {
  call_host(rank_, fmt::format("erase('{}')", key), [&] { callbacks_.erase(key); });
}

}  // namespace asynctp
