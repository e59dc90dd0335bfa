// The ops refuse an output that shares memory with an input or another output, on every call (a
// memo hit included), naming both operands and their byte spans; outputs that only touch an
// input's span, and broadcast (stride 0) inputs, pass. Then the check's own spans and its cost.
#include <time.h>

#include "ops/op_testing.h"
#include "ops/operand_overlap.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;  // NOLINT(google-build-using-namespace)
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr const char* kNoError = "<no error thrown>";

// One zeroed host allocation that every operand of a test is carved from, at byte offsets, so
// that the test decides which spans touch or overlap.
class Pool {
 public:
  Pool() : storage_(empty_host({kBytes / 4}, DType::kF32)) { fill_value(storage_, 0.0f); }

  Tensor at(size_t offset, DType dtype, Dims shape) const {
    return Tensor(base() + offset, dtype, shape);
  }
  Tensor at(size_t offset, DType dtype, Dims shape, Dims strides) const {
    return Tensor(base() + offset, dtype, shape, strides);
  }
  char* base() const { return storage_->data_as<char>(); }

 private:
  static constexpr size_t kBytes = size_t{1} << 16;
  OwnedTensor storage_;
};

// The text the error gives one operand: "name (description, bytes [begin, end))".
std::string operand_text(const char* name, const Tensor& t) {
  const detail::ByteSpan s = detail::byte_span(t);
  return fmt::format("{} ({}, bytes [{:#x}, {:#x}))", name, t.describe(), s.begin, s.end);
}

// The error of `op` for output `w` over operand `o`.
::testing::Matcher<std::string> overlap_error(const std::string& op, const char* w_name,
                                              const Tensor& w, const char* o_name,
                                              const Tensor& o) {
  return AllOf(HasSubstr(fmt::format("{}: {} overlaps {}", op, operand_text(w_name, w),
                                     operand_text(o_name, o))),
               HasSubstr("an output may share no memory with an input or another output"));
}

class OperandOverlapTest : public ::testing::TestWithParam<int> {};

TEST_P(OperandOverlapTest, AllGatherMatmul) {
  auto statuses = run_ranks(GetParam(), [](OpContext& ctx) {
    const int ws = ctx.world_size();
    const Pool pool;
    // A_shard [2, 3] f32 (24 bytes), gathered [2ws, 3]; Bs [3, 4] (48 bytes); outs [2ws, 4].
    const size_t out_bytes = 2 * ws * 4 * 4, a_out_bytes = 2 * ws * 3 * 4;
    const Tensor a = pool.at(0, DType::kF32, {2, 3});
    const Tensor b = pool.at(1024, DType::kF32, {3, 4});
    const Tensor b1 = pool.at(2048, DType::kF32, {3, 4});
    const Tensor out = pool.at(4096, DType::kF32, {2 * ws, 4});
    const Tensor a_out = pool.at(8192, DType::kF32, {2 * ws, 3});
    auto call = [&](const Tensor& a_shard, std::vector<Tensor> bs, std::vector<Tensor> outs,
                    const Tensor& gathered = {}) {
      return error_of([&] { all_gather_matmul(ctx, a_shard, bs, outs, gathered); });
    };
    const std::string op = "all_gather_matmul";
    // A good call first: the calls below hit its memo (the same metadata), and must still fail.
    EXPECT_EQ(call(a, {b}, {out}, a_out), kNoError);
    ctx.stream().synchronize();
    const Tensor out_on_a = pool.at(0, DType::kF32, {2 * ws, 4});
    EXPECT_THAT(call(a, {b}, {out_on_a}, a_out),
                overlap_error(op, "outs[0]", out_on_a, "A_shard", a));
    const Tensor out_on_b = pool.at(1024, DType::kF32, {2 * ws, 4});
    EXPECT_THAT(call(a, {b}, {out_on_b}, a_out),
                overlap_error(op, "outs[0]", out_on_b, "Bs[0]", b));
    // The gathered A over the output's last row.
    const Tensor a_out_on_out = pool.at(4096 + out_bytes - 16, DType::kF32, {2 * ws, 3});
    EXPECT_THAT(call(a, {b}, {out}, a_out_on_out),
                overlap_error(op, "outs[0]", out, "A_out", a_out_on_out));
    // The gathered A over Bs[1].
    const Tensor a_out_on_b1 = pool.at(2048 - 8, DType::kF32, {2 * ws, 3});
    EXPECT_THAT(call(a, {b, b1}, {out, pool.at(12288, DType::kF32, {2 * ws, 4})}, a_out_on_b1),
                overlap_error(op, "A_out", a_out_on_b1, "Bs[1]", b1));
    // Two Bs' outputs sharing one row (out1 starts at out0's last row), then the same memory.
    const Tensor out1 = pool.at(4096 + out_bytes - 16, DType::kF32, {2 * ws, 4});
    EXPECT_THAT(call(a, {b, b1}, {out, out1}), overlap_error(op, "outs[0]", out, "outs[1]", out1));
    EXPECT_THAT(call(a, {b, b1}, {out, out}), overlap_error(op, "outs[0]", out, "outs[1]", out));
    // An output whose last row is A_shard's first.
    const Tensor out_row = pool.at(0, DType::kF32, {2 * ws, 4});
    const Tensor a_after = pool.at(out_bytes - 16, DType::kF32, {2, 3});
    EXPECT_THAT(call(a_after, {b}, {out_row}),
                overlap_error(op, "outs[0]", out_row, "A_shard", a_after));
    // Neighbours: A_shard, outs[0], A_out, Bs[0] end to end; a broadcast A_shard (every row the
    // same 3 elements) and a broadcast B (every row the same 4) just before their neighbours.
    const Tensor n_a = pool.at(16384, DType::kF32, {2, 3});
    const Tensor n_out = pool.at(16384 + 24, DType::kF32, {2 * ws, 4});
    const Tensor n_a_out = pool.at(16384 + 24 + out_bytes, DType::kF32, {2 * ws, 3});
    const Tensor n_b = pool.at(16384 + 24 + out_bytes + a_out_bytes, DType::kF32, {3, 4});
    EXPECT_EQ(call(n_a, {n_b}, {n_out}, n_a_out), kNoError);
    ctx.stream().synchronize();
    const Tensor bcast_a = pool.at(20480, DType::kF32, {2, 3}, {0, 1});
    const Tensor bcast_b = pool.at(20480 + 12, DType::kF32, {3, 4}, {0, 1});
    const Tensor bcast_out = pool.at(20480 + 12 + 16, DType::kF32, {2 * ws, 4});
    EXPECT_EQ(call(bcast_a, {bcast_b}, {bcast_out}), kNoError);
    ctx.stream().synchronize();
  });
  EXPECT_RANKS_OK(statuses);
}

TEST_P(OperandOverlapTest, AllGatherMatmulSwiglu) {
  auto statuses = run_ranks(GetParam(), [](OpContext& ctx) {
    const int ws = ctx.world_size();
    const Pool pool;
    // A_shard [2, 3]; B_gate_up [3, 4]; out [2ws, 2]; pre_out [2ws, 4].
    const Tensor a = pool.at(0, DType::kF32, {2, 3});
    const Tensor b = pool.at(1024, DType::kF32, {3, 4});
    const Tensor out = pool.at(4096, DType::kF32, {2 * ws, 2});
    const Tensor pre = pool.at(8192, DType::kF32, {2 * ws, 4});
    auto call = [&](const Tensor& out_, const Tensor& pre_, const Tensor& a_out = {}) {
      return error_of([&] { all_gather_matmul_swiglu(ctx, a, b, out_, pre_, a_out); });
    };
    const std::string op = "all_gather_matmul_swiglu";
    EXPECT_EQ(call(out, pre), kNoError);
    ctx.stream().synchronize();
    const Tensor pre_on_out = pool.at(4096 + 8, DType::kF32, {2 * ws, 4});
    EXPECT_THAT(call(out, pre_on_out), overlap_error(op, "outs[0]", out, "pre_out", pre_on_out));
    const Tensor out_on_b = pool.at(1024 + 40, DType::kF32, {2 * ws, 2});
    EXPECT_THAT(call(out_on_b, pre), overlap_error(op, "outs[0]", out_on_b, "Bs[0]", b));
    const Tensor a_out_on_pre = pool.at(8192, DType::kF32, {2 * ws, 3});
    EXPECT_THAT(call(out, pre, a_out_on_pre),
                overlap_error(op, "pre_out", pre, "A_out", a_out_on_pre));
    // pre_out right after out, A_out right after pre_out: touching, not overlapping.
    const Tensor pre_next = pool.at(4096 + 2 * ws * 2 * 4, DType::kF32, {2 * ws, 4});
    const Tensor a_out_next = pool.at(4096 + 2 * ws * 6 * 4, DType::kF32, {2 * ws, 3});
    EXPECT_EQ(call(out, pre_next, a_out_next), kNoError);
    ctx.stream().synchronize();
  });
  EXPECT_RANKS_OK(statuses);
}

TEST_P(OperandOverlapTest, AllGatherScaledMatmul) {
  auto statuses = run_ranks(GetParam(), [](OpContext& ctx) {
    const int ws = ctx.world_size();
    const Pool pool;
    // f8 A_shard [2, 4], f8 Bs [4, 4], tensor-wise f32 scales, bf16 outs [2ws, 4].
    const Tensor a = pool.at(0, DType::kF8E4M3, {2, 4});
    const Tensor a_scale = pool.at(512, DType::kF32, {1});
    const Tensor b = pool.at(1024, DType::kF8E4M3, {4, 4});
    const Tensor b_scale = pool.at(1536, DType::kF32, {1});
    const Tensor out = pool.at(4096, DType::kBF16, {2 * ws, 4});
    auto call = [&](const Tensor& out_, const Tensor& a_scale_, const Tensor& b_scale_) {
      return error_of([&] { all_gather_scaled_matmul(ctx, a, a_scale_, b, b_scale_, out_); });
    };
    const std::string op = "all_gather_scaled_matmul";
    EXPECT_EQ(call(out, a_scale, b_scale), kNoError);
    ctx.stream().synchronize();
    const Tensor out_on_scale = pool.at(512 - 2, DType::kBF16, {2 * ws, 4});
    EXPECT_THAT(call(out_on_scale, a_scale, b_scale),
                overlap_error(op, "outs[0]", out_on_scale, "A_scale", a_scale));
    const Tensor b_scale_in_out = pool.at(4096 + 4, DType::kF32, {1});
    EXPECT_THAT(call(out, a_scale, b_scale_in_out),
                overlap_error(op, "outs[0]", out, "B_scales[0]", b_scale_in_out));
    // The scales just before and just after the output.
    EXPECT_EQ(call(out, pool.at(4096 - 4, DType::kF32, {1}),
                   pool.at(4096 + 2 * ws * 4 * 2, DType::kF32, {1})),
              kNoError);
    ctx.stream().synchronize();
  });
  EXPECT_RANKS_OK(statuses);
}

TEST_P(OperandOverlapTest, MatmulReduceScatter) {
  auto statuses = run_ranks(GetParam(), [](OpContext& ctx) {
    const int ws = ctx.world_size();
    const Pool pool;
    // A [2ws, 3] (24ws bytes); B [3, 2]; out [2, 2] (16 bytes).
    const Tensor a = pool.at(0, DType::kF32, {2 * ws, 3});
    const Tensor b = pool.at(1024, DType::kF32, {3, 2});
    const Tensor out = pool.at(4096, DType::kF32, {2, 2});
    auto call = [&](const Tensor& a_, const Tensor& b_, const Tensor& out_) {
      return error_of([&] { matmul_reduce_scatter(ctx, a_, b_, out_); });
    };
    const std::string op = "matmul_reduce_scatter";
    EXPECT_EQ(call(a, b, out), kNoError);
    ctx.stream().synchronize();
    const Tensor out_on_a = pool.at(0, DType::kF32, {2, 2});
    EXPECT_THAT(call(a, b, out_on_a), overlap_error(op, "out", out_on_a, "A", a));
    // The output's last row is B's first.
    const Tensor out_on_b = pool.at(1024 - 8, DType::kF32, {2, 2});
    EXPECT_THAT(call(a, b, out_on_b), overlap_error(op, "out", out_on_b, "B", b));
    // A strided output ([2, 2] strides [4, 1]) whose second row lands in A's last row.
    const Tensor strided_out = pool.at(24 * ws - 32, DType::kF32, {2, 2}, {4, 1});
    EXPECT_THAT(call(a, b, strided_out), overlap_error(op, "out", strided_out, "A", a));
    // The several-products form names As[i] / Bs[i].
    const Tensor a1 = pool.at(2048, DType::kF32, {2 * ws, 5});
    const Tensor b1 = pool.at(3072, DType::kF32, {5, 2});
    const std::vector<Tensor> as{a, a1}, bs{b, b1};
    auto call_sum = [&](const Tensor& out_) {
      return error_of([&] { matmul_reduce_scatter(ctx, as, bs, out_); });
    };
    EXPECT_EQ(call_sum(out), kNoError);
    ctx.stream().synchronize();
    const Tensor out_on_a1 = pool.at(2048 + 4, DType::kF32, {2, 2});
    EXPECT_THAT(call_sum(out_on_a1), overlap_error(op, "out", out_on_a1, "As[1]", a1));
    const Tensor out_on_b1 = pool.at(3072 + 36, DType::kF32, {2, 2});
    EXPECT_THAT(call_sum(out_on_b1), overlap_error(op, "out", out_on_b1, "Bs[1]", b1));
    // The output between A and B, touching both; a broadcast B ([3, 2] strides [0, 1]).
    const Tensor n_a = pool.at(8192, DType::kF32, {2 * ws, 3});
    const Tensor n_out = pool.at(8192 + 24 * ws, DType::kF32, {2, 2});
    const Tensor n_b = pool.at(8192 + 24 * ws + 16, DType::kF32, {3, 2}, {0, 1});
    EXPECT_EQ(call(n_a, n_b, n_out), kNoError);
    ctx.stream().synchronize();
  });
  EXPECT_RANKS_OK(statuses);
}

TEST_P(OperandOverlapTest, ScaledMatmulReduceScatter) {
  auto statuses = run_ranks(GetParam(), [](OpContext& ctx) {
    const int ws = ctx.world_size();
    const Pool pool;
    // f8 A [2ws, 4]; f8 B [4, 2]; tensor-wise scales; bf16 out [2, 2] (8 bytes).
    const Tensor a = pool.at(0, DType::kF8E4M3, {2 * ws, 4});
    const Tensor a_scale = pool.at(512, DType::kF32, {1});
    const Tensor b = pool.at(1024, DType::kF8E4M3, {4, 2});
    const Tensor b_scale = pool.at(1536, DType::kF32, {1});
    auto call = [&](const Tensor& out_) {
      return error_of([&] { scaled_matmul_reduce_scatter(ctx, a, a_scale, b, b_scale, out_); });
    };
    const std::string op = "scaled_matmul_reduce_scatter";
    EXPECT_EQ(call(pool.at(4096, DType::kBF16, {2, 2})), kNoError);
    ctx.stream().synchronize();
    const Tensor out_on_scale = pool.at(1536 - 6, DType::kBF16, {2, 2});
    EXPECT_THAT(call(out_on_scale), overlap_error(op, "out", out_on_scale, "B_scale", b_scale));
    const Tensor out_on_a_scale = pool.at(512, DType::kBF16, {2, 2});
    EXPECT_THAT(call(out_on_a_scale), overlap_error(op, "out", out_on_a_scale, "A_scale", a_scale));
    // Just after B_scale.
    EXPECT_EQ(call(pool.at(1536 + 4, DType::kBF16, {2, 2})), kNoError);
    ctx.stream().synchronize();
  });
  EXPECT_RANKS_OK(statuses);
}

TEST_P(OperandOverlapTest, Collectives) {
  auto statuses = run_ranks(GetParam(), [](OpContext& ctx) {
    const int ws = ctx.world_size();
    const Pool pool;
    const Tensor in = pool.at(0, DType::kF32, {2, 3});
    const Tensor gathered = pool.at(4096, DType::kF32, {2 * ws, 3});
    EXPECT_EQ(error_of([&] { all_gather(ctx, in, gathered); }), kNoError);
    ctx.stream().synchronize();
    // In place (the input as the output's slice of this rank) is refused as well.
    const Tensor in_place = pool.at(0, DType::kF32, {2 * ws, 3});
    EXPECT_THAT(error_of([&] { all_gather(ctx, in, in_place); }),
                overlap_error("all_gather", "output", in_place, "input", in));
    // Just after the input.
    EXPECT_EQ(error_of([&] {
                all_gather(ctx, in, pool.at(24, DType::kF32, {2 * ws, 3}));
              }),
              kNoError);
    ctx.stream().synchronize();
    const Tensor rs_in = pool.at(8192, DType::kF32, {2 * ws, 3});
    const Tensor rs_out = pool.at(8192 + 24 * ws - 12, DType::kF32, {2, 3});
    EXPECT_THAT(error_of([&] { reduce_scatter(ctx, rs_in, rs_out, ReduceOp::kSum); }),
                overlap_error("reduce_scatter", "output", rs_out, "input", rs_in));
    EXPECT_EQ(
        error_of([&] {
          reduce_scatter(ctx, rs_in, pool.at(8192 + 24 * ws, DType::kF32, {2, 3}), ReduceOp::kSum);
        }),
        kNoError);
    ctx.stream().synchronize();
  });
  EXPECT_RANKS_OK(statuses);
}

INSTANTIATE_TEST_SUITE_P(Ops, OperandOverlapTest, ::testing::Values(1, 2), world_size_name);

TEST(ByteSpanTest, FromShapeAndStrides) {
  const Pool pool;
  const auto begin = reinterpret_cast<uintptr_t>(pool.base());
  auto span = [&](const Tensor& t) {
    const detail::ByteSpan s = detail::byte_span(t);
    return std::pair<uintptr_t, uintptr_t>(s.begin - begin, s.end - begin);
  };
  using Span = std::pair<uintptr_t, uintptr_t>;
  EXPECT_EQ(span(pool.at(0, DType::kF32, {2, 3})), Span(0, 24));
  EXPECT_EQ(span(pool.at(8, DType::kBF16, {2, 3}, {5, 1})), Span(8, 8 + 16));  // padded rows
  EXPECT_EQ(span(pool.at(0, DType::kF32, {2, 3}, {1, 2})), Span(0, 24));       // column-major
  EXPECT_EQ(span(pool.at(0, DType::kF32, {4, 3}, {0, 1})), Span(0, 12));       // broadcast
  EXPECT_TRUE(detail::byte_span(pool.at(64, DType::kF32, {0, 3})).empty());
  EXPECT_TRUE(detail::byte_span(Tensor()).empty());
}

TEST(CheckNoOverlapTest, ZeroSizeAndUndefinedOverlapNothing) {
  const Pool pool;
  const Tensor in = pool.at(0, DType::kF32, {4});
  const Tensor empty_out = pool.at(4, DType::kF32, {0, 4});
  EXPECT_EQ(error_of([&] {
              detail::check_no_overlap("op", {{"in", in}}, {{"out", empty_out}, {"u", Tensor()}});
            }),
            kNoError);
  // Inputs may overlap each other.
  EXPECT_EQ(error_of([&] {
              detail::check_no_overlap("op", {{"x", in}, {"y", in}},
                                       {{"out", pool.at(16, DType::kF32, {4})}});
            }),
            kNoError);
  // One shared byte is enough.
  const Tensor out = pool.at(15, DType::kF8E4M3, {4});
  EXPECT_THAT(error_of([&] {
                detail::check_no_overlap("op", {{"in", in}}, {{"out", out}});
              }),
              overlap_error("op", "out", out, "in", in));
}

// The check runs on every op call: timed alone, in thread CPU time, for an all_gather_matmul
// of three Bs returning A (8 inputs, 5 outputs, none overlapping).
TEST(CheckNoOverlapTest, CostsWellUnderAMicrosecond) {
#if defined(__SANITIZE_ADDRESS__)
  // A bound on the Release build's cost (the ctest stage times it); AddressSanitizer's
  // instrumentation at -O1 takes about twice that on a loaded 2-core machine.
  GTEST_SKIP() << "timed in the Release build, not under AddressSanitizer";
#endif
  const Pool pool;
  const Tensor a = pool.at(0, DType::kBF16, {64, 128}, {128, 1});
  const Tensor a_scale = pool.at(20000, DType::kF32, {64, 1});
  const std::vector<Tensor> bs{pool.at(21000, DType::kBF16, {128, 16}, {1, 128}),
                               pool.at(26000, DType::kBF16, {128, 16}, {1, 128}),
                               pool.at(31000, DType::kBF16, {128, 16}, {1, 128})};
  const std::vector<Tensor> b_scales{pool.at(36000, DType::kF32, {1, 16}),
                                     pool.at(36100, DType::kF32, {1, 16}),
                                     pool.at(36200, DType::kF32, {1, 16})};
  const std::vector<Tensor> outs{pool.at(40000, DType::kBF16, {2, 64, 16}),
                                 pool.at(45000, DType::kBF16, {2, 64, 16}),
                                 pool.at(50000, DType::kBF16, {2, 64, 16})};
  const Tensor a_out = pool.at(55000, DType::kBF16, {2, 64, 8});
  auto thread_ns = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * int64_t{1000000000} + ts.tv_nsec;
  };
  constexpr int kCalls = 100000;
  const int64_t start = thread_ns();
  for (int i = 0; i < kCalls; ++i) {
    detail::check_no_overlap(
        "all_gather_scaled_matmul",
        {{"A_shard", a}, {"A_scale", a_scale}, {"Bs", bs}, {"B_scales", b_scales}},
        {{"outs", outs}, {"pre_out", Tensor()}, {"A_out", a_out}});
  }
  const double ns_per_call = static_cast<double>(thread_ns() - start) / kCalls;
  RecordProperty("ns_per_call", std::to_string(ns_per_call));
  EXPECT_LT(ns_per_call, 1000.0);
}

}  // namespace
}  // namespace asynctp
