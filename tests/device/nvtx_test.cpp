// device/nvtx.h: the ranges in the asynctp domain reach a tool as pushed, and cost no formatting
// without one. Registered twice (NVTX_TOOL, cmake/Targets.cmake): as it is, with no tool, and as
// <test>/nvtx_tool, with the test tool of support/nvtx_recorder.cpp loaded; each test says which
// it needs and skips in the other.
#include "device/nvtx.h"

#include <stdexcept>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/nvtx_record.h"

namespace asynctp {
namespace {

using ::testing::ElementsAre;

TEST(NvtxTest, CompiledInWhereTheBuildFoundTheHeaders) {
  EXPECT_EQ(nvtx::compiled_in(), ASYNCTP_TEST_NVTX_ENABLED != 0);
  if (!nvtx::compiled_in()) {
    EXPECT_FALSE(nvtx::attached());
  }
}

TEST(NvtxTest, WithoutAToolARangeFormatsNothing) {
  if (testing::nvtx_tool_named()) GTEST_SKIP() << "runs without an NVTX tool";
  EXPECT_FALSE(nvtx::attached());
  int described = 0;
  {
    const nvtx::Range range(nvtx::kSplitColor, [&] {
      ++described;
      return std::string("all_gather_matmul split");
    });
  }
  EXPECT_EQ(described, 0);
}

TEST(NvtxTest, WithAToolRangesNestInTheAsynctpDomain) {
  if (!testing::nvtx_tool_named()) GTEST_SKIP() << "runs with the test NVTX tool";
  if (!nvtx::compiled_in()) GTEST_SKIP() << "built without the NVTX headers";
  ASSERT_TRUE(nvtx::attached());
  // The domain was created by the first call, attached(), before anything was pushed.
  const auto created = testing::nvtx_record();
  ASSERT_TRUE(created.has_value());
  EXPECT_THAT(*created, ::testing::Contains("domain asynctp"));
  testing::nvtx_clear_record();
  int described = 0;
  {
    const nvtx::Range outer(nvtx::kSplitColor, [&] {
      ++described;
      return std::string("outer");
    });
    const nvtx::Range inner(nvtx::kNativeColor, [] { return std::string("inner"); });
  }
  // A range is popped when an exception leaves its scope.
  EXPECT_THROW(
      {
        const nvtx::Range range(nvtx::kFallbackColor, [] { return std::string("thrown"); });
        throw std::runtime_error("out");
      },
      std::runtime_error);
  EXPECT_EQ(described, 1);
  EXPECT_THAT(
      *testing::nvtx_record(),
      ElementsAre("push asynctp ff1f77b4 outer", "push asynctp ff76b900 inner", "pop asynctp",
                  "pop asynctp", "push asynctp ffff7f0e thrown", "pop asynctp"));
}

}  // namespace
}  // namespace asynctp
