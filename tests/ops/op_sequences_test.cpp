// Random sequences of both fused ops (the CPU backend's overlapped path, the fallback, auto),
// shapes and gather/scatter dims changing from op to op (so the symmetric workspace grows in the
// middle of a sequence), fresh inputs for every op, nothing synchronized between ops; then every
// result against the same op on the unfused path, bit for bit (f32 on the CPU backend: the
// overlapped paths add in the unfused path's order). A push into a buffer a peer still reads, a
// flag taken for another op's, or a stale chunk would show up as a wrong result. The GPU
// version, with the native paths, is tests/ops/cuda (RandomSequencesOfOpsMatchTheUnfusedPath).
#include <random>
#include <vector>

#include "ops/op_testing.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;  // NOLINT(google-build-using-namespace)

class OpSequencesTest : public ::testing::TestWithParam<int> {};

TEST_P(OpSequencesTest, RandomSequencesMatchTheUnfusedPathBitForBit) {
  for (const uint64_t seed : {1u, 2u}) {
    SCOPED_TRACE(fmt::format("seed {}", seed));
    auto statuses = run_ranks(GetParam(), [&](OpContext& ctx) {
      struct Step {
        bool ag = false;
        int dim = 0;
        OwnedTensor a, b, out;
      };
      const int ws = ctx.world_size();
      const uint64_t me = static_cast<uint64_t>(ctx.rank());
      std::mt19937_64 rng(seed);  // the same sequence on every rank
      auto pick = [&](std::initializer_list<int64_t> v) {
        return *(v.begin() + static_cast<std::ptrdiff_t>(rng() % v.size()));
      };
      const PathChoice paths[] = {PathChoice::kSplit, PathChoice::kSplit, PathChoice::kFallback,
                                  PathChoice::kAuto};
      std::vector<Step> steps;
      for (int i = 0; i < 16; ++i) {
        Step s;
        s.ag = rng() % 2 == 0;
        const PathChoice path = paths[rng() % std::size(paths)];
        s.dim = rng() % 3 == 0 ? -1 : 0;  // the last dim (contraction / output columns) or rows
        const int64_t rows = pick({2, 5, 24}), k = pick({3, 16}), n = pick({4, 9});
        const uint64_t i64 = static_cast<uint64_t>(i);
        if (s.ag) {
          s.a = seeded({rows, k}, DType::kF32, {201, seed, i64, me});
          s.b = seeded(s.dim == 0 ? Dims{k, n} : Dims{k * ws, n}, DType::kF32, {202, seed, i64});
          s.out = empty_host(s.dim == 0 ? Dims{rows * ws, n} : Dims{rows, n}, DType::kF32);
          const Tensor bs[] = {s.b.tensor};
          const Tensor outs[] = {s.out.tensor};
          all_gather_matmul(ctx, s.a, bs, outs, Tensor(), {.gather_dim = s.dim, .path = path});
        } else {
          s.a = seeded({rows * ws, k}, DType::kF32, {203, seed, i64, me});
          s.b = seeded({k, n * ws}, DType::kF32, {204, seed, i64, me});
          s.out = empty_host(s.dim == 0 ? Dims{rows, n * ws} : Dims{rows * ws, n}, DType::kF32);
          matmul_reduce_scatter(ctx, s.a, s.b, s.out, {.scatter_dim = s.dim, .path = path});
        }
        steps.push_back(std::move(s));
      }
      for (size_t i = 0; i < steps.size(); ++i) {
        const Step& s = steps[i];
        SCOPED_TRACE(fmt::format("op {}: {} on dim {}", i,
                                 s.ag ? "all_gather_matmul" : "matmul_reduce_scatter", s.dim));
        OwnedTensor expected = empty_host(s.out.tensor.shape(), DType::kF32);
        if (s.ag) {
          const Tensor bs[] = {s.b.tensor};
          const Tensor outs[] = {expected.tensor};
          all_gather_matmul(ctx, s.a, bs, outs, Tensor(),
                            {.gather_dim = s.dim, .path = PathChoice::kFallback});
        } else {
          matmul_reduce_scatter(ctx, s.a, s.b, expected,
                                {.scatter_dim = s.dim, .path = PathChoice::kFallback});
        }
        EXPECT_TRUE(same_bits(s.out, expected));
      }
    });
    EXPECT_RANKS_OK(statuses);
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, OpSequencesTest, ::testing::ValuesIn(kWorldSizes),
                         world_size_name);

}  // namespace
}  // namespace asynctp
