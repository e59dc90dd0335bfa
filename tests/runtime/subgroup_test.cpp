// Groups beyond the world: a group over any store (a host framework's, through CallbackStore),
// and subgroups of a group (split): the TP and DP groups of a 2-D mesh side by side, their own
// key namespaces, run ids and node maps, global ranks, and the named errors of a bad split.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include <asynctp/group.h>
#include "core/error.h"
#include "support/multiprocess.h"

namespace asynctp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::StartsWith;
using ::testing::ThrowsMessage;

testing::HarnessOptions fast_options() {
  testing::HarnessOptions options;
  options.group_timeout = Millis(10'000);
  options.run_timeout = Millis(60'000);
  return options;
}

std::vector<std::string> all_gather_string(Group& group, const std::string& tag,
                                           const std::string& value) {
  group.store().set(fmt::format("test/{}/{}", tag, group.rank()), value);
  std::vector<std::string> out;
  for (int r = 0; r < group.world_size(); ++r)
    out.push_back(group.store().get(fmt::format("test/{}/{}", tag, r)));
  return out;
}

// A host store as the C ABI and the torch binding see one: callbacks, here into a TcpStore
// client of the harness's server.
std::shared_ptr<Store> host_store(const RendezvousInfo& info, Millis timeout) {
  auto tcp = std::make_shared<TcpStore>(info.master_addr, info.master_port, timeout, info.rank,
                                        info.store_secret);
  StoreCallbacks cb;
  cb.set = [tcp](const std::string& k, const std::string& v) { tcp->set(k, v); };
  cb.get = [tcp](const std::string& k, Millis t) -> std::optional<std::string> {
    try {
      return tcp->get(k, t);
    } catch (const TimeoutError&) {
      return std::nullopt;
    }
  };
  cb.add = [tcp](const std::string& k, int64_t d) { return tcp->add(k, d); };
  cb.check = [tcp](const std::string& k) { return tcp->check({k}); };
  cb.erase = [tcp](const std::string& k) { tcp->erase(k); };
  return std::make_shared<CallbackStore>(cb, timeout, info.rank);
}

TEST(GroupOverAStore, RendezvousThroughCallbacks) {
  const auto options = fast_options();
  auto statuses = testing::run_processes(
      4,
      [&](const RendezvousInfo& info) {
        // Two nodes of two ranks; local ranks as torchrun would give them.
        GroupInfo g{info.rank, 4, info.rank % 2, 2};
        GroupOptions go;
        go.timeout = options.group_timeout;
        go.host_id = fmt::format("node{}", info.rank / 2);
        auto store = host_store(info, go.timeout);
        auto world = Group::create(std::make_shared<PrefixStore>(store, "pg/world"), g, go);
        EXPECT_EQ(world->rank(), info.rank);
        EXPECT_EQ(world->world_size(), 4);
        EXPECT_EQ(world->local_rank(), info.rank % 2);
        EXPECT_EQ(world->local_world_size(), 2);
        EXPECT_FALSE(world->single_node());
        EXPECT_EQ(world->node_of(1), 0);
        EXPECT_EQ(world->node_of(2), 1);
        EXPECT_EQ(world->global_rank(3), 3);
        // The harness's run id, extended so that groups over one store stay apart.
        const std::string run = std::getenv("ASYNCTP_RUN_ID");
        EXPECT_THAT(world->run_id(), MatchesRegex(run + "-[0-9a-f]{8}"));
        for (const auto& id : all_gather_string(*world, "run", world->run_id()))
          EXPECT_EQ(id, world->run_id());
        world->barrier("over callbacks");

        // A second group over the same host store, in its own namespace (as each torch process
        // group has): its own run id, no key shared with the first.
        auto again = Group::create(std::make_shared<PrefixStore>(store, "pg/again"), g, go);
        EXPECT_NE(again->run_id(), world->run_id());
        again->barrier("over callbacks");
        EXPECT_TRUE(store->check({"pg/world/asynctp/group/1/asynctp/run_id",
                                  "pg/again/asynctp/group/1/asynctp/run_id"}));

        // Two groups over the very same store, made in the same order on every rank: numbered
        // namespaces keep them apart.
        auto first = Group::create(store, g, go);
        auto second = Group::create(store, g, go);
        EXPECT_NE(first->run_id(), second->run_id());
        for (const auto& id : all_gather_string(*second, "run", second->run_id()))
          EXPECT_EQ(id, second->run_id());
        first->store().set(fmt::format("mine/{}", info.rank), "first");
        second->store().set(fmt::format("mine/{}", info.rank), "second");
        second->barrier("both set");
        first->barrier("both set");
        for (int r = 0; r < 4; ++r) {
          EXPECT_EQ(first->store().get(fmt::format("mine/{}", r)), "first");
          EXPECT_EQ(second->store().get(fmt::format("mine/{}", r)), "second");
        }
        EXPECT_EQ(store->get("asynctp/group/2/mine/0"), "second");
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

TEST(GroupOverAStore, BadArgumentsAreNamed) {
  EXPECT_THAT(
      [] {
        Group::create(std::shared_ptr<Store>(), GroupInfo{1, 2, 0, 1});
      },
      ThrowsMessage<Error>(HasSubstr("rank 1: Group::create needs a store, got null")));
  auto store = std::make_shared<TcpStore>("127.0.0.1", 1, Millis(100), 0, std::string(32, 's'));
  EXPECT_THAT(
      [&] {
        Group::create(store, GroupInfo{2, 2, 0, 1});
      },
      ThrowsMessage<Error>(HasSubstr("rank 2 out of range [0, 2)")));
  EXPECT_THAT(
      [&] {
        Group::create(store, GroupInfo{0, 2, 3, 2});
      },
      ThrowsMessage<Error>(HasSubstr("rank 0: local rank 3 out of range [0, 2)")));
}

// The 2 x 2 mesh of 4 ranks: TP groups {0,1} {2,3}, DP groups {0,2} {1,3}; every rank makes
// both of its groups and uses them side by side.
TEST(Split, MeshOfTwoByTwo) {
  const auto options = fast_options();
  auto statuses = testing::run_processes(
      4,
      [&](const RendezvousInfo& info) {
        auto go = testing::rank_group_options(options, info.rank);
        go.host_id = fmt::format("node{}", info.rank / 2);  // TP within a node, DP across
        auto world = Group::create(info, go);
        const int r = info.rank;
        const std::vector<int> tp_ranks = {r / 2 * 2, r / 2 * 2 + 1};
        const std::vector<int> dp_ranks = {r % 2, r % 2 + 2};
        auto tp = world->split(tp_ranks);
        auto dp = world->split(dp_ranks);
        EXPECT_EQ(tp->world_size(), 2);
        EXPECT_EQ(tp->rank(), r % 2);
        EXPECT_EQ(dp->rank(), r / 2);
        EXPECT_EQ(tp->local_rank(), world->local_rank());  // the GPU it drives
        EXPECT_EQ(dp->local_world_size(), world->local_world_size());
        EXPECT_EQ(tp->global_rank(0), tp_ranks[0]);
        EXPECT_EQ(tp->global_rank(1), tp_ranks[1]);
        EXPECT_EQ(dp->global_rank(1), dp_ranks[1]);
        EXPECT_TRUE(tp->single_node());
        EXPECT_FALSE(dp->single_node());
        EXPECT_EQ(dp->node_of(0), 0);
        EXPECT_EQ(dp->node_of(1), 1);
        EXPECT_THAT([&] { tp->global_rank(2); },
                    ThrowsMessage<Error>(HasSubstr("global_rank: rank 2 out of range [0, 2)")));

        // Run ids: under the world's, the same across a group, different between groups.
        EXPECT_THAT(tp->run_id(), StartsWith(world->run_id() + "-"));
        EXPECT_NE(tp->run_id(), dp->run_id());
        const auto tp_ids = all_gather_string(*world, "tp", tp->run_id());
        const auto dp_ids = all_gather_string(*world, "dp", dp->run_id());
        EXPECT_EQ(tp_ids[0], tp_ids[1]);
        EXPECT_EQ(tp_ids[2], tp_ids[3]);
        EXPECT_NE(tp_ids[0], tp_ids[2]);
        EXPECT_EQ(dp_ids[0], dp_ids[2]);
        EXPECT_EQ(dp_ids[1], dp_ids[3]);
        EXPECT_NE(dp_ids[0], dp_ids[1]);
        std::set<std::string> every_id(tp_ids.begin(), tp_ids.end());
        every_id.insert(dp_ids.begin(), dp_ids.end());
        EXPECT_EQ(every_id.size(), 4u);

        // The same key in every group holds that group's own value: TP {0,1} and {2,3} use
        // the same key names ("asynctp/x/0", barriers) without meeting.
        for (int round = 0; round < 3; ++round) {
          const std::string tp_key = tp->next_key("x");
          const std::string dp_key = dp->next_key("x");
          tp->store().set(fmt::format("{}/{}", tp_key, tp->rank()),
                          fmt::format("tp{}", tp_ranks[0]));
          dp->store().set(fmt::format("{}/{}", dp_key, dp->rank()),
                          fmt::format("dp{}", dp_ranks[0]));
          for (int p = 0; p < 2; ++p) {
            EXPECT_EQ(tp->store().get(fmt::format("{}/{}", tp_key, p)),
                      fmt::format("tp{}", tp_ranks[0]));
            EXPECT_EQ(dp->store().get(fmt::format("{}/{}", dp_key, p)),
                      fmt::format("dp{}", dp_ranks[0]));
          }
          tp->barrier("round");
          dp->barrier("round");
          world->barrier("round");
        }

        // A repeated split of the same ranks is a new group with a new namespace; a split of a
        // subgroup works in turn (here the group of itself alone).
        auto tp_again = world->split(tp_ranks);
        EXPECT_NE(tp_again->run_id(), tp->run_id());
        tp_again->barrier("again");
        const int me = tp->rank();
        auto alone = tp->split(std::vector<int>{me});
        EXPECT_EQ(alone->world_size(), 1);
        EXPECT_EQ(alone->global_rank(0), r);
        alone->barrier("alone");
        // Reversed order: ranks[i] becomes rank i.
        auto reversed = tp->split(std::vector<int>{1, 0});
        EXPECT_EQ(reversed->rank(), 1 - tp->rank());
        EXPECT_EQ(reversed->global_rank(0), tp_ranks[1]);
        reversed->barrier("reversed");
        // The world is still usable, and subgroups keep it alive after the caller drops it.
        world->barrier("end");
        world.reset();
        tp->barrier("after the world is dropped");
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

TEST(Split, BadRankListsAreNamed) {
  const auto options = fast_options();
  auto statuses = testing::run_processes(
      3,
      [&](const RendezvousInfo& info) {
        auto world = Group::create(info, testing::rank_group_options(options, info.rank));
        const int r = info.rank;
        EXPECT_THAT([&] { world->split(std::vector<int>{}); },
                    ThrowsMessage<Error>(HasSubstr("split needs at least one rank")));
        EXPECT_THAT(
            [&] {
              world->split(std::vector<int>{r, 3});
            },
            ThrowsMessage<Error>(HasSubstr("split rank 3 (index 1) is out of range [0, 3)")));
        EXPECT_THAT(
            [&] {
              world->split(std::vector<int>{r, r});
            },
            ThrowsMessage<Error>(HasSubstr(fmt::format("split lists rank {} twice", r))));
        const int other = (r + 1) % 3;
        EXPECT_THAT(
            [&] { world->split(std::vector<int>{other}); },
            ThrowsMessage<Error>(AllOf(HasSubstr(fmt::format("rank {}: split({})", r, other)),
                                       HasSubstr("is called by a rank that is not in the list"))));
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

// A member that never arrives: the subgroup's barrier times out naming the key under the
// subgroup's namespace, on the member that waited.
TEST(Split, AMissingMemberTimesOutNamingTheSubgroupsKey) {
  auto options = fast_options();
  options.group_timeout = Millis(800);
  auto statuses = testing::run_processes(
      2,
      [&](const RendezvousInfo& info) {
        auto world = Group::create(info, testing::rank_group_options(options, info.rank));
        if (info.rank == 1) return;
        auto sub = world->split(std::vector<int>{0, 1});
        EXPECT_THAT([&] { sub->barrier("stuck"); },
                    ThrowsMessage<TimeoutError>(AllOf(
                        HasSubstr("rank 0: store wait('asynctp/split/0,1/0/asynctp/barrier/stuck/0/"
                                  "done')"),
                        HasSubstr("timed out after 0.8 s"))));
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

}  // namespace
}  // namespace asynctp
