// Every event wait of the fused ops is needed: with the CPU streams' jitter on (NOTE [cpu
// streams]), dropping any one of them on one rank (cpu::testing::reset_event_waits) makes some
// rank compute a wrong result or fail, but for the split paths' two closing waits, which cover
// each other (see the test). A test of the emulation as much as of the ops: a dropped wait that
// goes unnoticed is either redundant or guards a race the emulation does not show.
//
// Each run writes the op's input on the op's stream (behind a garbage fill), runs the op, and
// overwrites the input on that stream again at once (the caller may reuse it once the op is
// through), three times with fresh inputs; then it synchronizes the op's stream only and compares
// with the unfused reference.
//
// Rank 0 drops the wait (the others run the op as it is: a drop on every rank stalls all of them
// alike, and the race it opens closes again), and the fault switch holds back the work it was
// for. The jitter alone (0-200 us an item) showed few of the waits: a consumer reaches the data
// late anyway, behind its own stream's other work.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "device/cpu_streams.h"
#include "ops/op_testing.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;  // NOLINT(google-build-using-namespace)

constexpr int kIterations = 3;
constexpr float kGarbage = 1e30f;

enum class Op { kAllGatherMatmul, kMatmulReduceScatter };

struct EdgeCase {
  Op op;
  PathChoice path;
  int ws;
};

std::string case_name(const ::testing::TestParamInfo<EdgeCase>& info) {
  const EdgeCase& c = info.param;
  return fmt::format("{}_{}_ws{}", c.op == Op::kAllGatherMatmul ? "AllGatherMatmul" : "MatmulRS",
                     path_choice_name(c.path), c.ws);
}

// The inputs and expected output of iteration `it` on `rank`.
struct Iteration {
  OwnedTensor a;  // this rank's A_shard (all_gather_matmul) or A (matmul_reduce_scatter)
  OwnedTensor expected;
};

Iteration make_iteration(Backend& be, const EdgeCase& c, int rank, int it, const OwnedTensor& b) {
  const int ws = c.ws;
  auto a_of = [&](int r) {
    const Dims shape = c.op == Op::kAllGatherMatmul ? Dims{64, 32} : Dims{16 * ws, 32};
    return seeded(shape, DType::kF32, {71, uint64_t(it), uint64_t(r)}, Values::kSmallInts);
  };
  Iteration out;
  out.a = a_of(rank);
  if (c.op == Op::kAllGatherMatmul) {
    std::vector<OwnedTensor> shards;
    for (int r = 0; r < ws; ++r)
      shards.push_back(a_of(r));
    const OwnedTensor gathered = concat(be, shards, 0);
    out.expected = empty_host({64 * ws, 24}, DType::kF32);
    reference_gemm(be, gathered, b, out.expected);
  } else {
    std::vector<OwnedTensor> products;
    for (int r = 0; r < ws; ++r) {
      products.push_back(empty_host({16 * ws, 24}, DType::kF32));
      reference_gemm(be, a_of(r), b, products.back());
    }
    out.expected = empty_host({16, 24}, DType::kF32);
    reference_reduce_scatter(be, out.expected, products, 0, rank, ReduceOp::kSum);
  }
  return out;
}

// Runs the op kIterations times, each call with its drop-th event wait dropped (-1: none);
// whether every result was right and nothing failed. *dropped: whether a call had that wait.
bool run_once(OpContext& ctx, const EdgeCase& c, int64_t drop, bool* dropped) {
  Backend& be = ctx.backend();
  Stream& stream = ctx.stream();
  const OwnedTensor b = seeded({32, 24}, DType::kF32, {72}, Values::kSmallInts);
  std::vector<Iteration> its;
  for (int it = 0; it < kIterations; ++it)
    its.push_back(make_iteration(be, c, ctx.rank(), it, b));
  const Tensor& a0 = its[0].a;
  OwnedTensor a = empty_host(a0.shape(), DType::kF32);
  std::vector<OwnedTensor> outs;
  for (int it = 0; it < kIterations; ++it)
    outs.push_back(empty_host(its[it].expected->shape(), DType::kF32));
  bool ok = true;
  *dropped = false;
  try {
    for (int it = 0; it < kIterations; ++it) {
      be.fill(a, kGarbage, stream);
      be.fill(outs[it], kGarbage, stream);
      be.copy(a, its[it].a, stream);
      cpu::testing::reset_event_waits(drop);
      if (c.op == Op::kAllGatherMatmul) {
        AllGatherMatmulOptions options;
        options.path = c.path;
        const Tensor bs[] = {b.tensor};
        const Tensor out_views[] = {outs[it].tensor};
        all_gather_matmul(ctx, a, bs, out_views, {}, options);
      } else {
        MatmulReduceScatterOptions options;
        options.path = c.path;
        matmul_reduce_scatter(ctx, a, b, outs[it], options);
      }
      *dropped |= cpu::testing::dropped_event_wait();
      cpu::testing::reset_event_waits();
      be.fill(a, kGarbage, stream);  // the caller writes its input again
    }
    stream.synchronize();
  } catch (const Error& e) {
    ok = false;
  }
  // Whatever a failed run left in flight ends before the tensors go.
  try {
    be.synchronize();
  } catch (const Error&) {
    ok = false;
  }
  for (int it = 0; it < kIterations && ok; ++it)
    ok = same_bits(outs[it], its[it].expected);
  return ok;
}

class EventEdgesTest : public ::testing::TestWithParam<EdgeCase> {
 protected:
  void SetUp() override {
    // The ranks inherit it; ctest sets each listed seed (ASYNCTP_JITTER_SEEDS).
    setenv("ASYNCTP_CPU_STREAM_JITTER", "1", /*overwrite=*/0);
  }
};

// Rank 0 drops wait k of each of its calls; the other ranks run the op as it is.
TEST_P(EventEdgesTest, DroppingAnyEventWaitFails) {
  const EdgeCase c = GetParam();
  HarnessOptions options;
  options.group_timeout = Millis(2000);  // a rank that fails leaves its peers waiting this long
  options.run_timeout = Millis(60'000);
  // Rank 0's exit code: the wait changed no result, or the op has no wait k.
  constexpr int kUnnoticed = 3;
  constexpr int kPastTheLastWait = 4;
  std::vector<int64_t> unnoticed;
  int64_t waits = 0;
  // k = -1: nothing dropped, every result right; then each wait k of the op until past its last.
  for (int64_t k = -1;; ++k) {
    auto statuses = run_ranks(
        c.ws,
        [&](OpContext& ctx) {
          bool dropped = false;
          const bool ok = run_once(ctx, c, ctx.rank() == 0 ? k : -1, &dropped);
          auto& store = ctx.group().store();
          store.set(fmt::format("k/{}", ctx.rank()), ok ? "1" : "0");
          if (ctx.rank() != 0) return;
          bool any_wrong = false;
          for (int r = 0; r < c.ws; ++r)
            any_wrong |= store.get(fmt::format("k/{}", r), Millis(30'000)) == "0";
          if (k < 0) {
            EXPECT_FALSE(any_wrong) << "a wrong result with no wait dropped";
            return;
          }
          std::fflush(stdout);
          if (!dropped) ::_exit(kPastTheLastWait);
          if (!any_wrong) ::_exit(kUnnoticed);
        },
        options);
    ASSERT_EQ(statuses.size(), static_cast<size_t>(c.ws));
    if (statuses[0].exited && statuses[0].exit_code == kPastTheLastWait) {
      waits = k;
      break;
    }
    if (statuses[0].exited && statuses[0].exit_code == kUnnoticed) {
      unnoticed.push_back(k);
      statuses[0].exit_code = 0;
    }
    ASSERT_RANKS_OK(statuses) << "event wait " << k;
  }
  // The split paths end with two waits of the op's stream: for the pushes (the caller may write
  // A or the staging again) and for the flag streams (OpContext::join_flag_streams). Each covers
  // the other's data: every push has its flag behind it on a flag stream, so the join orders the
  // stream after the pushes, and the flags the push wait leaves unjoined are raised on their own
  // streams, in order, only later. Either alone keeps an eager run right; both stay, for a CUDA
  // graph, which must join every stream it forked.
  const std::vector<int64_t> redundant_pair =
      waits >= 2 ? std::vector<int64_t>{waits - 2, waits - 1} : std::vector<int64_t>{};
  std::printf("%s: %lld event waits, unnoticed when dropped: %s\n", case_name({c, 0}).c_str(),
              static_cast<long long>(waits), fmt::format("{}", fmt::join(unnoticed, ", ")).c_str());
  if (c.path == PathChoice::kFallback) {
    EXPECT_EQ(waits, 0) << "the fallback runs on the op's stream alone";
  } else {
    EXPECT_GE(waits, 4);
    EXPECT_EQ(unnoticed, redundant_pair)
        << "dropping these event waits changed no result on any rank";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Ops, EventEdgesTest,
    ::testing::Values(EdgeCase{Op::kAllGatherMatmul, PathChoice::kSplit, 2},
                      EdgeCase{Op::kAllGatherMatmul, PathChoice::kSplit, 4},
                      EdgeCase{Op::kAllGatherMatmul, PathChoice::kFallback, 2},
                      EdgeCase{Op::kAllGatherMatmul, PathChoice::kFallback, 4},
                      EdgeCase{Op::kMatmulReduceScatter, PathChoice::kSplit, 2},
                      EdgeCase{Op::kMatmulReduceScatter, PathChoice::kSplit, 4},
                      EdgeCase{Op::kMatmulReduceScatter, PathChoice::kFallback, 2},
                      EdgeCase{Op::kMatmulReduceScatter, PathChoice::kFallback, 4}),
    case_name);

}  // namespace
}  // namespace asynctp
