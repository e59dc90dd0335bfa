// The store's wire protocol, and its server side without sockets (StoreEngine: bytes in, bytes
// out, per connection), which the socket loop in store.cpp drives and the fuzz target
// (tests/fuzz/store_protocol.cpp) feeds directly.
//
// Frames, both directions: [u32 payload length][u8 code][u32 count]{[u32 length][bytes]}...
// (little-endian, as the ranks of one job share one architecture).
//
// Handshake (challenge-response; the secret never crosses the wire):
//   server -> client  kHello  {kGreeting, server nonce (16 bytes)}          on accept
//   client -> server  kAuth   {client nonce (16 bytes), client_proof(...)}  32-byte HMAC
//   server -> client  kOk     {server_proof(...)}    or kFailed {why}, then the server closes
// Each side proves it knows the job's secret, so a rank of another job is refused by this
// store, and a rank of this job refuses a store of another job (two jobs on one port never
// merge). Until a connection has authenticated, the only frame it may send is kAuth, of at most
// kMaxHandshakeFrameBytes.
//
// Limits (what the job stores: ids, sizes, host names, and on the CPU backend the tensors the
// store communicator moves, far below kMaxValueBytes): a frame over kMaxFrameBytes is refused
// from its length prefix, before any of it is buffered; a key over kMaxKeyBytes, more than
// kMaxFields fields, or more than kMaxWaitersPerConnection blocked requests close the
// connection. Replies queue in a per-connection output buffer: while one holds more than
// kOutputSoftCapBytes the engine reads no more requests from that connection, and a connection
// whose buffer passes kOutputHardCapBytes (only possible through many blocked gets of large
// values woken at once) is closed, so that a client that never reads cannot grow the server.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/hmac.h"

namespace asynctp::store_protocol {

enum Command : uint8_t {
  kSet = 1,
  kGet = 2,
  kWait = 3,
  kAdd = 4,
  kCheck = 5,
  kErase = 6,
  kAuth = 7
};
enum Status : uint8_t { kOk = 0, kFailed = 1, kHello = 2 };

inline constexpr std::string_view kGreeting = "asynctp-store/1";
inline constexpr size_t kNonceBytes = 16;
inline constexpr size_t kMaxValueBytes = size_t{128} << 20;
inline constexpr size_t kMaxKeyBytes = size_t{64} << 10;
inline constexpr size_t kMaxFields = 65536;
// A set of the largest key and value, with room for the headers.
inline constexpr uint32_t kMaxFrameBytes = kMaxValueBytes + kMaxKeyBytes + 64;
inline constexpr uint32_t kMaxHandshakeFrameBytes = 256;
inline constexpr size_t kMaxWaitersPerConnection = 64;
inline constexpr size_t kOutputSoftCapBytes = size_t{4} << 20;
inline constexpr size_t kOutputHardCapBytes = kMaxFrameBytes + kOutputSoftCapBytes;

// [u32 payload length][payload = [u8 code][u32 count]{[u32 length][bytes]}].
std::string encode_frame(uint8_t code, const std::vector<std::string>& fields);
// Splits a payload; false when it is malformed (truncated, trailing bytes, or more than
// kMaxFields fields).
bool decode_payload(std::string_view payload, uint8_t* code, std::vector<std::string>* fields);

// HMAC-SHA256 over the role and both nonces: the client's and the server's proofs differ, so
// neither can be replayed as the other.
Digest client_proof(std::string_view secret, std::string_view server_nonce,
                    std::string_view client_nonce);
Digest server_proof(std::string_view secret, std::string_view server_nonce,
                    std::string_view client_nonce);

// A decimal int64 exactly ("-12", never "+1", " 1", "1x", "" or out of range).
std::optional<int64_t> parse_int64(std::string_view text);
// `bytes` for an error message: printable ASCII as is, other bytes as \xNN, at most
// `max_shown` bytes shown.
std::string printable(std::string_view bytes, size_t max_shown = 64);

class StoreEngine {
 public:
  // `secret`: the job's secret (at least 16 bytes). `make_nonce`: kNonceBytes fresh random
  // bytes per connection (random_bytes; the fuzz target passes a fixed one).
  StoreEngine(std::string secret, std::function<std::string()> make_nonce);

  // A new connection `id` (not open already); queues its kHello.
  void open(int id);
  // Bytes that arrived on `id`: buffers them and handles every complete frame it may.
  void receive(int id, std::string_view bytes);
  // Handles the frames buffered on `id` while its output is below the soft cap (call again once
  // output was sent).
  void process(int id);
  // The bytes waiting to be sent to `id`, and how many of them were sent.
  std::string_view pending(int id) const;
  void consumed(int id, size_t n);
  // Whether `id` may be read from (its output is below the soft cap and it is not closing).
  bool wants_input(int id) const;
  // Whether the engine is done with `id`: send what is pending (best effort), then close().
  bool closing(int id) const;
  bool authenticated(int id) const;
  void close(int id);
  size_t connections() const { return conns_.size(); }
  bool is_open(int id) const { return conns_.count(id) != 0; }

 private:
  struct Connection {
    std::string input;
    std::string output;
    size_t sent = 0;  // bytes of `output` already sent
    std::string nonce;
    bool authenticated = false;
    bool closing = false;
    size_t waiters = 0;
  };
  struct Waiter {
    int id;
    uint8_t command;  // kGet (reply with the value) or kWait
    std::vector<std::string> keys;
  };

  Connection& conn(int id);
  const Connection& conn(int id) const;
  void reply(int id, uint8_t status, const std::vector<std::string>& fields);
  // Replies kFailed {why} and marks `id` closing.
  void refuse(int id, const std::string& why);
  void handle(int id, uint8_t command, std::vector<std::string> fields);
  void authenticate(int id, const std::vector<std::string>& fields);
  void add(int id, const std::vector<std::string>& fields);
  bool all_present(const std::vector<std::string>& keys) const;
  void answer(const Waiter& w);
  void wake_waiters();

  std::string secret_;
  std::function<std::string()> make_nonce_;
  std::unordered_map<int, Connection> conns_;
  std::unordered_map<std::string, std::string> data_;
  std::vector<Waiter> waiters_;
};

}  // namespace asynctp::store_protocol
