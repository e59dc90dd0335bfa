// The store's server side without sockets (StoreEngine): the handshake, frames refused from
// their length alone, requests held back while a client does not read, the caps on blocked
// requests and buffered output, strict integers and printable keys.
#include "runtime/store_protocol.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace asynctp::store_protocol {
namespace {

using ::testing::HasSubstr;

const std::string kSecret = "0123456789abcdef0123456789abcdef";
const std::string kServerNonce(kNonceBytes, 's');
const std::string kClientNonce(kNonceBytes, 'c');

std::string u32_bytes(uint32_t v) {
  return std::string(reinterpret_cast<const char*>(&v), 4);
}

// The frames in `bytes`, decoded.
std::vector<std::pair<uint8_t, std::vector<std::string>>> frames_in(std::string_view bytes) {
  std::vector<std::pair<uint8_t, std::vector<std::string>>> out;
  while (bytes.size() >= 4) {
    uint32_t len = 0;
    std::memcpy(&len, bytes.data(), 4);
    EXPECT_LE(size_t{4} + len, bytes.size());
    uint8_t code = 0;
    std::vector<std::string> fields;
    EXPECT_TRUE(decode_payload(bytes.substr(4, len), &code, &fields));
    out.emplace_back(code, std::move(fields));
    bytes.remove_prefix(size_t{4} + len);
  }
  EXPECT_TRUE(bytes.empty());
  return out;
}

class Engine : public ::testing::Test {
 protected:
  Engine() : engine_(kSecret, [] { return kServerNonce; }) {}

  // Opens connection `id` and authenticates it; its output is then empty.
  void open_trusted(int id) {
    engine_.open(id);
    engine_.consumed(id, engine_.pending(id).size());
    const Digest proof = client_proof(kSecret, kServerNonce, kClientNonce);
    engine_.receive(id, encode_frame(kAuth, {kClientNonce, std::string(as_bytes(proof))}));
    ASSERT_TRUE(engine_.authenticated(id));
    engine_.consumed(id, engine_.pending(id).size());
  }
  // Takes what is pending for `id`.
  std::string take(int id) {
    std::string out(engine_.pending(id));
    engine_.consumed(id, out.size());
    return out;
  }

  StoreEngine engine_;
};

TEST_F(Engine, GreetsThenAuthenticatesBothWays) {
  engine_.open(1);
  const auto hello = frames_in(take(1));
  ASSERT_EQ(hello.size(), 1u);
  EXPECT_EQ(hello[0].first, kHello);
  EXPECT_EQ(hello[0].second, (std::vector<std::string>{std::string(kGreeting), kServerNonce}));
  const Digest proof = client_proof(kSecret, kServerNonce, kClientNonce);
  engine_.receive(1, encode_frame(kAuth, {kClientNonce, std::string(as_bytes(proof))}));
  const auto answer = frames_in(take(1));
  ASSERT_EQ(answer.size(), 1u);
  EXPECT_EQ(answer[0].first, kOk);
  EXPECT_EQ(answer[0].second, (std::vector<std::string>{std::string(
                                  as_bytes(server_proof(kSecret, kServerNonce, kClientNonce)))}));
  EXPECT_TRUE(engine_.authenticated(1));
  // The two proofs differ: the server's cannot be replayed as a client's.
  EXPECT_NE(as_bytes(proof), as_bytes(server_proof(kSecret, kServerNonce, kClientNonce)));
}

TEST_F(Engine, AFrameOverTheLimitIsRefusedFromItsLengthAlone) {
  engine_.open(1);
  take(1);
  engine_.receive(1, u32_bytes(1u << 30));  // 1 GiB announced, nothing of it sent
  EXPECT_TRUE(engine_.closing(1));
  const auto refusal = frames_in(take(1));
  ASSERT_EQ(refusal.size(), 1u);
  EXPECT_EQ(refusal[0].first, kFailed);
  EXPECT_THAT(refusal[0].second[0], HasSubstr("over the limit of 256 bytes"));
  engine_.receive(1, std::string(1 << 20, 'x'));  // ignored once closing: nothing is kept
  EXPECT_TRUE(engine_.pending(1).empty());

  open_trusted(2);
  engine_.receive(2, u32_bytes(kMaxFrameBytes + 1));
  EXPECT_TRUE(engine_.closing(2));
}

TEST_F(Engine, RequestsWaitWhileTheClientDoesNotRead) {
  open_trusted(1);
  engine_.receive(1, encode_frame(kSet, {"big", std::string(3 << 20, 'b')}));
  take(1);
  std::string gets;
  for (int i = 0; i < 10; ++i)
    gets += encode_frame(kGet, {"big"});
  engine_.receive(1, gets);
  // Two replies (6 MiB) pass the 4 MiB soft cap: the other eight gets stay unread.
  EXPECT_EQ(frames_in(engine_.pending(1)).size(), 2u);
  EXPECT_FALSE(engine_.wants_input(1));
  size_t replies = 0;
  while (!engine_.pending(1).empty()) {
    replies += frames_in(take(1)).size();
    engine_.process(1);
  }
  EXPECT_EQ(replies, 10u);
  EXPECT_TRUE(engine_.wants_input(1));
}

TEST_F(Engine, BlockedRequestsAndBufferedOutputAreCapped) {
  open_trusted(1);
  std::string gets;
  for (size_t i = 0; i < kMaxWaitersPerConnection; ++i)
    gets += encode_frame(kGet, {"later"});
  engine_.receive(1, gets);
  EXPECT_FALSE(engine_.closing(1));
  engine_.receive(1, encode_frame(kWait, {"later"}));
  EXPECT_TRUE(engine_.closing(1));

  // Many blocked gets of one large value, woken at once for a client that does not read: the
  // output would pass the hard cap, so the connection closes instead.
  open_trusted(2);
  open_trusted(3);
  gets.clear();
  for (int i = 0; i < 40; ++i)
    gets += encode_frame(kGet, {"large"});
  engine_.receive(2, gets);
  engine_.receive(3, encode_frame(kSet, {"large", std::string(8 << 20, 'l')}));
  EXPECT_TRUE(engine_.closing(2));
  EXPECT_LE(engine_.pending(2).size(), kOutputHardCapBytes);
  EXPECT_FALSE(engine_.closing(3));
}

TEST_F(Engine, ClosingAConnectionForgetsItsWaiters) {
  open_trusted(1);
  open_trusted(2);
  engine_.receive(1, encode_frame(kGet, {"k"}));
  engine_.close(1);
  EXPECT_FALSE(engine_.is_open(1));
  engine_.receive(2, encode_frame(kSet, {"k", "v"}));
  EXPECT_EQ(frames_in(take(2)).size(), 1u);
  EXPECT_EQ(engine_.connections(), 1u);
}

TEST(StoreProtocol, StrictIntegers) {
  EXPECT_EQ(parse_int64("0"), 0);
  EXPECT_EQ(parse_int64("-12"), -12);
  EXPECT_EQ(parse_int64("9223372036854775807"), INT64_MAX);
  EXPECT_EQ(parse_int64("-9223372036854775808"), INT64_MIN);
  for (const char* bad : {"", "+1", " 1", "1 ", "1x", "0x10", "9223372036854775808", "-", "1e3"})
    EXPECT_FALSE(parse_int64(bad).has_value()) << "'" << bad << "'";
}

TEST(StoreProtocol, PrintableKeys) {
  EXPECT_EQ(printable("asynctp/host/1"), "asynctp/host/1");
  EXPECT_EQ(printable(std::string("a\0'\\\xff", 5)), "a\\x00'\\\\xff");
  EXPECT_EQ(printable(std::string(70, 'k')), std::string(64, 'k') + "... (70 bytes)");
  EXPECT_EQ(printable(std::string(70, 'k'), 100), std::string(70, 'k'));
}

TEST(StoreProtocol, DecodeRefusesCountsThePayloadCannotHold) {
  uint8_t code = 0;
  std::vector<std::string> fields;
  // 2^31 fields announced in 5 bytes: refused before anything is reserved for them.
  std::string huge(1, kCheck);
  huge += u32_bytes(1u << 31);
  EXPECT_FALSE(decode_payload(huge, &code, &fields));
  std::string many(1, kCheck);
  many += u32_bytes(kMaxFields + 1);
  for (size_t i = 0; i <= kMaxFields; ++i)
    many += u32_bytes(0);
  EXPECT_FALSE(decode_payload(many, &code, &fields));
}

}  // namespace
}  // namespace asynctp::store_protocol
