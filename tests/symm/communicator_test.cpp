// The communicators a CPU context uses for ordinary collectives: symmetric memory on one node
// (in pieces when the input is larger than the workspace limit), and the store when the group
// spans nodes. Every result is checked bit for bit against a reference each rank rebuilds from
// the seeded inputs of every rank: all-gather is a copy, reductions add in f32 in rank order.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/multiprocess.h"
#include "support/tensor_testing.h"
#include "symm/cpu_symmetric_memory.h"
#include "symm/symm_communicator.h"

namespace asynctp {
namespace {

using testing::fill_seeded;
using testing::get;
using testing::same_bits;
using testing::seed_of;
using testing::Values;

struct CommCase {
  int world_size;
  bool spans_nodes;
  size_t max_workspace_bytes;  // 0: the default
};

void PrintTo(const CommCase& c, std::ostream* os) {
  *os << c.world_size << " ranks, " << (c.spans_nodes ? "spanning nodes" : "one node")
      << ", workspace limit " << c.max_workspace_bytes;
}

std::string comm_case_name(const ::testing::TestParamInfo<CommCase>& info) {
  const CommCase& c = info.param;
  return fmt::format(
      "ws{}_{}{}", c.world_size, c.spans_nodes ? "store" : "symm",
      c.max_workspace_bytes > 0 ? fmt::format("_limit{}", c.max_workspace_bytes) : "");
}

testing::HarnessOptions harness_options(const CommCase& c) {
  testing::HarnessOptions options;
  if (c.spans_nodes) options.host_id = [](int rank) { return fmt::format("node-{}", rank % 2); };
  if (c.max_workspace_bytes > 0) options.context.max_workspace_bytes = c.max_workspace_bytes;
  return options;
}

// Input of `rank` for test `tag`.
OwnedTensor input_of(uint64_t tag, int rank, Dims shape, DType dtype) {
  OwnedTensor t = empty_host(shape, dtype);
  fill_seeded(t, seed_of({tag, static_cast<uint64_t>(rank)}), Values::kRandom);
  return t;
}

// f32 sum in rank order of `part(r)` over ranks (divided by ws for avg), rounded once into out.
template <typename PartOf>
void reference_reduce(const Tensor& out, int ws, ReduceOp op, PartOf part_of) {
  std::vector<float> acc(out.numel(), 0.0f);
  for (int r = 0; r < ws; ++r) {
    const OwnedTensor part = part_of(r);
    for (int64_t i = 0; i < out.numel(); ++i)
      acc[i] = r == 0 ? get(part, i) : acc[i] + get(part, i);
  }
  for (int64_t i = 0; i < out.numel(); ++i) {
    testing::set(out, i, op == ReduceOp::kAvg ? acc[i] / static_cast<float>(ws) : acc[i]);
  }
}

class CommunicatorTest : public ::testing::TestWithParam<CommCase> {};

TEST_P(CommunicatorTest, AllGatherReduceScatterAllReduce) {
  const CommCase param = GetParam();
  auto statuses = testing::run_ranks(
      param.world_size,
      [param](OpContext& ctx) {
        const int ws = ctx.world_size(), rank = ctx.rank();
        Communicator& comm = ctx.communicator();
        EXPECT_EQ(comm.name(), param.spans_nodes && ws > 1 ? "store" : "symm");
        Stream& stream = ctx.stream();
        uint64_t tag = 0;
        for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
          for (const Dims& shape : {Dims{3, 5}, Dims{2, 3, 4}, Dims{1, 1}}) {
            SCOPED_TRACE(fmt::format("{}{}", dtype, shape));
            // all_gather: out [ws * n, ...] holds every rank's input in rank order.
            ++tag;
            const OwnedTensor in = input_of(tag, rank, shape, dtype);
            Dims gathered = shape;
            gathered[0] *= ws;
            OwnedTensor out = empty_host(gathered, dtype);
            comm.all_gather(out, in, stream);
            for (int r = 0; r < ws; ++r) {
              EXPECT_TRUE(
                  same_bits(out->narrow(0, r * shape[0], shape[0]), input_of(tag, r, shape, dtype)))
                  << "all_gather, slice of rank " << r;
            }
            for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
              SCOPED_TRACE(reduce_op_name(op));
              // reduce_scatter: out [n, ...] = op over ranks of their slice `rank`.
              ++tag;
              const OwnedTensor rs_in = input_of(tag, rank, gathered, dtype);
              OwnedTensor rs_out = empty_host(shape, dtype);
              comm.reduce_scatter(rs_out, rs_in, op, stream);
              OwnedTensor expected = empty_host(shape, dtype);
              reference_reduce(expected, ws, op, [&](int r) {
                OwnedTensor part = empty_host(shape, dtype);
                const OwnedTensor in = input_of(tag, r, gathered, dtype);
                ctx.backend().copy(part, in->narrow(0, rank * shape[0], shape[0]), stream);
                stream.synchronize();  // `in` goes with this scope
                return part;
              });
              EXPECT_TRUE(same_bits(rs_out, expected)) << "reduce_scatter";
              // all_reduce: in place, the same bits on every rank.
              ++tag;
              OwnedTensor ar = input_of(tag, rank, shape, dtype);
              comm.all_reduce(ar, op, stream);
              reference_reduce(expected, ws, op,
                               [&](int r) { return input_of(tag, r, shape, dtype); });
              EXPECT_TRUE(same_bits(ar, expected)) << "all_reduce";
            }
          }
        }
        if (param.max_workspace_bytes > 0 && !param.spans_nodes) {
          EXPECT_LE(ctx.workspace().capacity(), param.max_workspace_bytes);
        }
      },
      harness_options(param));
  EXPECT_RANKS_OK(statuses);
}

TEST_P(CommunicatorTest, InputsLargerThanTheWorkspaceGoInPieces) {
  const CommCase param = GetParam();
  auto statuses = testing::run_ranks(
      param.world_size,
      [](OpContext& ctx) {
        const int ws = ctx.world_size(), rank = ctx.rank();
        const Dims shape{37, 11};  // 407 elements per rank: many pieces under a small limit
        Dims gathered = shape;
        gathered[0] *= ws;
        const OwnedTensor in = input_of(100, rank, shape, DType::kF32);
        OwnedTensor out = empty_host(gathered, DType::kF32);
        ctx.communicator().all_gather(out, in, ctx.stream());
        for (int r = 0; r < ws; ++r) {
          EXPECT_TRUE(same_bits(out->narrow(0, r * 37, 37), input_of(100, r, shape, DType::kF32)));
        }
        const OwnedTensor rs_in = input_of(101, rank, gathered, DType::kF32);
        OwnedTensor rs_out = empty_host(shape, DType::kF32);
        ctx.communicator().reduce_scatter(rs_out, rs_in, ReduceOp::kSum, ctx.stream());
        OwnedTensor expected = empty_host(shape, DType::kF32);
        reference_reduce(expected, ws, ReduceOp::kSum, [&](int r) {
          OwnedTensor part = empty_host(shape, DType::kF32);
          const OwnedTensor in = input_of(101, r, gathered, DType::kF32);
          ctx.backend().copy(part, in->narrow(0, rank * 37, 37), ctx.stream());
          ctx.stream().synchronize();  // `in` goes with this scope
          return part;
        });
        EXPECT_TRUE(same_bits(rs_out, expected));
        OwnedTensor ar = input_of(102, rank, shape, DType::kF32);
        ctx.communicator().all_reduce(ar, ReduceOp::kAvg, ctx.stream());
        reference_reduce(expected, ws, ReduceOp::kAvg,
                         [&](int r) { return input_of(102, r, shape, DType::kF32); });
        EXPECT_TRUE(same_bits(ar, expected));
      },
      harness_options(param));
  EXPECT_RANKS_OK(statuses);
}

INSTANTIATE_TEST_SUITE_P(Cases, CommunicatorTest,
                         ::testing::Values(CommCase{1, false, 0}, CommCase{2, false, 0},
                                           CommCase{3, false, 0}, CommCase{8, false, 0},
                                           CommCase{2, false, 64}, CommCase{3, false, 100},
                                           CommCase{8, false, 40}, CommCase{2, true, 0},
                                           CommCase{3, true, 0}),
                         comm_case_name);

TEST(SymmCommunicatorTest, WorkspaceTooSmallForOneElementPerRankIsAnError) {
  auto statuses = testing::run_ranks(4, [](OpContext& ctx) {
    auto allocator = make_cpu_symm_allocator(ctx.group());
    SymmWorkspace workspace(*allocator, ctx.backend(),
                            8);  // 4 ranks need 16 bytes to reduce-scatter
    auto comm = make_symm_communicator(ctx.backend(), workspace, ctx.rank(), ctx.world_size());
    OwnedTensor in = empty_host({4, 2}, DType::kF32);
    OwnedTensor out = empty_host({1, 2}, DType::kF32);
    EXPECT_THAT(
        testing::error_of([&] { comm->reduce_scatter(out, in, ReduceOp::kSum, ctx.stream()); }),
        ::testing::HasSubstr("the symmetric workspace limit 8 is too small"));
  });
  EXPECT_RANKS_OK(statuses);
}

TEST(SymmCommunicatorTest, ContextUsesTheStoreUnderATinyWorkspaceLimit) {
  // A limit below one f32 per rank (0 turns symmetric memory off): the context's collectives go
  // through the store instead of failing.
  for (size_t limit : {size_t{0}, size_t{15}}) {
    testing::HarnessOptions options;
    options.context.max_workspace_bytes = limit;
    auto statuses = testing::run_ranks(
        4,
        [](OpContext& ctx) {
          EXPECT_EQ(ctx.communicator().name(), "store");
          OwnedTensor in = empty_host({4, 2}, DType::kF32);
          testing::fill_value(in, static_cast<float>(ctx.rank()));
          OwnedTensor out = empty_host({1, 2}, DType::kF32);
          ctx.communicator().reduce_scatter(out, in, ReduceOp::kSum, ctx.stream());
          EXPECT_EQ(get(out, 0), 0.0f + 1.0f + 2.0f + 3.0f);
          EXPECT_EQ(ctx.workspace().capacity(), 0u);
        },
        options);
    EXPECT_RANKS_OK(statuses) << "limit " << limit;
  }
  testing::HarnessOptions options;
  options.context.max_workspace_bytes = 16;
  auto statuses = testing::run_ranks(
      4, [](OpContext& ctx) { EXPECT_EQ(ctx.communicator().name(), "symm"); }, options);
  EXPECT_RANKS_OK(statuses);
}

TEST(SymmCommunicatorTest, ChecksItsArguments) {
  auto statuses = testing::run_ranks(2, [](OpContext& ctx) {
    OwnedTensor in = empty_host({2, 3}, DType::kF32);
    OwnedTensor out = empty_host({2, 3}, DType::kF32);
    EXPECT_THAT(testing::error_of([&] { ctx.communicator().all_gather(out, in, ctx.stream()); }),
                ::testing::HasSubstr("all_gather: output must be [4, 3]"));
    EXPECT_THAT(testing::error_of(
                    [&] { ctx.communicator().all_reduce(in->t(), ReduceOp::kSum, ctx.stream()); }),
                ::testing::HasSubstr(
                    "all_reduce: tensor f32[3, 2] strides [1, 3] on cpu must be contiguous"));
  });
  EXPECT_RANKS_OK(statuses);
}

}  // namespace
}  // namespace asynctp
