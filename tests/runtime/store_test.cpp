// The TCP store: every call across real processes (the harness serves the store in the test
// process and forks one process per rank), blocking gets, timeouts that name the rank and key,
// clients that start before the server, large values, many concurrent clients, a server that
// survives malformed frames; and a store only its own job can use: clients without the secret,
// servers without it, bad values, overflowing counters, slow readers, oversize frames, too many
// connections, the bound address and a taken port.
#include "runtime/store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/socket.h"
#include "runtime/store_protocol.h"
#include "support/multiprocess.h"

namespace asynctp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr Millis kStoreTimeout{10'000};

// The secret of the in-process servers below.
const std::string kSecret = "0123456789abcdef0123456789abcdef";

TcpStore connect(const RendezvousInfo& info, Millis timeout = kStoreTimeout) {
  return TcpStore(info.master_addr, info.master_port, timeout, info.rank, info.store_secret);
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(StoreAcrossRanks, SetThenGetEveryRanksValue) {
  constexpr int kRanks = 4;
  auto statuses = testing::run_processes(kRanks, [](const RendezvousInfo& info) {
    TcpStore store = connect(info);
    store.set(fmt::format("value/{}", info.rank), fmt::format("from rank {}", info.rank));
    for (int r = 0; r < kRanks; ++r) {
      // get() waits for ranks that have not set theirs yet.
      EXPECT_EQ(store.get(fmt::format("value/{}", r)), fmt::format("from rank {}", r));
    }
    EXPECT_EQ(store.host(), "127.0.0.1");
    EXPECT_EQ(store.port(), info.master_port);
    EXPECT_EQ(store.timeout(), kStoreTimeout);
  });
  EXPECT_RANKS_OK(statuses);
}

TEST(StoreAcrossRanks, GetBlocksUntilAnotherRankSetsTheKey) {
  auto statuses = testing::run_processes(2, [](const RendezvousInfo& info) {
    TcpStore store = connect(info);
    if (info.rank == 1) {
      store.wait({"getter-ready"});
      std::this_thread::sleep_for(Millis(300));
      store.set("late", "finally");
      return;
    }
    store.set("getter-ready", "1");
    const auto start = Clock::now();
    EXPECT_EQ(store.get("late"), "finally");
    EXPECT_GE(seconds_since(start), 0.25) << "get() returned before the key was set";
  });
  EXPECT_RANKS_OK(statuses);
}

TEST(StoreAcrossRanks, OneSetWakesEveryWaiter) {
  constexpr int kRanks = 5;
  auto statuses = testing::run_processes(kRanks, [](const RendezvousInfo& info) {
    TcpStore store = connect(info);
    if (info.rank == 0) {
      std::vector<std::string> keys;
      for (int r = 1; r < kRanks; ++r)
        keys.push_back(fmt::format("waiting/{}", r));
      store.wait(keys);
      store.set("go", "now");
    } else {
      store.set(fmt::format("waiting/{}", info.rank), "");
      EXPECT_EQ(store.get("go"), "now");
      store.wait({"go"});
    }
  });
  EXPECT_RANKS_OK(statuses);
}

TEST(StoreAcrossRanks, WaitForSeveralKeysThenCheck) {
  constexpr int kRanks = 4;
  auto statuses = testing::run_processes(kRanks, [](const RendezvousInfo& info) {
    TcpStore store = connect(info);
    if (info.rank > 0) {
      std::this_thread::sleep_for(Millis(40 * info.rank));
      store.set(fmt::format("part/{}", info.rank), "x");
      return;
    }
    const std::vector<std::string> keys{"part/1", "part/2", "part/3"};
    store.wait(keys);
    EXPECT_TRUE(store.check(keys));
    EXPECT_TRUE(store.check({"part/2"}));
    EXPECT_FALSE(store.check({"part/1", "part/4"}));  // all of them, not any
    EXPECT_FALSE(store.check({"part/0"}));
    EXPECT_TRUE(store.check({}));
  });
  EXPECT_RANKS_OK(statuses);
}

TEST(StoreAcrossRanks, AddIsAtomic) {
  constexpr int kRanks = 4;
  constexpr int kAdds = 50;
  auto statuses = testing::run_processes(kRanks, [](const RendezvousInfo& info) {
    TcpStore store = connect(info);
    int64_t last = 0;
    for (int i = 0; i < kAdds; ++i) {
      const int64_t now = store.add("counter", info.rank + 1);
      EXPECT_GT(now, last) << "add() must return the running total";
      last = now;
    }
    store.set(fmt::format("added/{}", info.rank), "");
    std::vector<std::string> keys;
    for (int r = 0; r < kRanks; ++r)
      keys.push_back(fmt::format("added/{}", r));
    store.wait(keys);
    // 50 * (1 + 2 + 3 + 4): no add was lost.
    EXPECT_EQ(store.add("counter", 0), kAdds * 10);
    EXPECT_EQ(store.get("counter"), std::to_string(kAdds * 10));
  });
  EXPECT_RANKS_OK(statuses);
}

TEST(StoreAcrossRanks, EraseAndOverwrite) {
  auto statuses = testing::run_processes(2, [](const RendezvousInfo& info) {
    TcpStore store = connect(info);
    if (info.rank == 1) {
      store.set("mine", "first");
      store.set("mine", "second");  // overwrites
      store.set("doomed", "x");
      store.erase("doomed");
      store.erase("never-set");  // no error
      store.set("rank1-done", "");
      return;
    }
    store.wait({"rank1-done"});
    EXPECT_EQ(store.get("mine"), "second");
    EXPECT_FALSE(store.check({"doomed"}));
    EXPECT_THROW(store.get("doomed", Millis(100)), TimeoutError);
  });
  EXPECT_RANKS_OK(statuses);
}

TEST(StoreAcrossRanks, LargeAndBinaryValues) {
  constexpr int kRanks = 3;
  auto statuses = testing::run_processes(kRanks, [](const RendezvousInfo& info) {
    TcpStore store = connect(info);
    // 3 MiB with every byte value, NULs included, in a pattern each rank can rebuild.
    auto big = [](int seed) {
      std::string value(3 << 20, '\0');
      for (size_t i = 0; i < value.size(); ++i) {
        value[i] = static_cast<char>((i * 131 + static_cast<size_t>(seed) * 7 + (i >> 12)) & 0xFF);
      }
      return value;
    };
    store.set(fmt::format("big/{}", info.rank), big(info.rank));
    for (int r = 0; r < kRanks; ++r) {
      const std::string got = store.get(fmt::format("big/{}", r));
      ASSERT_EQ(got.size(), size_t{3} << 20);
      EXPECT_TRUE(got == big(r)) << "value of rank " << r << " came back different";
    }
    const std::string binary_key("k\0ey\n\xff", 6);
    if (info.rank == 0) store.set(binary_key, std::string("\0\0v", 3));
    EXPECT_EQ(store.get(binary_key), std::string("\0\0v", 3));
    if (info.rank == 0) store.set("", "");  // empty key and value
    EXPECT_EQ(store.get(""), "");
  });
  EXPECT_RANKS_OK(statuses);
}

// ---------------------------------------------------------------------------------------------
// Timeouts: the message names the rank, the call and the key.

TEST(StoreTimeouts, GetAndWaitTimeOutNamingRankAndKey) {
  auto statuses = testing::run_processes(3, [](const RendezvousInfo& info) {
    TcpStore store = connect(info, Millis(400));
    const std::string get_key = fmt::format("never/{}", info.rank);
    auto start = Clock::now();
    EXPECT_THAT([&] { store.get(get_key); },
                ThrowsMessage<TimeoutError>(
                    AllOf(HasSubstr(fmt::format("rank {}: store get('{}') timed out after 0.4 s",
                                                info.rank, get_key)),
                          HasSubstr(fmt::format("127.0.0.1:{}", info.master_port)))));
    EXPECT_GE(seconds_since(start), 0.35);
    EXPECT_LT(seconds_since(start), 5.0);

    start = Clock::now();
    EXPECT_THAT(
        [&] {
          store.wait({"never/a", "never/b"}, Millis(200));
        },
        ThrowsMessage<TimeoutError>(
            HasSubstr(fmt::format("rank {}: store wait('never/a' and 1 more) timed out "
                                  "after 0.2 s",
                                  info.rank))));
    EXPECT_GE(seconds_since(start), 0.15);
    EXPECT_THAT([&] { store.wait({"never/c"}); },
                ThrowsMessage<TimeoutError>(HasSubstr("store wait('never/c') timed out")));
    EXPECT_THAT([&] { store.get("never/d", Millis(100)); },
                ThrowsMessage<TimeoutError>(HasSubstr("after 0.1 s")));

    // The client stays usable: a late answer to the timed-out request must not be taken for
    // the answer to the next one.
    store.set(fmt::format("after/{}", info.rank), "ok");
    EXPECT_EQ(store.get(fmt::format("after/{}", info.rank)), "ok");
    EXPECT_EQ(store.add(fmt::format("count/{}", info.rank), 2), 2);
  });
  EXPECT_RANKS_OK(statuses);
}

TEST(StoreTimeouts, KeySetAfterAClientGaveUpDoesNotConfuseIt) {
  auto statuses = testing::run_processes(2, [](const RendezvousInfo& info) {
    TcpStore store = connect(info);
    if (info.rank == 0) {
      EXPECT_THROW(store.get("slow", Millis(100)), TimeoutError);
      store.set("gave-up", "");
      // rank 1 now sets "slow": the server must not answer the abandoned get on a new
      // connection, and the next get must see the new value.
      store.wait({"slow-set"});
      EXPECT_EQ(store.get("other"), "value");
      EXPECT_EQ(store.get("slow"), "late");
    } else {
      store.wait({"gave-up"});
      store.set("slow", "late");
      store.set("other", "value");
      store.set("slow-set", "");
    }
  });
  EXPECT_RANKS_OK(statuses);
}

TEST(StoreTimeouts, WaitNeedsAKey) {
  TcpStore store("127.0.0.1", 1, Millis(100), 0, kSecret);
  EXPECT_THAT([&] { store.wait({}); },
              ThrowsMessage<Error>(HasSubstr("store wait() needs at least one key")));
}

// ---------------------------------------------------------------------------------------------
// In-process server and clients.

TEST(StoreServing, ClientThatStartsFirstRetriesUntilTheServerIsUp) {
  const int port = net::pick_free_port();
  std::unique_ptr<StoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(Millis(300));
    server = std::make_unique<StoreServer>("127.0.0.1", port, kSecret);
  });
  TcpStore store("127.0.0.1", port, Millis(10'000), 7, kSecret);
  const auto start = Clock::now();
  store.set("early", "bird");  // connects (retrying) on first use
  EXPECT_GE(seconds_since(start), 0.2);
  EXPECT_EQ(store.get("early"), "bird");
  starter.join();
  EXPECT_EQ(server->port(), port);
}

TEST(StoreServing, ClientGivesUpAtItsDeadlineWhenThereIsNoServer) {
  const int port = net::pick_free_port();
  TcpStore store("127.0.0.1", port, Millis(300), 5, kSecret);
  const auto start = Clock::now();
  EXPECT_THAT([&] { store.get("anything"); },
              ThrowsMessage<TimeoutError>(AllOf(
                  HasSubstr("rank 5: store get('anything')"),
                  HasSubstr(fmt::format("could not connect to the store at 127.0.0.1:{} within "
                                        "0.3 s",
                                        port)))));
  EXPECT_GE(seconds_since(start), 0.25);
  EXPECT_LT(seconds_since(start), 5.0);
}

// A picked port lies below the kernel's ephemeral range (so that no bind(0) or outgoing connection
// elsewhere is handed it before the store listens on it), differs from pick to pick, and can be
// listened on.
TEST(StoreServing, PickedPortsLieBelowTheEphemeralRangeAndCanBeListenedOn) {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0;
  if (!(range >> lo)) GTEST_SKIP() << "no /proc/sys/net/ipv4/ip_local_port_range to compare with";
  if (lo < 11000) GTEST_SKIP() << "the ephemeral range starts at " << lo << ": the kernel picks";
  std::set<int> seen;
  for (int i = 0; i < 8; ++i) {
    const int port = net::pick_free_port();
    EXPECT_GE(port, 10000);
    EXPECT_LT(port, lo);
    seen.insert(port);
    StoreServer server("127.0.0.1", port, kSecret);
    EXPECT_EQ(server.port(), port);
  }
  EXPECT_GT(seen.size(), 1u) << "eight picks gave one port";
}

TEST(StoreServing, BindsAFreePortWhenAskedForPortZero) {
  StoreServer server("127.0.0.1", 0, kSecret);
  EXPECT_GT(server.port(), 0);
  TcpStore store("127.0.0.1", server.port(), Millis(5000), 0, kSecret);
  store.set("k", "v");
  EXPECT_EQ(store.get("k"), "v");
}

TEST(StoreServing, ManyConcurrentClients) {
  StoreServer server("127.0.0.1", 0, kSecret);
  constexpr int kClients = 16;
  constexpr int kAdds = 100;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      try {
        TcpStore store("127.0.0.1", server.port(), Millis(20'000), c, kSecret);
        for (int i = 0; i < kAdds; ++i) {
          store.add("shared", 1);
          store.set(fmt::format("own/{}/{}", c, i % 5), std::to_string(i));
        }
        // Each client waits for a key the next one sets: all progress together.
        store.set(fmt::format("done/{}", c), "");
        EXPECT_EQ(store.get(fmt::format("done/{}", (c + 1) % kClients)), "");
        if (store.get(fmt::format("own/{}/4", c)) != std::to_string(kAdds - 1)) ++failures;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "client " << c << ": " << e.what();
        ++failures;
      }
    });
  }
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(failures.load(), 0);
  TcpStore check("127.0.0.1", server.port(), Millis(5000), 0, kSecret);
  EXPECT_EQ(check.add("shared", 0), kClients * kAdds);
}

TEST(StoreServing, OneClientSharedByThreads) {
  // Calls through one TcpStore are serialised by its mutex; none may interleave on the socket.
  StoreServer server("127.0.0.1", 0, kSecret);
  TcpStore store("127.0.0.1", server.port(), Millis(20'000), 0, kSecret);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        const std::string key = fmt::format("t{}/{}", t, i);
        store.set(key, key);
        EXPECT_EQ(store.get(key), key);
        store.add("total", 1);
      }
    });
  }
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(store.add("total", 0), 400);
}

namespace sp = store_protocol;

// A raw connection to the server, for sending what the TcpStore client never would.
class RawClient {
 public:
  explicit RawClient(int port, const std::string& host = "127.0.0.1")
      : fd_(net::tcp_connect(host, port, Deadline(Millis(5000)), "raw")) {}

  void send_bytes(const std::string& bytes) {
    net::send_all(fd_.get(), bytes.data(), bytes.size());
  }

  // A frame: u32 payload length, then the payload.
  void send_frame(const std::string& payload) {
    const uint32_t len = static_cast<uint32_t>(payload.size());
    send_bytes(std::string(reinterpret_cast<const char*>(&len), 4) + payload);
  }

  // The payload of the next frame the server sends.
  std::string read_frame(Millis timeout = Millis(5000)) {
    const Deadline deadline(timeout);
    uint32_t len = 0;
    if (!net::recv_all(fd_.get(), &len, 4, deadline)) return "(timed out)";
    std::string out(len, '\0');
    if (!net::recv_all(fd_.get(), out.data(), len, deadline)) return "(timed out)";
    return out;
  }

  // The server's greeting: its nonce.
  std::string read_greeting() {
    const std::string hello = read_frame();
    uint8_t code = 0;
    std::vector<std::string> fields;
    EXPECT_TRUE(sp::decode_payload(hello, &code, &fields)) << sp::printable(hello);
    EXPECT_EQ(code, sp::kHello);
    if (fields.size() != 2) {
      ADD_FAILURE() << "greeting " << sp::printable(hello);
      return "";
    }
    EXPECT_EQ(fields[0], sp::kGreeting);
    EXPECT_EQ(fields[1].size(), sp::kNonceBytes);
    return fields[1];
  }

  // The client's side of the handshake, made with `secret`: the server's answer (its payload).
  std::string authenticate(const std::string& secret) {
    const std::string server_nonce = read_greeting();
    const std::string client_nonce(sp::kNonceBytes, 'c');
    const Digest proof = sp::client_proof(secret, server_nonce, client_nonce);
    send_frame(payload_of(sp::kAuth, {client_nonce, std::string(as_bytes(proof))}));
    const std::string answer = read_frame();
    server_nonce_ = server_nonce;
    return answer;
  }
  const std::string& server_nonce() const { return server_nonce_; }

  // True when the server closed the connection within the timeout (reads and drops any reply).
  bool closed_by_server(Millis timeout = Millis(5000)) {
    const Deadline deadline(timeout);
    char buf[256];
    while (!deadline.expired()) {
      try {
        if (!net::recv_all(fd_.get(), buf, 1, deadline)) return false;  // timed out, still open
      } catch (const Error&) {
        return true;  // end of stream
      }
    }
    return false;
  }

  // [u8 command][u32 count]{[u32 len][bytes]}
  static std::string payload_of(uint8_t command, const std::vector<std::string>& fields) {
    const std::string frame = sp::encode_frame(command, fields);
    return frame.substr(4);
  }

 private:
  net::Fd fd_;
  std::string server_nonce_;
};

std::string u32_bytes(uint32_t v) {
  return std::string(reinterpret_cast<const char*>(&v), 4);
}

std::string payload(uint8_t command, const std::vector<std::string>& fields) {
  return RawClient::payload_of(command, fields);
}

// The reply payload that means "ok" with these fields.
std::string ok(const std::vector<std::string>& fields) {
  return payload(sp::kOk, fields);
}

// A raw client that has authenticated with the right secret.
std::unique_ptr<RawClient> trusted_raw(int port) {
  auto raw = std::make_unique<RawClient>(port);
  const std::string answer = raw->authenticate(kSecret);
  uint8_t code = 1;
  std::vector<std::string> fields;
  EXPECT_TRUE(sp::decode_payload(answer, &code, &fields) && code == sp::kOk)
      << sp::printable(answer);
  return raw;
}

TEST(StoreServing, SurvivesMalformedFrames) {
  StoreServer server("127.0.0.1", 0, kSecret);
  TcpStore good("127.0.0.1", server.port(), Millis(5000), 0, kSecret);
  good.set("before", "1");

  struct BadInput {
    const char* what;
    std::string bytes;  // sent as is
  };
  const std::vector<BadInput> bad{
      {"frame longer than the limit", u32_bytes(0xFFFFFFFFu) + "xxxx"},
      {"empty payload", u32_bytes(0)},
      {"count larger than the payload", u32_bytes(5) + std::string(1, 1) + u32_bytes(1000)},
      {"field longer than the payload",
       u32_bytes(13) + std::string(1, 1) + u32_bytes(1) + u32_bytes(200) + "abcd"},
      {"bytes after the last field",
       [] {
         const std::string p = payload(1, {"k", "v"}) + "junk";
         return u32_bytes(static_cast<uint32_t>(p.size())) + p;
       }()},
      {"unknown command",
       [] {
         const std::string p = payload(99, {"k"});
         return u32_bytes(static_cast<uint32_t>(p.size())) + p;
       }()},
      {"set with one field",
       [] {
         const std::string p = payload(1, {"k"});
         return u32_bytes(static_cast<uint32_t>(p.size())) + p;
       }()},
      {"get with two fields",
       [] {
         const std::string p = payload(2, {"a", "b"});
         return u32_bytes(static_cast<uint32_t>(p.size())) + p;
       }()},
      {"wait with no key",
       [] {
         const std::string p = payload(3, {});
         return u32_bytes(static_cast<uint32_t>(p.size())) + p;
       }()},
      {"erase with two fields",
       [] {
         const std::string p = payload(6, {"a", "b"});
         return u32_bytes(static_cast<uint32_t>(p.size())) + p;
       }()},
  };
  for (const auto& input : bad) {
    auto raw = trusted_raw(server.port());
    raw->send_bytes(input.bytes);
    EXPECT_TRUE(raw->closed_by_server()) << input.what << ": the server kept the connection";
    // The server still serves everyone else.
    good.set("after", input.what);
    EXPECT_EQ(good.get("after"), input.what);
  }

  // Half a frame, then the client disappears; and a client that vanishes while waiting.
  {
    auto raw = trusted_raw(server.port());
    raw->send_bytes(u32_bytes(100) + "partial");
  }
  {
    auto raw = trusted_raw(server.port());
    raw->send_frame(payload(2, {"never-set"}));
  }
  // Pipelined requests on one connection are answered in order, and a malformed frame after
  // them still only drops that connection.
  {
    auto raw = trusted_raw(server.port());
    raw->send_frame(payload(1, {"pipelined", "yes"}) + std::string());
    raw->send_frame(payload(4, {"pipelined-count", "3"}));
    raw->send_bytes(u32_bytes(0xFFFFFFF0u));
    EXPECT_TRUE(raw->closed_by_server());
  }
  good.set("never-set", "now");  // wakes the waiter whose client is gone
  EXPECT_EQ(good.get("pipelined"), "yes");
  EXPECT_EQ(good.add("pipelined-count", 0), 3);
  EXPECT_EQ(good.get("before"), "1");

  // A well-formed request on a raw connection gets a well-formed reply: [u32 len][u8 status 0]
  // [u32 count 1][u32 len]["5"].
  auto raw = trusted_raw(server.port());
  raw->send_frame(payload(4, {"raw-add", "5"}));
  EXPECT_EQ(raw->read_frame(), payload(0, {"5"}));
  TcpStore check("127.0.0.1", server.port(), Millis(5000), 0, kSecret);
  EXPECT_EQ(check.add("raw-add", 0), 5);
}

TEST(StoreServing, CallsFailNamingTheRankOnceTheServerIsGone) {
  auto server = std::make_unique<StoreServer>("127.0.0.1", 0, kSecret);
  TcpStore store("127.0.0.1", server->port(), Millis(2000), 3, kSecret);
  store.set("k", "v");
  server.reset();
  EXPECT_THAT([&] { store.get("k"); }, ThrowsMessage<Error>(HasSubstr("rank 3: store get('k')")));
}

// ---------------------------------------------------------------------------------------------
// A store only its own job can use.

// What the server answered: its status and fields.
struct Answer {
  uint8_t status = 255;
  std::vector<std::string> fields;
};
Answer decode(const std::string& payload) {
  Answer a;
  EXPECT_TRUE(sp::decode_payload(payload, &a.status, &a.fields)) << sp::printable(payload);
  return a;
}

TEST(StoreSecurity, AnOutsiderWithoutTheSecretCanNeitherReadNorWrite) {
  StoreServer server("127.0.0.1", 0, kSecret);
  TcpStore good("127.0.0.1", server.port(), Millis(5000), 0, kSecret);
  good.set("asynctp/run_id", "the-run-id");

  {  // A read before authenticating: refused, and nothing of the store's content comes back.
    RawClient raw(server.port());
    raw.read_greeting();
    raw.send_frame(payload(sp::kGet, {"asynctp/run_id"}));
    const Answer a = decode(raw.read_frame());
    EXPECT_EQ(a.status, sp::kFailed);
    ASSERT_EQ(a.fields.size(), 1u);
    EXPECT_THAT(a.fields[0], HasSubstr("command 2 before authentication"));
    EXPECT_TRUE(raw.closed_by_server());
  }
  {  // A write before authenticating: refused, and the key is not planted.
    RawClient raw(server.port());
    raw.read_greeting();
    raw.send_frame(payload(sp::kSet, {"asynctp/host/1", "attacker"}));
    EXPECT_EQ(decode(raw.read_frame()).status, sp::kFailed);
    EXPECT_TRUE(raw.closed_by_server());
  }
  {  // A wrong secret: refused, and the connection closes before any request is read.
    RawClient raw(server.port());
    const Answer a = decode(raw.authenticate("ffffffffffffffffffffffffffffffff"));
    EXPECT_EQ(a.status, sp::kFailed);
    ASSERT_EQ(a.fields.size(), 1u);
    EXPECT_THAT(a.fields[0], HasSubstr("wrong secret"));
    raw.send_frame(payload(sp::kSet, {"asynctp/host/1", "attacker"}));
    EXPECT_TRUE(raw.closed_by_server());
  }
  {  // A proof replayed from another connection (another nonce) is as wrong as no secret.
    RawClient first(server.port());
    first.authenticate(kSecret);
    RawClient second(server.port());
    const std::string nonce = second.read_greeting();
    ASSERT_NE(nonce, first.server_nonce()) << "two connections got the same nonce";
    const std::string client_nonce(sp::kNonceBytes, 'c');
    const Digest replayed = sp::client_proof(kSecret, first.server_nonce(), client_nonce);
    second.send_frame(payload(sp::kAuth, {client_nonce, std::string(as_bytes(replayed))}));
    EXPECT_EQ(decode(second.read_frame()).status, sp::kFailed);
    EXPECT_TRUE(second.closed_by_server());
  }
  {  // The TcpStore client with another job's secret fails at once, naming the port.
    TcpStore outsider("127.0.0.1", server.port(), Millis(20'000), 1,
                      "ffffffffffffffffffffffffffffffff");
    const auto start = Clock::now();
    EXPECT_THAT([&] { outsider.get("asynctp/run_id"); },
                ThrowsMessage<Error>(AllOf(
                    HasSubstr("rank 1: store get('asynctp/run_id') failed"),
                    HasSubstr(fmt::format("the store at 127.0.0.1:{} refused this rank (wrong "
                                          "secret",
                                          server.port())),
                    HasSubstr(fmt::format("port {} is held by another job's store", server.port())),
                    HasSubstr("ASYNCTP_STORE_SECRET"))));
    EXPECT_LT(seconds_since(start), 2.0);
    EXPECT_THROW(outsider.set("asynctp/host/1", "attacker"), Error);
  }
  // With the secret, the handshake succeeds and the server proves it knows the secret too.
  RawClient raw(server.port());
  const Answer a = decode(raw.authenticate(kSecret));
  EXPECT_EQ(a.status, sp::kOk);
  ASSERT_EQ(a.fields.size(), 1u);
  EXPECT_EQ(a.fields[0], as_bytes(sp::server_proof(kSecret, raw.server_nonce(),
                                                   std::string(sp::kNonceBytes, 'c'))));
  EXPECT_FALSE(good.check({"asynctp/host/1"})) << "an outsider planted a key";
  EXPECT_EQ(good.get("asynctp/run_id"), "the-run-id");
}

// A fake server on a port the client dials (another job's store, or another program): the
// client must not take it for its own job's store.
class FakeServer {
 public:
  // Sends `greeting` (raw bytes) on accept, then `answer` (raw bytes) once a frame arrives.
  FakeServer(std::string greeting, std::string answer)
      : listener_(net::tcp_listen("127.0.0.1", 0, &port_)),
        thread_([this, g = std::move(greeting), a = std::move(answer)] {
          net::Fd conn(::accept(listener_.get(), nullptr, nullptr));
          if (!conn.valid()) return;
          net::send_all(conn.get(), g.data(), g.size());
          char buf[512];
          if (::recv(conn.get(), buf, sizeof(buf), 0) > 0 && !a.empty()) {
            net::send_all(conn.get(), a.data(), a.size());
          }
          ::recv(conn.get(), buf, sizeof(buf), 0);  // until the client hangs up
        }) {}
  ~FakeServer() { thread_.join(); }
  int port() const { return port_; }

 private:
  int port_ = 0;
  net::Fd listener_;
  std::thread thread_;
};

TEST(StoreSecurity, AClientRefusesAServerThatDoesNotKnowItsSecret) {
  const std::string nonce(sp::kNonceBytes, 'n');
  {
    // Greets as an asynctp store, then claims success with a proof it could not make.
    FakeServer fake(sp::encode_frame(sp::kHello, {std::string(sp::kGreeting), nonce}),
                    sp::encode_frame(sp::kOk, {std::string(32, 'x')}));
    TcpStore store("127.0.0.1", fake.port(), Millis(10'000), 2, kSecret);
    EXPECT_THAT(
        [&] { store.set("k", "v"); },
        ThrowsMessage<Error>(
            AllOf(HasSubstr(fmt::format("the store at 127.0.0.1:{} does not know this job's "
                                        "secret",
                                        fake.port())),
                  HasSubstr(fmt::format("port {} is held by another job's store", fake.port())))));
  }
  {
    // Not an asynctp store at all.
    FakeServer fake("HTTP/1.1 400 Bad Request\r\n\r\n", "");
    TcpStore store("127.0.0.1", fake.port(), Millis(10'000), 2, kSecret);
    EXPECT_THAT([&] { store.get("k"); },
                ThrowsMessage<Error>(AllOf(HasSubstr("is not an asynctp store"),
                                           HasSubstr(fmt::format("port {} is held by another "
                                                                 "program",
                                                                 fake.port())))));
  }
}

TEST(StoreSecurity, BadValuesAreNamedErrors) {
  StoreServer server("127.0.0.1", 0, kSecret);
  TcpStore store("127.0.0.1", server.port(), Millis(5000), 4, kSecret);
  store.set("text", "abc");
  EXPECT_THAT([&] { store.add("text", 1); },
              ThrowsMessage<Error>(
                  AllOf(HasSubstr("rank 4: store add('text') failed"),
                        HasSubstr("add('text'): the stored value 'abc' is not a 64-bit integer"))));
  store.set("spaced", " 12");
  EXPECT_THAT([&] { store.add("spaced", 1); },
              ThrowsMessage<Error>(HasSubstr("the stored value ' 12' is not a 64-bit integer")));
  store.set("binary", std::string("\x01\xff", 2));
  EXPECT_THAT([&] { store.add("binary", 1); },
              ThrowsMessage<Error>(HasSubstr("the stored value '\\x01\\xff'")));
  // The connection stays usable, and the values are untouched.
  EXPECT_EQ(store.get("text"), "abc");
  EXPECT_EQ(store.add("count", 2), 2);

  // A delta that is not an integer (only a raw client sends one).
  auto raw = trusted_raw(server.port());
  raw->send_frame(payload(sp::kAdd, {"count", "1x"}));
  const Answer a = decode(raw->read_frame());
  EXPECT_EQ(a.status, sp::kFailed);
  ASSERT_EQ(a.fields.size(), 1u);
  EXPECT_EQ(a.fields[0], "add('count'): the delta '1x' is not a 64-bit integer");
  raw->send_frame(payload(sp::kAdd, {"count", "+1"}));
  EXPECT_EQ(decode(raw->read_frame()).status, sp::kFailed);
  raw->send_frame(payload(sp::kAdd, {"count", "1"}));
  EXPECT_EQ(raw->read_frame(), ok({"3"}));
}

TEST(StoreSecurity, AddNeverOverflows) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  StoreServer server("127.0.0.1", 0, kSecret);
  TcpStore store("127.0.0.1", server.port(), Millis(5000), 0, kSecret);
  EXPECT_EQ(store.add("up", kMax), kMax);
  EXPECT_THAT([&] { store.add("up", 1); },
              ThrowsMessage<Error>(
                  HasSubstr("add('up'): 9223372036854775807 + 1 overflows a 64-bit integer")));
  EXPECT_EQ(store.add("up", 0), kMax) << "a failed add must leave the counter as it was";
  EXPECT_EQ(store.add("down", kMin), kMin);
  EXPECT_THAT([&] { store.add("down", -1); },
              ThrowsMessage<Error>(HasSubstr("-9223372036854775808 + -1 overflows")));
  EXPECT_EQ(store.add("down", kMax), -1);
}

TEST(StoreSecurity, ASlowReaderDoesNotFreezeTheStore) {
  StoreServer server("127.0.0.1", 0, kSecret);
  TcpStore store("127.0.0.1", server.port(), Millis(3000), 0, kSecret);
  store.set("big", std::string(8 << 20, 'b'));
  // Asks for 8 MiB a hundred times and never reads: far more than the socket buffers hold.
  auto slow = trusted_raw(server.port());
  std::string requests;
  for (int i = 0; i < 100; ++i)
    requests += u32_bytes(static_cast<uint32_t>(payload(sp::kGet, {"big"}).size())) +
                payload(sp::kGet, {"big"});
  slow->send_bytes(requests);
  std::this_thread::sleep_for(Millis(300));
  // Everyone else is served, promptly.
  const auto start = Clock::now();
  for (int i = 0; i < 20; ++i) {
    store.set("k", std::to_string(i));
    EXPECT_EQ(store.get("k"), std::to_string(i));
  }
  EXPECT_LT(seconds_since(start), 2.0);
  // The slow reader still gets its replies, in order, once it reads.
  for (int i = 0; i < 3; ++i) {
    const std::string reply = slow->read_frame();
    EXPECT_EQ(reply.size(), 1u + 4 + 4 + (8u << 20));
  }
}

TEST(StoreSecurity, OversizeFramesAreRefusedFromTheirLength) {
  StoreServer server("127.0.0.1", 0, kSecret);
  {  // Before authentication, a frame of more than a handshake's size.
    RawClient raw(server.port());
    raw.read_greeting();
    raw.send_bytes(u32_bytes(256u << 20));  // the length alone; none of the 256 MiB follows
    const Answer a = decode(raw.read_frame());
    EXPECT_EQ(a.status, sp::kFailed);
    ASSERT_EQ(a.fields.size(), 1u);
    EXPECT_EQ(a.fields[0],
              "a frame of 268435456 bytes is over the limit of 256 bytes before authentication");
    EXPECT_TRUE(raw.closed_by_server(Millis(2000)));
  }
  {  // After authentication, a frame over the limit for the largest key and value.
    auto raw = trusted_raw(server.port());
    raw->send_bytes(u32_bytes(sp::kMaxFrameBytes + 1));
    const Answer a = decode(raw->read_frame());
    EXPECT_EQ(a.status, sp::kFailed);
    ASSERT_EQ(a.fields.size(), 1u);
    EXPECT_EQ(a.fields[0], fmt::format("a frame of {} bytes is over the limit of {} bytes",
                                       sp::kMaxFrameBytes + 1, sp::kMaxFrameBytes));
    EXPECT_TRUE(raw->closed_by_server(Millis(2000)));
  }
  // The client refuses to send a value over the limit, naming the key.
  TcpStore store("127.0.0.1", server.port(), Millis(5000), 0, kSecret);
  EXPECT_THAT([&] { store.set("huge", std::string(sp::kMaxValueBytes + 1, 'h')); },
              ThrowsMessage<Error>(AllOf(HasSubstr("store set('huge')"),
                                         HasSubstr("values up to 134217728 bytes"))));
  store.set("fine", "v");
  EXPECT_EQ(store.get("fine"), "v");
}

TEST(StoreSecurity, ConnectionsAreCappedAndIdleHandshakesDropped) {
  StoreServerOptions options;
  options.max_connections = 4;
  options.handshake_timeout = Millis(500);
  StoreServer server("127.0.0.1", 0, kSecret, options);
  std::vector<std::unique_ptr<RawClient>> idle;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(std::make_unique<RawClient>(server.port()));
    idle.back()->read_greeting();
  }
  // A fifth is closed at once, ungreeted.
  RawClient fifth(server.port());
  EXPECT_TRUE(fifth.closed_by_server(Millis(300)));
  // The idle ones never authenticate: dropped at the handshake timeout, which frees the slots.
  for (auto& raw : idle)
    EXPECT_TRUE(raw->closed_by_server(Millis(3000)));
  TcpStore store("127.0.0.1", server.port(), Millis(5000), 0, kSecret);
  store.set("k", "v");
  EXPECT_EQ(store.get("k"), "v");
}

TEST(StoreSecurity, ListensOnlyOnTheGivenAddress) {
  StoreServer server("127.0.0.1", 0, kSecret);
  // 127.0.0.2 is this host too, but not the address the store was given.
  EXPECT_THROW(net::tcp_connect("127.0.0.2", server.port(), Deadline(Millis(300)), "other"),
               TimeoutError);
  RawClient raw(server.port(), "127.0.0.1");
  raw.read_greeting();
}

TEST(StoreSecurity, ATakenPortIsAClearError) {
  StoreServer first("127.0.0.1", 0, kSecret);
  const auto start = Clock::now();
  EXPECT_THAT([&] { StoreServer second("127.0.0.1", first.port(), kSecret); },
              ThrowsMessage<Error>(
                  AllOf(HasSubstr(fmt::format("cannot listen on 127.0.0.1:{}: port {} is taken "
                                              "(another job or program holds it)",
                                              first.port(), first.port())),
                        HasSubstr("--master-port"))));
  EXPECT_LT(seconds_since(start), 1.0);
}

}  // namespace
}  // namespace asynctp
