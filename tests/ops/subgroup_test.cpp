// The fused ops on a TP subgroup of a 2 x 2 mesh at world size 4, beside an ordinary collective
// on the DP subgroup and one on the world, all three groups and contexts alive at once in every
// process:
//
//   world  0 1 2 3        TP groups (rows):    {0,1} {2,3}   all_gather_matmul,
//          -------                                           matmul_reduce_scatter
//   node0  0 1            DP groups (columns): {0,2} {1,3}   all_reduce, all_gather
//   node1  2 3
//
// Each TP group draws its inputs from its own seeds, so a shard or partial that crossed from the
// other TP group would show. The references are the unfused ones (all-gather then one GEMM; GEMM
// then reduce-scatter in rank order), computed locally from every member's seeded inputs; on the
// CPU backend the ops must equal them bit for bit, on the overlapped path and on the fallback.
#include "ops/op_testing.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;  // NOLINT(google-build-using-namespace)

// The collectives take (ctx, out, in): in one place here, so a change of order is one edit.
void gather_into(OpContext& ctx, const Tensor& in, const Tensor& out, int dim) {
  all_gather(ctx, in, out, dim);
}

void expect_overlapped(OpContext& ctx, std::string_view op) {
  const auto last = ctx.usage().last(op);
  ASSERT_TRUE(last.has_value()) << op << " recorded no call";
  EXPECT_NE(last->path, Path::kFallback) << op << " fell back: " << last->reason;
}

// all_gather_matmul on the TP group: A_shard [s, k] -AG(g)-> A; outs[i] = A @ Bs[i].
void check_all_gather_matmul(OpContext& tp, int tp_index, uint64_t id, DType dtype,
                             int gather_dim) {
  SCOPED_TRACE(fmt::format("all_gather_matmul, TP group {}, {}, gather_dim {}", tp_index, dtype,
                           gather_dim));
  Backend& be = tp.backend();
  const uint64_t group = static_cast<uint64_t>(tp_index);
  const Dims shard = {3, 4};
  std::vector<OwnedTensor> shards;
  for (int r = 0; r < tp.world_size(); ++r)
    shards.push_back(seeded(shard, dtype, {id, group, 1, uint64_t(r)}));
  const OwnedTensor a_full = concat(be, shards, gather_dim);
  const int64_t k = a_full->size(-1);
  std::vector<OwnedTensor> bs_owned, expected;
  std::vector<Tensor> bs;
  for (int64_t n : {5, 2}) {
    bs_owned.push_back(seeded({k, n}, dtype, {id, group, 2, uint64_t(n)}));
    bs.push_back(bs_owned.back());
    expected.push_back(empty_host(
        all_gather_matmul_out_shape(shards[0], bs.back(), gather_dim, tp.world_size()), dtype));
    reference_gemm(be, a_full, bs.back(), expected.back());
  }
  for (PathChoice path : {PathChoice::kAuto, PathChoice::kFallback}) {
    SCOPED_TRACE(path_choice_name(path));
    std::vector<OwnedTensor> outs_owned;
    std::vector<Tensor> outs;
    for (const auto& e : expected) {
      outs_owned.push_back(empty_host(e->shape(), dtype));
      fill_value(outs_owned.back(), -1.0f);
      outs.push_back(outs_owned.back());
    }
    OwnedTensor a_out = empty_host(a_full->shape(), dtype);
    AllGatherMatmulOptions options;
    options.gather_dim = gather_dim;
    options.path = path;
    all_gather_matmul(tp, shards[tp.rank()], bs, outs, a_out, options);
    if (path == PathChoice::kAuto) expect_overlapped(tp, "all_gather_matmul");
    for (size_t i = 0; i < outs.size(); ++i)
      EXPECT_TRUE(same_bits(outs[i], expected[i])) << "outs[" << i << "]";
    EXPECT_TRUE(same_bits(a_out, a_full)) << "the gathered A";
  }
}

// matmul_reduce_scatter on the TP group: out = RS(A [m, k] @ B [k, n], scatter_dim).
void check_matmul_reduce_scatter(OpContext& tp, int tp_index, uint64_t id, DType dtype,
                                 int scatter_dim) {
  SCOPED_TRACE(fmt::format("matmul_reduce_scatter, TP group {}, {}, scatter_dim {}", tp_index,
                           dtype, scatter_dim));
  Backend& be = tp.backend();
  const uint64_t group = static_cast<uint64_t>(tp_index);
  const int ws = tp.world_size();
  const Dims a_shape = {2 * ws, 6};
  const OwnedTensor b = seeded({6, 2 * ws}, dtype, {id, group, 2});
  std::vector<OwnedTensor> as, products;
  for (int r = 0; r < ws; ++r) {
    as.push_back(seeded(a_shape, dtype, {id, group, 1, uint64_t(r)}));
    // Each rank's product rounded to the output dtype, as the op's partials are.
    products.push_back(empty_host({2 * ws, 2 * ws}, dtype));
    reference_gemm(be, as.back(), b, products.back());
  }
  OwnedTensor expected =
      empty_host(matmul_reduce_scatter_out_shape(as[0], b, scatter_dim, ws), dtype);
  reference_reduce_scatter(be, expected, products, scatter_dim, tp.rank(), ReduceOp::kSum);
  for (PathChoice path : {PathChoice::kAuto, PathChoice::kFallback}) {
    SCOPED_TRACE(path_choice_name(path));
    OwnedTensor out = empty_host(expected->shape(), dtype);
    fill_value(out, -1.0f);
    MatmulReduceScatterOptions options;
    options.scatter_dim = scatter_dim;
    options.path = path;
    matmul_reduce_scatter(tp, as[tp.rank()], b, out, options);
    if (path == PathChoice::kAuto) expect_overlapped(tp, "matmul_reduce_scatter");
    EXPECT_TRUE(same_bits(out, expected));
  }
}

// all_reduce and all_gather on the DP group (or the world): inputs seeded by global rank.
void check_collectives(OpContext& ctx, const char* name, uint64_t id) {
  SCOPED_TRACE(fmt::format("collectives on the {} group", name));
  Backend& be = ctx.backend();
  const Dims shape = {3, 4};
  std::vector<OwnedTensor> ins;
  for (int r = 0; r < ctx.world_size(); ++r)
    ins.push_back(seeded(shape, DType::kF32, {id, 7, uint64_t(ctx.group().global_rank(r))}));
  std::vector<Tensor> parts(ins.begin(), ins.end());
  OwnedTensor sum = empty_host(shape, DType::kF32);
  be.reduce(sum, parts, ReduceOp::kSum, be.compute_stream());
  OwnedTensor inout = contiguous_copy(be, ins[ctx.rank()]);
  all_reduce(ctx, inout, ReduceOp::kSum);
  EXPECT_TRUE(same_bits(inout, sum)) << "all_reduce";
  OwnedTensor gathered = empty_host(with_dim(shape, 1, 4 * ctx.world_size()), DType::kF32);
  gather_into(ctx, ins[ctx.rank()], gathered, 1);
  EXPECT_TRUE(same_bits(gathered, concat(be, ins, 1))) << "all_gather";
}

TEST(Subgroups, TensorParallelOnTheRowsOfATwoByTwoMesh) {
  HarnessOptions options;
  options.host_id = [](int rank) { return fmt::format("node{}", rank / 2); };
  auto statuses = run_processes(
      4,
      [&](const RendezvousInfo& info) {
        const int r = info.rank;
        auto world = Group::create(info, rank_group_options(options, r));
        const int row = r / 2, column = r % 2;
        auto tp_group = world->split(std::vector<int>{2 * row, 2 * row + 1});
        auto dp_group = world->split(std::vector<int>{column, column + 2});
        ASSERT_EQ(tp_group->rank(), column);
        ASSERT_EQ(dp_group->rank(), row);
        auto tp = OpContext::create(tp_group, options.context);
        auto dp = OpContext::create(dp_group, options.context);
        auto all = OpContext::create(world, options.context);
        uint64_t id = 0;
        for (int round = 0; round < 2; ++round) {
          for (DType dtype : {DType::kF32, DType::kBF16}) {
            check_all_gather_matmul(*tp, row, ++id, dtype, 0);
            check_collectives(*dp, "DP", ++id);
            check_matmul_reduce_scatter(*tp, row, ++id, dtype, 0);
            check_all_gather_matmul(*tp, row, ++id, dtype, -1);
            check_collectives(*all, "world", ++id);
            check_matmul_reduce_scatter(*tp, row, ++id, dtype, -1);
          }
        }
        // The symmetric memory of each group is its own: a TP context released first leaves
        // the DP and world contexts working.
        tp.reset();
        check_collectives(*dp, "DP", ++id);
        check_collectives(*all, "world", ++id);
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

}  // namespace
}  // namespace asynctp
