#include "runtime/store.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"

namespace asynctp {

namespace {

enum Command : uint8_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4, kCheck = 5, kErase = 6 };
enum Status : uint8_t { kOk = 0, kFailed = 1 };
constexpr uint32_t kMaxFrame = 1u << 30;

void put_u32(std::string* out, uint32_t v) {
  out->append(reinterpret_cast<const char*>(&v), 4);
}

// [u32 payload length][u8 code][u32 count]{[u32 len][bytes]}...
std::string encode_frame(uint8_t code, const std::vector<std::string>& fields) {
  std::string payload;
  payload.push_back(static_cast<char>(code));
  put_u32(&payload, static_cast<uint32_t>(fields.size()));
  for (const auto& f : fields) {
    put_u32(&payload, static_cast<uint32_t>(f.size()));
    payload += f;
  }
  std::string frame;
  put_u32(&frame, static_cast<uint32_t>(payload.size()));
  return frame + payload;
}

bool decode_payload(std::string_view payload, uint8_t* code, std::vector<std::string>* fields) {
  auto read_u32 = [&](uint32_t* v) {
    if (payload.size() < 4) return false;
    std::memcpy(v, payload.data(), 4);
    payload.remove_prefix(4);
    return true;
  };
  if (payload.empty()) return false;
  *code = static_cast<uint8_t>(payload[0]);
  payload.remove_prefix(1);
  uint32_t count = 0;
  if (!read_u32(&count) || count > payload.size()) return false;
  fields->clear();
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t len = 0;
    if (!read_u32(&len) || len > payload.size()) return false;
    fields->emplace_back(payload.substr(0, len));
    payload.remove_prefix(len);
  }
  return payload.empty();
}

struct Waiter {
  int fd;
  uint8_t command;  // kGet (reply with the value) or kWait
  std::vector<std::string> keys;
};

// All server state lives on the serving thread; nothing here is shared.
class ServerLoop {
 public:
  ServerLoop(int listener, int wake) : listener_(listener), wake_(wake) {}

  void run() {
    std::vector<pollfd> fds;
    while (true) {
      fds.clear();
      fds.push_back({wake_, POLLIN, 0});
      fds.push_back({listener_, POLLIN, 0});
      for (const auto& [fd, buf] : clients_)
        fds.push_back({fd, POLLIN, 0});
      const int rc = ::poll(fds.data(), fds.size(), -1);
      if (rc < 0) {
        if (errno == EINTR) continue;
        ASYNCTP_LOG_ERROR("store server: poll failed: {}", std::strerror(errno));
        return;
      }
      if (fds[0].revents != 0) return;  // shutdown
      if (fds[1].revents & POLLIN) accept_client();
      for (size_t i = 2; i < fds.size(); ++i) {
        // A client dropped earlier in this round (a failed reply to a waiter) is gone.
        if (fds[i].revents != 0 && clients_.count(fds[i].fd) != 0) read_client(fds[i].fd);
      }
    }
  }

  ~ServerLoop() {
    for (auto& [fd, buf] : clients_)
      ::close(fd);
  }

 private:
  void accept_client() {
    const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    clients_[fd] = std::string();
  }

  void drop_client(int fd) {
    ::close(fd);
    clients_.erase(fd);
    std::erase_if(waiters_, [fd](const Waiter& w) { return w.fd == fd; });
  }

  void read_client(int fd) {
    char chunk[65536];
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) {
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
      drop_client(fd);
      return;
    }
    clients_[fd].append(chunk, static_cast<size_t>(n));
    // handle() may drop clients (this one too, when a reply to it fails): look the buffer up
    // afresh for every frame instead of holding a reference across it.
    while (true) {
      auto it = clients_.find(fd);
      if (it == clients_.end()) return;
      std::string& buf = it->second;
      if (buf.size() < 4) return;
      uint32_t len = 0;
      std::memcpy(&len, buf.data(), 4);
      if (len > kMaxFrame) {
        drop_client(fd);
        return;
      }
      if (buf.size() < 4 + static_cast<size_t>(len)) return;
      uint8_t command = 0;
      std::vector<std::string> fields;
      const bool ok = decode_payload(std::string_view(buf).substr(4, len), &command, &fields);
      buf.erase(0, 4 + static_cast<size_t>(len));
      if (!ok || !handle(fd, command, std::move(fields))) {
        if (clients_.count(fd) != 0) drop_client(fd);
        return;
      }
    }
  }

  bool reply(int fd, uint8_t status, const std::vector<std::string>& fields) {
    const std::string frame = encode_frame(status, fields);
    const char* p = frame.data();
    size_t left = frame.size();
    while (left > 0) {
      const ssize_t n = ::send(fd, p, left, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      p += n;
      left -= static_cast<size_t>(n);
    }
    return true;
  }

  bool all_present(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return data_.count(k) > 0; });
  }

  bool answer_waiter(const Waiter& w) {
    if (w.command == kGet) return reply(w.fd, kOk, {data_.at(w.keys[0])});
    return reply(w.fd, kOk, {});
  }

  void wake_waiters() {
    std::vector<Waiter> ready;
    std::erase_if(waiters_, [&](const Waiter& w) {
      if (!all_present(w.keys)) return false;
      ready.push_back(w);
      return true;
    });
    for (const auto& w : ready) {
      if (clients_.count(w.fd) != 0 && !answer_waiter(w)) drop_client(w.fd);
    }
  }

  // Returns false when the client sent something malformed (it is then dropped).
  bool handle(int fd, uint8_t command, std::vector<std::string> fields) {
    switch (command) {
      case kSet: {
        if (fields.size() != 2) return false;
        data_[fields[0]] = std::move(fields[1]);
        if (!reply(fd, kOk, {})) return false;
        wake_waiters();
        return true;
      }
      case kGet:
      case kWait: {
        if (fields.empty() || (command == kGet && fields.size() != 1)) return false;
        Waiter w{fd, command, std::move(fields)};
        if (all_present(w.keys)) return answer_waiter(w);
        waiters_.push_back(std::move(w));
        return true;
      }
      case kAdd: {
        if (fields.size() != 2) return false;
        int64_t value = 0;
        if (auto it = data_.find(fields[0]); it != data_.end()) {
          value = std::strtoll(it->second.c_str(), nullptr, 10);
        }
        value += std::strtoll(fields[1].c_str(), nullptr, 10);
        data_[fields[0]] = std::to_string(value);
        if (!reply(fd, kOk, {std::to_string(value)})) return false;
        wake_waiters();
        return true;
      }
      case kCheck:
        return reply(fd, kOk, {all_present(fields) ? "1" : "0"});
      case kErase:
        if (fields.size() != 1) return false;
        data_.erase(fields[0]);
        return reply(fd, kOk, {});
      default:
        reply(fd, kFailed, {fmt::format("unknown store command {}", command)});
        return false;
    }
  }

  int listener_;
  int wake_;
  std::unordered_map<int, std::string> clients_;
  std::unordered_map<std::string, std::string> data_;
  std::vector<Waiter> waiters_;
};

}  // namespace

StoreServer::StoreServer(net::Fd listener) : listener_(std::move(listener)) {
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

StoreServer::StoreServer(const std::string& host, int port)
    : StoreServer([&] {
        int bound = 0;
        return net::tcp_listen(host, port, &bound);
      }()) {}

StoreServer::~StoreServer() {
  const char byte = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_write_.get(), &byte, 1);
  if (thread_.joinable()) thread_.join();
}

void StoreServer::serve() {
  try {
    ServerLoop loop(listener_.get(), wake_read_.get());
    loop.run();
  } catch (const std::exception& e) {
    ASYNCTP_LOG_ERROR("store server stopped: {}", e.what());
  }
}

TcpStore::TcpStore(std::string host, int port, Millis timeout, int rank)
    : host_(std::move(host)),
      port_(port),
      timeout_(timeout),
      rank_(rank),
      fd_(std::make_unique<net::Fd>()) {}

TcpStore::~TcpStore() = default;

std::vector<std::string> TcpStore::request(uint8_t command, const std::vector<std::string>& fields,
                                           Millis timeout, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Deadline deadline(timeout);
  const std::string who = fmt::format("rank {}: store {}", rank_, what);
  if (!fd_->valid()) *fd_ = net::tcp_connect(host_, port_, deadline, who);
  try {
    const std::string frame = encode_frame(command, fields);
    net::send_all(fd_->get(), frame.data(), frame.size());
    uint32_t len = 0;
    bool ok = net::recv_all(fd_->get(), &len, 4, deadline);
    std::string payload;
    if (ok) {
      ASYNCTP_CHECK(len <= kMaxFrame, "{}: reply of {} bytes is too large", who, len);
      payload.resize(len);
      ok = net::recv_all(fd_->get(), payload.data(), len, deadline);
    }
    if (!ok) {
      // The server may still answer later; drop the connection so that a late reply can never
      // be mistaken for the answer to the next request.
      fd_->reset();
      ASYNCTP_TIMEOUT("{} timed out after {} (store at {}:{})", who, deadline.describe(), host_,
                      port_);
    }
    uint8_t status = 0;
    std::vector<std::string> reply;
    ASYNCTP_CHECK(decode_payload(payload, &status, &reply), "{}: malformed reply", who);
    ASYNCTP_CHECK(status == kOk, "{} failed: {}", who, reply.empty() ? "" : reply[0]);
    return reply;
  } catch (const TimeoutError&) {
    throw;
  } catch (const Error& e) {
    fd_->reset();
    throw Error(fmt::format("{} failed: {}", who, e.what()));
  }
}

void TcpStore::set(const std::string& key, const std::string& value) {
  request(kSet, {key, value}, timeout_, fmt::format("set('{}')", key));
}

std::string TcpStore::get(const std::string& key, Millis timeout) {
  auto reply = request(kGet, {key}, timeout, fmt::format("get('{}')", key));
  ASYNCTP_CHECK(reply.size() == 1, "store get('{}'): malformed reply", key);
  return std::move(reply[0]);
}

void TcpStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  ASYNCTP_CHECK(!keys.empty(), "store wait() needs at least one key");
  request(kWait, keys, timeout,
          fmt::format("wait('{}'{})", keys[0],
                      keys.size() > 1 ? fmt::format(" and {} more", keys.size() - 1) : ""));
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  auto reply = request(kAdd, {key, std::to_string(delta)}, timeout_, fmt::format("add('{}')", key));
  ASYNCTP_CHECK(reply.size() == 1, "store add('{}'): malformed reply", key);
  return std::strtoll(reply[0].c_str(), nullptr, 10);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  auto reply = request(kCheck, keys, timeout_, "check");
  return reply.size() == 1 && reply[0] == "1";
}

void TcpStore::erase(const std::string& key) {
  request(kErase, {key}, timeout_, fmt::format("erase('{}')", key));
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
