// The public C++ API (asynctp/asynctp.h): a Context over the engine (OpContext), and each public
// op giving the same bits as the engine's op of the same name on the same inputs, so that every
// argument reaches its place. ws 2 on the CPU backend; options that differ from the defaults
// (gather/scatter dims, avg, a returned A) show a dropped option too.
#include <asynctp/asynctp.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "op_testing.h"
#include "ops/context.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;  // NOLINT(google-build-using-namespace)

// Runs body(ctx) on 2 ranks, each with a public Context over its group.
void on_two_ranks(const std::function<void(Context&)>& body) {
  HarnessOptions options;
  auto statuses = run_processes(
      2,
      [&](const RendezvousInfo& info) {
        auto group = Group::create(info, rank_group_options(options, info.rank));
        auto ctx = Context::create(group, options.context);
        body(*ctx);
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

// One output for the public op and one for the engine's, both zeroed.
struct OutPair {
  OutPair(const Dims& shape, DType dtype)
      : by_public(empty_host(shape, dtype)), by_engine(empty_host(shape, dtype)) {
    fill_value(by_public, 0.0f);
    fill_value(by_engine, 0.0f);
  }
  ::testing::AssertionResult same() const { return same_bits(by_public, by_engine); }
  OwnedTensor by_public;
  OwnedTensor by_engine;
};

TEST(PublicApi, ContextSaysWhereItRuns) {
  on_two_ranks([](Context& ctx) {
    EXPECT_EQ(ctx.world_size(), 2);
    EXPECT_EQ(ctx.rank(), ctx.group().rank());
    EXPECT_EQ(ctx.options().backend, "cpu");
    EXPECT_TRUE(ctx.device().is_cpu());
    EXPECT_EQ(ctx.memory_stats().symmetric_limit,
              static_cast<int64_t>(ctx.options().max_workspace_bytes));
    EXPECT_FALSE(ctx.usage().last("all_gather_matmul").has_value());
  });
}

// The ops return once enqueued (the CPU backend's streams run on workers, with jitter):
// synchronize() is what makes the outputs readable, as in examples/.
TEST(PublicApi, SynchronizeWaitsForTheOps) {
  on_two_ranks([](Context& ctx) {
    constexpr int64_t kRows = 512;
    std::vector<float> in(kRows, static_cast<float>(ctx.rank() + 1)), out(2 * kRows, -1.0f);
    for (int i = 0; i < 8; ++i) {
      all_gather(ctx, Tensor(in.data(), DType::kF32, {kRows, 1}),
                 Tensor(out.data(), DType::kF32, {2 * kRows, 1}));
    }
    ctx.synchronize();
    for (int64_t i = 0; i < 2 * kRows; ++i)
      ASSERT_EQ(out[i], static_cast<float>(i / kRows + 1)) << "row " << i;
  });
}

TEST(PublicApi, CreateNamesAMissingGroup) {
  EXPECT_THAT([] { Context::create(nullptr); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr("needs a group")));
}

TEST(PublicApi, AllGatherMatmulsMatchTheEngine) {
  on_two_ranks([](Context& ctx) {
    OpContext& engine = detail::ContextAccess::engine(ctx);
    const uint64_t r = static_cast<uint64_t>(ctx.rank());
    // Two Bs, the gathered A returned: A_shard [4, 8] -> A [8, 8] @ [8, 6], [8, 5].
    OwnedTensor a = seeded({4, 8}, DType::kF32, {1, r});
    OwnedTensor b0 = seeded({8, 6}, DType::kF32, {2});
    OwnedTensor b1 = seeded({8, 5}, DType::kF32, {3});
    OutPair out0({8, 6}, DType::kF32), out1({8, 5}, DType::kF32), a_out({8, 8}, DType::kF32);
    const std::vector<Tensor> bs{b0, b1};
    all_gather_matmul(ctx, a, bs, std::vector<Tensor>{out0.by_public, out1.by_public},
                      a_out.by_public);
    all_gather_matmul(engine, a, bs, std::vector<Tensor>{out0.by_engine, out1.by_engine},
                      a_out.by_engine);
    EXPECT_TRUE(out0.same());
    EXPECT_TRUE(out1.same());
    EXPECT_TRUE(a_out.same());
    EXPECT_TRUE(ctx.usage().last("all_gather_matmul").has_value());

    // One B, gathered on the contraction dim: A [4, 16] @ B [16, 6], on a stream of the call.
    OwnedTensor bk = seeded({16, 6}, DType::kF32, {4});
    OutPair out_k({4, 6}, DType::kF32);
    void* const stream = reinterpret_cast<void*>(uintptr_t{0x1000});
    all_gather_matmul(ctx, a, bk, out_k.by_public, {}, {.gather_dim = -1, .stream = stream});
    all_gather_matmul(engine, a, bk, out_k.by_engine, {}, {.gather_dim = -1});
    EXPECT_TRUE(out_k.same());

    // float8: A_shard [4, 8] e4m3 with a tensor-wise scale, into bf16 [8, 6] (one B, and two).
    OwnedTensor a8 = seeded({4, 8}, DType::kF8E4M3, {5, r});
    OwnedTensor b8 = seeded({8, 6}, DType::kF8E4M3, {6});
    OwnedTensor a_scale = seeded({1}, DType::kF32, {7}, Values::kPositive);
    OwnedTensor b_scale = seeded({1}, DType::kF32, {8}, Values::kPositive);
    OutPair out8({8, 6}, DType::kBF16), out8_span({8, 6}, DType::kBF16);
    all_gather_scaled_matmul(ctx, a8, a_scale, b8, b_scale, out8.by_public);
    all_gather_scaled_matmul(engine, a8, a_scale, b8, b_scale, out8.by_engine);
    EXPECT_TRUE(out8.same());
    const std::vector<Tensor> b8s{b8}, b_scales{b_scale};
    all_gather_scaled_matmul(ctx, a8, a_scale, b8s, b_scales,
                             std::vector<Tensor>{out8_span.by_public});
    all_gather_scaled_matmul(engine, a8, a_scale, b8s, b_scales,
                             std::vector<Tensor>{out8_span.by_engine});
    EXPECT_TRUE(out8_span.same());
    EXPECT_TRUE(same_bits(out8.by_public, out8_span.by_public));
  });
}

TEST(PublicApi, MatmulReduceScattersMatchTheEngine) {
  on_two_ranks([](Context& ctx) {
    OpContext& engine = detail::ContextAccess::engine(ctx);
    const uint64_t r = static_cast<uint64_t>(ctx.rank());
    // A [8, 8] @ B [8, 6] -> [8, 6], averaged and scattered on the last dim -> [8, 3].
    OwnedTensor a = seeded({8, 8}, DType::kF32, {1, r});
    OwnedTensor b = seeded({8, 6}, DType::kF32, {2, r});
    const MatmulReduceScatterOptions avg_last{.reduce_op = ReduceOp::kAvg, .scatter_dim = -1};
    OutPair out({8, 3}, DType::kF32);
    matmul_reduce_scatter(ctx, a, b, out.by_public, avg_last);
    matmul_reduce_scatter(engine, a, b, out.by_engine, avg_last);
    EXPECT_TRUE(out.same());
    EXPECT_TRUE(ctx.usage().last("matmul_reduce_scatter").has_value());

    // Two products summed before one scatter on dim 0: [8, 8] @ [8, 6] + [8, 4] @ [4, 6].
    OwnedTensor a1 = seeded({8, 4}, DType::kF32, {3, r});
    OwnedTensor b1 = seeded({4, 6}, DType::kF32, {4, r});
    const std::vector<Tensor> as{a, a1}, bs{b, b1};
    OutPair out_sum({4, 6}, DType::kF32);
    matmul_reduce_scatter(ctx, as, bs, out_sum.by_public);
    matmul_reduce_scatter(engine, as, bs, out_sum.by_engine);
    EXPECT_TRUE(out_sum.same());

    // float8 A [8, 8] @ B [8, 6] with tensor-wise scales into bf16 [4, 6].
    OwnedTensor a8 = seeded({8, 8}, DType::kF8E4M3, {5, r});
    OwnedTensor b8 = seeded({8, 6}, DType::kF8E4M3, {6, r});
    OwnedTensor a_scale = seeded({1}, DType::kF32, {7}, Values::kPositive);
    OwnedTensor b_scale = seeded({1}, DType::kF32, {8}, Values::kPositive);
    OutPair out8({4, 6}, DType::kBF16);
    scaled_matmul_reduce_scatter(ctx, a8, a_scale, b8, b_scale, out8.by_public);
    scaled_matmul_reduce_scatter(engine, a8, a_scale, b8, b_scale, out8.by_engine);
    EXPECT_TRUE(out8.same());
  });
}

TEST(PublicApi, CollectivesMatchTheEngine) {
  on_two_ranks([](Context& ctx) {
    OpContext& engine = detail::ContextAccess::engine(ctx);
    const uint64_t r = static_cast<uint64_t>(ctx.rank());
    OwnedTensor x = seeded({4, 3}, DType::kF32, {1, r});
    OutPair gathered({4, 6}, DType::kF32);
    all_gather(ctx, x, gathered.by_public, 1);
    all_gather(engine, x, gathered.by_engine, 1);
    EXPECT_TRUE(gathered.same());

    OwnedTensor y = seeded({8, 6}, DType::kF32, {2, r});
    OutPair scattered({4, 6}, DType::kF32);
    reduce_scatter(ctx, y, scattered.by_public, ReduceOp::kAvg, 0);
    reduce_scatter(engine, y, scattered.by_engine, ReduceOp::kAvg, 0);
    EXPECT_TRUE(scattered.same());

    OutPair reduced({4, 6}, DType::kF32);
    fill_seeded(reduced.by_public, seed_of({3, r}), Values::kRandom);
    fill_seeded(reduced.by_engine, seed_of({3, r}), Values::kRandom);
    ctx.set_stream(reinterpret_cast<void*>(uintptr_t{0x2000}));
    all_reduce(ctx, reduced.by_public, ReduceOp::kSum);
    all_reduce(engine, reduced.by_engine, ReduceOp::kSum);
    EXPECT_TRUE(reduced.same());
  });
}

// A public reserve sizes what the engine's reserve with the same arguments would: the engine's
// then finds nothing left to grow.
TEST(PublicApi, ReservesMatchTheEngine) {
  on_two_ranks([](Context& ctx) {
    OpContext& engine = detail::ContextAccess::engine(ctx);
    OwnedTensor a = seeded({4, 8}, DType::kF32, {1});
    OwnedTensor b = seeded({8, 6}, DType::kF32, {2});
    OwnedTensor a_full = seeded({8, 8}, DType::kF32, {3});
    const std::vector<Tensor> as{a_full}, bs{b};
    reserve_all_gather_matmul(ctx, a, bs, /*return_a=*/false);
    reserve_matmul_reduce_scatter(ctx, as, bs, {.scatter_dim = -1}, DType::kBF16);
    reserve_all_gather(ctx, a, /*out_contiguous=*/false, 1);
    reserve_reduce_scatter(ctx, a_full, /*out_contiguous=*/false, 1);
    const MemoryStats after_public = ctx.memory_stats();
    EXPECT_GT(after_public.symmetric_bytes, 0);
    EXPECT_GT(after_public.local_bytes, 0);
    reserve_all_gather_matmul(engine, a, bs, /*return_a=*/false);
    reserve_matmul_reduce_scatter(engine, as, bs, {.scatter_dim = -1}, DType::kBF16);
    reserve_all_gather(engine, a, /*out_contiguous=*/false, 1);
    reserve_reduce_scatter(engine, a_full, /*out_contiguous=*/false, 1);
    const MemoryStats after_engine = ctx.memory_stats();
    EXPECT_EQ(after_engine.symmetric_bytes, after_public.symmetric_bytes);
    EXPECT_EQ(after_engine.local_bytes, after_public.local_bytes);
  });
}

}  // namespace
}  // namespace asynctp
