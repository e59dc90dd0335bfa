// Group: rendezvous from torchrun's variables, node detection, run ids, barriers and keys.
#include <asynctp/group.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
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
using ::testing::MatchesRegex;
using ::testing::ThrowsMessage;

// Every variable from_env() reads; each test starts with all of them unset but the secret (the
// test may itself run under a launcher that set them) and gets the old values back afterwards.
constexpr const char* kRendezvousVars[] = {
    "RANK",           "WORLD_SIZE",      "LOCAL_RANK",          "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",    "MASTER_PORT",     "ASYNCTP_STORE_PORT",  "TORCHELASTIC_USE_AGENT_STORE",
    "ASYNCTP_RUN_ID", "ASYNCTP_HOST_ID", "ASYNCTP_STORE_SECRET"};

// A valid ASYNCTP_STORE_SECRET, which every test starts with (one that needs it unset says so).
constexpr const char* kTestSecret = "00112233445566778899aabbccddeeff";

class RendezvousEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kRendezvousVars) {
      if (const char* v = std::getenv(name)) saved_[name] = v;
      ::unsetenv(name);
    }
    ::setenv("ASYNCTP_STORE_SECRET", kTestSecret, 1);
  }
  void TearDown() override {
    for (const char* name : kRendezvousVars)
      ::unsetenv(name);
    for (const auto& [name, value] : saved_)
      ::setenv(name.c_str(), value.c_str(), 1);
  }
  static void set(const std::map<std::string, std::string>& vars) {
    for (const auto& [name, value] : vars)
      ::setenv(name.c_str(), value.c_str(), 1);
  }
  // The error from_env() throws with these variables set.
  static std::string error_with(const std::map<std::string, std::string>& vars) {
    set(vars);
    try {
      RendezvousInfo::from_env();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }

 private:
  std::map<std::string, std::string> saved_;
};

TEST_F(RendezvousEnv, NothingSetMeansASingleRank) {
  const RendezvousInfo info = RendezvousInfo::from_env();
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.local_world_size, 1);
  EXPECT_EQ(info.master_addr, "127.0.0.1");
  EXPECT_EQ(info.master_port, 0);  // serve on a free port
  // Empty values count as unset.
  set({{"RANK", ""}, {"WORLD_SIZE", ""}, {"MASTER_PORT", ""}});
  EXPECT_EQ(RendezvousInfo::from_env().world_size, 1);
}

TEST_F(RendezvousEnv, EverythingSet) {
  set({{"RANK", "5"},
       {"WORLD_SIZE", "8"},
       {"LOCAL_RANK", "1"},
       {"LOCAL_WORLD_SIZE", "4"},
       {"MASTER_ADDR", "node-0.example"},
       {"MASTER_PORT", "29500"}});
  const RendezvousInfo info = RendezvousInfo::from_env();
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.master_addr, "node-0.example");
  EXPECT_EQ(info.master_port, 29500);
}

TEST_F(RendezvousEnv, LocalVariablesDefaultToTheGlobalOnes) {
  set({{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_PORT", "1234"}});
  const RendezvousInfo info = RendezvousInfo::from_env();
  EXPECT_EQ(info.local_rank, 2);
  EXPECT_EQ(info.local_world_size, 3);
  EXPECT_EQ(info.master_addr, "127.0.0.1");
}

TEST_F(RendezvousEnv, StorePortOverrides) {
  set({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}});
  EXPECT_EQ(RendezvousInfo::from_env().master_port, 29500);
  // torchrun's agent store owns MASTER_PORT: ours moves to the next port.
  set({{"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  EXPECT_EQ(RendezvousInfo::from_env().master_port, 29501);
  set({{"TORCHELASTIC_USE_AGENT_STORE", "False"}});
  EXPECT_EQ(RendezvousInfo::from_env().master_port, 29500);
  // An explicit ASYNCTP_STORE_PORT wins over both.
  set({{"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"ASYNCTP_STORE_PORT", "40000"}});
  EXPECT_EQ(RendezvousInfo::from_env().master_port, 40000);
  EXPECT_THAT(error_with({{"ASYNCTP_STORE_PORT", "x"}}),
              HasSubstr("ASYNCTP_STORE_PORT='x' is not an integer; allowed: an integer from 0 "
                        "to 65535"));
  EXPECT_THAT(error_with({{"ASYNCTP_STORE_PORT", "65536"}}),
              HasSubstr("ASYNCTP_STORE_PORT='65536' is out of range"));
  // 0 is the default: MASTER_PORT, moved by torchrun's agent store.
  set({{"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"ASYNCTP_STORE_PORT", "0"}});
  EXPECT_EQ(RendezvousInfo::from_env().master_port, 29501);
}

TEST_F(RendezvousEnv, MissingVariablesAreNamed) {
  EXPECT_THAT(error_with({{"RANK", "0"}}), HasSubstr("environment variable WORLD_SIZE is not set"));
  ::unsetenv("RANK");
  EXPECT_THAT(error_with({{"WORLD_SIZE", "2"}}), HasSubstr("environment variable RANK is not set"));
  ::unsetenv("WORLD_SIZE");
  EXPECT_THAT(error_with({{"MASTER_PORT", "29500"}}),
              HasSubstr("environment variable RANK is not set"));
  EXPECT_THAT(error_with({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", ""}}),
              AllOf(HasSubstr("environment variable MASTER_PORT is not set"),
                    HasSubstr("torchrun or `asynctp launch`")));
}

TEST_F(RendezvousEnv, MalformedVariablesAreNamedWithTheirValue) {
  set({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}});
  struct Case {
    const char* name;
    const char* value;
    const char* expected;
  };
  const Case cases[] = {
      {"RANK", "abc", "environment variable RANK='abc' is not an integer >= 0"},
      {"RANK", "-1", "environment variable RANK='-1' is not an integer >= 0"},
      {"RANK", "1x", "environment variable RANK='1x' is not an integer >= 0"},
      {"RANK", " 1", "environment variable RANK=' 1' is not an integer >= 0"},
      {"RANK", "99999999999", "RANK='99999999999' is not an integer"},
      {"WORLD_SIZE", "0", "environment variable WORLD_SIZE='0' is not an integer >= 1"},
      {"WORLD_SIZE", "two", "WORLD_SIZE='two'"},
      {"LOCAL_RANK", "-3", "environment variable LOCAL_RANK='-3' is not an integer >= 0"},
      {"LOCAL_WORLD_SIZE", "0", "LOCAL_WORLD_SIZE='0' is not an integer >= 1"},
      {"MASTER_PORT", "0", "environment variable MASTER_PORT='0' is not an integer >= 1"},
      {"MASTER_PORT", "http", "MASTER_PORT='http'"},
      {"MASTER_PORT", "70000", "MASTER_PORT=70000 is not a TCP port"},
  };
  for (const Case& c : cases) {
    const std::string old = std::getenv(c.name) ? std::getenv(c.name) : "";
    EXPECT_THAT(error_with({{c.name, c.value}}), HasSubstr(c.expected)) << c.name << "=" << c.value;
    if (old.empty()) {
      ::unsetenv(c.name);
    } else {
      ::setenv(c.name, old.c_str(), 1);
    }
  }
}

// The store admits only clients that know the job's secret: a job of several ranks that was not
// started by `asynctp launch` must be given one, and the error says how (under torchrun too).
TEST_F(RendezvousEnv, SeveralRanksNeedTheStoreSecret) {
  ::unsetenv("ASYNCTP_STORE_SECRET");
  set({{"RANK", "1"},
       {"WORLD_SIZE", "2"},
       {"MASTER_PORT", "29500"},
       {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  EXPECT_THAT(error_with({}),
              AllOf(HasSubstr("ASYNCTP_STORE_SECRET is not set, and this job has 2 ranks"),
                    HasSubstr("`asynctp launch` sets it"), HasSubstr("torchrun"),
                    HasSubstr("cannot reach torchrun's own store")));
  struct Case {
    const char* value;
    const char* expected;
  };
  const Case cases[] = {
      {"abc",
       "ASYNCTP_STORE_SECRET must be 32 to 128 hexadecimal digits (128 to 512 random "
       "bits), got 3 characters"},
      {"0123456789abcdef0123456789abcdeg", "got 32 characters that are not all hex digits"},
      {"0123456789abcdef0123456789abcde", "got 31 characters"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(error_with({{"ASYNCTP_STORE_SECRET", c.value}}), HasSubstr(c.expected)) << c.value;
  }
  set({{"ASYNCTP_STORE_SECRET", std::string(128, 'F')}});
  EXPECT_EQ(RendezvousInfo::from_env().store_secret, std::string(128, 'F'));
}

// A single rank is the store's only client: it makes a random secret of its own.
TEST_F(RendezvousEnv, ASingleRankMakesItsOwnSecret) {
  ::unsetenv("ASYNCTP_STORE_SECRET");
  const RendezvousInfo alone = RendezvousInfo::from_env();
  EXPECT_THAT(alone.store_secret, MatchesRegex("[0-9a-f]{64}"));
  EXPECT_NE(RendezvousInfo::from_env().store_secret, alone.store_secret);
  auto group = Group::from_env();
  group->store().set("k", "v");
  EXPECT_EQ(group->store().get("k"), "v");
  set({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "29500"}});
  EXPECT_THAT(RendezvousInfo::from_env().store_secret, MatchesRegex("[0-9a-f]{64}"));
}

TEST_F(RendezvousEnv, RanksMustBeBelowTheirSizes) {
  EXPECT_THAT(error_with({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "1"}}),
              HasSubstr("RANK=4 is not below WORLD_SIZE=4"));
  EXPECT_THAT(error_with({{"RANK", "1"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
              HasSubstr("LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"));
}

TEST_F(RendezvousEnv, SingleRankGroupServesItsOwnStore) {
  auto group = Group::from_env();
  EXPECT_EQ(group->rank(), 0);
  EXPECT_EQ(group->world_size(), 1);
  EXPECT_EQ(group->local_rank(), 0);
  EXPECT_EQ(group->local_world_size(), 1);
  EXPECT_TRUE(group->single_node());
  EXPECT_EQ(group->node_of(0), 0);
  EXPECT_THAT(group->run_id(), MatchesRegex("[0-9a-f]{12}"));
  EXPECT_GT(dynamic_cast<TcpStore&>(group->store()).port(), 0);
  group->store().set("k", "v");
  EXPECT_EQ(group->store().get("k"), "v");
  group->barrier("alone");
  group->barrier("alone");
}

TEST_F(RendezvousEnv, RunIdComesFromTheEnvironmentWhenSet) {
  set({{"ASYNCTP_RUN_ID", "my-run"}});
  GroupOptions options;
  options.timeout = Millis(5000);
  auto group = Group::from_env(options);
  EXPECT_EQ(group->run_id(), "my-run");
  EXPECT_EQ(group->timeout(), Millis(5000));
}

TEST_F(RendezvousEnv, HostIdFromTheEnvironment) {
  const std::string default_id = local_host_id();
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  EXPECT_THAT(default_id, HasSubstr(host));
  EXPECT_EQ(local_host_id(), default_id);  // stable
  set({{"ASYNCTP_HOST_ID", "rack3-node7"}});
  EXPECT_EQ(local_host_id(), "rack3-node7");
}

TEST(GroupCreate, InvalidRanksAreNamed) {
  RendezvousInfo info;
  info.world_size = 0;
  EXPECT_THAT([&] { Group::create(info); },
              ThrowsMessage<Error>(HasSubstr("world size must be at least 1, got 0")));
  info.world_size = 4;
  info.rank = 5;
  EXPECT_THAT([&] { Group::create(info); },
              ThrowsMessage<Error>(HasSubstr("rank 5 out of range [0, 4)")));
  info.rank = 2;
  info.master_port = 0;
  GroupOptions options;
  options.serve_store = false;
  EXPECT_THAT([&] { Group::create(info, options); },
              ThrowsMessage<Error>(HasSubstr("rank 2: no store port (MASTER_PORT)")));
}

// ---------------------------------------------------------------------------------------------
// Across processes.

testing::HarnessOptions fast_options() {
  testing::HarnessOptions options;
  options.group_timeout = Millis(10'000);
  options.run_timeout = Millis(60'000);
  return options;
}

// Gathers one string from every rank through the group's store.
std::vector<std::string> all_gather_string(Group& group, const std::string& tag,
                                           const std::string& value) {
  group.store().set(fmt::format("test/{}/{}", tag, group.rank()), value);
  std::vector<std::string> out;
  for (int r = 0; r < group.world_size(); ++r) {
    out.push_back(group.store().get(fmt::format("test/{}/{}", tag, r)));
  }
  return out;
}

TEST(GroupAcrossRanks, RanksSizesAndRunIdAgree) {
  constexpr int kRanks = 4;
  const auto options = fast_options();
  auto statuses = testing::run_processes(
      kRanks,
      [&](const RendezvousInfo& info) {
        // Without ASYNCTP_RUN_ID, rank 0 makes one up and every rank must learn the same one.
        ::unsetenv("ASYNCTP_RUN_ID");
        auto group = Group::create(info, testing::rank_group_options(options, info.rank));
        EXPECT_EQ(group->rank(), info.rank);
        EXPECT_EQ(group->world_size(), kRanks);
        EXPECT_EQ(group->local_rank(), info.rank);
        EXPECT_EQ(group->local_world_size(), kRanks);
        EXPECT_EQ(group->timeout(), options.group_timeout);
        EXPECT_THAT(group->run_id(), MatchesRegex("[0-9a-f]{12}"));
        for (const auto& id : all_gather_string(*group, "run_id", group->run_id())) {
          EXPECT_EQ(id, group->run_id());
        }
        EXPECT_TRUE(group->single_node());
        for (int r = 0; r < kRanks; ++r)
          EXPECT_EQ(group->node_of(r), 0);
        EXPECT_THROW(group->node_of(kRanks), std::out_of_range);
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

TEST(GroupAcrossRanks, RunIdFromTheEnvironment) {
  // The harness sets ASYNCTP_RUN_ID for the run (it checks /dev/shm by it afterwards).
  const auto options = fast_options();
  auto statuses = testing::run_processes(
      3,
      [&](const RendezvousInfo& info) {
        const char* expected = std::getenv("ASYNCTP_RUN_ID");
        ASSERT_NE(expected, nullptr);
        auto group = Group::create(info, testing::rank_group_options(options, info.rank));
        EXPECT_EQ(group->run_id(), expected);
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

// A rank reports a failure only where it failed itself. The ranks are forked from the test's
// process and inherit the failures it has recorded so far, which had every rank of a passing run
// report "test assertion failed" after an earlier run of the same test had failed. The outer
// rank stands in for such a test: it records a failure, runs ranks that pass and ranks of which
// one fails, and exits with whether they said so (exit code 42).
TEST(GroupAcrossRanks, ARankReportsOnlyItsOwnFailures) {
  const auto options = fast_options();
  auto statuses = testing::run_processes(
      1,
      [&](const RendezvousInfo&) {
        ADD_FAILURE() << "recorded on purpose: the earlier failure of the test this rank stands "
                         "in for";
        const auto passing = testing::run_processes(
            2, [](const RendezvousInfo&) {}, options);
        const auto failing = testing::run_processes(
            2, [](const RendezvousInfo& info) { EXPECT_NE(info.rank, 1) << "on purpose"; },
            options);
        const bool said_so = passing.size() == 2 && passing[0].ok() && passing[1].ok() &&
                             failing.size() == 2 && failing[0].ok() && failing[1].exited &&
                             failing[1].exit_code == testing::kRankGtestFailure;
        std::fflush(stdout);
        std::fflush(stderr);
        ::_exit(said_so ? 42 : 43);
      },
      options);
  ASSERT_EQ(statuses.size(), 1u);
  EXPECT_TRUE(statuses[0].exited && statuses[0].exit_code == 42)
      << statuses[0].describe() << " (43: a rank's status was wrong)";
}

struct NodeCase {
  const char* name;
  std::vector<std::string> hosts;  // per rank
  std::vector<int> expected_nodes;
  bool single_node;
};

class GroupNodes : public ::testing::TestWithParam<NodeCase> {};

TEST_P(GroupNodes, NodesAreNumberedInOrderOfFirstAppearance) {
  const NodeCase& c = GetParam();
  auto options = fast_options();
  options.host_id = [hosts = c.hosts](int rank) { return hosts[rank]; };
  auto statuses = testing::run_processes(
      static_cast<int>(c.hosts.size()),
      [&](const RendezvousInfo& info) {
        auto group = Group::create(info, testing::rank_group_options(options, info.rank));
        EXPECT_EQ(group->single_node(), c.single_node);
        for (int r = 0; r < group->world_size(); ++r) {
          EXPECT_EQ(group->node_of(r), c.expected_nodes[r]) << "node of rank " << r;
        }
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

INSTANTIATE_TEST_SUITE_P(
    HostIds, GroupNodes,
    ::testing::Values(NodeCase{"one_node", {"a", "a", "a"}, {0, 0, 0}, true},
                      NodeCase{"two_blocks", {"a", "a", "b", "b"}, {0, 0, 1, 1}, false},
                      NodeCase{"interleaved", {"n1", "n0", "n1", "n0"}, {0, 1, 0, 1}, false},
                      NodeCase{"each_its_own", {"x", "y", "z"}, {0, 1, 2}, false},
                      NodeCase{"single", {"solo"}, {0}, true}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(GroupAcrossRanks, HostIdFromTheEnvironmentOfEachRank) {
  const auto options = fast_options();
  auto statuses = testing::run_processes(
      4,
      [&](const RendezvousInfo& info) {
        ::setenv("ASYNCTP_HOST_ID", info.rank % 2 == 0 ? "even" : "odd", 1);
        auto group = Group::create(info, testing::rank_group_options(options, info.rank));
        EXPECT_FALSE(group->single_node());
        EXPECT_EQ(group->node_of(0), 0);
        EXPECT_EQ(group->node_of(1), 1);
        EXPECT_EQ(group->node_of(2), 0);
        EXPECT_EQ(group->node_of(3), 1);
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

TEST(GroupAcrossRanks, BarrierWaitsForEveryRank) {
  constexpr int kRanks = 4;
  const auto options = fast_options();
  auto statuses = testing::run_processes(
      kRanks,
      [&](const RendezvousInfo& info) {
        auto group = Group::create(info, testing::rank_group_options(options, info.rank));
        for (int round = 0; round < 3; ++round) {
          // Ranks arrive at different times; none may leave before the last has arrived.
          std::this_thread::sleep_for(Millis(30 * ((info.rank + round) % kRanks)));
          group->store().set(fmt::format("arrived/{}/{}", round, info.rank), "");
          group->barrier("rounds");
          std::vector<std::string> keys;
          for (int r = 0; r < kRanks; ++r)
            keys.push_back(fmt::format("arrived/{}/{}", round, r));
          EXPECT_TRUE(group->store().check(keys)) << "left barrier round " << round << " early";
        }
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

TEST(GroupAcrossRanks, BarrierTimesOutNamingRankAndTag) {
  auto options = fast_options();
  options.group_timeout = Millis(1000);
  auto statuses = testing::run_processes(
      2,
      [&](const RendezvousInfo& info) {
        auto group = Group::create(info, testing::rank_group_options(options, info.rank));
        if (info.rank == 1) return;  // never arrives
        const auto start = Clock::now();
        EXPECT_THAT([&] { group->barrier("stuck"); },
                    ThrowsMessage<TimeoutError>(
                        AllOf(HasSubstr("rank 0: store wait('asynctp/barrier/stuck/0/done')"),
                              HasSubstr("timed out after 1 s"))));
        const double waited = std::chrono::duration<double>(Clock::now() - start).count();
        EXPECT_GE(waited, 0.9);
        EXPECT_LT(waited, 10.0);
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

// A rank that never comes to the rendezvous is named, not only the store key it left unset.
TEST(GroupAcrossRanks, RendezvousTimeoutNamesTheRankThatNeverCame) {
  auto options = fast_options();
  options.group_timeout = Millis(1000);
  auto statuses = testing::run_processes(
      3,
      [&](const RendezvousInfo& info) {
        if (info.rank == 2) return;  // never joins
        EXPECT_THAT([&] { Group::create(info, testing::rank_group_options(options, info.rank)); },
                    ThrowsMessage<TimeoutError>(
                        AllOf(HasSubstr(fmt::format("rank {}: rank 2 of 3 never joined the group "
                                                    "(asynctp/host/2 never came)",
                                                    info.rank)),
                              HasSubstr("timed out after 1 s"))));
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

TEST(GroupAcrossRanks, NextKeyIsTheSameOnEveryRank) {
  const auto options = fast_options();
  auto statuses = testing::run_processes(
      3,
      [&](const RendezvousInfo& info) {
        auto group = Group::create(info, testing::rank_group_options(options, info.rank));
        const std::string first = group->next_key("symm/cpu");
        const std::string second = group->next_key("symm/cpu");
        const std::string other = group->next_key("other");
        EXPECT_EQ(first, "asynctp/symm/cpu/0");
        EXPECT_EQ(second, "asynctp/symm/cpu/1");
        EXPECT_EQ(other, "asynctp/other/2");  // one counter for every name
        for (const auto& key : all_gather_string(*group, "key", first + "|" + other)) {
          EXPECT_EQ(key, first + "|" + other);
        }
        // Barriers draw from the same counter, on every rank alike.
        group->barrier("b");
        EXPECT_EQ(group->next_key("x"), "asynctp/x/4");
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

TEST(GroupAcrossRanks, RankZeroKeepsServingUntilEveryRankIsDone) {
  // Rank 0 serves the store itself (as in a real job) and finishes first; a slower rank's last
  // store calls must still be answered, because rank 0's Group waits for it on destruction.
  const int port = net::pick_free_port();
  auto options = fast_options();
  auto statuses = testing::run_processes(
      3,
      [&](RendezvousInfo info) {
        info.master_port = port;
        GroupOptions group_options;
        group_options.timeout = Millis(10'000);
        group_options.serve_store = true;
        auto group = Group::create(info, group_options);
        group->barrier("started");
        if (info.rank == 0) return;  // done at once; ~Group waits for the others
        std::this_thread::sleep_for(Millis(200 * info.rank));
        group->store().set(fmt::format("late/{}", info.rank), "x");
        EXPECT_EQ(group->store().get(fmt::format("late/{}", info.rank)), "x");
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

}  // namespace
}  // namespace asynctp
