// The TCP store: every call across real processes (the harness serves the store in the test
// process and forks one process per rank), blocking gets, timeouts that name the rank and key,
// clients that start before the server, large values, many concurrent clients, and a server
// that survives malformed frames.
#include "runtime/store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/socket.h"
#include "support/multiprocess.h"

namespace asynctp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr Millis kStoreTimeout{10'000};

TcpStore connect(const RendezvousInfo& info, Millis timeout = kStoreTimeout) {
  return TcpStore(info.master_addr, info.master_port, timeout, info.rank);
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
  TcpStore store("127.0.0.1", 1, Millis(100), 0);
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
    server = std::make_unique<StoreServer>("127.0.0.1", port);
  });
  TcpStore store("127.0.0.1", port, Millis(10'000), 7);
  const auto start = Clock::now();
  store.set("early", "bird");  // connects (retrying) on first use
  EXPECT_GE(seconds_since(start), 0.2);
  EXPECT_EQ(store.get("early"), "bird");
  starter.join();
  EXPECT_EQ(server->port(), port);
}

TEST(StoreServing, ClientGivesUpAtItsDeadlineWhenThereIsNoServer) {
  const int port = net::pick_free_port();
  TcpStore store("127.0.0.1", port, Millis(300), 5);
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

TEST(StoreServing, BindsAFreePortWhenAskedForPortZero) {
  StoreServer server("127.0.0.1", 0);
  EXPECT_GT(server.port(), 0);
  TcpStore store("127.0.0.1", server.port(), Millis(5000), 0);
  store.set("k", "v");
  EXPECT_EQ(store.get("k"), "v");
}

TEST(StoreServing, ManyConcurrentClients) {
  StoreServer server("127.0.0.1", 0);
  constexpr int kClients = 16;
  constexpr int kAdds = 100;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      try {
        TcpStore store("127.0.0.1", server.port(), Millis(20'000), c);
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
  TcpStore check("127.0.0.1", server.port(), Millis(5000), 0);
  EXPECT_EQ(check.add("shared", 0), kClients * kAdds);
}

TEST(StoreServing, OneClientSharedByThreads) {
  // Calls through one TcpStore are serialised by its mutex; none may interleave on the socket.
  StoreServer server("127.0.0.1", 0);
  TcpStore store("127.0.0.1", server.port(), Millis(20'000), 0);
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

// A raw connection to the server, for sending what the TcpStore client never would.
class RawClient {
 public:
  explicit RawClient(int port)
      : fd_(net::tcp_connect("127.0.0.1", port, Deadline(Millis(5000)), "raw")) {}

  void send_bytes(const std::string& bytes) {
    net::send_all(fd_.get(), bytes.data(), bytes.size());
  }

  // A frame: u32 payload length, then the payload.
  void send_frame(const std::string& payload) {
    const uint32_t len = static_cast<uint32_t>(payload.size());
    send_bytes(std::string(reinterpret_cast<const char*>(&len), 4) + payload);
  }

  // The payload of the next frame the server sends.
  std::string read_frame() {
    const Deadline deadline(Millis(5000));
    uint32_t len = 0;
    if (!net::recv_all(fd_.get(), &len, 4, deadline)) return "(timed out)";
    std::string out(len, '\0');
    if (!net::recv_all(fd_.get(), out.data(), len, deadline)) return "(timed out)";
    return out;
  }

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

 private:
  net::Fd fd_;
};

std::string u32_bytes(uint32_t v) {
  return std::string(reinterpret_cast<const char*>(&v), 4);
}

// [u8 command][u32 count]{[u32 len][bytes]}
std::string payload(uint8_t command, const std::vector<std::string>& fields) {
  std::string p(1, static_cast<char>(command));
  p += u32_bytes(static_cast<uint32_t>(fields.size()));
  for (const auto& f : fields)
    p += u32_bytes(static_cast<uint32_t>(f.size())) + f;
  return p;
}

TEST(StoreServing, SurvivesMalformedFrames) {
  StoreServer server("127.0.0.1", 0);
  TcpStore good("127.0.0.1", server.port(), Millis(5000), 0);
  good.set("before", "1");

  struct BadInput {
    const char* what;
    std::string bytes;  // sent as is
  };
  const std::vector<BadInput> bad{
      {"frame longer than the 1 GiB limit", u32_bytes(0xFFFFFFFFu) + "xxxx"},
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
    RawClient raw(server.port());
    raw.send_bytes(input.bytes);
    EXPECT_TRUE(raw.closed_by_server()) << input.what << ": the server kept the connection";
    // The server still serves everyone else.
    good.set("after", input.what);
    EXPECT_EQ(good.get("after"), input.what);
  }

  // Half a frame, then the client disappears; and a client that vanishes while waiting.
  {
    RawClient raw(server.port());
    raw.send_bytes(u32_bytes(100) + "partial");
  }
  {
    RawClient raw(server.port());
    raw.send_frame(payload(2, {"never-set"}));
  }
  // Pipelined requests on one connection are answered in order, and a malformed frame after
  // them still only drops that connection.
  {
    RawClient raw(server.port());
    raw.send_frame(payload(1, {"pipelined", "yes"}) + std::string());
    raw.send_frame(payload(4, {"pipelined-count", "3"}));
    raw.send_bytes(u32_bytes(0xFFFFFFF0u));
    EXPECT_TRUE(raw.closed_by_server());
  }
  good.set("never-set", "now");  // wakes the waiter whose client is gone
  EXPECT_EQ(good.get("pipelined"), "yes");
  EXPECT_EQ(good.add("pipelined-count", 0), 3);
  EXPECT_EQ(good.get("before"), "1");

  // A well-formed request on a raw connection gets a well-formed reply: [u32 len][u8 status 0]
  // [u32 count 1][u32 len]["5"].
  RawClient raw(server.port());
  raw.send_frame(payload(4, {"raw-add", "5"}));
  EXPECT_EQ(raw.read_frame(), payload(0, {"5"}));
  TcpStore check("127.0.0.1", server.port(), Millis(5000), 0);
  EXPECT_EQ(check.add("raw-add", 0), 5);
}

TEST(StoreServing, CallsFailNamingTheRankOnceTheServerIsGone) {
  auto server = std::make_unique<StoreServer>("127.0.0.1", 0);
  TcpStore store("127.0.0.1", server->port(), Millis(2000), 3);
  store.set("k", "v");
  server.reset();
  EXPECT_THAT([&] { store.get("k"); }, ThrowsMessage<Error>(HasSubstr("rank 3: store get('k')")));
}

}  // namespace
}  // namespace asynctp
