// libFuzzer target for the store's protocol: the input is what clients send to the server, fed
// to StoreEngine (runtime/store_protocol.h), the server's whole frame parser and request handler
// without its sockets. Any exception, crash, sanitizer report or broken invariant is a finding.
//
// Input layout (tests/fuzz/make_store_protocol_corpus.py writes the seed corpus in it):
//   [u8 flags]   bit 0: the three connections authenticate with the right secret first, so
//                that the requests after the handshake are reached
//   then chunks  [u8 selector][u8 length][length bytes] (the last may be short):
//                connection = selector % 3; bit 6: the client hangs up (and a new one takes
//                its place) instead of sending; bit 7: the client reads what is pending first.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/store_protocol.h"

namespace {

namespace sp = asynctp::store_protocol;

constexpr int kConnections = 3;
const std::string kSecret = "0123456789abcdef0123456789abcdef";
const std::string kServerNonce(sp::kNonceBytes, 'n');
const std::string kClientNonce(sp::kNonceBytes, 'c');

void check(bool invariant) {
  if (!invariant) __builtin_trap();
}

// The client reads everything pending; the engine may then handle requests it held back.
void drain(sp::StoreEngine& engine, int id) {
  for (int round = 0; round < 64 && !engine.pending(id).empty(); ++round) {
    engine.consumed(id, engine.pending(id).size());
    if (engine.wants_input(id)) engine.process(id);
  }
}

void reopen(sp::StoreEngine& engine, int id) {
  engine.close(id);
  check(!engine.is_open(id));
  engine.open(id);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  sp::StoreEngine engine(kSecret, [] { return kServerNonce; });
  for (int id = 0; id < kConnections; ++id)
    engine.open(id);
  if (data[0] & 1) {
    const asynctp::Digest proof = sp::client_proof(kSecret, kServerNonce, kClientNonce);
    const std::string auth =
        sp::encode_frame(sp::kAuth, {kClientNonce, std::string(asynctp::as_bytes(proof))});
    for (int id = 0; id < kConnections; ++id) {
      drain(engine, id);
      engine.receive(id, auth);
      check(engine.authenticated(id));
      drain(engine, id);
    }
  }
  size_t at = 1;
  while (at < size) {
    const uint8_t selector = data[at++];
    const size_t len = at < size ? data[at++] : 0;
    const std::string_view chunk(reinterpret_cast<const char*>(data) + at,
                                 std::min(len, size - at));
    at += chunk.size();
    const int id = selector % kConnections;
    if (selector & 0x80) drain(engine, id);
    if (selector & 0x40) {
      reopen(engine, id);
      continue;
    }
    engine.receive(id, chunk);
    // The output a client has not read stays bounded whatever it sends.
    check(engine.pending(id).size() <= sp::kOutputHardCapBytes + sp::kMaxFrameBytes);
    if (engine.closing(id)) reopen(engine, id);
  }
  check(engine.connections() == kConnections);
  return 0;
}
