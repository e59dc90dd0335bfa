#include "runtime/store_protocol.h"

#include <algorithm>
#include <charconv>
#include <cstring>

#include "core/error.h"

namespace asynctp::store_protocol {

namespace {

void put_u32(std::string* out, uint32_t v) {
  out->append(reinterpret_cast<const char*>(&v), 4);
}

}  // namespace

std::string encode_frame(uint8_t code, const std::vector<std::string>& fields) {
  size_t size = 1 + 4;
  for (const auto& f : fields)
    size += 4 + f.size();
  ASYNCTP_CHECK(size <= kMaxFrameBytes && fields.size() <= kMaxFields,
                "store frame of {} bytes and {} fields is over the limit of {} bytes and {} "
                "fields",
                size, fields.size(), kMaxFrameBytes, kMaxFields);
  std::string frame;
  frame.reserve(4 + size);
  put_u32(&frame, static_cast<uint32_t>(size));
  frame.push_back(static_cast<char>(code));
  put_u32(&frame, static_cast<uint32_t>(fields.size()));
  for (const auto& f : fields) {
    put_u32(&frame, static_cast<uint32_t>(f.size()));
    frame += f;
  }
  return frame;
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
  // Every field takes at least its 4-byte length: a count the payload cannot hold is refused
  // before anything is allocated for it.
  if (!read_u32(&count) || count > kMaxFields || count > payload.size() / 4) return false;
  fields->clear();
  fields->reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t len = 0;
    if (!read_u32(&len) || len > payload.size()) return false;
    fields->emplace_back(payload.substr(0, len));
    payload.remove_prefix(len);
  }
  return payload.empty();
}

Digest client_proof(std::string_view secret, std::string_view server_nonce,
                    std::string_view client_nonce) {
  return hmac_sha256(secret, fmt::format("asynctp-store client|{}|{}", server_nonce, client_nonce));
}

Digest server_proof(std::string_view secret, std::string_view server_nonce,
                    std::string_view client_nonce) {
  return hmac_sha256(secret, fmt::format("asynctp-store server|{}|{}", server_nonce, client_nonce));
}

std::optional<int64_t> parse_int64(std::string_view text) {
  if (text.empty() || text.front() == '+') return std::nullopt;
  int64_t value = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return value;
}

std::string printable(std::string_view bytes, size_t max_shown) {
  std::string out;
  for (const char c : bytes.substr(0, max_shown)) {
    const auto b = static_cast<unsigned char>(c);
    if (b >= 0x20 && b < 0x7f) {
      out.push_back(c);
    } else {
      out += fmt::format("\\x{:02x}", b);
    }
  }
  if (bytes.size() > max_shown) out += fmt::format("... ({} bytes)", bytes.size());
  return out;
}

// ---- StoreEngine ----

StoreEngine::StoreEngine(std::string secret, std::function<std::string()> make_nonce)
    : secret_(std::move(secret)), make_nonce_(std::move(make_nonce)) {
  ASYNCTP_CHECK(secret_.size() >= 16, "the store's secret is {} bytes; at least 16 expected",
                secret_.size());
  ASYNCTP_CHECK(static_cast<bool>(make_nonce_), "the store needs a source of nonces");
}

StoreEngine::Connection& StoreEngine::conn(int id) {
  auto it = conns_.find(id);
  ASYNCTP_CHECK(it != conns_.end(), "store connection {} is not open", id);
  return it->second;
}

const StoreEngine::Connection& StoreEngine::conn(int id) const {
  auto it = conns_.find(id);
  ASYNCTP_CHECK(it != conns_.end(), "store connection {} is not open", id);
  return it->second;
}

void StoreEngine::open(int id) {
  ASYNCTP_CHECK(conns_.count(id) == 0, "store connection {} is open already", id);
  Connection& c = conns_[id];
  c.nonce = make_nonce_();
  ASYNCTP_CHECK(c.nonce.size() == kNonceBytes, "a store nonce is {} bytes; {} expected",
                c.nonce.size(), kNonceBytes);
  reply(id, kHello, {std::string(kGreeting), c.nonce});
}

void StoreEngine::receive(int id, std::string_view bytes) {
  Connection& c = conn(id);
  if (c.closing) return;
  c.input.append(bytes);
  process(id);
}

void StoreEngine::process(int id) {
  while (true) {
    // handle() may close other connections' waiters but never erases a connection: `c` stays
    // valid, yet look it up per frame in case a future handler does.
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    Connection& c = it->second;
    if (c.closing || c.output.size() - c.sent > kOutputSoftCapBytes || c.input.size() < 4) return;
    uint32_t len = 0;
    std::memcpy(&len, c.input.data(), 4);
    const uint32_t limit = c.authenticated ? kMaxFrameBytes : kMaxHandshakeFrameBytes;
    if (len > limit) {
      c.input.clear();
      refuse(id, fmt::format("a frame of {} bytes is over the limit of {} bytes{}", len, limit,
                             c.authenticated ? "" : " before authentication"));
      return;
    }
    if (c.input.size() - 4 < len) return;
    uint8_t command = 0;
    std::vector<std::string> fields;
    const bool ok = decode_payload(std::string_view(c.input).substr(4, len), &command, &fields);
    c.input.erase(0, size_t{4} + len);
    if (!ok) {
      c.input.clear();
      refuse(id, fmt::format("malformed frame of {} bytes", len));
      return;
    }
    handle(id, command, std::move(fields));
  }
}

std::string_view StoreEngine::pending(int id) const {
  const Connection& c = conn(id);
  return std::string_view(c.output).substr(c.sent);
}

void StoreEngine::consumed(int id, size_t n) {
  Connection& c = conn(id);
  ASYNCTP_CHECK(n <= c.output.size() - c.sent,
                "store connection {}: {} bytes consumed of the {} pending", id, n,
                c.output.size() - c.sent);
  c.sent += n;
  if (c.sent == c.output.size()) {
    c.output.clear();
    c.sent = 0;
  } else if (c.sent > (size_t{1} << 20) && c.sent > c.output.size() / 2) {
    c.output.erase(0, c.sent);  // amortised: at most half the buffer moves
    c.sent = 0;
  }
}

bool StoreEngine::wants_input(int id) const {
  const Connection& c = conn(id);
  return !c.closing && c.output.size() - c.sent <= kOutputSoftCapBytes;
}

bool StoreEngine::closing(int id) const {
  return conn(id).closing;
}

bool StoreEngine::authenticated(int id) const {
  return conn(id).authenticated;
}

void StoreEngine::close(int id) {
  if (conns_.erase(id) == 0) return;
  std::erase_if(waiters_, [id](const Waiter& w) { return w.id == id; });
}

void StoreEngine::reply(int id, uint8_t status, const std::vector<std::string>& fields) {
  Connection& c = conn(id);
  if (c.closing) return;
  c.output += encode_frame(status, fields);
  if (c.output.size() - c.sent > kOutputHardCapBytes) {
    // Only blocked gets of large values, woken together for a client that does not read, get
    // here: drop it rather than grow.
    c.closing = true;
    c.output.clear();
    c.sent = 0;
  }
}

void StoreEngine::refuse(int id, const std::string& why) {
  reply(id, kFailed, {why});
  conn(id).closing = true;
}

void StoreEngine::authenticate(int id, const std::vector<std::string>& fields) {
  Connection& c = conn(id);
  if (fields.size() != 2 || fields[0].size() != kNonceBytes || fields[1].size() != 32) {
    refuse(id, "malformed authentication");
    return;
  }
  const Digest expected = client_proof(secret_, c.nonce, fields[0]);
  if (!constant_time_equal(as_bytes(expected), fields[1])) {
    refuse(id, "wrong secret: this store belongs to another job");
    return;
  }
  c.authenticated = true;
  reply(id, kOk, {std::string(as_bytes(server_proof(secret_, c.nonce, fields[0])))});
}

void StoreEngine::add(int id, const std::vector<std::string>& fields) {
  const std::string& key = fields[0];
  const auto delta = parse_int64(fields[1]);
  if (!delta) {
    reply(id, kFailed,
          {fmt::format("add('{}'): the delta '{}' is not a 64-bit integer", printable(key),
                       printable(fields[1]))});
    return;
  }
  int64_t value = 0;
  if (auto it = data_.find(key); it != data_.end()) {
    const auto stored = parse_int64(it->second);
    if (!stored) {
      reply(id, kFailed,
            {fmt::format("add('{}'): the stored value '{}' is not a 64-bit integer", printable(key),
                         printable(it->second))});
      return;
    }
    value = *stored;
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(value, *delta, &sum)) {
    reply(id, kFailed,
          {fmt::format("add('{}'): {} + {} overflows a 64-bit integer", printable(key), value,
                       *delta)});
    return;
  }
  data_[key] = std::to_string(sum);
  reply(id, kOk, {std::to_string(sum)});
  wake_waiters();
}

void StoreEngine::handle(int id, uint8_t command, std::vector<std::string> fields) {
  Connection& c = conn(id);
  if (!c.authenticated) {
    if (command == kAuth) {
      authenticate(id, fields);
    } else {
      refuse(id, fmt::format("command {} before authentication", command));
    }
    return;
  }
  // Every field but a set's value is a key (or an add's delta, far shorter).
  for (size_t i = 0; i < fields.size(); ++i) {
    if (fields[i].size() > kMaxKeyBytes && !(command == kSet && i == 1)) {
      refuse(id, fmt::format("field {} of {} bytes is over the limit of {} bytes for a key", i,
                             fields[i].size(), kMaxKeyBytes));
      return;
    }
  }
  switch (command) {
    case kSet:
    case kAdd:
      if (fields.size() != 2) {
        refuse(id, fmt::format("{} takes 2 fields, got {}", command == kSet ? "set" : "add",
                               fields.size()));
        return;
      }
      if (command == kAdd) {
        add(id, fields);
        return;
      }
      if (fields[1].size() > kMaxValueBytes) {
        refuse(id, fmt::format("set('{}'): a value of {} bytes is over the limit of {} bytes",
                               printable(fields[0]), fields[1].size(), kMaxValueBytes));
        return;
      }
      data_[std::move(fields[0])] = std::move(fields[1]);
      reply(id, kOk, {});
      wake_waiters();
      return;
    case kGet:
    case kWait: {
      if (fields.empty() || (command == kGet && fields.size() != 1)) {
        refuse(id, fmt::format("{} with {} keys", command == kGet ? "get" : "wait", fields.size()));
        return;
      }
      Waiter w{id, command, std::move(fields)};
      if (all_present(w.keys)) {
        answer(w);
        return;
      }
      if (c.waiters >= kMaxWaitersPerConnection) {
        refuse(id,
               fmt::format("over {} blocked requests on one connection", kMaxWaitersPerConnection));
        return;
      }
      ++c.waiters;
      waiters_.push_back(std::move(w));
      return;
    }
    case kCheck:
      reply(id, kOk, {all_present(fields) ? "1" : "0"});
      return;
    case kErase:
      if (fields.size() != 1) {
        refuse(id, fmt::format("erase takes 1 field, got {}", fields.size()));
        return;
      }
      data_.erase(fields[0]);
      reply(id, kOk, {});
      return;
    default:
      refuse(id, fmt::format("unknown store command {}", command));
      return;
  }
}

bool StoreEngine::all_present(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return data_.count(k) > 0; });
}

void StoreEngine::answer(const Waiter& w) {
  if (w.command == kGet) {
    reply(w.id, kOk, {data_.at(w.keys[0])});
  } else {
    reply(w.id, kOk, {});
  }
}

void StoreEngine::wake_waiters() {
  std::vector<Waiter> ready;
  std::erase_if(waiters_, [&](Waiter& w) {
    if (!all_present(w.keys)) return false;
    ready.push_back(std::move(w));
    return true;
  });
  for (const auto& w : ready) {
    auto it = conns_.find(w.id);
    if (it == conns_.end()) continue;
    --it->second.waiters;
    answer(w);
  }
}

}  // namespace asynctp::store_protocol
