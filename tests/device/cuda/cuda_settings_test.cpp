// The CUDA backend's settings that need no GPU: how many ranks may share one.
#include <cstdlib>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "device/cuda/cuda_backend.h"
#include "support/env_testing.h"

namespace asynctp {
namespace {

TEST(SharedGpus, SettingComesFromTheEnvironmentAndIsChecked) {
  const testing::ScopedUnsetEnv unset("ASYNCTP_SHARED_GPUS");
  EXPECT_EQ(cuda_ranks_per_gpu(), 1);
  for (int k = 1; k <= 8; ++k) {
    ::setenv("ASYNCTP_SHARED_GPUS", std::to_string(k).c_str(), 1);
    EXPECT_EQ(cuda_ranks_per_gpu(), k);
  }
  for (const char* bad : {"0", "9", "12", "-2", "x", "2 "}) {
    ::setenv("ASYNCTP_SHARED_GPUS", bad, 1);
    EXPECT_THAT([] { cuda_ranks_per_gpu(); },
                ::testing::ThrowsMessage<Error>(::testing::AllOf(
                    ::testing::HasSubstr("ASYNCTP_SHARED_GPUS"), ::testing::HasSubstr(bad))));
  }
}

}  // namespace
}  // namespace asynctp
