// The C ABI's memory queries: what a context holds, and reserve before any op.
#include <gtest/gtest.h>

#include <string>

#include "capi/capi_testing.h"
#include "support/multiprocess.h"

namespace asynctp::capi_testing {
namespace {

// What the context holds: the limit asked for, symmetric memory once an overlapped op ran.
TEST(CapiMemory, Stats) {
  auto statuses = run_env_ranks(2, 20'000, [&](const RendezvousInfo&, asynctp_group group) {
    asynctp_context ctx = cpu_context(group, 8 << 20);
    ASSERT_NE(ctx, nullptr);
    asynctp_memory_stats stats{};
    EXPECT_STATUS(asynctp_memory_stats_get(ctx, &stats), ASYNCTP_ERROR_INVALID_ARGUMENT,
                  "out->struct_size is 0");
    stats.struct_size = sizeof(stats);
    C_ASSERT_OK(asynctp_memory_stats_get(ctx, &stats));
    EXPECT_EQ(stats.symmetric_limit, 8 << 20);
    const int64_t before = stats.symmetric_bytes;
    const HostTensor a = host_of(seeded_values({64, 32}, 1), {64, 32}, ASYNCTP_F32);
    const HostTensor b = host_of(seeded_values({32, 16}, 2), {32, 16}, ASYNCTP_F32);
    HostTensor out({128, 16}, ASYNCTP_F32);
    const asynctp_tensor ad = a.desc(), bd = b.desc(), od = out.desc();
    C_ASSERT_OK(asynctp_all_gather_matmul(ctx, &ad, &bd, 1, &od, nullptr, 0, ASYNCTP_PATH_SPLIT,
                                          ASYNCTP_CONTEXT_STREAM));
    C_ASSERT_OK(asynctp_memory_stats_get(ctx, &stats));
    EXPECT_GE(stats.symmetric_bytes, before + 64 * 32 * 4) << "the gathered A's workspace";
    EXPECT_LE(stats.symmetric_bytes, 2 * stats.symmetric_limit);
    EXPECT_GE(stats.local_bytes, 0);
    C_EXPECT_OK(asynctp_context_destroy(ctx));
    C_EXPECT_OK(asynctp_group_destroy(group));
  });
  EXPECT_RANKS_OK(statuses);
}

// reserve sizes the workspaces for the shapes it is given (descriptors with no data), before any
// op ran; the op then grows nothing.
TEST(CapiMemory, Reserve) {
  auto statuses = run_env_ranks(2, 20'000, [&](const RendezvousInfo&, asynctp_group group) {
    asynctp_context ctx = cpu_context(group, 8 << 20);
    ASSERT_NE(ctx, nullptr);
    const HostTensor a = host_of(seeded_values({64, 32}, 1), {64, 32}, ASYNCTP_F32);
    const HostTensor b = host_of(seeded_values({32, 16}, 2), {32, 16}, ASYNCTP_F32);
    HostTensor out({128, 16}, ASYNCTP_F32);
    asynctp_tensor shape_a = a.desc(), shape_b = b.desc();
    shape_a.data = nullptr;
    shape_b.data = nullptr;
    C_ASSERT_OK(asynctp_reserve_all_gather_matmul(ctx, &shape_a, &shape_b, 1, 0, 0,
                                                  ASYNCTP_CONTEXT_STREAM));
    EXPECT_STATUS(
        asynctp_reserve_all_gather_matmul(ctx, &shape_a, &shape_b, 1, 0, 2, ASYNCTP_CONTEXT_STREAM),
        ASYNCTP_ERROR_INVALID_ARGUMENT, "return_a is 2");
    asynctp_memory_stats reserved{};
    reserved.struct_size = sizeof(reserved);
    C_ASSERT_OK(asynctp_memory_stats_get(ctx, &reserved));
    EXPECT_GT(reserved.symmetric_bytes, 0);
    const asynctp_tensor ad = a.desc(), bd = b.desc(), od = out.desc();
    C_ASSERT_OK(asynctp_all_gather_matmul(ctx, &ad, &bd, 1, &od, nullptr, 0, ASYNCTP_PATH_SPLIT,
                                          ASYNCTP_CONTEXT_STREAM));
    asynctp_memory_stats after = reserved;
    C_ASSERT_OK(asynctp_memory_stats_get(ctx, &after));
    EXPECT_EQ(after.symmetric_bytes, reserved.symmetric_bytes);
    // matmul_reduce_scatter of A [128, 32] @ B [32, 16] on dim 0.
    C_ASSERT_OK(asynctp_reserve_matmul_reduce_scatter(ctx, &shape_a, &shape_b, 1, 0,
                                                      ASYNCTP_CONTEXT_STREAM));
    C_EXPECT_OK(asynctp_context_destroy(ctx));
    C_EXPECT_OK(asynctp_group_destroy(group));
  });
  EXPECT_RANKS_OK(statuses);
}

}  // namespace
}  // namespace asynctp::capi_testing
