// CPU symmetric memory across real processes: visibility of every peer's writes, signal
// handshakes on several channels reused many times without reset, barriers, timeouts that name
// rank, peer and channel, allocation mismatches, and the growing workspace. The harness checks
// that nothing of a run is left in /dev/shm.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>

#include "core/deadline.h"
#include "support/multiprocess.h"
#include "support/tensor_testing.h"
#include "symm/cpu_symmetric_memory.h"
#include "symm/symmetric_memory.h"
#include "symm/workspace.h"

namespace asynctp {
namespace {

using testing::error_of;
using ::testing::HasSubstr;

class SymmWorldTest : public ::testing::TestWithParam<int> {
 protected:
  int world_size() const { return GetParam(); }
};

std::string world_name(const ::testing::TestParamInfo<int>& info) {
  return fmt::format("ws{}", info.param);
}

TEST_P(SymmWorldTest, EveryRankSeesEveryPeersWrites) {
  auto statuses = testing::run_ranks(world_size(), [](OpContext& ctx) {
    auto allocator = make_cpu_symm_allocator(ctx.group());
    ASSERT_EQ(allocator->unavailable_reason(), "");
    const int rank = ctx.rank(), ws = ctx.world_size();
    constexpr int64_t kInts = 1000;  // not a multiple of the page size
    auto sm = allocator->allocate(kInts * sizeof(int32_t));
    EXPECT_EQ(sm->rank(), rank);
    EXPECT_EQ(sm->world_size(), ws);
    EXPECT_EQ(sm->size(), kInts * sizeof(int32_t));
    Stream& stream = ctx.stream();
    for (int round = 0; round < 3; ++round) {
      // Each rank writes its own buffer; after the barrier everyone reads everyone's.
      auto* mine = static_cast<int32_t*>(sm->buffer_ptr(rank));
      for (int64_t i = 0; i < kInts; ++i)
        mine[i] = static_cast<int32_t>(round * 1'000'000 + rank * kInts + i);
      sm->barrier(0, stream);
      stream.synchronize();
      for (int peer = 0; peer < ws; ++peer) {
        const Tensor view = sm->buffer(peer, {kInts}, DType::kF32);
        EXPECT_EQ(view.data(), sm->buffer_ptr(peer));
        const auto* theirs = static_cast<const int32_t*>(sm->buffer_ptr(peer));
        for (int64_t i = 0; i < kInts; ++i) {
          ASSERT_EQ(theirs[i], round * 1'000'000 + peer * kInts + i)
              << "round " << round << ", peer " << peer << ", element " << i;
        }
      }
      sm->barrier(0, stream);  // nobody reads any more: the next round may overwrite
      stream.synchronize();
    }
    // Writes into a peer's buffer are seen by that peer too.
    const int next = (rank + 1) % ws;
    static_cast<int32_t*>(sm->buffer_ptr(next))[rank] = 7 + rank;
    sm->barrier(1, stream);
    stream.synchronize();
    const int prev = (rank - 1 + ws) % ws;
    EXPECT_EQ(static_cast<int32_t*>(sm->buffer_ptr(rank))[prev], 7 + prev);
  });
  EXPECT_RANKS_OK(statuses);
}

// reset_and_barrier: the flags a rank owns (peers raise them, as the native all-gather's ready
// flags) read 0 on every peer past the barrier, and nothing else on the pad changes.
TEST_P(SymmWorldTest, ResetAndBarrierClearsTheOwnFlagsForEveryPeer) {
  auto statuses = testing::run_ranks(world_size(), [](OpContext& ctx) {
    auto allocator = make_cpu_symm_allocator(ctx.group());
    auto sm = allocator->allocate(64);
    const int rank = ctx.rank(), ws = ctx.world_size();
    constexpr int kFlagChannel = 1;
    Stream& stream = ctx.stream();
    for (int round = 0; round < 3; ++round) {
      // Every rank raises flag [1][rank] on every peer's pad (and its own).
      for (int peer = 0; peer < ws; ++peer) {
        std::atomic_ref<uint32_t>(sm->signal_pad_ptr(peer)[kFlagChannel * ws + rank])
            .store(round + 1, std::memory_order_release);
      }
      sm->barrier(0, stream);
      stream.synchronize();
      uint32_t* mine = sm->signal_pad_ptr(rank) + kFlagChannel * ws;
      for (int src = 0; src < ws; ++src)
        EXPECT_EQ(std::atomic_ref<uint32_t>(mine[src]).load(), round + 1u) << "from " << src;
      sm->reset_and_barrier(mine, ws, 0, stream);
      stream.synchronize();
      for (int peer = 0; peer < ws; ++peer) {
        uint32_t* theirs = sm->signal_pad_ptr(peer) + kFlagChannel * ws;
        for (int src = 0; src < ws; ++src) {
          EXPECT_EQ(std::atomic_ref<uint32_t>(theirs[src]).load(), 0u)
              << "round " << round << ": flag " << src << " of rank " << peer;
        }
      }
      sm->barrier(0, stream);  // everyone has checked before the next round raises them again
      stream.synchronize();
    }
    EXPECT_THAT(error_of([&] { sm->reset_and_barrier(nullptr, 2, 0, stream); }),
                HasSubstr("reset_and_barrier: 2 flags"));
  });
  EXPECT_RANKS_OK(statuses);
}

TEST_P(SymmWorldTest, SignalHandshakesOnSeveralChannelsWithoutReset) {
  auto statuses = testing::run_ranks(world_size(), [](OpContext& ctx) {
    auto allocator = make_cpu_symm_allocator(ctx.group());
    auto sm = allocator->allocate(sizeof(int64_t) * kNumChannels);
    const int rank = ctx.rank(), ws = ctx.world_size();
    const int next = (rank + 1) % ws, prev = (rank - 1 + ws) % ws;
    Stream& stream = ctx.stream();
    // A token passed around the ring on each channel in turn; each hop writes the counter into
    // the next rank's buffer, then signals. 200 rounds reuse every flag 200 times.
    constexpr int kRounds = 200;
    auto* mine = static_cast<int64_t*>(sm->buffer_ptr(rank));
    auto* theirs = static_cast<int64_t*>(sm->buffer_ptr(next));
    for (int round = 0; round < kRounds; ++round) {
      const int channel = round % kNumChannels;
      if (ws == 1) break;
      if (rank == 0) {
        theirs[channel] = round * ws;
        sm->put_signal(next, channel, stream);
        stream.synchronize();
        sm->wait_signal(prev, channel, stream);
        stream.synchronize();
        ASSERT_EQ(mine[channel], round * ws + ws - 1) << "round " << round;
      } else {
        sm->wait_signal(prev, channel, stream);
        stream.synchronize();
        ASSERT_EQ(mine[channel], round * ws + rank - 1) << "round " << round;
        theirs[channel] = mine[channel] + 1;
        sm->put_signal(next, channel, stream);
        stream.synchronize();
      }
    }
    // All-to-all on every channel at once: each rank signals every peer on every channel before
    // waiting for any (each flag holds one pending signal).
    for (int round = 0; round < 20; ++round) {
      for (int channel = 0; channel < kNumChannels; ++channel) {
        for (int peer = 0; peer < ws; ++peer) {
          if (peer != rank) {
            sm->put_signal(peer, channel, stream);
            stream.synchronize();
          }
        }
      }
      for (int channel = kNumChannels - 1; channel >= 0; --channel) {
        for (int peer = ws - 1; peer >= 0; --peer) {
          if (peer != rank) {
            sm->wait_signal(peer, channel, stream);
            stream.synchronize();
          }
        }
      }
    }
    // Once everyone is past its waits, every flag is back to 0 in every pad.
    ctx.group().barrier("all-to-all done");
    for (int peer = 0; peer < ws; ++peer) {
      const uint32_t* pad = sm->signal_pad_ptr(peer);
      for (int i = 0; i < kNumChannels * ws; ++i) {
        EXPECT_EQ(std::atomic_ref<const uint32_t>(pad[i]).load(), 0u)
            << "pad of rank " << peer << ", flag " << i;
      }
    }
    ctx.group().barrier("pads checked");
    for (int i = 0; i < 100; ++i)
      sm->barrier(i % kNumChannels, stream);
    stream.synchronize();
  });
  EXPECT_RANKS_OK(statuses);
}

TEST_P(SymmWorldTest, BarrierOrdersWritesRepeatedly) {
  auto statuses = testing::run_ranks(world_size(), [](OpContext& ctx) {
    auto allocator = make_cpu_symm_allocator(ctx.group());
    const int rank = ctx.rank(), ws = ctx.world_size();
    auto sm = allocator->allocate(sizeof(int32_t));
    for (int round = 1; round <= 100; ++round) {
      *static_cast<int32_t*>(sm->buffer_ptr(rank)) = round * (rank + 1);
      sm->barrier(3, ctx.stream());
      ctx.stream().synchronize();
      for (int peer = 0; peer < ws; ++peer) {
        ASSERT_EQ(*static_cast<int32_t*>(sm->buffer_ptr(peer)), round * (peer + 1)) << round;
      }
      sm->barrier(4, ctx.stream());
      ctx.stream().synchronize();
    }
  });
  EXPECT_RANKS_OK(statuses);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SymmWorldTest, ::testing::Values(1, 2, 3, 5, 8), world_name);

TEST(SymmTimeoutTest, WaitOnSilentPeerNamesRankPeerAndChannel) {
  testing::HarnessOptions options;
  options.group_timeout = Millis(2000);  // also bounds group startup: not too tight under ASan
  auto statuses = testing::run_ranks(
      3,
      [](OpContext& ctx) {
        auto allocator = make_cpu_symm_allocator(ctx.group());
        auto sm = allocator->allocate(64);
        const std::string done_key = "test/timeout-done";
        if (ctx.rank() == 2) {
          const auto start = Clock::now();
          try {
            sm->wait_signal(1, 5, ctx.stream());
            ctx.stream().synchronize();
            ADD_FAILURE() << "wait_signal returned without a signal";
          } catch (const TimeoutError& e) {
            EXPECT_THAT(e.what(), HasSubstr("rank 2: wait_signal from peer 1 on channel 5"));
            EXPECT_THAT(e.what(), HasSubstr("timed out after 2 s"));
          }
          EXPECT_GE(Clock::now() - start, Millis(1990));
          // The flag is untouched by the failed wait: a later signal still goes through.
          ctx.group().store().set(done_key, "1");
          sm->wait_signal(1, 5, ctx.stream());
          ctx.stream().synchronize();
        } else if (ctx.rank() == 1) {
          ctx.group().store().get(done_key, Millis(20'000));
          sm->put_signal(2, 5, ctx.stream());
          ctx.stream().synchronize();
        }
        // A put_signal whose previous signal was never consumed times out as well.
        if (ctx.rank() == 0) {
          sm->put_signal(1, 6, ctx.stream());
          ctx.stream().synchronize();
          EXPECT_THAT(error_of([&] {
                        sm->put_signal(1, 6, ctx.stream());
                        ctx.stream().synchronize();
                      }),
                      HasSubstr("rank 0: put_signal to peer 1 on channel 6 timed out"));
          ctx.group().store().set("test/put-done", "1");
        } else if (ctx.rank() == 1) {
          ctx.group().store().get("test/put-done", Millis(20'000));
          sm->wait_signal(0, 6, ctx.stream());
          ctx.stream().synchronize();
        }
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

TEST(SymmTimeoutTest, TimeoutIsATimeoutErrorForBarriersToo) {
  testing::HarnessOptions options;
  options.group_timeout = Millis(2000);  // also bounds group startup: not too tight under ASan
  auto statuses = testing::run_ranks(
      2,
      [](OpContext& ctx) {
        auto allocator = make_cpu_symm_allocator(ctx.group());
        auto sm = allocator->allocate(64);
        if (ctx.rank() == 0) {
          EXPECT_THROW(
              {
                sm->barrier(2, ctx.stream());
                ctx.stream().synchronize();
              },
              TimeoutError);
          ctx.group().store().set("test/barrier-done", "1");
        } else {
          ctx.group().store().get("test/barrier-done", Millis(20'000));
          // Rank 0's half of the barrier is still pending on channel 2: consume it.
          sm->wait_signal(0, 2, ctx.stream());
          ctx.stream().synchronize();
        }
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

TEST(SymmArgumentsTest, PeerChannelAndViewBoundsAreChecked) {
  auto statuses = testing::run_ranks(2, [](OpContext& ctx) {
    auto allocator = make_cpu_symm_allocator(ctx.group());
    auto sm = allocator->allocate(256);
    EXPECT_THAT(error_of([&] { sm->buffer_ptr(2); }),
                HasSubstr("buffer_ptr: peer 2 out of range [0, 2)"));
    EXPECT_THAT(error_of([&] { sm->signal_pad_ptr(-1); }), HasSubstr("peer -1 out of range"));
    EXPECT_THAT(
        error_of([&] { sm->put_signal(0, kNumChannels, ctx.stream()); }),
        HasSubstr(fmt::format("put_signal: channel {0} out of range [0, {0})", kNumChannels)));
    EXPECT_THAT(error_of([&] { sm->wait_signal(1, -1, ctx.stream()); }),
                HasSubstr("wait_signal: channel -1 out of range"));
    EXPECT_THAT(error_of([&] { sm->barrier(kNumChannels + 1, ctx.stream()); }),
                HasSubstr(fmt::format("barrier: channel {}", kNumChannels + 1)));
    EXPECT_NO_THROW(sm->buffer(1, {64}, DType::kF32));
    EXPECT_THAT(error_of([&] { sm->buffer(1, {64}, DType::kF32, 4); }),
                HasSubstr("needs 260 bytes; the allocation has 256"));
    EXPECT_THAT(error_of([&] { sm->buffer(0, {65}, DType::kF32); }), HasSubstr("f32[65]"));
  });
  EXPECT_RANKS_OK(statuses);
}

TEST(SymmAllocationTest, SizeMismatchBetweenRanksIsAClearErrorOnEveryRank) {
  auto statuses = testing::run_ranks(3, [](OpContext& ctx) {
    auto allocator = make_cpu_symm_allocator(ctx.group());
    const size_t bytes = ctx.rank() == 2 ? 2048 : 1024;
    const std::string msg = error_of([&] { allocator->allocate(bytes); });
    EXPECT_THAT(msg, HasSubstr("every rank must allocate the same sizes"));
    if (ctx.rank() == 2) {
      EXPECT_THAT(msg, HasSubstr("rank 2 asked for 2048 bytes but rank 0 for 1024"));
    } else {
      EXPECT_THAT(msg, HasSubstr(fmt::format("rank {} asked for 1024 bytes but rank 2 for 2048",
                                             ctx.rank())));
    }
  });
  EXPECT_RANKS_OK(statuses);
}

TEST(SymmAllocationTest, SeveralAllocationsAreIndependent) {
  auto statuses = testing::run_ranks(3, [](OpContext& ctx) {
    auto allocator = make_cpu_symm_allocator(ctx.group());
    auto a = allocator->allocate(4096 * 3 + 8);
    auto b = allocator->allocate(16);
    auto empty = allocator->allocate(0);
    EXPECT_EQ(empty->size(), 0u);
    const int rank = ctx.rank();
    static_cast<char*>(a->buffer_ptr(rank))[4096 * 3 + 7] = static_cast<char>('a' + rank);
    static_cast<char*>(b->buffer_ptr(rank))[15] = static_cast<char>('A' + rank);
    a->barrier(0, ctx.stream());
    ctx.stream().synchronize();
    b->barrier(0, ctx.stream());  // separate pads: these flags are independent of a's
    ctx.stream().synchronize();
    for (int peer = 0; peer < 3; ++peer) {
      EXPECT_EQ(static_cast<char*>(a->buffer_ptr(peer))[4096 * 3 + 7], 'a' + peer);
      EXPECT_EQ(static_cast<char*>(b->buffer_ptr(peer))[15], 'A' + peer);
    }
    empty->barrier(7, ctx.stream());
    ctx.stream().synchronize();
  });
  EXPECT_RANKS_OK(statuses);
}

TEST(SymmAllocationTest, GroupSpanningNodesHasNoSymmetricMemory) {
  testing::HarnessOptions options;
  options.host_id = [](int rank) { return rank < 2 ? "node-a" : "node-b"; };
  auto statuses = testing::run_ranks(
      4,
      [](OpContext& ctx) {
        auto allocator = make_cpu_symm_allocator(ctx.group());
        EXPECT_EQ(allocator->unavailable_reason(),
                  "the group spans 2 nodes; shared memory reaches one node only");
        EXPECT_THAT(error_of([&] { allocator->allocate(64); }),
                    HasSubstr("cannot allocate symmetric memory: the group spans 2 nodes"));
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

TEST(SymmWorkspaceTest, GrowsOnDemandUpToItsLimit) {
  auto statuses = testing::run_ranks(3, [](OpContext& ctx) {
    auto allocator = make_cpu_symm_allocator(ctx.group());
    constexpr size_t kMiB = size_t{1} << 20;
    SymmWorkspace ws(*allocator, ctx.backend(), 3 * kMiB + 100);
    EXPECT_EQ(ws.capacity(), 0u);
    EXPECT_EQ(ws.max_bytes(), 3 * kMiB + 100);
    EXPECT_TRUE(ws.fits(3 * kMiB + 100));
    EXPECT_FALSE(ws.fits(3 * kMiB + 101));
    EXPECT_EQ(ws.unavailable_reason(), "");

    SymmetricMemory* first = &ws.get(100, ctx.stream());
    EXPECT_GE(ws.capacity(), 100u);
    EXPECT_EQ(&ws.get(50, ctx.stream()), first);  // fits: no reallocation
    EXPECT_EQ(&ws.get(ws.capacity(), ctx.stream()), first);

    // Growing is collective; the new buffer works across processes like the first.
    SymmetricMemory& grown = ws.get(kMiB + 1, ctx.stream());
    EXPECT_GE(ws.capacity(), kMiB + 1);
    EXPECT_LE(ws.capacity(), ws.max_bytes());
    auto* mine = static_cast<char*>(grown.buffer_ptr(ctx.rank()));
    mine[kMiB] = static_cast<char>(ctx.rank() + 1);
    grown.barrier(0, ctx.stream());
    ctx.stream().synchronize();
    for (int peer = 0; peer < 3; ++peer) {
      EXPECT_EQ(static_cast<char*>(grown.buffer_ptr(peer))[kMiB], peer + 1);
    }
    grown.barrier(0, ctx.stream());
    ctx.stream().synchronize();
    ws.get(ws.max_bytes(), ctx.stream());
    EXPECT_EQ(ws.capacity(), ws.max_bytes());

    EXPECT_THAT(error_of([&] { ws.get(ws.max_bytes() + 1, ctx.stream()); }),
                HasSubstr(fmt::format("would need {} bytes; its limit is {}", 3 * kMiB + 101,
                                      3 * kMiB + 100)));
    EXPECT_EQ(ws.capacity(), ws.max_bytes());  // the failed request changed nothing
  });
  EXPECT_RANKS_OK(statuses);
}

}  // namespace
}  // namespace asynctp
