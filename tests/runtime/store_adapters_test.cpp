// The stores over other stores: PrefixStore (one namespace of a shared store) and CallbackStore
// (a host framework's store through callbacks; here an in-memory map whose get blocks on a
// condition variable, as c10d's does). Their semantics are the TcpStore's: blocking get and
// wait, add on missing keys, check without waiting, erase, and timeouts that name rank, call and
// key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/store.h"

namespace asynctp {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A host store: a map behind a mutex; get waits for the key up to the timeout it is given.
struct MemoryStore {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::string, std::string> data;
  std::vector<std::string> calls;  // "<callback> <key>", in order

  StoreCallbacks callbacks() {
    StoreCallbacks cb;
    cb.set = [this](const std::string& key, const std::string& value) {
      std::lock_guard lock(mutex);
      calls.push_back("set " + key);
      data[key] = value;
      changed.notify_all();
    };
    cb.get = [this](const std::string& key, Millis timeout) -> std::optional<std::string> {
      std::unique_lock lock(mutex);
      calls.push_back("get " + key);
      if (!changed.wait_for(lock, timeout, [&] { return data.count(key) > 0; }))
        return std::nullopt;
      return data.at(key);
    };
    cb.add = [this](const std::string& key, int64_t delta) {
      std::lock_guard lock(mutex);
      calls.push_back("add " + key);
      const int64_t sum = (data.count(key) ? std::stoll(data[key]) : 0) + delta;
      data[key] = std::to_string(sum);
      changed.notify_all();
      return sum;
    };
    cb.check = [this](const std::string& key) {
      std::lock_guard lock(mutex);
      calls.push_back("check " + key);
      return data.count(key) > 0;
    };
    cb.erase = [this](const std::string& key) {
      std::lock_guard lock(mutex);
      calls.push_back("erase " + key);
      data.erase(key);
    };
    return cb;
  }
};

TEST(CallbackStore, SetGetAddCheckErase) {
  MemoryStore host;
  CallbackStore store(host.callbacks(), Millis(2000), 3);
  EXPECT_EQ(store.timeout(), Millis(2000));
  store.set("a", "1");
  EXPECT_EQ(store.get("a"), "1");
  store.set("a", std::string("x\0y", 3));  // overwrites; values are bytes
  EXPECT_EQ(store.get("a"), std::string("x\0y", 3));
  EXPECT_EQ(store.add("n", 5), 5);  // missing = 0
  EXPECT_EQ(store.add("n", -2), 3);
  EXPECT_TRUE(store.check({"a", "n"}));
  EXPECT_FALSE(store.check({"a", "missing"}));
  store.erase("a");
  EXPECT_FALSE(store.check({"a"}));
  store.erase("never-set");  // no error
  EXPECT_EQ(host.data.count("a"), 0u);
  EXPECT_EQ(host.data.at("n"), "3");
}

TEST(CallbackStore, GetAndWaitBlockUntilAnotherThreadSets) {
  MemoryStore host;
  CallbackStore store(host.callbacks(), Millis(10'000), 0);
  const auto start = Clock::now();
  std::thread setter([&] {
    std::this_thread::sleep_for(Millis(200));
    CallbackStore other(host.callbacks(), Millis(10'000), 1);
    other.set("late", "here");
    std::this_thread::sleep_for(Millis(100));
    other.set("later", "too");
  });
  EXPECT_EQ(store.get("late"), "here");
  EXPECT_GE(seconds_since(start), 0.15);
  store.wait({"late", "later"});
  EXPECT_GE(seconds_since(start), 0.25);
  setter.join();
}

TEST(CallbackStore, TimeoutsNameTheRankCallAndKey) {
  MemoryStore host;
  CallbackStore store(host.callbacks(), Millis(300), 6);
  auto start = Clock::now();
  EXPECT_THAT([&] { store.get("nobody/sets/this"); },
              ThrowsMessage<TimeoutError>(AllOf(HasSubstr("rank 6: store get('nobody/sets/this')"),
                                                HasSubstr("timed out after 0.3 s"))));
  EXPECT_GE(seconds_since(start), 0.25);
  EXPECT_THAT([&] { store.get("k", Millis(100)); },
              ThrowsMessage<TimeoutError>(HasSubstr("timed out after 0.1 s")));
  // wait() names the first key still missing, within one deadline for all of them.
  store.set("present", "1");
  start = Clock::now();
  EXPECT_THAT(
      [&] {
        store.wait({"present", "absent", "also-absent"});
      },
      ThrowsMessage<TimeoutError>(AllOf(HasSubstr("rank 6: store wait('absent' of 3 keys)"),
                                        HasSubstr("timed out after 0.3 s"))));
  EXPECT_LT(seconds_since(start), 2.0);
  EXPECT_THAT([&] { store.wait({}); },
              ThrowsMessage<Error>(HasSubstr("rank 6: store wait() needs at least one key")));
}

TEST(CallbackStore, WaitAsksCheckBeforeBlocking) {
  MemoryStore host;
  CallbackStore store(host.callbacks(), Millis(1000), 0);
  store.set("k", "v");
  host.calls.clear();
  store.wait({"k"});
  EXPECT_THAT(host.calls, ElementsAre("check k"));
}

TEST(CallbackStore, HostErrorsAreNamed) {
  MemoryStore host;
  StoreCallbacks cb = host.callbacks();
  cb.add = [](const std::string&, int64_t) -> int64_t {
    throw std::runtime_error("connection reset");
  };
  CallbackStore store(cb, Millis(1000), 2);
  EXPECT_THAT([&] { store.add("counter", 1); },
              ThrowsMessage<Error>(
                  AllOf(HasSubstr("rank 2: store add('counter')"), HasSubstr("connection reset"))));
}

TEST(CallbackStore, EveryCallbackIsRequired) {
  MemoryStore host;
  StoreCallbacks cb = host.callbacks();
  cb.check = nullptr;
  EXPECT_THAT([&] { CallbackStore(cb, Millis(1000), 4); },
              ThrowsMessage<Error>(AllOf(HasSubstr("rank 4: CallbackStore needs every callback"),
                                         HasSubstr("check false"))));
}

TEST(PrefixStore, EveryKeyLivesUnderThePrefix) {
  MemoryStore host;
  auto inner = std::make_shared<CallbackStore>(host.callbacks(), Millis(500), 1);
  PrefixStore tp(inner, "mesh/tp0");
  PrefixStore dp(inner, "mesh/dp1");
  EXPECT_EQ(tp.prefix(), "mesh/tp0");
  EXPECT_EQ(tp.timeout(), Millis(500));
  tp.set("k", "tp");
  dp.set("k", "dp");
  EXPECT_EQ(tp.get("k"), "tp");
  EXPECT_EQ(dp.get("k"), "dp");
  EXPECT_EQ(inner->get("mesh/tp0/k"), "tp");
  EXPECT_EQ(inner->get("mesh/dp1/k"), "dp");
  EXPECT_EQ(tp.add("n", 2), 2);
  EXPECT_EQ(dp.add("n", 5), 5);
  EXPECT_TRUE(tp.check({"k", "n"}));
  EXPECT_FALSE(tp.check({"k", "absent"}));
  tp.wait({"k", "n"});
  tp.erase("k");
  EXPECT_FALSE(tp.check({"k"}));
  EXPECT_TRUE(dp.check({"k"}));
  // Nested prefixes compose.
  PrefixStore nested(std::make_shared<PrefixStore>(inner, "mesh"), "pp2");
  nested.set("k", "nested");
  EXPECT_EQ(inner->get("mesh/pp2/k"), "nested");
}

TEST(PrefixStore, TimeoutsNameTheFullKey) {
  MemoryStore host;
  auto inner = std::make_shared<CallbackStore>(host.callbacks(), Millis(200), 7);
  PrefixStore store(inner, "group/3");
  EXPECT_THAT([&] { store.get("id"); },
              ThrowsMessage<TimeoutError>(HasSubstr("rank 7: store get('group/3/id')")));
  EXPECT_THAT(
      [&] {
        store.wait({"a", "b"}, Millis(50));
      },
      ThrowsMessage<TimeoutError>(HasSubstr("rank 7: store wait('group/3/a' of 2 keys)")));
  EXPECT_THAT([&] { PrefixStore(nullptr, "p"); },
              ThrowsMessage<Error>(HasSubstr("PrefixStore('p') needs an inner store, got null")));
  EXPECT_THAT([&] { PrefixStore(inner, ""); },
              ThrowsMessage<Error>(HasSubstr("PrefixStore needs a non-empty prefix")));
}

}  // namespace
}  // namespace asynctp
