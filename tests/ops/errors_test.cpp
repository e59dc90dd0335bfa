// Bad inputs to the fused ops: every error names the argument and the offending value, and is
// raised before any communication (so every rank fails alike and the context stays usable).
// Then a rank that dies before or during an op: its peers fail with a TimeoutError naming
// themselves, the dead peer and the channel, instead of hanging.
#include <unistd.h>

#include "core/deadline.h"
#include "ops/op_testing.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;  // NOLINT(google-build-using-namespace)
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

OwnedTensor f32(Dims shape) {
  return empty_host(shape, DType::kF32);
}

TEST(AllGatherMatmulErrorsTest, NameTheArgumentAndValue) {
  auto statuses = run_ranks(2, [](OpContext& ctx) {
    const OwnedTensor a = f32({2, 3}), b = f32({3, 4}), out = f32({4, 4}), a_out = f32({4, 3});
    auto call = [&](const Tensor& a_shard, std::vector<Tensor> bs, std::vector<Tensor> outs,
                    const Tensor& gathered = {}, int gather_dim = 0) {
      return error_of([&] {
        AllGatherMatmulOptions options;
        options.gather_dim = gather_dim;
        all_gather_matmul(ctx, a_shard, bs, outs, gathered, options);
      });
    };
    const std::string op = "all_gather_matmul: ";
    EXPECT_THAT(call(Tensor(), {b}, {out}), HasSubstr(op + "A_shard is undefined"));
    EXPECT_THAT(call(Tensor(a->data(), DType::kF32, {2, 3}, Device::cuda(0)), {b}, {out}),
                HasSubstr(op + "A_shard is on cuda:0 but the context runs on cpu"));
    EXPECT_THAT(call(f32({6}), {b}, {out}),
                HasSubstr(op + "A_shard must have rank >= 2, got f32[6]"));
    EXPECT_THAT(call(a, {b}, {out}, {}, 2),
                HasSubstr(op + "gather_dim 2 is out of range for A_shard of rank 2"));
    EXPECT_THAT(call(a, {b}, {out}, {}, -3),
                HasSubstr(op + "gather_dim -3 is out of range for A_shard of rank 2"));
    EXPECT_THAT(call(empty_host({2, 3}, DType::kF8E4M3), {b}, {out}),
                HasSubstr(op + "A_shard is f8e4m3; float8 operands need the scaled form"));
    EXPECT_THAT(call(empty_host({2, 3}, DType::kI64), {b}, {out}),
                HasSubstr(op + "A_shard is i64; GEMM operands are float dtypes"));
    EXPECT_THAT(call(a, {}, {}), HasSubstr(op + "Bs must hold at least one matrix"));
    EXPECT_THAT(call(a, {b, b}, {out}), HasSubstr(op + "got 2 Bs but 1 outs"));
    EXPECT_THAT(call(a, {b, f32({1, 3, 4})}, {out, out}),
                HasSubstr(op + "Bs[1] must be 2-D [K, N], got f32[1, 3, 4]"));
    EXPECT_THAT(call(a, {b, f32({4, 4})}, {out, out}),
                HasSubstr(op + "Bs[1] has 4 rows but the gathered A's contraction dim is 3 "
                               "(A_shard f32[2, 3] strides [3, 1] on cpu, gather_dim 0)"));
    // Gathering on the last dim doubles K.
    EXPECT_THAT(call(a, {b}, {f32({2, 4})}, {}, 1),
                HasSubstr(op + "Bs[0] has 3 rows but the gathered A's contraction dim is 6"));
    EXPECT_THAT(call(a, {empty_host({3, 4}, DType::kBF16)}, {out}),
                HasSubstr(op + "Bs[0] is bf16 but A_shard is f32"));
    EXPECT_THAT(call(a, {empty_host({3, 4}, DType::kF8E5M2)}, {out}),
                HasSubstr(op + "Bs[0] is f8e5m2; float8 operands need the scaled form"));
    EXPECT_THAT(call(a, {b}, {empty_host({4, 4}, DType::kF8E4M3)}),
                HasSubstr(op + "outs[0] must be f32, bf16 or f16, got f8e4m3"));
    EXPECT_THAT(call(a, {b, b}, {out, f32({2, 4})}),
                HasSubstr(op + "outs[1] must have shape [4, 4], got f32[2, 4]"));
    EXPECT_THAT(call(a, {b}, {f32({4, 4})->t()}),
                HasSubstr(op + "outs[0] must be contiguous, got f32[4, 4] strides [1, 4]"));
    EXPECT_THAT(call(a, {b}, {Tensor(out->data(), DType::kF32, {4, 4}, Device::cuda(1))}),
                HasSubstr(op + "outs[0] is on cuda:1"));
    EXPECT_THAT(call(a, {b}, {out}, f32({2, 3})),
                HasSubstr(op + "A_out must be a contiguous f32[4, 3], got f32[2, 3]"));
    EXPECT_THAT(call(a, {b}, {out}, empty_host({4, 3}, DType::kBF16)),
                HasSubstr(op + "A_out must be a contiguous f32[4, 3], got bf16[4, 3]"));
    EXPECT_THAT(
        call(a, {b}, {out}, f32({3, 4})->t()),
        HasSubstr(op + "A_out must be a contiguous f32[4, 3], got f32[4, 3] strides [1, 4]"));
    EXPECT_THAT(error_of([&] {
                  AllGatherMatmulOptions options;
                  options.fast_accum = {true};
                  all_gather_matmul(ctx, a, b, out, {}, options);
                }),
                HasSubstr(op + "fast_accum is for the scaled (float8) form, "
                               "all_gather_scaled_matmul; got 1 values"));
    EXPECT_EQ(ctx.usage().count("all_gather_matmul", Path::kSplit) +
                  ctx.usage().count("all_gather_matmul", Path::kFallback),
              0);
    // Nothing was left half done: a good call works on every rank.
    fill_seeded(a, seed_of({uint64_t(ctx.rank())}), Values::kSmallInts);
    fill_seeded(b, seed_of({7}), Values::kSmallInts);
    EXPECT_EQ(call(a, {b}, {out}, a_out), "<no error thrown>");
    ctx.stream().synchronize();  // the op ran on the stream; its operands go with this scope
    expect_path(ctx, "all_gather_matmul", Path::kSplit);
  });
  EXPECT_RANKS_OK(statuses);
}

TEST(AllGatherScaledMatmulErrorsTest, NameTheArgumentAndValue) {
  auto statuses = run_ranks(2, [](OpContext& ctx) {
    const OwnedTensor a = empty_host({2, 3}, DType::kF8E4M3),
                      b = empty_host({3, 4}, DType::kF8E4M3);
    const OwnedTensor out = empty_host({4, 4}, DType::kBF16), one = f32({1});
    auto call = [&](const Tensor& a_shard, const Tensor& a_scale, std::vector<Tensor> bs,
                    std::vector<Tensor> b_scales, int gather_dim = 0,
                    std::vector<bool> fast_accum = {}) {
      return error_of([&] {
        std::vector<Tensor> outs(bs.size(), out.tensor);
        AllGatherMatmulOptions options;
        options.gather_dim = gather_dim;
        options.fast_accum = std::move(fast_accum);
        all_gather_scaled_matmul(ctx, a_shard, a_scale, bs, b_scales, outs, {}, options);
      });
    };
    const std::string op = "all_gather_scaled_matmul: ";
    EXPECT_THAT(call(f32({2, 3}), one, {b}, {one}),
                HasSubstr(op + "A_shard must be float8 (f8e4m3 or f8e5m2), got f32"));
    EXPECT_THAT(call(a, one, {empty_host({3, 4}, DType::kBF16)}, {one}),
                HasSubstr(op + "Bs[0] must be float8 (f8e4m3 or f8e5m2), got bf16"));
    EXPECT_THAT(
        call(a, one, {b}, {one}, -1),
        HasSubstr(op + "gathering on the contraction dim (gather_dim -1) is not supported"));
    EXPECT_THAT(call(a, one, {b}, {one, one}), HasSubstr(op + "got 1 Bs but 2 B_scales"));
    EXPECT_THAT(call(a, Tensor(), {b}, {one}), HasSubstr(op + "A_scale is undefined"));
    EXPECT_THAT(call(a, empty_host({1}, DType::kBF16), {b}, {one}),
                HasSubstr(op + "A_scale must be f32, got bf16"));
    EXPECT_THAT(call(a, f32({2}), {b}, {one}),
                HasSubstr(op + "A_scale must hold one element (tensor-wise) or have shape [2, 1] "
                               "(row-wise), got f32[2]"));
    EXPECT_THAT(call(a, f32({4, 1}), {b}, {one}),
                HasSubstr(op + "A_scale must hold one element (tensor-wise) or have shape [2, 1] "
                               "(row-wise), got f32[4, 1]"));
    EXPECT_THAT(call(a, one, {b}, {f32({4, 1})}),
                HasSubstr(op + "B_scales[0] must hold one element (tensor-wise) or have shape "
                               "[1, 4] (column-wise), got f32[4, 1]"));
    EXPECT_THAT(call(a, one, {b}, {empty_host({1, 4}, DType::kF16)}),
                HasSubstr(op + "B_scales[0] must be f32, got f16"));
    EXPECT_THAT(call(a, one, {b}, {Tensor()}), HasSubstr(op + "B_scales[0] is undefined"));
    EXPECT_THAT(call(a, one, {b, b, b}, {one, one, one}, 0, {true, false}),
                HasSubstr(op + "fast_accum holds 2 values for 3 Bs: give one per B, or one for "
                               "all"));
  });
  EXPECT_RANKS_OK(statuses);
}

TEST(MatmulReduceScatterErrorsTest, NameTheArgumentAndValue) {
  auto statuses = run_ranks(2, [](OpContext& ctx) {
    const OwnedTensor a = f32({4, 3}), b = f32({3, 2}), out = f32({2, 2});
    auto call = [&](const Tensor& a_, const Tensor& b_, const Tensor& out_, int scatter_dim = 0) {
      return error_of([&] {
        MatmulReduceScatterOptions options;
        options.scatter_dim = scatter_dim;
        matmul_reduce_scatter(ctx, a_, b_, out_, options);
      });
    };
    const std::string op = "matmul_reduce_scatter: ";
    EXPECT_THAT(call(Tensor(), b, out), HasSubstr(op + "A is undefined"));
    EXPECT_THAT(call(a, b, Tensor()), HasSubstr(op + "out is undefined"));
    EXPECT_THAT(call(f32({4}), b, out), HasSubstr(op + "A must have rank >= 2, got f32[4]"));
    EXPECT_THAT(call(a, f32({1, 3, 2}), out),
                HasSubstr(op + "B must be 2-D [K, N], got f32[1, 3, 2]"));
    EXPECT_THAT(call(a, f32({4, 2}), out),
                HasSubstr(op + "B has 4 rows but A's contraction dim (last) is 3"));
    EXPECT_THAT(call(empty_host({4, 3}, DType::kF8E4M3), b, out),
                HasSubstr(op + "A is f8e4m3; float8 operands need the scaled form"));
    EXPECT_THAT(call(a, empty_host({3, 2}, DType::kBF16), out),
                HasSubstr(op + "A is f32 but B is bf16"));
    EXPECT_THAT(call(a, b, out, 2),
                HasSubstr(op + "scatter_dim 2 is out of range for the product [4, 2] of rank 2"));
    EXPECT_THAT(call(a, b, out, -3), HasSubstr(op + "scatter_dim -3 is out of range"));
    EXPECT_THAT(call(f32({3, 3}), b, out),
                HasSubstr(op + "scatter_dim 0 of the product [3, 2] (size 3) is not divisible by "
                               "the world size 2"));
    EXPECT_THAT(call(a, f32({3, 3}), out, -1),
                HasSubstr(op + "scatter_dim 1 of the product [4, 3] (size 3) is not divisible by "
                               "the world size 2"));
    EXPECT_THAT(call(a, b, f32({4, 2})),
                HasSubstr(op + "out must have shape [2, 2] (the product [4, 2] scattered on dim 0 "
                               "over 2 ranks), got f32[4, 2]"));
    EXPECT_THAT(
        call(a, b, f32({2, 2}), 1),
        HasSubstr(op + "out must have shape [4, 1] (the product [4, 2] scattered on dim 1"));
    EXPECT_THAT(call(a, b, empty_host({2, 2}, DType::kF8E5M2)),
                HasSubstr(op + "out must be f32, bf16 or f16, got f8e5m2"));
    // The summed form names each pair.
    auto call_sum = [&](std::vector<Tensor> as, std::vector<Tensor> bs) {
      return error_of([&] { matmul_reduce_scatter(ctx, as, bs, out); });
    };
    EXPECT_THAT(call_sum({}, {}), HasSubstr(op + "needs at least one product"));
    EXPECT_THAT(call_sum({a, a}, {b}), HasSubstr(op + "got 2 As but 1 Bs"));
    EXPECT_THAT(call_sum({a, f32({4, 5})}, {b, f32({3, 2})}),
                HasSubstr(op + "Bs[1] has 3 rows but As[1]'s contraction dim (last) is 5"));
    EXPECT_THAT(call_sum({a, f32({4, 5})}, {b, f32({5, 3})}),
                HasSubstr(op + "the product As[1] @ Bs[1] ([4, 3]) differs in shape from As[0] @ "
                               "Bs[0] ([4, 2])"));
    EXPECT_THAT(
        call_sum({a, empty_host({4, 5}, DType::kBF16)}, {b, empty_host({5, 2}, DType::kBF16)}),
        HasSubstr(op + "As[1] is bf16 but As[0] is f32"));
    EXPECT_THAT(error_of([&] {
                  MatmulReduceScatterOptions options;
                  options.fast_accum = true;
                  matmul_reduce_scatter(ctx, a, b, out, options);
                }),
                HasSubstr(op + "fast_accum is for the scaled (float8) form, "
                               "scaled_matmul_reduce_scatter"));
    EXPECT_EQ(ctx.usage().count("matmul_reduce_scatter", Path::kSplit), 0);
    EXPECT_EQ(call(a, b, out), "<no error thrown>");
    ctx.stream().synchronize();  // the op ran on the stream; its operands go with this scope
    expect_path(ctx, "matmul_reduce_scatter", Path::kSplit);
  });
  EXPECT_RANKS_OK(statuses);
}

TEST(ScaledMatmulReduceScatterErrorsTest, NameTheArgumentAndValue) {
  auto statuses = run_ranks(2, [](OpContext& ctx) {
    const OwnedTensor a = empty_host({4, 3}, DType::kF8E4M3),
                      b = empty_host({3, 2}, DType::kF8E5M2);
    const OwnedTensor out = empty_host({2, 2}, DType::kF16), one = f32({1});
    auto call = [&](const Tensor& a_, const Tensor& a_scale, const Tensor& b_,
                    const Tensor& b_scale) {
      return error_of([&] { scaled_matmul_reduce_scatter(ctx, a_, a_scale, b_, b_scale, out); });
    };
    const std::string op = "scaled_matmul_reduce_scatter: ";
    EXPECT_THAT(call(f32({4, 3}), one, b, one),
                HasSubstr(op + "A must be float8 (f8e4m3 or f8e5m2), got f32"));
    EXPECT_THAT(call(a, one, f32({3, 2}), one),
                HasSubstr(op + "B must be float8 (f8e4m3 or f8e5m2), got f32"));
    EXPECT_THAT(call(a, f32({1, 4}), b, one),
                HasSubstr(op + "A_scale must hold one element (tensor-wise) or have shape [4, 1] "
                               "(row-wise), got f32[1, 4]"));
    EXPECT_THAT(call(a, empty_host({4, 1}, DType::kBF16), b, one),
                HasSubstr(op + "A_scale must be f32, got bf16"));
    EXPECT_THAT(call(a, one, b, f32({2})),
                HasSubstr(op + "B_scale must hold one element (tensor-wise) or have shape [1, 2] "
                               "(column-wise), got f32[2]"));
    EXPECT_THAT(call(a, one, b, Tensor()), HasSubstr(op + "B_scale is undefined"));
  });
  EXPECT_RANKS_OK(statuses);
}

// --- a rank that dies ------------------------------------------------------------------------

constexpr int kDeadRank = 1;
constexpr int kDeathCode = 42;

enum class Op { kAllGatherMatmul, kMatmulReduceScatter };

// A rank dies before the op (after a warm-up call that every rank made).
struct DeathCase {
  Op op;
  // The channel the survivors are left waiting on; -1: whichever the schedule uses there (a
  // peer dying inside the split matmul_reduce_scatter is noticed by the reduction, which waits
  // for its partial's landed flag), as long as the message names one.
  int channel;
};

// One call of the op with fixed shapes (the second call needs no new workspace), waited for: the
// op runs on the context's stream, and a peer's death shows (as a TimeoutError) when the caller
// waits for it, as a caller reading the output does.
void call_op(OpContext& ctx, Op op) {
  const int ws = ctx.world_size();
  if (op == Op::kAllGatherMatmul) {
    const OwnedTensor a = seeded({2, 3}, DType::kF32, {1}), b = seeded({3, 2}, DType::kF32, {2});
    const OwnedTensor out = f32({2 * ws, 2});
    const Tensor bs[] = {b.tensor}, outs[] = {out.tensor};
    all_gather_matmul(ctx, a, bs, outs);
    ctx.stream().synchronize();
  } else {
    const OwnedTensor a = seeded({2 * ws, 3}, DType::kF32, {3}),
                      b = seeded({3, 2}, DType::kF32, {4});
    const OwnedTensor out = f32({2, 2});
    matmul_reduce_scatter(ctx, a, b, out);
    ctx.stream().synchronize();
  }
}

void PrintTo(const DeathCase& c, std::ostream* os) {
  *os << (c.op == Op::kAllGatherMatmul ? "all_gather_matmul" : "matmul_reduce_scatter")
      << ", a rank dies before the op, survivors wait on channel "
      << (c.channel < 0 ? "any" : std::to_string(c.channel));
}

class RankDeathTest : public ::testing::TestWithParam<DeathCase> {};

TEST_P(RankDeathTest, PeersFailWithATimeoutNamingPeerAndChannel) {
  const DeathCase c = GetParam();
  HarnessOptions options;
  options.group_timeout = Millis(2000);  // also bounds group startup: not too tight under ASan
  options.run_timeout = Millis(60'000);
  auto statuses = run_ranks(
      3,
      [c](OpContext& ctx) {
        call_op(ctx, c.op);  // warm-up: the workspace is allocated while everyone is alive
        expect_path(ctx,
                    c.op == Op::kAllGatherMatmul ? "all_gather_matmul" : "matmul_reduce_scatter",
                    Path::kSplit);
        if (ctx.rank() == kDeadRank) {
          std::fflush(stdout);
          ::_exit(kDeathCode);
        }
        const auto start = Clock::now();
        try {
          call_op(ctx, c.op);
          ADD_FAILURE() << "the op returned although rank " << kDeadRank << " is dead";
        } catch (const TimeoutError& e) {
          const auto signal =
              AllOf(ContainsRegex(fmt::format(
                        "rank {}: wait_signal from peer {} on channel {}", ctx.rank(), kDeadRank,
                        c.channel < 0 ? std::string("[0-9]+ ") : fmt::format("{} ", c.channel))),
                    HasSubstr("timed out after 2 s"));
          if (c.channel >= 0) {
            EXPECT_THAT(e.what(), signal);
          } else {
            EXPECT_THAT(e.what(),
                        AnyOf(signal,
                              ContainsRegex(fmt::format(
                                  "rank {}: the reduction waited 2 s for the partial of "
                                  "rank {} on channel [0-9]+ ",
                                  ctx.rank(), kDeadRank)),
                              ContainsRegex(fmt::format("rank {}: waited 2 s for the shard of "
                                                        "peer {} on channel [0-9]+ ",
                                                        ctx.rank(), kDeadRank))));
          }
        } catch (const std::exception& e) {
          ADD_FAILURE() << "expected a TimeoutError, got: " << e.what();
        }
        EXPECT_LT(Clock::now() - start, Millis(10'000));
      },
      options);
  ASSERT_EQ(statuses.size(), 3u);
  EXPECT_TRUE(statuses[kDeadRank].exited);
  EXPECT_EQ(statuses[kDeadRank].exit_code, kDeathCode);
  for (int r : {0, 2})
    EXPECT_TRUE(statuses[r].ok()) << statuses[r].describe();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RankDeathTest,
    // Run eagerly, neither split path has a barrier: the survivors' GEMMs (all_gather_matmul)
    // or reductions (matmul_reduce_scatter) wait for the dead rank's shard or partial.
    ::testing::Values(DeathCase{Op::kAllGatherMatmul, -1}, DeathCase{Op::kMatmulReduceScatter, -1}),
    [](const auto& info) {
      return std::string(info.param.op == Op::kAllGatherMatmul ? "AllGatherMatmul_DiesBefore"
                                                               : "MatmulReduceScatter_DiesBefore");
    });

}  // namespace
}  // namespace asynctp
