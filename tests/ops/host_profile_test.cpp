// The host profile (ops/host_profile.h): a call's phases, in the order its steps were stamped,
// partition the call (their times add up to the call's), calls are filed per (op, path), a
// nested scope files nothing of its own, and a call that threw is dropped. Through the ops: each
// path's phases from entering to returning, and nothing while the profile is off.
#include "ops/host_profile.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ops/op_testing.h"

namespace asynctp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> phase_names(const HostProfile::Summary& s) {
  std::vector<std::string> out;
  for (const HostProfile::Phase& p : s.phases)
    out.push_back(p.from + " > " + p.to);
  return out;
}

TEST(HostProfileTest, OffItFilesNothing) {
  HostProfile profile;
  {
    const HostProfile::Call call(profile);
    EXPECT_FALSE(profile.open());
    profile.stamp("a");
    profile.set_path("op", Path::kNative);
  }
  EXPECT_TRUE(profile.summaries().empty());
  EXPECT_EQ(profile.json(), "{}");
  EXPECT_EQ(profile.table(), "");
}

TEST(HostProfileTest, PhasesPartitionEachCallInStampOrder) {
  HostProfile profile;
  profile.set_enabled(true);
  for (int i = 0; i < 3; ++i) {
    const HostProfile::Call call(profile);
    profile.stamp("a");
    {
      const HostProfile::Call nested(profile);  // the op inside the C ABI's scope
      profile.stamp("b");
    }
    profile.set_path("op", Path::kSplit);
  }
  {
    const HostProfile::Call call(profile);
    profile.set_path("op", Path::kNative);
  }
  const std::vector<HostProfile::Summary> all = profile.summaries();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].op, "op");
  EXPECT_EQ(all[0].path, Path::kSplit);
  EXPECT_EQ(all[0].calls, 3);
  EXPECT_THAT(phase_names(all[0]), ElementsAre("entry > a", "a > b", "b > return"));
  double sum = 0;
  for (const HostProfile::Phase& p : all[0].phases) {
    EXPECT_EQ(p.count, 3);
    EXPECT_GE(p.median_us, 0.0);
    sum += p.total_us;
  }
  EXPECT_NEAR(sum, all[0].total_us, 1e-6 * std::max(1.0, all[0].total_us));
  EXPECT_EQ(all[1].path, Path::kNative);
  EXPECT_THAT(phase_names(all[1]), ElementsAre("entry > return"));

  const nlohmann::json j = nlohmann::json::parse(profile.json());
  EXPECT_EQ(j["op"]["split"]["calls"], 3);
  EXPECT_EQ(j["op"]["split"]["phases"][1]["from"], "a");
  EXPECT_EQ(j["op"]["split"]["phases"][1]["to"], "b");
  EXPECT_EQ(j["op"]["native"]["phases"].size(), 1u);
  EXPECT_THAT(profile.table(), HasSubstr("op (split): 3 calls"));

  profile.set_enabled(true);  // starts over
  EXPECT_TRUE(profile.summaries().empty());
}

TEST(HostProfileTest, DropsCallsThatThrewOrChoseNoPath) {
  HostProfile profile;
  profile.set_enabled(true);
  EXPECT_THROW(
      {
        const HostProfile::Call call(profile);
        profile.set_path("op", Path::kSplit);
        throw std::runtime_error("bad argument");
      },
      std::runtime_error);
  {
    const HostProfile::Call call(profile);
    profile.stamp("a");
  }
  EXPECT_TRUE(profile.summaries().empty());
  EXPECT_FALSE(profile.open());
}

TEST(HostProfileTest, RepeatedStepsFileUnderOnePhase) {
  HostProfile profile;
  profile.set_enabled(true);
  {
    const HostProfile::Call call(profile);
    profile.stamp("step");
    profile.stamp("step");
    profile.set_path("op", Path::kFallback);
  }
  const auto all = profile.summaries();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_THAT(phase_names(all[0]), ElementsAre("entry > step", "step > step", "step > return"));
}

// Through the ops on the CPU backend: every path files its phases under its own name.
TEST(HostProfileTest, TheOpsFileEachPathsSteps) {
  auto statuses = testing::run_ranks(2, [](OpContext& ctx) {
    // bf16, rows of 16 bytes, chunks of matmul_reduce_scatter 128 rows: what the native GEMM
    // takes.
    const uint64_t r = static_cast<uint64_t>(ctx.rank());
    OwnedTensor a_shard = testing::seeded({4, 8}, DType::kBF16, {1, r});
    OwnedTensor b = testing::seeded({8, 8}, DType::kBF16, {2});
    OwnedTensor gathered = empty_host({8, 8}, DType::kBF16);
    OwnedTensor a = testing::seeded({256, 8}, DType::kBF16, {3, r});
    OwnedTensor scattered = empty_host({128, 8}, DType::kBF16);
    HostProfile& profile = ctx.host_profile();
    all_gather_matmul(ctx, a_shard, b, gathered);  // profile off
    EXPECT_TRUE(profile.summaries().empty());
    profile.set_enabled(true);
    for (const PathChoice choice :
         {PathChoice::kNative, PathChoice::kSplit, PathChoice::kFallback}) {
      AllGatherMatmulOptions ag;
      ag.path = choice;
      MatmulReduceScatterOptions rs;
      rs.path = choice;
      for (int i = 0; i < 2; ++i) {
        all_gather_matmul(ctx, a_shard, b, gathered, {}, ag);
        matmul_reduce_scatter(ctx, a, b, scattered, rs);
      }
    }
    ctx.stream().synchronize();
    const auto all = profile.summaries();
    ASSERT_EQ(all.size(), 6u);
    for (const HostProfile::Summary& s : all) {
      EXPECT_EQ(s.calls, 2) << s.op << " " << path_name(s.path);
      const std::vector<std::string> names = phase_names(s);
      ASSERT_GE(names.size(), 4u);
      // The C++ call opens the call itself (no C ABI around it): its first step is "run". (The
      // phases are in the order they first occurred: the first call's, then those only the
      // second one took, past the memo.)
      EXPECT_EQ(names.front(), "entry > run");
      EXPECT_EQ(names[1], "run > call");
      EXPECT_EQ(names[2], "call > memo");
      EXPECT_THAT(names, ::testing::Contains(HasSubstr("> return")));
    }
    // The native all_gather_matmul's enqueueing steps, in order (the first call chose and
    // checked; the second hit the memo).
    const HostProfile::Summary& native = all[0];
    EXPECT_EQ(native.op, "all_gather_matmul");
    EXPECT_EQ(native.path, Path::kNative);
    EXPECT_THAT(phase_names(native),
                ::testing::IsSupersetOf({"memo > checks", "checks > start", "memo > start",
                                         "start > launch", "launch > gemm", "gemm > pushes",
                                         "pushes > joined", "joined > end", "end > return"}));
    // The native matmul_reduce_scatter's push of its one piece, a step per enqueueing.
    const HostProfile::Summary& native_rs = all[1];
    EXPECT_EQ(native_rs.op, "matmul_reduce_scatter");
    EXPECT_EQ(native_rs.path, Path::kNative);
    EXPECT_THAT(phase_names(native_rs),
                ::testing::IsSupersetOf({"forked > gemm", "gemm > push waits",
                                         "push waits > push copies", "push copies > push flags",
                                         "push flags > pushes", "pushes > end"}));
  });
  EXPECT_TRUE(testing::all_ranks_ok(statuses));
}

}  // namespace
}  // namespace asynctp
