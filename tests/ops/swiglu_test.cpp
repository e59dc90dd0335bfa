// all_gather_matmul_swiglu against its unfused reference on every path of the CPU backend:
//
//   A_shard [.., s@g, .., k] -AG(g)-> A [ws*s, .., K];  P = A @ B_gate_up [K, 2N] in f32;
//   out = silu(P[.., :N]) * P[.., N:] in f32, rounded once;  pre_out = P rounded once.
//
// The reference gathers by concatenation, multiplies with the CPU reference GEMM into f32 and
// applies the SwiGLU written out here. Every path accumulates as that GEMM does (the native
// path's emulation, the split path's chunk GEMMs and K-slice partial sums, the fallback's one
// GEMM), so outputs compare bit for bit.
#include <cmath>

#include "ops/op_testing.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;  // NOLINT(google-build-using-namespace)

struct SwigluCase {
  Dims shard;
  int gather_dim = 0;
  int64_t n = 24;  // out's columns; B_gate_up has 2n
  DType dtype = DType::kBF16;
  DType out_dtype = DType::kBF16;
  Layout b_layout = Layout::kContiguous;
  bool return_pre = false;
  DType pre_dtype = DType::kBF16;
  bool return_a = false;
  size_t piece_bytes = 0;  // the native path's push pieces (0: one per shard)

  std::string describe() const {
    return fmt::format("A_shard {}{}, gather_dim {}, N {}, B {}, out {}{}{}, pieces of {} bytes",
                       dtype, shard, gather_dim, n, layout_name(b_layout), out_dtype,
                       return_pre ? fmt::format(", pre_out {}", pre_dtype) : "",
                       return_a ? ", returning A" : "", piece_bytes);
  }
};

// Runs one case on `path` (auto: expecting `expected`) and compares every output with the
// reference, bit for bit.
void check_swiglu(OpContext& ctx, const SwigluCase& c, uint64_t id, PathChoice path,
                  Path expected_path = Path::kNative) {
  SCOPED_TRACE(fmt::format("{} on path {}", c.describe(), static_cast<int>(path)));
  Backend& be = ctx.backend();
  const int ws = ctx.world_size();
  std::vector<OwnedTensor> shards;
  for (int r = 0; r < ws; ++r)
    shards.push_back(seeded(c.shard, c.dtype, {id, 1, uint64_t(r)}));
  const OwnedTensor a_full = concat(be, shards, c.gather_dim);
  const OwnedTensor b =
      seeded({c.shard.back() * (c.gather_dim == c.shard.size() - 1 ? ws : 1), 2 * c.n}, c.dtype,
             {id, 2}, Values::kRandom, c.b_layout);

  // The reference: the f32 products, then the SwiGLU of each row.
  const Dims pre_shape = with_dim(a_full->shape(), -1, 2 * c.n);
  const Dims out_shape = with_dim(a_full->shape(), -1, c.n);
  const OwnedTensor products = empty_host(pre_shape, DType::kF32);
  reference_gemm(be, a_full, b, products);
  const OwnedTensor expected = empty_host(out_shape, c.out_dtype);
  const int64_t rows = expected->numel() / c.n;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < c.n; ++j) {
      const float g = get(products, r * 2 * c.n + j);
      const float u = get(products, r * 2 * c.n + c.n + j);
      set(expected, r * c.n + j, g / (1.0f + std::exp(-g)) * u);
    }
  }
  const OwnedTensor expected_pre = empty_host(pre_shape, c.pre_dtype);
  be.copy(expected_pre, products, be.compute_stream());
  be.compute_stream().synchronize();

  const OwnedTensor out = filled(out_shape, c.out_dtype, kSentinel);
  const OwnedTensor pre = c.return_pre ? filled(pre_shape, c.pre_dtype, kSentinel) : OwnedTensor();
  const OwnedTensor a_out =
      c.return_a ? filled(a_full->shape(), c.dtype, kSentinel) : OwnedTensor();
  AllGatherMatmulOptions options;
  options.gather_dim = c.gather_dim;
  options.path = path;
  options.push_piece_bytes = c.piece_bytes;
  all_gather_matmul_swiglu(ctx, shards[ctx.rank()], b, out, pre.tensor, a_out.tensor, options);
  ctx.stream().synchronize();
  expect_path(ctx, "all_gather_matmul_swiglu",
              path == PathChoice::kAuto ? expected_path : path_of(path));
  EXPECT_TRUE(same_bits(out, expected)) << "out";
  if (c.return_pre) {
    EXPECT_TRUE(same_bits(pre, expected_pre)) << "pre_out";
  }
  if (c.return_a) {
    EXPECT_TRUE(same_bits(a_out, a_full)) << "A_out";
  }
}

// Cases every path runs (bf16 and f16 inputs, row gathers: the native GEMM's domain).
std::vector<SwigluCase> native_cases() {
  return {
      // On the 128-row tile grid, N a multiple of the 128-column SwiGLU tile.
      {.shard = {128, 32}, .n = 128},
      // Off the grid; N not a multiple of the tile (the last tile's gate half reads up columns,
      // which no output column takes); an f32 output and f32 products returned.
      {.shard = {40, 16},
       .n = 136,
       .out_dtype = DType::kF32,
       .return_pre = true,
       .pre_dtype = DType::kF32},
      // f16, a column-major B (the transposed right-hand side), the products in f16, A returned.
      {.shard = {24, 16},
       .n = 40,
       .dtype = DType::kF16,
       .out_dtype = DType::kF16,
       .b_layout = Layout::kTransposed,
       .return_pre = true,
       .pre_dtype = DType::kF16,
       .return_a = true},
      // 3-D, gathered on dim 1 after a batch dim of 1; bf16 products of an f32 output.
      {.shard = {1, 72, 16}, .gather_dim = 1, .n = 8, .out_dtype = DType::kF32, .return_pre = true},
      // N not a multiple of 8, with a column-major B (its up half starts on a row of B, which
      // TMA addresses at any N; a row-major B's would start off a 16-byte boundary).
      {.shard = {17, 8}, .n = 12, .b_layout = Layout::kTransposed},
      // 300 rows pushed in pieces of 128 rows: the tiles wait for the pieces they overlap.
      {.shard = {300, 16}, .n = 8, .return_pre = true, .piece_bytes = 128 * 16 * 2},
  };
}

class SwigluTest : public ::testing::TestWithParam<int> {};

TEST_P(SwigluTest, EveryPathMatchesTheUnfusedReferenceBitForBit) {
  auto statuses = run_ranks(GetParam(), [](OpContext& ctx) {
    const std::vector<SwigluCase> cases = native_cases();
    for (PathChoice path : {PathChoice::kNative, PathChoice::kSplit, PathChoice::kFallback}) {
      for (size_t i = 0; i < cases.size(); ++i)
        check_swiglu(ctx, cases[i], 100 + i, path);
    }
  });
  EXPECT_RANKS_OK(statuses);
}

// What only the split and fallback paths take: f32 inputs, the contraction-dim gather, gathers
// past a batch dim, B rows that are no multiple of 16 bytes (odd N), a row-major B whose up half
// starts off a 16-byte boundary (N % 8 != 0).
TEST_P(SwigluTest, SplitAndFallbackTakeWhatTheNativeGemmCannot) {
  auto statuses = run_ranks(GetParam(), [](OpContext& ctx) {
    const std::vector<SwigluCase> cases = {
        {.shard = {17, 8}, .n = 3, .return_pre = true},
        {.shard = {17, 8}, .n = 12},
        {.shard = {24, 16}, .n = 20, .dtype = DType::kF32, .out_dtype = DType::kF32},
        {.shard = {16, 8}, .gather_dim = 1, .n = 12, .return_pre = true, .return_a = true},
        {.shard = {2, 8, 8},
         .gather_dim = 1,
         .n = 16,
         .dtype = DType::kF16,
         .out_dtype = DType::kF32,
         .return_pre = true,
         .pre_dtype = DType::kF32},
    };
    for (PathChoice path : {PathChoice::kSplit, PathChoice::kFallback}) {
      for (size_t i = 0; i < cases.size(); ++i)
        check_swiglu(ctx, cases[i], 200 + i, path);
    }
  });
  EXPECT_RANKS_OK(statuses);
}

// Under auto the CPU backend takes the native path where it can run, and the split path
// otherwise (the usage counters say which); a repeated call (memoized) takes the same one.
TEST_P(SwigluTest, AutoTakesTheNativePathWhereItCan) {
  auto statuses = run_ranks(GetParam(), [](OpContext& ctx) {
    for (int i = 0; i < 2; ++i)
      check_swiglu(ctx, {.shard = {64, 16}, .n = 24}, 300, PathChoice::kAuto);
    EXPECT_EQ(ctx.usage().count("all_gather_matmul_swiglu", Path::kNative), 2);
    check_swiglu(ctx, {.shard = {16, 8}, .gather_dim = 1, .n = 8}, 301, PathChoice::kAuto,
                 Path::kSplit);
    check_swiglu(ctx, {.shard = {16, 8}, .n = 12}, 302, PathChoice::kAuto, Path::kSplit);
    EXPECT_EQ(ctx.usage().count("all_gather_matmul_swiglu", Path::kSplit), 2);
  });
  EXPECT_RANKS_OK(statuses);
}

// After a reserve, a call allocates no scratch: its workspaces were sized by the reserve.
TEST_P(SwigluTest, ReserveSizesTheSplitPathsProducts) {
  auto statuses = run_ranks(GetParam(), [](OpContext& ctx) {
    const OwnedTensor shard = seeded({32, 16}, DType::kBF16, {400, uint64_t(ctx.rank())});
    const OwnedTensor b = seeded({16, 48}, DType::kBF16, {401});
    reserve_all_gather_matmul_swiglu(ctx, shard, b, /*return_a=*/false,
                                     {.path = PathChoice::kSplit});
    const MemoryStats before = ctx.memory_stats();
    const OwnedTensor out = empty_host({32 * ctx.world_size(), 24}, DType::kBF16);
    all_gather_matmul_swiglu(ctx, shard, b, out, {}, {}, {.path = PathChoice::kSplit});
    ctx.stream().synchronize();
    EXPECT_EQ(ctx.memory_stats().local_bytes, before.local_bytes);
    EXPECT_EQ(ctx.memory_stats().symmetric_bytes, before.symmetric_bytes);
  });
  EXPECT_RANKS_OK(statuses);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SwigluTest, ::testing::Values(1, 2, 3, 4), world_size_name);

// The checks name the bad argument (one rank: they run before any communication).
TEST(SwigluErrorsTest, BadShapesAreRejectedNamingTheArgument) {
  auto statuses = run_ranks(1, [](OpContext& ctx) {
    const OwnedTensor shard = seeded({8, 16}, DType::kBF16, {500});
    const OwnedTensor odd_b = seeded({16, 7}, DType::kBF16, {501});
    const OwnedTensor b = seeded({16, 8}, DType::kBF16, {502});
    const OwnedTensor out = empty_host({8, 4}, DType::kBF16);
    const OwnedTensor wide_out = empty_host({8, 8}, DType::kBF16);
    const OwnedTensor bad_pre = empty_host({8, 4}, DType::kBF16);
    EXPECT_THAT(error_of([&] { all_gather_matmul_swiglu(ctx, shard, odd_b, out); }),
                ::testing::HasSubstr("must hold 2N columns"));
    EXPECT_THAT(error_of([&] { all_gather_matmul_swiglu(ctx, shard, b, wide_out); }),
                ::testing::HasSubstr("outs[0] must have shape [8, 4]"));
    EXPECT_THAT(error_of([&] { all_gather_matmul_swiglu(ctx, shard, b, out, bad_pre); }),
                ::testing::HasSubstr("pre_out must be contiguous of shape [8, 8]"));
  });
  EXPECT_RANKS_OK(statuses);
}

// swiglu_backward through the op: the backend's pass on the context's device (CPU: the same bits
// as the backend's own call), and its argument checks, each naming the operand.
TEST(SwigluBackwardTest, MatchesTheBackendAndRefusesBadOperands) {
  auto statuses = run_ranks(1, [](OpContext& ctx) {
    const OwnedTensor gate_up = seeded({8, 12}, DType::kBF16, {510});
    const OwnedTensor grad_out = seeded({8, 6}, DType::kBF16, {511});
    const OwnedTensor got = empty_host({8, 12}, DType::kBF16);
    swiglu_backward(ctx, grad_out, gate_up, got);
    ctx.backend().synchronize();
    const OwnedTensor expected = empty_host({8, 12}, DType::kBF16);
    ctx.backend().swiglu_backward(expected, grad_out, gate_up, ctx.stream());
    ctx.backend().synchronize();
    EXPECT_TRUE(same_bits(got, expected));
    // In place over the products: refused, naming both.
    EXPECT_THAT(
        error_of([&] { swiglu_backward(ctx, grad_out, gate_up, gate_up); }),
        ::testing::AllOf(::testing::HasSubstr("swiglu_backward"),
                         ::testing::HasSubstr("grad_gate_up"), ::testing::HasSubstr("gate_up")));
    EXPECT_THAT(error_of([&] { swiglu_backward(ctx, grad_out, Tensor(), got); }),
                ::testing::HasSubstr("swiglu_backward: gate_up is undefined"));
    const Tensor elsewhere(got->data(), DType::kBF16, {8, 12}, Device::cuda(0));
    EXPECT_THAT(error_of([&] { swiglu_backward(ctx, grad_out, gate_up, elsewhere); }),
                ::testing::HasSubstr("swiglu_backward: grad_gate_up is on cuda:0 but the "
                                     "context runs on cpu"));
  });
  EXPECT_RANKS_OK(statuses);
}

}  // namespace
}  // namespace asynctp
