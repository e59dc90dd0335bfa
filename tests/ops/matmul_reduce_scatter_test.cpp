// matmul_reduce_scatter (one product or a sum of several) and scaled_matmul_reduce_scatter
// against their unfused reference on every world size: each rank rebuilds every rank's A and B,
// computes every rank's product P_r in the output dtype, and reduces its own chunk over ranks in
// rank order ("GEMM then reduce-scatter"); the op also runs with the fallback forced. On the CPU
// backend all three must agree bit for bit:
//
//   P = A [.., K] @ B [K, N] -> A's shape with the last dim N;  out = RS(g)(P): dim g / ws
//
// including g = last (each rank's chunk comes from a column block of B).
#include <chrono>
#include <thread>

#include "ops/op_testing.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;  // NOLINT(google-build-using-namespace)

struct RsCase {
  Dims out_chunk;  // the output of one rank; the product is this with dim g times ws
  int scatter_dim = 0;
  std::vector<int64_t> ks{4};  // K of each product (several: the summed form)
  ReduceOp op = ReduceOp::kSum;
  DType dtype = DType::kF32;  // A's (and B's unless float8)
  DType out_dtype = DType::kF32;
  Layout a_layout = Layout::kContiguous;
  Layout b_layout = Layout::kContiguous;
  Layout out_layout = Layout::kContiguous;
  // float8 only:
  DType b_dtype = DType::kF32;
  bool rowwise = false;
  bool colwise = false;
  Layout scale_layout = Layout::kContiguous;  // of a row-wise A_scale
  bool fast_accum = false;                    // MatmulReduceScatterOptions::fast_accum
  Values float8_values = Values::kQuarters;

  bool scaled() const { return is_float8(dtype); }
  std::string describe() const {
    std::string s = fmt::format(
        "out chunk {} ({}), scatter_dim {}, K [{}], {}, A {} ({}), B {}, out {}", out_chunk,
        layout_name(out_layout), scatter_dim, fmt::join(ks, ", "), reduce_op_name(op), dtype,
        layout_name(a_layout), layout_name(b_layout), out_dtype);
    if (scaled()) {
      s += fmt::format(", B {}, A_scale {} ({}), B_scale {}{}", b_dtype,
                       rowwise ? "row-wise" : "tensor-wise", layout_name(scale_layout),
                       colwise ? "column-wise" : "tensor-wise", fast_accum ? ", fast_accum" : "");
    }
    return s;
  }
};

struct RankInputs {
  std::vector<OwnedTensor> as, bs;
  OwnedTensor a_scale, b_scale;
};

RankInputs inputs_of(const RsCase& c, uint64_t id, int rank, const Dims& product) {
  RankInputs in;
  const Values values = c.scaled() ? c.float8_values : Values::kRandom;
  const uint64_t r = static_cast<uint64_t>(rank);
  for (size_t i = 0; i < c.ks.size(); ++i) {
    in.as.push_back(
        seeded(with_dim(product, -1, c.ks[i]), c.dtype, {id, 1, r, i}, values, c.a_layout));
    in.bs.push_back(seeded({c.ks[i], product.back()}, c.scaled() ? c.b_dtype : c.dtype,
                           {id, 2, r, i}, values, c.b_layout));
  }
  if (c.scaled()) {
    in.a_scale = seeded(c.rowwise ? with_dim(product, -1, 1) : Dims{1}, DType::kF32, {id, 3, r},
                        Values::kPositive, c.rowwise ? c.scale_layout : Layout::kContiguous);
    in.b_scale = seeded(c.colwise ? Dims{1, product.back()} : Dims{}, DType::kF32, {id, 4, r},
                        Values::kPositive);
  }
  return in;
}

// P_r in the output dtype: one (scaled) GEMM, or several accumulated in f32 and rounded once.
OwnedTensor product_of(Backend& be, const RsCase& c, const RankInputs& in, const Dims& product) {
  OwnedTensor p = empty_host(product, c.out_dtype);
  if (in.as.size() == 1) {
    reference_gemm(be, in.as[0], in.bs[0], p, in.a_scale.tensor, in.b_scale.tensor);
    return p;
  }
  OwnedTensor acc = empty_host(product, DType::kF32);
  for (size_t i = 0; i < in.as.size(); ++i) {
    reference_gemm(be, in.as[i], in.bs[i], acc, {}, {}, /*accumulate=*/i > 0);
  }
  be.copy(p, acc, be.compute_stream());
  be.compute_stream().synchronize();  // acc goes with this call
  return p;
}

void run_op(OpContext& ctx, const RsCase& c, const RankInputs& in, const Tensor& out,
            const MatmulReduceScatterOptions& options) {
  if (c.scaled()) {
    scaled_matmul_reduce_scatter(ctx, in.as[0], in.a_scale, in.bs[0], in.b_scale, out, options);
  } else if (c.ks.size() == 1) {
    matmul_reduce_scatter(ctx, in.as[0], in.bs[0], out, options);
  } else {
    std::vector<Tensor> as(in.as.begin(), in.as.end()), bs(in.bs.begin(), in.bs.end());
    matmul_reduce_scatter(ctx, as, bs, out, options);
  }
}

void check_case(OpContext& ctx, const RsCase& c, uint64_t id) {
  SCOPED_TRACE(c.describe());
  Backend& be = ctx.backend();
  const int ws = ctx.world_size(), rank = ctx.rank();
  const int g = c.scatter_dim < 0 ? c.scatter_dim + c.out_chunk.size() : c.scatter_dim;
  const Dims product = with_dim(c.out_chunk, g, c.out_chunk[g] * ws);

  std::vector<OwnedTensor> products;
  for (int r = 0; r < ws; ++r)
    products.push_back(product_of(be, c, inputs_of(c, id, r, product), product));
  OwnedTensor expected = empty_host(c.out_chunk, c.out_dtype);
  reference_reduce_scatter(be, expected, products, g, rank, c.op);

  const RankInputs mine = inputs_of(c, id, rank, product);
  const char* op = c.scaled() ? "scaled_matmul_reduce_scatter" : "matmul_reduce_scatter";
  MatmulReduceScatterOptions options;
  options.reduce_op = c.op;
  options.scatter_dim = c.scatter_dim;
  options.fast_accum = c.fast_accum;
  OwnedTensor fused;
  for (PathChoice path : {PathChoice::kSplit, PathChoice::kFallback}) {
    SCOPED_TRACE(path_choice_name(path));
    options.path = path;
    OwnedTensor out = empty_with_layout(c.out_chunk, c.out_dtype, c.out_layout);
    fill_value(out, kSentinel);
    run_op(ctx, c, mine, out, options);
    expect_path(ctx, op, path_of(path));
    EXPECT_TRUE(same_bits(out, expected)) << "against the reference";
    if (path == PathChoice::kSplit) {
      fused = std::move(out);
    } else {
      EXPECT_TRUE(same_bits(out, fused)) << "fallback vs fused";
    }
  }
  // Deterministic: the fused path again gives the same bits.
  options.path = PathChoice::kSplit;
  OwnedTensor again = empty_host(c.out_chunk, c.out_dtype);
  run_op(ctx, c, mine, again, options);
  EXPECT_TRUE(same_bits(again, fused)) << "second fused run";
}

// Every (output chunk, scatter dim): 2-D and 3-D on every dim, 4-D once, and negative dims.
std::vector<std::pair<Dims, int>> chunks_and_dims() {
  return {{{2, 5}, 0},    {{2, 3}, 1},    {{3, 5}, -1},    {{1, 2, 3}, 0},
          {{2, 1, 3}, 1}, {{2, 3, 2}, 2}, {{2, 3, 4}, -2}, {{1, 2, 2, 3}, 2}};
}

class MatmulReduceScatterTest : public ::testing::TestWithParam<int> {
 protected:
  void run_cases(const std::vector<RsCase>& cases, const HarnessOptions& options = {}) {
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

TEST_P(MatmulReduceScatterTest, F32MatchesUnfusedBitForBit) {
  std::vector<RsCase> cases;
  for (const auto& [chunk, g] : chunks_and_dims()) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      RsCase c;
      c.out_chunk = chunk;
      c.scatter_dim = g;
      c.op = op;
      c.ks = {7};
      cases.push_back(c);
    }
  }
  run_cases(cases);
}

TEST_P(MatmulReduceScatterTest, TwoGemmStreams) {
  // ASYNCTP_GEMM_STREAMS=2: chunk GEMMs alternate between the compute stream and a second one.
  std::vector<RsCase> cases;
  for (const auto& [chunk, g] : chunks_and_dims()) {
    RsCase c;
    c.out_chunk = chunk;
    c.scatter_dim = g;
    c.op = g == 0 ? ReduceOp::kAvg : ReduceOp::kSum;
    cases.push_back(c);
  }
  HarnessOptions options;
  options.context.gemm_streams = 2;
  run_cases(cases, options);
}

TEST_P(MatmulReduceScatterTest, HalfPrecisionMatchesUnfusedBitForBit) {
  std::vector<RsCase> cases;
  int i = 0;
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (const auto& [chunk, g] : chunks_and_dims()) {
      RsCase c;
      c.out_chunk = chunk;
      c.scatter_dim = g;
      c.dtype = dtype;
      c.out_dtype = i % 3 == 2 ? DType::kF32 : dtype;
      c.op = i % 2 == 0 ? ReduceOp::kSum : ReduceOp::kAvg;
      c.ks = {5};
      cases.push_back(c);
      ++i;
    }
  }
  run_cases(cases);
}

TEST_P(MatmulReduceScatterTest, NonContiguousOperandsAndOutput) {
  std::vector<RsCase> cases;
  auto add = [&](Dims chunk, int g, Layout a, Layout b, Layout out, DType dtype, ReduceOp op) {
    RsCase c;
    c.out_chunk = chunk;
    c.scatter_dim = g;
    c.a_layout = a;
    c.b_layout = b;
    c.out_layout = out;
    c.dtype = c.out_dtype = dtype;
    c.op = op;
    cases.push_back(c);
  };
  // A transposed (its last two dims stored the other way round), B column-major, strided out.
  add({2, 5}, 0, Layout::kTransposed, Layout::kContiguous, Layout::kContiguous, DType::kF32,
      ReduceOp::kSum);
  add({2, 5}, 0, Layout::kContiguous, Layout::kTransposed, Layout::kPadded, DType::kF32,
      ReduceOp::kAvg);
  add({2, 3}, 1, Layout::kTransposed, Layout::kTransposed, Layout::kTransposed, DType::kF32,
      ReduceOp::kSum);
  add({2, 3}, 1, Layout::kPadded, Layout::kContiguous, Layout::kPadded, DType::kBF16,
      ReduceOp::kSum);
  add({2, 1, 3}, 1, Layout::kTransposed, Layout::kTransposed, Layout::kPadded, DType::kF32,
      ReduceOp::kAvg);
  add({2, 3, 2}, 2, Layout::kPadded, Layout::kTransposed, Layout::kTransposed, DType::kF16,
      ReduceOp::kSum);
  add({1, 2, 3}, 0, Layout::kTransposed, Layout::kContiguous, Layout::kTransposed, DType::kF32,
      ReduceOp::kSum);
  run_cases(cases);
}

TEST_P(MatmulReduceScatterTest, SumOfSeveralProducts) {
  std::vector<RsCase> cases;
  int i = 0;
  for (const auto& [chunk, g] : chunks_and_dims()) {
    RsCase c;
    c.out_chunk = chunk;
    c.scatter_dim = g;
    c.ks = i % 2 == 0 ? std::vector<int64_t>{3, 5} : std::vector<int64_t>{2, 4, 1};
    c.dtype = i % 3 == 1 ? DType::kBF16 : DType::kF32;
    c.out_dtype = i % 4 == 3 ? DType::kBF16 : c.dtype;
    c.op = i % 2 == 1 ? ReduceOp::kAvg : ReduceOp::kSum;
    c.a_layout = i % 5 == 2 ? Layout::kTransposed : Layout::kContiguous;
    c.b_layout = i % 3 == 0 ? Layout::kTransposed : Layout::kContiguous;
    cases.push_back(c);
    ++i;
  }
  run_cases(cases);
}

TEST_P(MatmulReduceScatterTest, Float8ScaledMatchesUnfused) {
  std::vector<RsCase> cases;
  const std::vector<std::pair<Dims, int>> chunks = {
      {{2, 5}, 0}, {{2, 3}, 1}, {{1, 2, 3}, 1}, {{2, 1, 2}, 2}};
  const DType outs[] = {DType::kF32, DType::kBF16, DType::kF16};
  int i = 0;
  for (auto [a_dtype, b_dtype] :
       {std::pair{DType::kF8E4M3, DType::kF8E4M3}, std::pair{DType::kF8E5M2, DType::kF8E5M2},
        std::pair{DType::kF8E4M3, DType::kF8E5M2}}) {
    for (const auto& [chunk, g] : chunks) {
      for (bool rowwise : {false, true}) {
        for (bool colwise : {false, true}) {
          if (a_dtype != b_dtype && rowwise != colwise) continue;
          RsCase c;
          c.out_chunk = chunk;
          c.scatter_dim = g;
          c.dtype = a_dtype;
          c.b_dtype = b_dtype;
          c.rowwise = rowwise;
          c.colwise = colwise;
          c.out_dtype = outs[i % 3];
          c.op = i % 2 == 0 ? ReduceOp::kSum : ReduceOp::kAvg;
          c.ks = {8};
          c.a_layout = i % 5 == 4 ? Layout::kTransposed : Layout::kContiguous;
          c.b_layout = i % 2 == 1 ? Layout::kTransposed : Layout::kContiguous;
          c.scale_layout = i % 3 == 0 ? Layout::kPadded : Layout::kContiguous;
          c.fast_accum = i % 4 >= 2;
          cases.push_back(c);
          ++i;
        }
      }
    }
  }
  run_cases(cases);
}

// fast_accum is a permission the CPU backend leaves unused: on random float8 values (whose f32
// sums round) both paths still give the exact reference's bits.
TEST_P(MatmulReduceScatterTest, Float8FastAccumulationGivesTheExactBits) {
  std::vector<RsCase> cases;
  for (const auto& [chunk, g] : std::vector<std::pair<Dims, int>>{{{2, 6}, 0}, {{2, 3, 2}, 2}}) {
    for (bool fast : {false, true}) {
      RsCase c;
      c.out_chunk = chunk;
      c.scatter_dim = g;
      c.dtype = c.b_dtype = DType::kF8E4M3;
      c.rowwise = c.colwise = g == 0;
      c.out_dtype = DType::kBF16;
      c.ks = {48};
      c.fast_accum = fast;
      c.float8_values = Values::kRandom;
      cases.push_back(c);
    }
  }
  run_cases(cases);
}

TEST_P(MatmulReduceScatterTest, EdgeShapes) {
  std::vector<RsCase> cases;
  auto add = [&](Dims chunk, int g, std::vector<int64_t> ks, DType dtype, bool rowwise = false) {
    RsCase c;
    c.out_chunk = chunk;
    c.scatter_dim = g;
    c.ks = ks;
    c.dtype = dtype;
    c.b_dtype = dtype;
    c.rowwise = rowwise;
    cases.push_back(c);
  };
  add({1, 3}, 0, {4}, DType::kF32);                       // one row per rank
  add({1, 1}, 1, {4}, DType::kF32);                       // one column per rank
  add({1, 2}, 1, {3}, DType::kF8E5M2, /*rowwise=*/true);  // a one-row A's own scale
  add({2, 1, 3}, 1, {1}, DType::kF32);                    // K = 1
  add({0, 3}, 1, {2}, DType::kF32);                       // empty products
  add({2, 3}, 0, {0}, DType::kF32);                       // K = 0: the product is zero
  add({2, 3}, 0, {2, 0}, DType::kBF16);
  run_cases(cases);
}

TEST_P(MatmulReduceScatterTest, BackToBackCallsWithSkewedRanks) {
  // One rank at a time arrives late: the opening barrier must keep its peers from pushing into
  // slots it is still reducing from, and no landed flag of one op may pass for the next one's.
  // Shapes alternate so that the workspace grows, with empty outputs between (an op that moves
  // nothing must leave no flag behind).
  auto statuses = run_ranks(GetParam(), [](OpContext& ctx) {
    for (int iter = 0; iter < 16; ++iter) {
      if (ctx.rank() == iter % ctx.world_size()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
      }
      RsCase c;
      c.out_chunk = iter % 4 == 3 ? Dims{0, 3} : iter % 3 == 2 ? Dims{40, 300} : Dims{2, 3};
      c.scatter_dim = iter % 2 == 0 ? 0 : -1;
      c.ks = {3};
      check_case(ctx, c, 1000 + iter);
    }
  });
  EXPECT_RANKS_OK(statuses);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, MatmulReduceScatterTest, ::testing::ValuesIn(kWorldSizes),
                         world_size_name);

}  // namespace
}  // namespace asynctp
