// The ordinary collectives of ops/collectives.h (what the fallbacks are built from) on every dim,
// any strides and every world size, through the symmetric-memory communicator and through the
// store when the group spans nodes; bit for bit against references built from every rank's
// seeded input (concatenation; f32 sums in rank order, rounded once).
#include "ops/op_testing.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;  // NOLINT(google-build-using-namespace)

void check_collectives(OpContext& ctx, uint64_t id, Dims shape, DType dtype, Layout in_layout,
                       Layout out_layout) {
  Backend& be = ctx.backend();
  const int ws = ctx.world_size(), rank = ctx.rank();
  for (int dim = 0; dim < shape.size(); ++dim) {
    SCOPED_TRACE(fmt::format("{}{} on dim {}, input {}, output {}", dtype, shape, dim,
                             layout_name(in_layout), layout_name(out_layout)));
    // all_gather: rank r's input lands at slice r of dim.
    std::vector<OwnedTensor> ins;
    for (int r = 0; r < ws; ++r)
      ins.push_back(seeded(shape, dtype, {id, 1, uint64_t(dim), uint64_t(r)}));
    const OwnedTensor in =
        seeded(shape, dtype, {id, 1, uint64_t(dim), uint64_t(rank)}, Values::kRandom, in_layout);
    const OwnedTensor gathered_ref = concat(be, ins, dim);
    OwnedTensor gathered = empty_with_layout(gathered_ref->shape(), dtype, out_layout);
    all_gather(ctx, in, gathered, dim);
    EXPECT_TRUE(same_bits(gathered, gathered_ref)) << "all_gather";

    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      SCOPED_TRACE(reduce_op_name(op));
      // reduce_scatter: chunk `rank` of dim, reduced over ranks in rank order.
      const Dims big = with_dim(shape, dim, shape[dim] * ws);
      std::vector<OwnedTensor> bigs;
      for (int r = 0; r < ws; ++r)
        bigs.push_back(seeded(big, dtype, {id, 2, uint64_t(dim), uint64_t(r)}));
      const OwnedTensor rs_in =
          seeded(big, dtype, {id, 2, uint64_t(dim), uint64_t(rank)}, Values::kRandom, in_layout);
      OwnedTensor expected = empty_host(shape, dtype);
      reference_reduce_scatter(be, expected, bigs, dim, rank, op);
      OwnedTensor rs_out = empty_with_layout(shape, dtype, out_layout);
      reduce_scatter(ctx, rs_in, rs_out, op, dim);
      EXPECT_TRUE(same_bits(rs_out, expected)) << "reduce_scatter";
    }
  }
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    std::vector<Tensor> all;
    std::vector<OwnedTensor> owned;
    for (int r = 0; r < ws; ++r) {
      owned.push_back(seeded(shape, dtype, {id, 3, uint64_t(r)}));
      all.push_back(owned.back());
    }
    OwnedTensor expected = empty_host(shape, dtype);
    be.reduce(expected, all, op, be.compute_stream());
    OwnedTensor inout = seeded(shape, dtype, {id, 3, uint64_t(rank)}, Values::kRandom, in_layout);
    all_reduce(ctx, inout, op);
    EXPECT_TRUE(same_bits(inout, expected)) << "all_reduce " << reduce_op_name(op);
  }
}

void check_all(OpContext& ctx) {
  uint64_t id = 0;
  check_collectives(ctx, ++id, {3, 4}, DType::kF32, Layout::kContiguous, Layout::kContiguous);
  check_collectives(ctx, ++id, {2, 3, 4}, DType::kF32, Layout::kContiguous, Layout::kContiguous);
  check_collectives(ctx, ++id, {2, 3, 4}, DType::kBF16, Layout::kTransposed, Layout::kPadded);
  check_collectives(ctx, ++id, {3, 2}, DType::kF16, Layout::kPadded, Layout::kTransposed);
  check_collectives(ctx, ++id, {1, 2, 1, 3}, DType::kF32, Layout::kTransposed, Layout::kContiguous);
  check_collectives(ctx, ++id, {2, 3}, DType::kF8E4M3, Layout::kContiguous, Layout::kContiguous);
}

class CollectivesTest : public ::testing::TestWithParam<int> {};

// Even and odd ranks on two "nodes": no symmetric memory spans the group, and the communicator
// goes through the store.
HarnessOptions across_two_nodes() {
  HarnessOptions options;
  options.host_id = [](int rank) { return rank % 2 == 0 ? "node-even" : "node-odd"; };
  return options;
}

TEST_P(CollectivesTest, EveryDimThroughSymmetricMemory) {
  auto statuses = run_ranks(GetParam(), [](OpContext& ctx) {
    EXPECT_EQ(ctx.communicator().name(), "symm");
    check_all(ctx);
  });
  EXPECT_RANKS_OK(statuses);
}

TEST_P(CollectivesTest, EveryDimThroughTheStoreAcrossNodes) {
  if (GetParam() == 1) GTEST_SKIP() << "one rank is always on one node";
  auto statuses = run_ranks(
      GetParam(),
      [](OpContext& ctx) {
        EXPECT_EQ(ctx.communicator().name(), "store");
        check_all(ctx);
      },
      across_two_nodes());
  EXPECT_RANKS_OK(statuses);
}

TEST_P(CollectivesTest, BarrierHoldsEveryStreamUntilTheLastRankArrives) {
  auto statuses = run_ranks(GetParam(), [](OpContext& ctx) {
    // The first barrier of a context makes the smallest symmetric workspace (collectively).
    EXPECT_EQ(ctx.workspace().capacity(), 0u);
    barrier(ctx);
    EXPECT_GT(ctx.workspace().capacity(), 0u);
    check_barrier_waits_for_the_last(ctx, /*host_free=*/true);
  });
  EXPECT_RANKS_OK(statuses);
}

TEST_P(CollectivesTest, BarrierThroughTheCommunicatorWithoutSymmetricMemory) {
  if (GetParam() == 1) GTEST_SKIP() << "one rank is always on one node";
  auto statuses = run_ranks(
      GetParam(),
      [](OpContext& ctx) {
        check_barrier_waits_for_the_last(ctx, /*host_free=*/false);
        EXPECT_EQ(ctx.workspace().capacity(), 0u);
      },
      across_two_nodes());
  EXPECT_RANKS_OK(statuses);
}

TEST_P(CollectivesTest, InPiecesUnderASmallWorkspaceLimit) {
  HarnessOptions options;
  options.context.max_workspace_bytes = 4 * 8 * 3;  // three f32 elements per rank at ws 8
  auto statuses = run_ranks(
      GetParam(),
      [](OpContext& ctx) {
        check_collectives(ctx, 50, {5, 7}, DType::kF32, Layout::kContiguous, Layout::kContiguous);
        check_collectives(ctx, 51, {3, 2, 5}, DType::kBF16, Layout::kPadded, Layout::kTransposed);
        EXPECT_LE(ctx.workspace().capacity(), ctx.workspace().max_bytes());
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

TEST(CollectivesArgumentsTest, NameTheBadArgument) {
  auto statuses = run_ranks(2, [](OpContext& ctx) {
    OwnedTensor in = empty_host({2, 3}, DType::kF32);
    OwnedTensor out = empty_host({4, 3}, DType::kF32);
    using ::testing::HasSubstr;
    EXPECT_THAT(error_of([&] { all_gather(ctx, in, out, 1); }),
                HasSubstr("all_gather: output must be f32[2, 6] for input f32[2, 3]"));
    EXPECT_THAT(error_of([&] { all_gather(ctx, in, out, 2); }), HasSubstr("dim 2 out of range"));
    OwnedTensor bf = empty_host({4, 3}, DType::kBF16);
    EXPECT_THAT(error_of([&] { all_gather(ctx, in, bf, 0); }), HasSubstr("got bf16[4, 3]"));
    EXPECT_THAT(error_of([&] { all_gather(ctx, Tensor(), out, 0); }),
                HasSubstr("all_gather: input is undefined"));
    const Tensor on_gpu(out->data(), DType::kF32, {4, 3}, Device::cuda(0));
    EXPECT_THAT(error_of([&] { all_gather(ctx, in, on_gpu, 0); }),
                HasSubstr("all_gather: output is on cuda:0 but the context runs on cpu"));
    EXPECT_THAT(error_of([&] { reduce_scatter(ctx, out, in, ReduceOp::kSum, 1); }),
                HasSubstr("dim 1 of the input (size 3) is not divisible by the world size 2"));
    EXPECT_THAT(error_of([&] { reduce_scatter(ctx, in, out, ReduceOp::kSum, 0); }),
                HasSubstr("reduce_scatter: output must be f32[1, 3] for input f32[2, 3]"));
    EXPECT_THAT(error_of([&] { all_reduce(ctx, Tensor(), ReduceOp::kSum); }),
                HasSubstr("all_reduce: tensor is undefined"));
    OwnedTensor mask = empty_host({2, 3}, DType::kBool);
    EXPECT_THAT(error_of([&] { all_reduce(ctx, mask, ReduceOp::kSum); }),
                HasSubstr("all_reduce: tensor is bool; the collectives take float dtypes"));
  });
  EXPECT_RANKS_OK(statuses);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CollectivesTest, ::testing::ValuesIn(kWorldSizes),
                         world_size_name);

}  // namespace
}  // namespace asynctp
