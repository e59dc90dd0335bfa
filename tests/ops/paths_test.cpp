// Which path the fused ops take, and why: forced by the caller (per op or per context), taken
// because the workspace limit is too small, taken because the group spans nodes; the usage
// counters and reasons; and the error when the caller insists on a fused path that is not
// possible. Every fallback result is checked against the reference.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/cpu_backend.h"
#include "device/cpu_streams.h"
#include "ops/matmul_common.h"
#include "ops/op_testing.h"
#include "support/env_testing.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;  // NOLINT(google-build-using-namespace)
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr char kAgMm[] = "all_gather_matmul";
constexpr char kMmRs[] = "matmul_reduce_scatter";

// all_gather_matmul of A_shard [4, 3] (per rank) with B [3, 4] on dim 0, checked against the
// reference; returns nothing, fails the test on a mismatch.
void all_gather_matmul_checked(OpContext& ctx, std::optional<PathChoice> path) {
  Backend& be = ctx.backend();
  std::vector<OwnedTensor> shards;
  for (int r = 0; r < ctx.world_size(); ++r)
    shards.push_back(seeded({4, 3}, DType::kF32, {1, uint64_t(r)}));
  const OwnedTensor b = seeded({3, 4}, DType::kF32, {2});
  OwnedTensor expected = empty_host({4 * ctx.world_size(), 4}, DType::kF32);
  reference_gemm(be, concat(be, shards, 0), b, expected);
  OwnedTensor out = empty_host({4 * ctx.world_size(), 4}, DType::kF32);
  const Tensor bs[] = {b.tensor};
  const Tensor outs[] = {out.tensor};
  AllGatherMatmulOptions options;
  options.path = path;
  all_gather_matmul(ctx, shards[ctx.rank()], bs, outs, {}, options);
  EXPECT_TRUE(same_bits(out, expected)) << "all_gather_matmul";
}

// matmul_reduce_scatter of A [2 * ws, 3] @ B [3, 4] (per rank) on dim 0, checked likewise.
void matmul_reduce_scatter_checked(OpContext& ctx, std::optional<PathChoice> path) {
  Backend& be = ctx.backend();
  const int ws = ctx.world_size();
  std::vector<OwnedTensor> as, bs, products;
  for (int r = 0; r < ws; ++r) {
    as.push_back(seeded({2 * ws, 3}, DType::kF32, {3, uint64_t(r)}));
    bs.push_back(seeded({3, 4}, DType::kF32, {4, uint64_t(r)}));
    products.push_back(empty_host({2 * ws, 4}, DType::kF32));
    reference_gemm(be, as.back(), bs.back(), products.back());
  }
  OwnedTensor expected = empty_host({2, 4}, DType::kF32);
  reference_reduce_scatter(be, expected, products, 0, ctx.rank(), ReduceOp::kSum);
  OwnedTensor out = empty_host({2, 4}, DType::kF32);
  MatmulReduceScatterOptions options;
  options.path = path;
  matmul_reduce_scatter(ctx, as[ctx.rank()], bs[ctx.rank()], out, options);
  EXPECT_TRUE(same_bits(out, expected)) << "matmul_reduce_scatter";
}

class PathsTest : public ::testing::TestWithParam<int> {};

TEST_P(PathsTest, CallerForcesTheFallbackPerOp) {
  auto statuses = run_ranks(GetParam(), [](OpContext& ctx) {
    all_gather_matmul_checked(ctx, PathChoice::kFallback);
    expect_path(ctx, kAgMm, Path::kFallback, "the caller asked for the fallback");
    all_gather_matmul_checked(ctx, std::nullopt);
    expect_path(ctx, kAgMm, Path::kSplit);
    all_gather_matmul_checked(ctx, PathChoice::kAuto);
    expect_path(ctx, kAgMm, Path::kSplit);
    matmul_reduce_scatter_checked(ctx, PathChoice::kFallback);
    expect_path(ctx, kMmRs, Path::kFallback, "the caller asked for the fallback");
    matmul_reduce_scatter_checked(ctx, PathChoice::kSplit);
    expect_path(ctx, kMmRs, Path::kSplit);

    EXPECT_EQ(ctx.usage().count(kAgMm, Path::kSplit), 2);
    EXPECT_EQ(ctx.usage().count(kAgMm, Path::kFallback), 1);
    EXPECT_EQ(ctx.usage().count(kMmRs, Path::kSplit), 1);
    EXPECT_EQ(ctx.usage().count(kMmRs, Path::kFallback), 1);
    EXPECT_EQ(ctx.usage().count("all_gather_scaled_matmul", Path::kSplit), 0);
    const auto counts = ctx.usage().counts();
    EXPECT_EQ(counts.size(), 4u);
    EXPECT_EQ(counts.at({kAgMm, Path::kSplit}), 2);
    ctx.usage().reset();
    EXPECT_EQ(ctx.usage().count(kAgMm, Path::kSplit), 0);
    EXPECT_FALSE(ctx.usage().last(kAgMm).has_value());
  });
  EXPECT_RANKS_OK(statuses);
}

TEST_P(PathsTest, ContextDefaultPathAndPerOpOverride) {
  HarnessOptions options;
  options.context.path = PathChoice::kFallback;
  auto statuses = run_ranks(
      GetParam(),
      [](OpContext& ctx) {
        all_gather_matmul_checked(ctx, std::nullopt);
        expect_path(ctx, kAgMm, Path::kFallback, "the caller asked for the fallback");
        matmul_reduce_scatter_checked(ctx, std::nullopt);
        expect_path(ctx, kMmRs, Path::kFallback, "the caller asked for the fallback");
        // The op's own choice wins over the context's.
        all_gather_matmul_checked(ctx, PathChoice::kSplit);
        expect_path(ctx, kAgMm, Path::kSplit);
        matmul_reduce_scatter_checked(ctx, PathChoice::kAuto);
        expect_path(ctx, kMmRs, Path::kSplit);
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

// What all_gather_matmul_checked's overlapped paths need: three buffers (eager ops by turns, and
// captured ones) of ws shard slots (4 x 3 f32 = 48 bytes), each 256-byte aligned.
size_t ag_workspace_bytes(int ws) {
  return 3 * ((48 * static_cast<size_t>(ws) + 255) / 256 * 256);
}

TEST_P(PathsTest, WorkspaceLimitTooSmallTakesTheFallback) {
  const int ws = GetParam();
  HarnessOptions options;
  // all_gather_matmul needs three buffers (256-byte aligned) of ws slots of its shard (4 x 3 f32 =
  // 48 bytes each) in the push workspace; matmul_reduce_scatter three buffers of ws slots of its
  // output chunk (2 x 4 f32 = 32 bytes each) in the shared one. The fallback's collectives still
  // fit in pieces.
  options.context.max_workspace_bytes = std::max(20, 4 * ws);
  auto statuses = run_ranks(
      ws,
      [ws](OpContext& ctx) {
        const size_t limit = ctx.workspace().max_bytes();
        all_gather_matmul_checked(ctx, std::nullopt);
        expect_path(ctx, kAgMm, Path::kFallback,
                    fmt::format("it needs {} bytes of symmetric workspace per rank and the limit "
                                "is {} (ASYNCTP_MAX_WORKSPACE_MB)",
                                ag_workspace_bytes(ws), limit));
        matmul_reduce_scatter_checked(ctx, PathChoice::kAuto);
        expect_path(ctx, kMmRs, Path::kFallback,
                    fmt::format("it needs {} bytes of symmetric workspace",
                                3 * ((32 * ws + 255) / 256 * 256)));
        // Insisting on the split path is an error that gives the reason.
        EXPECT_THAT([&] { all_gather_matmul_checked(ctx, PathChoice::kSplit); },
                    ThrowsMessage<PathUnavailableError>(HasSubstr(
                        fmt::format("all_gather_matmul: the split path was requested but it "
                                    "needs {} bytes of symmetric workspace per rank and the "
                                    "limit is {}",
                                    ag_workspace_bytes(ws), limit))));
        EXPECT_THAT([&] { matmul_reduce_scatter_checked(ctx, PathChoice::kSplit); },
                    ThrowsMessage<PathUnavailableError>(HasSubstr(
                        "matmul_reduce_scatter: the split path was requested but it needs")));
        EXPECT_EQ(ctx.usage().count(kAgMm, Path::kFallback),
                  1);  // the refused call recorded nothing
        EXPECT_EQ(ctx.usage().count(kAgMm, Path::kSplit), 0);
        EXPECT_LE(ctx.workspace().capacity(), limit);
        EXPECT_LE(ctx.push_workspace().capacity(), limit);
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

TEST_P(PathsTest, WorkspaceLimitExactlyLargeEnoughStaysFused) {
  const int ws = GetParam();
  HarnessOptions options;
  options.context.max_workspace_bytes = ag_workspace_bytes(ws);  // to the byte
  auto statuses = run_ranks(
      ws,
      [ws](OpContext& ctx) {
        all_gather_matmul_checked(ctx, std::nullopt);
        expect_path(ctx, kAgMm, Path::kSplit);
        EXPECT_EQ(ctx.push_workspace().capacity(), ag_workspace_bytes(ws));
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

TEST_P(PathsTest, WorkspaceLimitZeroTurnsSymmetricMemoryOff) {
  // ASYNCTP_MAX_WORKSPACE_MB=0: every op takes the fallback, and the fallback's collectives
  // still work (they cannot stage anything in a workspace of zero bytes).
  HarnessOptions options;
  options.context.max_workspace_bytes = 0;
  auto statuses = run_ranks(
      GetParam(),
      [](OpContext& ctx) {
        all_gather_matmul_checked(ctx, std::nullopt);
        expect_path(ctx, kAgMm, Path::kFallback, "the limit is 0");
        matmul_reduce_scatter_checked(ctx, std::nullopt);
        expect_path(ctx, kMmRs, Path::kFallback, "the limit is 0");
        EXPECT_EQ(ctx.workspace().capacity(), 0u);
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

TEST_P(PathsTest, GroupSpanningNodesTakesTheFallback) {
  const int ws = GetParam();
  if (ws == 1) GTEST_SKIP() << "one rank is always on one node";
  HarnessOptions options;
  options.host_id = [](int rank) { return fmt::format("host{}", rank % 2); };
  auto statuses = run_ranks(
      ws,
      [](OpContext& ctx) {
        const std::string reason = "the group spans 2 nodes; shared memory reaches one node only";
        all_gather_matmul_checked(ctx, std::nullopt);
        expect_path(ctx, kAgMm, Path::kFallback, reason);
        matmul_reduce_scatter_checked(ctx, std::nullopt);
        expect_path(ctx, kMmRs, Path::kFallback, reason);
        EXPECT_THAT([&] { all_gather_matmul_checked(ctx, PathChoice::kSplit); },
                    ThrowsMessage<PathUnavailableError>(HasSubstr(
                        "all_gather_matmul: the split path was requested but " + reason)));
        EXPECT_THAT([&] { matmul_reduce_scatter_checked(ctx, PathChoice::kSplit); },
                    ThrowsMessage<PathUnavailableError>(HasSubstr(
                        "matmul_reduce_scatter: the split path was requested but " + reason)));
        EXPECT_EQ(ctx.communicator().name(), "store");
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

// The native path takes bf16, f16 or float8 e4m3 operands (the kernel's contract, which the CPU
// backend's emulation checks alike): asked for with f32 ones it fails saying why, as a
// PathUnavailableError; under auto the ops stay on the split path without measuring anything.
TEST_P(PathsTest, NativeRequestedWhereItCannotRunSaysWhy) {
  auto statuses = run_ranks(GetParam(), [](OpContext& ctx) {
    EXPECT_THAT([&] { all_gather_matmul_checked(ctx, PathChoice::kNative); },
                ThrowsMessage<PathUnavailableError>(
                    HasSubstr("the native path was requested but cannot run: inputs are not bf16, "
                              "f16 or float8 e4m3; got inputs = f32")));
    EXPECT_THAT([&] { matmul_reduce_scatter_checked(ctx, PathChoice::kNative); },
                ThrowsMessage<PathUnavailableError>(
                    HasSubstr("the native path was requested but cannot run")));
    all_gather_matmul_checked(ctx, PathChoice::kAuto);
    expect_path(ctx, kAgMm, Path::kSplit);
    EXPECT_EQ(ctx.usage().count(kAgMm, Path::kNative), 0);
  });
  EXPECT_RANKS_OK(statuses);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, PathsTest, ::testing::ValuesIn(kWorldSizes), world_size_name);

// The overlapped paths, in the ops' order of preference.
constexpr Route kOverlapped[] = {Path::kNative, Path::kSplit};
constexpr Route kAllPaths[] = {Path::kNative, Path::kSplit, Path::kFallback};

// Runs `body` on `ranks` ranks without a dispatch cache; the test fails where a rank fails.
void on_ranks_without_cache(int ranks, const std::function<void(OpContext&)>& body) {
  HarnessOptions options;
  options.context.dispatch_cache = "off";
  auto statuses = run_ranks(ranks, body, options);
  EXPECT_RANKS_OK(statuses);
}

// A dispatch cache file of this test process under /tmp ("asynctp_<name>_<pid>.json"), absent.
std::filesystem::path cache_file(std::string_view name) {
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / fmt::format("asynctp_{}_{}.json", name, ::getpid());
  std::filesystem::remove(file);
  return file;
}

// Writes a dispatch cache of `version` holding `entries`.
void write_cache(const std::filesystem::path& file, int version, const nlohmann::json& entries) {
  std::ofstream out(file);
  out << nlohmann::json{{"version", version}, {"entries", entries}}.dump();
}

// Harness options whose contexts use the dispatch cache `file`.
HarnessOptions with_cache(const std::filesystem::path& file) {
  HarnessOptions options;
  options.context.dispatch_cache = file.string();
  return options;
}

// A measured run that takes `length` on the device and next to nothing on the host: its stream
// is held for it (Backend::spin, which sleeps on the CPU backend) and the host only enqueues it.
void device_run(OpContext& ctx, std::chrono::duration<double, std::milli> length) {
  ctx.backend().spin(std::chrono::duration_cast<std::chrono::nanoseconds>(length).count(),
                     ctx.stream());
}

// A run for Dispatcher::pick that counts its calls per path in `runs` and takes the path's
// milliseconds on the device (device_run).
std::function<void(Route)> counting_runner(OpContext& ctx, std::map<Path, int>& runs, int native_ms,
                                           int split_ms, int fallback_ms) {
  return [&ctx, &runs, native_ms, split_ms, fallback_ms](Route r) {
    const Path p = r.path;
    ++runs[p];
    const int ms = p == Path::kNative ? native_ms : p == Path::kSplit ? split_ms : fallback_ms;
    device_run(ctx, std::chrono::milliseconds(ms));
  };
}

TEST(DispatcherTest, CacheLocationFollowsTheEnvironment) {
  ::setenv("ASYNCTP_CACHE_DIR", "/tmp/somewhere", 1);
  EXPECT_EQ(Dispatcher::default_cache_path(), "/tmp/somewhere/dispatch.json");
  ::unsetenv("ASYNCTP_CACHE_DIR");
  ::setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
  EXPECT_EQ(Dispatcher::default_cache_path(), "/tmp/xdg/asynctp/dispatch.json");
  ::unsetenv("XDG_CACHE_HOME");
}

// The dispatcher's measured choice on the CPU backend, with runs that take a set time per rank:
// the native path is faster on average but slower on its slowest rank, so the split path must
// win (the op ends when its slowest rank ends; the bench reports the slowest rank too), on every
// rank alike, with the slowest rank's times in the decision.
TEST(DispatcherTest, ChoosesByTheSlowestRank) {
  // The counts of runs below are paced tuning's: no back-to-back warm-up rounds.
  const testing::ScopedSetEnv paced("ASYNCTP_TUNE_PACE", "1");
  on_ranks_without_cache(2, [](OpContext& ctx) {
    using Ms = std::chrono::duration<double, std::milli>;
    // Margins of 10 ms: a loaded 2-core machine oversleeps by a few ms.
    const double native_ms = ctx.rank() == 0 ? 1.0 : 30.0;  // mean 15.5, slowest 30
    const double split_ms = 20.0;
    int runs = 0;
    const Route path = ctx.dispatcher().pick("test|slowest", kOverlapped, [&](Route r) {
      ++runs;
      device_run(ctx, Ms(r == Path::kNative ? native_ms : split_ms));
    });
    EXPECT_EQ(path, Path::kSplit);
    EXPECT_EQ(runs, 4 + 2 * Dispatcher::tuning_rounds(2));  // two warm-ups each; no close call
    const std::optional<DispatchTiming> t = ctx.dispatcher().decision("test|slowest");
    ASSERT_TRUE(t.has_value());
    EXPECT_FALSE(t->from_disk);
    EXPECT_GE(t->native_us, 30000.0);
    EXPECT_GE(t->split_us, 20000.0);
    EXPECT_LT(t->split_us, t->native_us);
  });
}

// The disk cache: choices written by another version of the paths are measured again and the
// file rewritten at this version; a later process then takes the choice from the file without
// measuring anything.
TEST(DispatcherTest, CacheOfAnotherVersionIsMeasuredAgain) {
  // Entries without a pace were measured paced: at pace 1 only the check under test rejects them.
  const testing::ScopedSetEnv paced("ASYNCTP_TUNE_PACE", "1");
  const std::filesystem::path file = cache_file("dispatch");
  write_cache(file, Dispatcher::kCacheVersion - 1, {{"test|stale", {{"path", "native"}}}});
  const HarnessOptions options = with_cache(file);
  // Native much slower than split: the stale entry said native.
  auto pick = [](OpContext& ctx, int* runs) {
    return ctx.dispatcher().pick("test|stale", kOverlapped, [&](Route r) {
      ++*runs;
      device_run(ctx, std::chrono::milliseconds(r == Path::kNative ? 12 : 1));
    });
  };
  // Every rank picks; `measured`: the choice was measured (else taken from the file).
  auto pick_on_ranks = [&](bool measured) {
    auto statuses = run_ranks(
        2,
        [&](OpContext& ctx) {
          int runs = 0;
          EXPECT_EQ(pick(ctx, &runs), Path::kSplit);
          if (measured) {
            EXPECT_GT(runs, 0);
          } else {
            EXPECT_EQ(runs, 0);
          }
          ASSERT_TRUE(ctx.dispatcher().decision("test|stale").has_value());
          EXPECT_EQ(ctx.dispatcher().decision("test|stale")->from_disk, !measured);
        },
        options);
    EXPECT_RANKS_OK(statuses);
  };
  pick_on_ranks(/*measured=*/true);
  {
    std::ifstream in(file);
    const nlohmann::json j = nlohmann::json::parse(in);
    EXPECT_EQ(j.value("version", 0), Dispatcher::kCacheVersion);
    EXPECT_EQ(j["entries"]["test|stale"].value("path", ""), "split");
  }
  pick_on_ranks(/*measured=*/false);
  std::filesystem::remove(file);
}

// Three candidates: the fallback, fastest on every rank, is taken, each candidate measured as
// often as the others, the times in the decision and in the cache file.
TEST(DispatcherTest, MeasuresTheFallbackBesideTheOverlappedPaths) {
  // The counts of runs below are paced tuning's: no back-to-back warm-up rounds.
  const testing::ScopedSetEnv paced("ASYNCTP_TUNE_PACE", "1");
  const std::filesystem::path file = cache_file("dispatch3");
  const HarnessOptions options = with_cache(file);
  auto statuses = run_ranks(
      2,
      [](OpContext& ctx) {
        std::map<Path, int> runs;
        // Margins of 10 ms and more (see ChoosesByTheSlowestRank).
        const Route path =
            ctx.dispatcher().pick("test|three", kAllPaths, counting_runner(ctx, runs, 15, 30, 2));
        EXPECT_EQ(path, Path::kFallback);
        for (Route r : kAllPaths)
          EXPECT_EQ(runs[r.path], 2 + Dispatcher::tuning_rounds(3)) << route_name(r);
        const std::optional<DispatchTiming> t = ctx.dispatcher().decision("test|three");
        ASSERT_TRUE(t.has_value());
        EXPECT_GE(t->fallback_us, 2000.0);
        EXPECT_LT(t->fallback_us, t->native_us);
        EXPECT_LT(t->native_us, t->split_us);
      },
      options);
  EXPECT_RANKS_OK(statuses);
  std::ifstream in(file);
  const nlohmann::json entry = nlohmann::json::parse(in)["entries"]["test|three"];
  EXPECT_EQ(entry.value("path", ""), "fallback");
  EXPECT_EQ(entry.value("captured_path", ""), "fallback");
  for (const char* field : {"native_us", "split_us", "fallback_us", "native_host_us",
                            "split_host_us", "fallback_host_us"})
    EXPECT_GT(entry.value(field, 0.0), 0.0) << field;
  std::filesystem::remove(file);
}

// A path that is faster on the device but slow to enqueue: eager calls take the least device +
// host time, captured ones (whose replays enqueue nothing) the least device time, and the cache
// keeps both. Native: 15 ms on the device, enqueued at once; split: the host takes 25 ms before
// it enqueues 3 ms of device work. Each tuning run starts behind a device spin of twice the
// longest enqueueing, so split's device time holds none of the host's 25 ms. Eager: native 15
// against split 28; captured: split 3 against native 15.
TEST(DispatcherTest, EagerCallsCountTheHostTimeCapturedCallsDoNot) {
  const std::filesystem::path file = cache_file("dispatch_host");
  const HarnessOptions options = with_cache(file);
  auto statuses = run_ranks(
      2,
      [](OpContext& ctx) {
        using Ms = std::chrono::milliseconds;
        const Route path = ctx.dispatcher().pick("test|host", kOverlapped, [&](Route r) {
          if (r == Path::kSplit) std::this_thread::sleep_for(Ms(25));
          device_run(ctx, Ms(r == Path::kSplit ? 3 : 15));
        });
        EXPECT_EQ(path, Path::kNative);
        const std::optional<DispatchTiming> t = ctx.dispatcher().decision("test|host");
        ASSERT_TRUE(t.has_value());
        EXPECT_EQ(t->path, Path::kNative);
        EXPECT_EQ(t->path_for(false), Path::kNative);
        EXPECT_EQ(t->captured_path, Path::kSplit);
        EXPECT_EQ(t->path_for(true), Path::kSplit);
        EXPECT_GE(t->split_host_us, 25000.0);
        EXPECT_LT(t->native_host_us, t->split_host_us);
        EXPECT_LT(t->split_us, 12000.0);  // the host's 25 ms hidden
        EXPECT_LT(t->split_us, t->native_us);
        EXPECT_GT(t->split_us + t->split_host_us, t->native_us + t->native_host_us);
      },
      options);
  EXPECT_RANKS_OK(statuses);
  std::ifstream in(file);
  const nlohmann::json entry = nlohmann::json::parse(in)["entries"]["test|host"];
  EXPECT_EQ(entry.value("path", ""), "native");
  EXPECT_EQ(entry.value("captured_path", ""), "split");
  EXPECT_GE(entry.value("split_host_us", 0.0), 25000.0);
  // A later process takes both from the file, measuring nothing; it runs the captured path once,
  // eagerly, so that a capture finds what that path allocates on first use.
  statuses = run_ranks(
      2,
      [](OpContext& ctx) {
        std::vector<Route> runs;
        EXPECT_EQ(
            ctx.dispatcher().pick("test|host", kOverlapped, [&](Route r) { runs.push_back(r); }),
            Path::kNative);
        EXPECT_EQ(runs, std::vector<Route>{Path::kSplit});
        const std::optional<DispatchTiming> t = ctx.dispatcher().decision("test|host");
        ASSERT_TRUE(t.has_value());
        EXPECT_TRUE(t->from_disk);
        EXPECT_EQ(t->captured_path, Path::kSplit);
      },
      options);
  EXPECT_RANKS_OK(statuses);
  std::filesystem::remove(file);
}

// ASYNCTP_TUNE_PACE=0: every rank first runs rounds back to back for kSustainedWarmupMs (the
// same rounds on every rank: each run is a collective op), then times them with no pause; the
// choice is cached with its pace. An entry without a pace was paced: measured anew at pace 0. A
// later process at the entry's pace takes it from the file; one at another pace (1: paced)
// measures the problem anew and replaces the entry.
TEST(DispatcherTest, TunesBackToBackAtPaceZeroAndCachesPerPace) {
  const std::filesystem::path file = cache_file("dispatch_pace");
  auto write_unpaced_entry = [&] {
    write_cache(file, Dispatcher::kCacheVersion,
                {{"test|pace", {{"path", "native"}, {"captured_path", "native"}}}});
  };
  write_unpaced_entry();
  const HarnessOptions options = with_cache(file);
  auto pick_on_ranks = [&](double pace, bool measured) {
    SCOPED_TRACE(fmt::format("pace {}, measured {}", pace, measured));
    ::setenv("ASYNCTP_TUNE_PACE", fmt::format("{}", pace).c_str(), 1);
    auto statuses = run_ranks(
        2,
        [&](OpContext& ctx) {
          EXPECT_EQ(ctx.dispatcher().pace(), pace);
          std::map<Path, int> runs;
          // Margins of 10 ms (see ChoosesByTheSlowestRank): no close call.
          EXPECT_EQ(
              ctx.dispatcher().pick("test|pace", kOverlapped, counting_runner(ctx, runs, 2, 12, 0)),
              Path::kNative);
          const std::optional<DispatchTiming> t = ctx.dispatcher().decision("test|pace");
          ASSERT_TRUE(t.has_value());
          EXPECT_EQ(t->pace, pace);
          EXPECT_EQ(t->from_disk, !measured);
          if (!measured) {
            EXPECT_TRUE(runs.empty());
            return;
          }
          const int tuning = 2 + Dispatcher::tuning_rounds(2);
          if (pace == 0) {
            EXPECT_GE(t->warmup_ms, Dispatcher::kSustainedWarmupMs);
            // The warm-up's rounds (14 ms each: some 20 of them) beside the tuning's, alike on
            // every rank.
            EXPECT_GT(runs[Path::kNative], tuning);
            EXPECT_EQ(runs[Path::kNative], runs[Path::kSplit]);
            Store& store = ctx.group().store();
            store.set(fmt::format("test/pace_runs/{}", ctx.rank()),
                      std::to_string(runs[Path::kNative]));
            for (int r = 0; r < ctx.world_size(); ++r) {
              EXPECT_EQ(store.get(fmt::format("test/pace_runs/{}", r)),
                        std::to_string(runs[Path::kNative]))
                  << "rank " << r;
            }
          } else {
            EXPECT_EQ(t->warmup_ms, 0.0);
            EXPECT_EQ(runs[Path::kNative], tuning);
            EXPECT_EQ(runs[Path::kSplit], tuning);
          }
        },
        options);
    ::unsetenv("ASYNCTP_TUNE_PACE");
    EXPECT_RANKS_OK(statuses);
    std::ifstream in(file);
    const nlohmann::json entry = nlohmann::json::parse(in)["entries"]["test|pace"];
    EXPECT_EQ(entry.value("path", ""), "native");
    EXPECT_EQ(entry.value("pace", 1.0), pace);  // none: paced
  };
  pick_on_ranks(0, /*measured=*/true);
  pick_on_ranks(0, /*measured=*/false);
  pick_on_ranks(1, /*measured=*/true);
  pick_on_ranks(1, /*measured=*/false);
  write_unpaced_entry();
  pick_on_ranks(1, /*measured=*/false);
  std::filesystem::remove(file);
}

// Ranks at different paces would run different rounds of collective ops: a named error on every
// rank, before anything runs.
// Unset, ASYNCTP_TUNE_PACE is 0: the paths are ranked back to back, at a training step's clocks.
TEST(DispatcherTest, TunesBackToBackByDefault) {
  const testing::ScopedUnsetEnv unset("ASYNCTP_TUNE_PACE");
  on_ranks_without_cache(1, [](OpContext& ctx) { EXPECT_EQ(Dispatcher(ctx, "off").pace(), 0.0); });
}

TEST(DispatcherTest, RanksAtDifferentPacesAreANamedError) {
  auto statuses = run_ranks(2, [](OpContext& ctx) {
    ::setenv("ASYNCTP_TUNE_PACE", ctx.rank() == 0 ? "1" : "0", 1);
    Dispatcher dispatcher(ctx, "off");
    ::unsetenv("ASYNCTP_TUNE_PACE");
    int runs = 0;
    EXPECT_THAT([&] { dispatcher.pick("test|paces", kOverlapped, [&](Route) { ++runs; }); },
                ThrowsMessage<Error>(HasSubstr("dispatcher: test|paces: rank 1 tunes at "
                                               "ASYNCTP_TUNE_PACE=0, rank 0 at 1; set the same "
                                               "value on every rank")));
    EXPECT_EQ(runs, 0);
  });
  EXPECT_RANKS_OK(statuses);
}

// A cached path that is no longer a candidate (here: native, where only split and the fallback
// can run now, e.g. under a smaller workspace limit) is measured again, not taken.
TEST(DispatcherTest, CachedPathThatCannotRunIsMeasuredAgain) {
  // Entries without a pace were measured paced: at pace 1 only the check under test rejects them.
  const testing::ScopedSetEnv paced("ASYNCTP_TUNE_PACE", "1");
  const std::filesystem::path file = cache_file("dispatch_gone");
  write_cache(file, Dispatcher::kCacheVersion,
              {{"test|gone", {{"path", "native"}, {"captured_path", "native"}}}});
  const HarnessOptions options = with_cache(file);
  auto statuses = run_ranks(
      2,
      [](OpContext& ctx) {
        const Route candidates[] = {Path::kSplit, Path::kFallback};
        int runs = 0;
        const Route path = ctx.dispatcher().pick("test|gone", candidates, [&](Route r) {
          ++runs;
          EXPECT_NE(r.path, Path::kNative);
          device_run(ctx, std::chrono::milliseconds(r == Path::kSplit ? 1 : 12));
        });
        EXPECT_EQ(path, Path::kSplit);
        EXPECT_GT(runs, 0);
        EXPECT_FALSE(ctx.dispatcher().decision("test|gone")->from_disk);
      },
      options);
  EXPECT_RANKS_OK(statuses);
  std::filesystem::remove(file);
}

// A cache entry this program did not write (not an object, a "path" or "captured_path" that is
// not a string, a "pace" that is not a number) is an error that names the file and the entry, not
// nlohmann's type_error escaping the op.
TEST(DispatcherTest, MalformedCacheEntryIsANamedError) {
  const std::filesystem::path file = cache_file("dispatch_bad");
  const std::string prefix = fmt::format("dispatch cache {}: entry 'test|bad' ", file.string());
  const std::pair<nlohmann::json, std::string> cases[] = {
      {nlohmann::json("native"), "must be an object whose \"path\" is a string, got string"},
      {nlohmann::json(3), "must be an object whose \"path\" is a string, got number"},
      {nlohmann::json{{"path", 2}}, "must be an object whose \"path\" is a string, got object"},
      {nlohmann::json{{"path", "native"}, {"captured_path", 1}},
       "must be an object whose \"captured_path\" is a string, got object with a "
       "\"captured_path\" of type number"},
      {nlohmann::json{{"path", "native"}, {"captured_path", "native"}, {"pace", "fast"}},
       "has a \"pace\" of type string (\"fast\"), not a number"},
  };
  for (const auto& [entry, message] : cases) {
    write_cache(file, Dispatcher::kCacheVersion, {{"test|bad", entry}});
    auto statuses = run_ranks(
        1,
        [&](OpContext& ctx) {
          EXPECT_THAT([&] { ctx.dispatcher().pick("test|bad", kOverlapped, [](Route) {}); },
                      ThrowsMessage<Error>(HasSubstr(prefix + message)))
              << entry.dump();
        },
        with_cache(file));
    EXPECT_RANKS_OK(statuses);
  }
  std::filesystem::remove(file);
}

// One candidate is no choice: taken without running anything or talking to the other ranks (a
// rank whose only candidate is the fallback must not wait in an exchange the others skip).
TEST(DispatcherTest, SingleCandidateIsTakenUnmeasured) {
  on_ranks_without_cache(2, [](OpContext& ctx) {
    const Route only[] = {Path::kFallback};
    int runs = 0;
    EXPECT_EQ(ctx.dispatcher().pick("test|one", only, [&](Route) { ++runs; }), Path::kFallback);
    EXPECT_EQ(runs, 0);
    EXPECT_FALSE(ctx.dispatcher().decision("test|one").has_value());
  });
}

// Ranks that can run different paths choose among those all of them can run, alike: measured
// where two or more remain, taken unmeasured where one does.
TEST(DispatcherTest, ChoosesAmongThePathsEveryRankCanRun) {
  // The counts of runs below are paced tuning's: no back-to-back warm-up rounds.
  const testing::ScopedSetEnv paced("ASYNCTP_TUNE_PACE", "1");
  on_ranks_without_cache(2, [](OpContext& ctx) {
    // Rank 1 cannot run the native path (which would be fastest).
    const std::vector<Route> offered =
        ctx.rank() == 0 ? std::vector<Route>{Path::kNative, Path::kSplit, Path::kFallback}
                        : std::vector<Route>{Path::kSplit, Path::kFallback};
    std::map<Path, int> runs;
    const Route path =
        ctx.dispatcher().pick("test|some", offered, counting_runner(ctx, runs, 1, 20, 5));
    EXPECT_EQ(path, Path::kFallback);
    EXPECT_EQ(runs[Path::kNative], 0);
    EXPECT_EQ(runs[Path::kSplit], 2 + Dispatcher::tuning_rounds(2));
    // Here only the fallback is common: nothing runs, and the choice is remembered.
    const std::vector<Route> one = ctx.rank() == 0
                                       ? std::vector<Route>{Path::kNative, Path::kFallback}
                                       : std::vector<Route>{Path::kSplit, Path::kFallback};
    int later = 0;
    EXPECT_EQ(ctx.dispatcher().pick("test|one common", one, [&](Route) { ++later; }),
              Path::kFallback);
    EXPECT_EQ(later, 0);
    ASSERT_TRUE(ctx.dispatcher().decision("test|one common").has_value());
    EXPECT_EQ(ctx.dispatcher().decision("test|one common")->path, Path::kFallback);
  });
}

TEST(DispatcherTest, RejectsNoCandidateOrOneTwice) {
  on_ranks_without_cache(1, [](OpContext& ctx) {
    auto run = [](Route) { FAIL() << "nothing may run"; };
    EXPECT_THAT([&] { ctx.dispatcher().pick("test|none", {}, run); },
                ThrowsMessage<Error>(HasSubstr("no path can run test|none")));
    const Route twice[] = {Path::kSplit, Path::kNative, Path::kSplit};
    EXPECT_THAT([&] { ctx.dispatcher().pick("test|twice", twice, run); },
                ThrowsMessage<Error>(HasSubstr("path split named twice for test|twice")));
  });
}

// The native matmul_reduce_scatter's two routes are told apart: measured beside each other, the
// faster one is taken, kept in the cache under its own name and read back from it.
TEST(DispatcherTest, ChoosesBetweenTheNativeRoutesAndCachesTheChoice) {
  const testing::ScopedSetEnv paced("ASYNCTP_TUNE_PACE", "1");
  const std::filesystem::path file = cache_file("native_routes");
  const HarnessOptions options = with_cache(file);
  const Route pushed(Path::kNative, true);
  const Route offered[] = {Path::kNative, pushed, Path::kSplit, Path::kFallback};
  auto statuses = run_ranks(
      2,
      [&](OpContext& ctx) {
        std::map<int, int> runs;  // by route: 0 native, 1 native_push, 2 split, 3 fallback
        // Margins of 10 ms and more (see ChoosesByTheSlowestRank).
        const Route route = ctx.dispatcher().pick("test|routes", offered, [&](Route r) {
          ++runs[r == pushed ? 1 : r == Path::kNative ? 0 : r == Path::kSplit ? 2 : 3];
          device_run(ctx, std::chrono::milliseconds(r == pushed ? 2 : 15));
        });
        EXPECT_EQ(route, pushed);
        for (int r = 0; r < 4; ++r)
          EXPECT_EQ(runs[r], 2 + Dispatcher::tuning_rounds(4)) << "route " << r;
        const std::optional<DispatchTiming> t = ctx.dispatcher().decision("test|routes");
        ASSERT_TRUE(t.has_value());
        EXPECT_EQ(t->captured_path, pushed);
        EXPECT_GE(t->native_us, 15000.0);
        EXPECT_LT(t->native_push_us, t->native_us);
        EXPECT_GT(t->native_push_host_us, 0.0);
      },
      options);
  EXPECT_RANKS_OK(statuses);
  {
    std::ifstream in(file);
    const nlohmann::json entry = nlohmann::json::parse(in)["entries"]["test|routes"];
    EXPECT_EQ(entry.value("path", ""), "native_push");
    EXPECT_EQ(entry.value("captured_path", ""), "native_push");
    EXPECT_GT(entry.value("native_push_us", 0.0), 0.0);
    EXPECT_GE(entry.value("native_us", 0.0), 15000.0);
  }
  // A later process takes the route from the file; one that cannot take it measures again.
  statuses = run_ranks(
      2,
      [&](OpContext& ctx) {
        int runs = 0;
        EXPECT_EQ(ctx.dispatcher().pick("test|routes", offered, [&](Route) { ++runs; }), pushed);
        EXPECT_EQ(runs, 0);
        EXPECT_TRUE(ctx.dispatcher().decision("test|routes")->from_disk);
      },
      options);
  EXPECT_RANKS_OK(statuses);
  statuses = run_ranks(
      2,
      [&](OpContext& ctx) {
        // Rank 1 cannot have the GEMM push (ContextOptions::kernel_push 0 there, say).
        const std::vector<Route> mine =
            ctx.rank() == 0 ? std::vector<Route>(std::begin(offered), std::end(offered))
                            : std::vector<Route>{Path::kNative, Path::kSplit, Path::kFallback};
        int pushes = 0;
        const Route route = ctx.dispatcher().pick("test|routes", mine, [&](Route r) {
          pushes += r == pushed ? 1 : 0;
          device_run(ctx, std::chrono::milliseconds(r == Path::kNative ? 2 : 15));
        });
        EXPECT_EQ(route, Path::kNative);
        EXPECT_EQ(pushes, 0);
        EXPECT_FALSE(ctx.dispatcher().decision("test|routes")->from_disk);
      },
      options);
  EXPECT_RANKS_OK(statuses);
  std::filesystem::remove(file);
}

TEST(RouteTest, NamesEachRoute) {
  EXPECT_EQ(route_name(Path::kNative), "native");
  EXPECT_EQ(route_name(Route(Path::kNative, true)), "native_push");
  EXPECT_EQ(route_name(Path::kSplit), "split");
  EXPECT_EQ(route_name(Path::kFallback), "fallback");
  EXPECT_NE(Route(Path::kNative, true), Route(Path::kNative));
}

TEST(KernelPushTest, ParsesEverySpellingAndNamesABadOne) {
  EXPECT_EQ(parse_kernel_push("auto"), KernelPush::kAuto);
  EXPECT_EQ(parse_kernel_push("AUTO"), KernelPush::kAuto);
  for (const char* off : {"0", "off", "false", "No"})
    EXPECT_EQ(parse_kernel_push(off), KernelPush::kOff) << off;
  for (const char* on : {"1", "on", "TRUE", "yes"})
    EXPECT_EQ(parse_kernel_push(on), KernelPush::kOn) << on;
  for (const KernelPush push : {KernelPush::kAuto, KernelPush::kOff, KernelPush::kOn})
    EXPECT_EQ(parse_kernel_push(kernel_push_name(push)), push);
  EXPECT_THAT([] { parse_kernel_push("gemm"); },
              ThrowsMessage<Error>(HasSubstr("kernel_push must be auto, 0 (copy streams push) or "
                                             "1 (the GEMM pushes), got 'gemm'")));
  {
    const testing::ScopedSetEnv unset("ASYNCTP_KERNEL_PUSH", "");
    EXPECT_EQ(ContextOptions::default_kernel_push(), KernelPush::kAuto);
  }
  for (const char* on : {"1", "on", "True", "yes"}) {
    const testing::ScopedSetEnv set("ASYNCTP_KERNEL_PUSH", on);
    EXPECT_EQ(ContextOptions::default_kernel_push(), KernelPush::kOn) << on;
  }
  for (const char* off : {"0", "OFF", "false", "no"}) {
    const testing::ScopedSetEnv set("ASYNCTP_KERNEL_PUSH", off);
    EXPECT_EQ(ContextOptions::default_kernel_push(), KernelPush::kOff) << off;
  }
}

// Under auto, on a backend whose timings tell the paths apart (the CPU backend made to say so:
// cpu::testing::time_paths), the native matmul_reduce_scatter is measured both ways, its copy
// streams pushing the peers' rows ("native") and its GEMM pushing them ("native_push"), beside
// split and the fallback; ContextOptions::kernel_push 0 or 1 leaves one of the two, under a key
// of its own. Whichever route a call takes, its result is right (small integers: every path's
// sum is exact), and a later call takes the remembered route; so does a call forced onto the
// native path, whose route is the GEMM's pushes only where kernel_push is 1.
TEST(DispatcherTest, MeasuresBothWaysTheNativeReduceScatterPushes) {
  const testing::ScopedSetEnv paced("ASYNCTP_TUNE_PACE", "1");
  const std::filesystem::path file = cache_file("rs_routes");
  struct TimePaths {  // (the forked ranks inherit it)
    TimePaths() { cpu::testing::time_paths(true); }
    ~TimePaths() { cpu::testing::time_paths(false); }
  } time_paths;
  for (const KernelPush push : {KernelPush::kAuto, KernelPush::kOff, KernelPush::kOn}) {
    SCOPED_TRACE(fmt::format("kernel_push {}", kernel_push_name(push)));
    HarnessOptions options = with_cache(file);
    options.context.kernel_push = push;
    auto statuses = run_ranks(
        2,
        [](OpContext& ctx) {
          const int ws = ctx.world_size(), rank = ctx.rank();
          const int64_t rows = 128, k = 8, n = 16;
          const OwnedTensor b = seeded({k, n}, DType::kBF16, {331}, Values::kSmallInts);
          OwnedTensor a;
          OwnedTensor expected = empty_host({rows, n}, DType::kF32);
          fill_value(expected, 0.0f);
          for (int r = 0; r < ws; ++r) {
            OwnedTensor ar =
                seeded({rows * ws, k}, DType::kBF16, {330, uint64_t(r)}, Values::kSmallInts);
            OwnedTensor product = empty_host({rows * ws, n}, DType::kF32);
            reference_gemm(ctx.backend(), ar, b, product);
            for (int64_t i = 0; i < rows * n; ++i)
              set(expected, i, get(expected, i) + get(product, rank * rows * n + i));
            if (r == rank) a = std::move(ar);
          }
          for (int call = 0; call < 3; ++call) {
            OwnedTensor out = empty_host({rows, n}, DType::kBF16);
            fill_value(out, kSentinel);
            cpu::testing::reset_event_waits();
            matmul_reduce_scatter(ctx, a, b, out, {});
            ctx.stream().synchronize();
            for (int64_t i = 0; i < rows * n; ++i)
              ASSERT_EQ(get(out, i), get(expected, i)) << "call " << call << ", element " << i;
            // The later calls take the remembered route: the GEMM's pushes wait for no event,
            // the copy streams for some.
            const std::string variant =
                ctx.options().kernel_push == KernelPush::kOn    ? "|kernel push"
                : ctx.options().kernel_push == KernelPush::kOff ? "|copy pushes"
                                                                : "";
            const auto decision = ctx.dispatcher().decision(
                fmt::format("matmul_reduce_scatter|{}x{}x{}|bf16->bf16|B row|ws{}|{}{}", rows * ws,
                            n, k, ws, ctx.backend().hardware(), variant));
            ASSERT_TRUE(decision.has_value()) << variant;
            if (call > 0 && decision->path.path == Path::kNative)
              EXPECT_EQ(cpu::testing::event_waits() == 0, decision->path.kernel_push)
                  << "call " << call << ": " << cpu::testing::event_waits()
                  << " event waits, route " << decision->path;
          }
          // Forced onto the native path, the first route: the GEMM's pushes where it must push,
          // else the copy streams, remembered for the later calls.
          for (int call = 0; call < 3; ++call) {
            OwnedTensor out = empty_host({rows, n}, DType::kBF16);
            cpu::testing::reset_event_waits();
            matmul_reduce_scatter(ctx, a, b, out, {.path = PathChoice::kNative});
            ctx.stream().synchronize();
            for (int64_t i = 0; i < rows * n; ++i)
              ASSERT_EQ(get(out, i), get(expected, i)) << "call " << call << ", element " << i;
            EXPECT_EQ(cpu::testing::event_waits() == 0,
                      ctx.options().kernel_push == KernelPush::kOn)
                << "call " << call << ": " << cpu::testing::event_waits() << " event waits";
          }
        },
        options);
    EXPECT_RANKS_OK(statuses);
  }
  std::ifstream in(file);
  const nlohmann::json entries = nlohmann::json::parse(in)["entries"];
  std::map<std::string, int> seen;  // by kernel_push
  for (const auto& [key, entry] : entries.items()) {
    if (!key.starts_with("matmul_reduce_scatter|")) continue;
    SCOPED_TRACE(key);
    const bool on = key.ends_with("|kernel push"), off = key.ends_with("|copy pushes");
    ++seen[on ? "1" : off ? "0" : "auto"];
    EXPECT_EQ(entry.contains("native_us"), !on);
    EXPECT_EQ(entry.contains("native_push_us"), !off);
    EXPECT_TRUE(entry.contains("split_us"));
    EXPECT_TRUE(entry.contains("fallback_us"));
    EXPECT_THAT(entry.value("path", ""),
                ::testing::AnyOf("native", "native_push", "split", "fallback"));
  }
  EXPECT_EQ(seen, (std::map<std::string, int>{{"0", 1}, {"1", 1}, {"auto", 1}}));
  std::filesystem::remove(file);
}

// A fallback is warned about only where nobody chose it: not asked for by the caller, not
// measured fastest by the dispatcher.
TEST(PathDecisionTest, WarnsOnlyOfAFallbackNobodyChose) {
  EXPECT_TRUE((detail::PathDecision{Path::kFallback, "the limit is 0"}).warns());
  EXPECT_FALSE(
      (detail::PathDecision{Path::kFallback, "the caller asked for the fallback", true}).warns());
  EXPECT_FALSE((detail::PathDecision{Path::kFallback, "measured fastest", false, true}).warns());
  EXPECT_FALSE((detail::PathDecision{Path::kSplit, ""}).warns());
  EXPECT_FALSE((detail::PathDecision{Path::kNative, "", false, true}).warns());
}

TEST(PathChoiceTest, NamesRoundTrip) {
  for (PathChoice c :
       {PathChoice::kAuto, PathChoice::kSplit, PathChoice::kFallback, PathChoice::kNative}) {
    EXPECT_EQ(parse_path_choice(path_choice_name(c)), c);
  }
  EXPECT_EQ(path_name(Path::kNative), "native");
  EXPECT_EQ(parse_path_choice("unfused"), PathChoice::kFallback);
  EXPECT_THAT(error_of([] { parse_path_choice("fast"); }), HasSubstr("got 'fast'"));
  // "fused" names the ops, not a path.
  EXPECT_THAT(error_of([] { parse_path_choice("fused"); }), HasSubstr("got 'fused'"));
  EXPECT_EQ(path_name(Path::kSplit), "split");
  EXPECT_EQ(path_name(Path::kFallback), "fallback");
}

}  // namespace
}  // namespace asynctp
