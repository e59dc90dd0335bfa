// all_gather_matmul and all_gather_scaled_matmul against their unfused reference, on every world
// size: each rank rebuilds every rank's shard, concatenates them on the gather dim and runs one
// GEMM per B (the "all_gather then GEMM" reference), and also runs the op with the fallback path
// forced. On the CPU backend the fused path must equal both bit for bit, for every dtype:
//
//   A_shard [.., s@g, .., k] -AG(g)-> A [.., ws*s@g, .., K];  out_i = A @ B_i  [.., N_i]
//
// including g = last (each shard a slice of K; the partial sums are accumulated in f32 in rank
// order, which on the CPU gives exactly the one-GEMM bits).
#include <chrono>
#include <thread>

#include "ops/op_testing.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;  // NOLINT(google-build-using-namespace)

struct AgCase {
  Dims shard;
  int gather_dim = 0;
  std::vector<int64_t> ns{5};
  bool return_a = false;
  DType dtype = DType::kF32;  // A and B (B's for float8, see b_dtype)
  DType out_dtype = DType::kF32;
  Layout a_layout = Layout::kContiguous;
  Layout b_layout = Layout::kContiguous;
  // float8 only:
  DType b_dtype = DType::kF32;
  bool rowwise = false;  // A_scale per row (else one element)
  bool colwise = false;  // B_scales per column (else one element)
  Layout scale_layout = Layout::kContiguous;
  std::vector<bool> fast_accum;  // AllGatherMatmulOptions::fast_accum
  Values float8_values = Values::kQuarters;
  bool scaled() const { return is_float8(dtype); }
  std::string describe() const {
    std::string s = fmt::format("A_shard {}{} ({}), gather_dim {}, Ns [{}], B {}, out {}{}", dtype,
                                shard, layout_name(a_layout), gather_dim, fmt::join(ns, ", "),
                                layout_name(b_layout), out_dtype, return_a ? ", returning A" : "");
    if (scaled()) {
      s += fmt::format(", B {}, A_scale {} ({}), B_scales {}, fast_accum [{}]", b_dtype,
                       rowwise ? "row-wise" : "tensor-wise", layout_name(scale_layout),
                       colwise ? "column-wise" : "tensor-wise", fmt::join(fast_accum, ", "));
    }
    return s;
  }
};

// Runs one case fused and forced-unfused on this rank and checks both against the reference.
void check_case(OpContext& ctx, const AgCase& c, uint64_t id) {
  SCOPED_TRACE(c.describe());
  Backend& be = ctx.backend();
  const int ws = ctx.world_size(), rank = ctx.rank();
  const int g = c.gather_dim < 0 ? c.gather_dim + c.shard.size() : c.gather_dim;
  const Values values = c.scaled() ? c.float8_values : Values::kRandom;

  std::vector<OwnedTensor> shards, scales;
  for (int r = 0; r < ws; ++r) {
    shards.push_back(seeded(c.shard, c.dtype, {id, 1, uint64_t(r)}, values, c.a_layout));
    if (c.rowwise) {
      scales.push_back(seeded(with_dim(c.shard, -1, 1), DType::kF32, {id, 2, uint64_t(r)},
                              Values::kPositive, c.scale_layout));
    }
  }
  // Tensor-wise: one scale, the same on every rank.
  if (c.scaled() && !c.rowwise)
    scales.push_back(seeded({1}, DType::kF32, {id, 2}, Values::kPositive));
  const OwnedTensor a_full = concat(be, shards, g);
  const int64_t k = a_full->size(-1);
  std::vector<OwnedTensor> bs_owned, b_scales_owned;
  std::vector<Tensor> bs, b_scales;
  for (size_t i = 0; i < c.ns.size(); ++i) {
    const DType b_dtype = c.scaled() ? c.b_dtype : c.dtype;
    bs_owned.push_back(seeded({k, c.ns[i]}, b_dtype, {id, 3, i}, values, c.b_layout));
    bs.push_back(bs_owned.back());
    if (c.scaled()) {
      b_scales_owned.push_back(seeded(c.colwise ? Dims{1, c.ns[i]} : Dims{1}, DType::kF32,
                                      {id, 4, i}, Values::kPositive));
      b_scales.push_back(b_scales_owned.back());
    }
  }

  // Reference: one GEMM per B over the whole gathered A.
  OwnedTensor scale_full;
  if (c.rowwise) scale_full = concat(be, scales, g);
  const Tensor a_scale_full =
      c.rowwise ? scale_full.tensor : (c.scaled() ? scales[0].tensor : Tensor());
  std::vector<OwnedTensor> expected;
  for (size_t i = 0; i < bs.size(); ++i) {
    expected.push_back(
        empty_host(all_gather_matmul_out_shape(shards[0], bs[i], g, ws), c.out_dtype));
    reference_gemm(be, a_full, bs[i], expected.back(), a_scale_full,
                   c.scaled() ? b_scales[i] : Tensor());
  }

  const Tensor& a_shard = shards[rank];
  const Tensor a_scale = c.scaled() ? scales[c.rowwise ? rank : 0].tensor : Tensor();
  std::vector<OwnedTensor> fused_outs;
  for (PathChoice path : {PathChoice::kSplit, PathChoice::kFallback}) {
    SCOPED_TRACE(path_choice_name(path));
    std::vector<OwnedTensor> outs_owned;
    std::vector<Tensor> outs;
    for (size_t i = 0; i < bs.size(); ++i) {
      outs_owned.push_back(filled(expected[i]->shape(), c.out_dtype, kSentinel));
      outs.push_back(outs_owned.back());
    }
    const OwnedTensor a_out =
        c.return_a ? filled(a_full->shape(), c.dtype, kSentinel) : OwnedTensor();
    AllGatherMatmulOptions options;
    options.gather_dim = c.gather_dim;
    options.path = path;
    options.fast_accum = c.fast_accum;
    const char* op = c.scaled() ? "all_gather_scaled_matmul" : "all_gather_matmul";
    if (c.scaled()) {
      all_gather_scaled_matmul(ctx, a_shard, a_scale, bs, b_scales, outs, a_out.tensor, options);
    } else {
      all_gather_matmul(ctx, a_shard, bs, outs, a_out.tensor, options);
    }
    expect_path(ctx, op, path_of(path));
    for (size_t i = 0; i < bs.size(); ++i) {
      EXPECT_TRUE(same_bits(outs[i], expected[i])) << "outs[" << i << "] against the reference";
      if (path == PathChoice::kFallback) {
        EXPECT_TRUE(same_bits(outs[i], fused_outs[i])) << "outs[" << i << "]: fallback vs fused";
      }
    }
    if (c.return_a) {
      EXPECT_TRUE(same_bits(a_out, a_full)) << "A_out";
    }
    if (path == PathChoice::kSplit) fused_outs = std::move(outs_owned);
  }
}

// Every (shard shape, gather dim) the tests walk: 2-D and 3-D on every dim, 4-D on two, and a
// negative gather_dim for the last dim.
std::vector<std::pair<Dims, int>> shapes_and_dims() {
  return {{{3, 4}, 0},    {{3, 4}, -1},      {{2, 3, 4}, 0},    {{2, 3, 4}, 1},
          {{2, 3, 4}, 2}, {{2, 1, 3, 2}, 2}, {{2, 1, 3, 2}, -1}};
}

class AllGatherMatmulTest : public ::testing::TestWithParam<int> {
 protected:
  void run_cases(const std::vector<AgCase>& cases, const HarnessOptions& options = {}) {
    auto statuses = run_ranks(
        GetParam(),
        [&](OpContext& ctx) {
          for (size_t i = 0; i < cases.size(); ++i)
            check_case(ctx, cases[i], i);
        },
        options);
    EXPECT_RANKS_OK(statuses);
  }
};

TEST_P(AllGatherMatmulTest, F32MatchesUnfusedBitForBit) {
  std::vector<AgCase> cases;
  for (const auto& [shard, g] : shapes_and_dims()) {
    for (const auto& ns : {std::vector<int64_t>{5}, std::vector<int64_t>{5, 1, 3}}) {
      for (bool return_a : {false, true}) {
        AgCase c;
        c.shard = shard;
        c.gather_dim = g;
        c.ns = ns;
        c.return_a = return_a;
        cases.push_back(c);
      }
    }
  }
  run_cases(cases);
}

TEST_P(AllGatherMatmulTest, TwoGemmStreams) {
  // ASYNCTP_GEMM_STREAMS=2: chunk GEMMs alternate between the compute stream and a second one.
  std::vector<AgCase> cases;
  for (const auto& [shard, g] : shapes_and_dims()) {
    AgCase c;
    c.shard = shard;
    c.gather_dim = g;
    c.ns = {3, 2};
    c.return_a = g == 0;
    cases.push_back(c);
  }
  HarnessOptions options;
  options.context.gemm_streams = 2;
  run_cases(cases, options);
}

TEST_P(AllGatherMatmulTest, HalfPrecisionMatchesUnfusedBitForBit) {
  std::vector<AgCase> cases;
  int i = 0;
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (const auto& [shard, g] : shapes_and_dims()) {
      AgCase c;
      c.shard = shard;
      c.gather_dim = g;
      c.ns = {4, 2, 3};
      c.dtype = dtype;
      c.out_dtype = i % 3 == 0 ? DType::kF32 : (i % 3 == 1 ? dtype : DType::kBF16);
      c.return_a = i % 2 == 0;
      cases.push_back(c);
      ++i;
    }
  }
  run_cases(cases);
}

TEST_P(AllGatherMatmulTest, NonContiguousShardAndColumnMajorB) {
  std::vector<AgCase> cases;
  auto add = [&](Dims shard, int g, Layout a, Layout b, bool return_a, DType dtype) {
    AgCase c;
    c.shard = shard;
    c.gather_dim = g;
    c.a_layout = a;
    c.b_layout = b;
    c.return_a = return_a;
    c.dtype = dtype;
    c.out_dtype = dtype;
    c.ns = {3, 2};
    cases.push_back(c);
  };
  add({3, 4}, 0, Layout::kTransposed, Layout::kContiguous, false, DType::kF32);
  add({3, 4}, 0, Layout::kPadded, Layout::kTransposed, true, DType::kF32);
  add({3, 4}, 1, Layout::kPadded, Layout::kContiguous, false, DType::kF32);
  add({3, 4}, 1, Layout::kTransposed, Layout::kTransposed, true, DType::kBF16);
  add({2, 3, 4}, 1, Layout::kTransposed, Layout::kTransposed, false, DType::kF32);
  add({2, 3, 4}, 0, Layout::kPadded, Layout::kContiguous, true, DType::kF16);
  add({2, 3, 4}, 2, Layout::kContiguous, Layout::kTransposed, false, DType::kF32);
  run_cases(cases);
}

TEST_P(AllGatherMatmulTest, Float8ScaledMatchesUnfused) {
  std::vector<AgCase> cases;
  const std::vector<std::pair<Dims, int>> shapes = {
      {{3, 4}, 0}, {{2, 3, 4}, 0}, {{2, 3, 4}, 1}, {{2, 1, 3, 2}, 2}};
  const DType outs[] = {DType::kF32, DType::kBF16, DType::kF16};
  int i = 0;
  for (auto [a_dtype, b_dtype] :
       {std::pair{DType::kF8E4M3, DType::kF8E4M3}, std::pair{DType::kF8E5M2, DType::kF8E5M2}}) {
    for (const auto& [shard, g] : shapes) {
      for (bool rowwise : {false, true}) {
        for (bool colwise : {false, true}) {
          AgCase c;
          c.shard = shard;
          c.gather_dim = g;
          c.dtype = a_dtype;
          c.b_dtype = b_dtype;
          c.rowwise = rowwise;
          c.colwise = colwise;
          c.out_dtype = outs[i % 3];
          c.ns = i % 2 == 0 ? std::vector<int64_t>{5} : std::vector<int64_t>{5, 2};
          c.return_a = i % 4 == 1;
          // Exact, fast for every B, or per B.
          if (i % 3 == 1) c.fast_accum = {true};
          if (i % 3 == 2)
            c.fast_accum =
                c.ns.size() == 1 ? std::vector<bool>{false} : std::vector<bool>{true, false};
          cases.push_back(c);
          ++i;
        }
      }
    }
  }
  // Mixed float8 kinds, column-major B, non-contiguous A and row-wise scales.
  AgCase mixed;
  mixed.shard = {3, 4};
  mixed.dtype = DType::kF8E4M3;
  mixed.b_dtype = DType::kF8E5M2;
  mixed.rowwise = mixed.colwise = true;
  mixed.out_dtype = DType::kBF16;
  mixed.a_layout = Layout::kPadded;
  mixed.b_layout = Layout::kTransposed;
  mixed.scale_layout = Layout::kPadded;
  cases.push_back(mixed);
  mixed.shard = {2, 3, 4};
  mixed.gather_dim = 1;
  mixed.a_layout = Layout::kTransposed;
  mixed.return_a = true;
  cases.push_back(mixed);
  run_cases(cases);
}

// fast_accum is a permission the CPU backend leaves unused: on random float8 values (whose f32
// sums round) both paths still give the exact reference's bits, for every B, per B or none.
TEST_P(AllGatherMatmulTest, Float8FastAccumulationGivesTheExactBits) {
  std::vector<AgCase> cases;
  for (const std::vector<bool>& fast :
       {std::vector<bool>{}, std::vector<bool>{true}, std::vector<bool>{false, true}}) {
    for (bool rowwise : {false, true}) {
      AgCase c;
      c.shard = {2, 3, 40};
      c.gather_dim = 1;
      c.dtype = c.b_dtype = DType::kF8E4M3;
      c.rowwise = c.colwise = rowwise;
      c.out_dtype = DType::kF32;
      c.ns = {5, 3};
      c.fast_accum = fast;
      c.float8_values = Values::kRandom;
      cases.push_back(c);
    }
  }
  run_cases(cases);
}

TEST_P(AllGatherMatmulTest, EdgeShapes) {
  std::vector<AgCase> cases;
  auto add = [&](Dims shard, int g, std::vector<int64_t> ns, DType dtype, bool rowwise = false,
                 DType out_dtype = DType::kF32) {
    AgCase c;
    c.shard = shard;
    c.gather_dim = g;
    c.ns = ns;
    c.dtype = dtype;
    c.b_dtype = dtype;
    c.out_dtype = out_dtype;
    c.rowwise = rowwise;
    c.return_a = true;
    cases.push_back(c);
  };
  add({2, 1, 3, 2}, 1, {3}, DType::kF32);  // gathering a dim of size 1
  add({1, 4}, 0, {2}, DType::kF32);        // one-row shards
  add({1, 4}, -1, {2}, DType::kBF16);
  add({1, 4}, 0, {2, 3}, DType::kF8E4M3, /*rowwise=*/true);  // a one-row shard's own scale
  add({3, 1}, 0, {1}, DType::kF32);                          // K = 1
  add({3, 1}, 1, {1}, DType::kF32);                          // K = ws
  add({0, 4}, 0, {2}, DType::kF32);                          // empty shards
  add({2, 0, 4}, 1, {2}, DType::kF32);
  add({2, 3}, 0, {0, 2}, DType::kF32);  // a B with no columns
  // A 16-bit contraction-dim gather into 16-bit outputs with nothing to accumulate (the f32
  // accumulator of the outputs would be empty): no rows, or no columns in the only B.
  add({0, 4}, -1, {2}, DType::kBF16, false, DType::kBF16);
  add({2, 0, 4}, 2, {2}, DType::kF16, false, DType::kF16);
  add({2, 3}, -1, {0}, DType::kBF16, false, DType::kBF16);
  run_cases(cases);
}

TEST_P(AllGatherMatmulTest, BackToBackCallsWithSkewedRanks) {
  // One rank at a time arrives late; the barriers must keep every rank from overwriting its
  // symmetric buffer while a peer still reads it. Shapes alternate so that the workspace grows.
  auto statuses = run_ranks(GetParam(), [](OpContext& ctx) {
    for (int iter = 0; iter < 12; ++iter) {
      if (ctx.rank() == iter % ctx.world_size()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
      }
      AgCase c;
      c.shard = iter % 3 == 2 ? Dims{40, 300} : Dims{2, 3};
      c.gather_dim = iter % 2 == 0 ? 0 : -1;
      c.ns = {2};
      check_case(ctx, c, 1000 + iter);
    }
  });
  EXPECT_RANKS_OK(statuses);
}

TEST_P(AllGatherMatmulTest, BackToBackLargeShardsCheckedAfterwards) {
  // Ops issued back to back with nothing in between, large enough that a rank can be preempted
  // in the middle of its pulls (more ranks than cores): a rank that started the next op before
  // every peer had finished reading its buffer would corrupt the peers' results. Checked once
  // all ops are done.
  constexpr int kOps = 6;
  const Dims shard{128, 512};
  auto statuses = run_ranks(GetParam(), [&](OpContext& ctx) {
    Backend& be = ctx.backend();
    const int ws = ctx.world_size();
    const OwnedTensor b = seeded({512, 2}, DType::kF32, {77});
    const Tensor bs[] = {b.tensor};
    std::vector<OwnedTensor> mine, outs;
    for (int i = 0; i < kOps; ++i) {
      mine.push_back(seeded(shard, DType::kF32, {78, uint64_t(i), uint64_t(ctx.rank())}));
      outs.push_back(empty_host({128 * ws, 2}, DType::kF32));
    }
    for (int i = 0; i < kOps; ++i) {
      const Tensor out[] = {outs[i].tensor};
      all_gather_matmul(ctx, mine[i], bs, out);
    }
    EXPECT_EQ(ctx.usage().count("all_gather_matmul", Path::kSplit), kOps);
    for (int i = 0; i < kOps; ++i) {
      std::vector<OwnedTensor> shards;
      for (int r = 0; r < ws; ++r)
        shards.push_back(seeded(shard, DType::kF32, {78, uint64_t(i), uint64_t(r)}));
      OwnedTensor expected = empty_host({128 * ws, 2}, DType::kF32);
      reference_gemm(be, concat(be, shards, 0), b, expected);
      EXPECT_TRUE(same_bits(outs[i], expected)) << "op " << i;
    }
  });
  EXPECT_RANKS_OK(statuses);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, AllGatherMatmulTest, ::testing::ValuesIn(kWorldSizes),
                         world_size_name);

}  // namespace
}  // namespace asynctp
