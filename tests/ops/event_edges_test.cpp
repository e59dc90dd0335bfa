// Every event wait of the fused ops, and every flag wait of their native paths, is needed: with
// the CPU streams' jitter on (NOTE [cpu streams]), dropping any one of them on one rank
// (cpu::testing::reset_event_waits, cpu::testing::reset_flag_waits) makes some rank compute a
// wrong result or fail, but for the split paths' two closing event waits, which cover each other
// in a run of like calls (the split all_gather_matmul's join of its flag stream is needed before a
// native call: a test of its own shows it), the native all_gather_matmul's join of its flag
// stream, which guards no data between like calls (a test of its own shows it between unlike
// ones), and its ready waits on the own chunk, which stream order covers (see the tests). A test of
// the emulation as much as of the ops: a dropped wait that goes unnoticed is either redundant or
// guards a race the emulation does not show.
//
// Each run writes the op's input on the op's stream (behind a garbage fill), runs the op, and
// overwrites the input on that stream again at once (the caller may reuse it once the op is
// through), three times (or more: calls_per_run) with fresh inputs; then it synchronizes the op's
// stream only and compares with the unfused reference. The backend's allocations start as garbage
// (as a GPU's do; the ops' flags are zeroed on the op's stream as they are allocated).
//
// Rank 0 drops the wait (the others run the op as it is: a drop on every rank stalls all of them
// alike, and the race it opens closes again), and the fault switch holds back the work it was
// for: an event wait's recorded work until the waiting stream has passed the point of the wait
// (its last item, and where that shows nothing, every item no earlier event of its stream stands
// for: cpu::testing::HoldBack), none of the op's work starting before the host has enqueued the
// dropped wait; a stream flag wait's counted tiles of the native GEMM. A native GEMM's dropped wait
// reads what it guarded as the GEMM starts, and the other ranks start each op kPeerDelay late, so
// that what it reads is still an earlier op's. The jitter alone (0-200 us an item) showed few of
// the waits: a consumer reaches the data late anyway, behind its own stream's other work.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "device/cpu_backend.h"
#include "device/cpu_streams.h"
#include "ops/op_testing.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;  // NOLINT(google-build-using-namespace)

constexpr float kGarbage = 1e30f;

enum class Op { kAllGatherMatmul, kMatmulReduceScatter };

// The native paths take 16-bit operands (or float8); their K of 8 keeps every partial product of
// the small integers exact in bf16, so that the contract's sum (kernels/native/params.h) and the
// unfused reference round alike. The native matmul_reduce_scatter needs chunks of 128 rows.
//
// float8 (native only): e4m3 operands, B column-major, fast accumulation, row-wise A scales that
// change with every call and rank (a stale one shows) and column-wise B scales, all powers of two
// from 1/2 to 2: a partial is a sum of at most 8 significant bits times a power of two, exact in
// bf16.
struct EdgeCase {
  Op op;
  PathChoice path;
  int ws;
  // The native matmul_reduce_scatter's inline push schedule (ContextOptions::push_inline_min_k
  // 0), else the schedule beside.
  bool inline_pushes = false;
  bool float8 = false;
  // The native matmul_reduce_scatter's pushes by its GEMM (ContextOptions::kernel_push), else
  // by copy streams (inline_pushes says which schedule).
  bool kernel_push = false;

  bool native() const { return path == PathChoice::kNative; }
  DType dtype() const {
    if (float8) return DType::kF8E4M3;
    return native() ? DType::kBF16 : DType::kF32;
  }
  // all_gather_matmul's output: f32 (the native GEMM stores it too); matmul_reduce_scatter's:
  // A's dtype (bf16 for float8).
  DType out_dtype() const {
    if (op == Op::kAllGatherMatmul) return DType::kF32;
    return float8 ? DType::kBF16 : dtype();
  }
  // (float8: 16, the TMA's 16-byte rows; a partial then has at most 8 significant bits.)
  int64_t k() const {
    if (float8) return 16;
    return native() ? 8 : 32;
  }
  // The native matmul_reduce_scatter's chunks of 256 x 256: its GEMM takes longer to store one
  // than a push stream's jitter, so that a push that reads its done counter too early (a stale
  // count: see DroppingAnyEventWaitFails) reads rows not yet stored.
  int64_t n() const { return native() && op == Op::kMatmulReduceScatter ? 256 : 24; }
  // Rows of a shard (all_gather_matmul: on the 128-row tile grid at ws 2, off it beyond) or of
  // an output chunk.
  int64_t rows() const {
    if (op == Op::kMatmulReduceScatter) return native() ? 256 : 16;
    return native() && ws == 2 ? 128 : 64;
  }
};

std::string name_of(const EdgeCase& c) {
  return fmt::format("{}_{}{}{}{}_ws{}",
                     c.op == Op::kAllGatherMatmul ? "AllGatherMatmul" : "MatmulRS",
                     path_choice_name(c.path), c.inline_pushes ? "_inline" : "",
                     c.kernel_push ? "_kernelpush" : "", c.float8 ? "_float8" : "", c.ws);
}

std::string case_name(const ::testing::TestParamInfo<EdgeCase>& info) {
  return name_of(info.param);
}

// gtest's printout of a case (its bytes otherwise, padding included).
void PrintTo(const EdgeCase& c, std::ostream* os) {
  *os << name_of(c);
}

// Both ops on each path at each of its world sizes.
std::vector<EdgeCase> edge_cases(
    std::initializer_list<std::pair<PathChoice, std::vector<int>>> paths) {
  std::vector<EdgeCase> cases;
  for (const auto& [path, world_sizes] : paths)
    for (const Op op : {Op::kAllGatherMatmul, Op::kMatmulReduceScatter})
      for (const int ws : world_sizes)
        cases.push_back({op, path, ws});
  return cases;
}

// The native matmul_reduce_scatter's inline pushes at each of these world sizes.
std::vector<EdgeCase> inline_cases(std::vector<EdgeCase> cases, std::vector<int> world_sizes) {
  for (const int ws : world_sizes)
    cases.push_back({Op::kMatmulReduceScatter, PathChoice::kNative, ws, true});
  return cases;
}

// The native matmul_reduce_scatter pushed by its GEMM (bf16, and float8 where `float8`) at each
// of these world sizes.
std::vector<EdgeCase> kernel_push_cases(std::vector<EdgeCase> cases, std::vector<int> world_sizes,
                                        bool float8) {
  for (const int ws : world_sizes) {
    cases.push_back({Op::kMatmulReduceScatter, PathChoice::kNative, ws, false, false, true});
    if (float8)
      cases.push_back({Op::kMatmulReduceScatter, PathChoice::kNative, ws, false, true, true});
  }
  return cases;
}

// The native ops `ops` with float8 operands at each of these world sizes.
std::vector<EdgeCase> float8_cases(std::vector<EdgeCase> cases, std::vector<Op> ops,
                                   std::vector<int> world_sizes) {
  for (const Op op : ops)
    for (const int ws : world_sizes)
      cases.push_back({op, PathChoice::kNative, ws, false, true});
  return cases;
}

// The context of a run: the case's push schedule.
ContextOptions context_of(const EdgeCase& c) {
  ContextOptions options;
  options.push_inline_min_k = c.inline_pushes ? 0 : std::numeric_limits<int64_t>::max();
  options.kernel_push = c.kernel_push ? KernelPush::kOn : KernelPush::kOff;
  return options;
}

// Which waits a run drops: the event waits (cpu::testing::reset_event_waits) or the flag waits
// (cpu::testing::reset_flag_waits).
enum class Waits { kEvent, kFlag };

// Calls a run makes. The native matmul_reduce_scatter's event waits that order the next call
// (the joins) are shown by a race between that call's push and GEMM (see
// DroppingAnyEventWaitFails): each pair of calls one chance.
int calls_per_run(const EdgeCase& c, Waits waits) {
  return waits == Waits::kEvent && c.native() && c.op == Op::kMatmulReduceScatter ? 6 : 3;
}

// A power of two from 1/2 to 2, by i.
float power_of_two_scale(int64_t i) {
  constexpr float kScales[] = {0.5f, 1.0f, 2.0f};
  return kScales[i % 3];
}

// The float8 B's column-wise scale [1, n].
OwnedTensor b_scale_of(const EdgeCase& c) {
  OwnedTensor s = empty_host({1, c.n()}, DType::kF32);
  for (int64_t j = 0; j < c.n(); ++j)
    set(s, j, power_of_two_scale(j % 2));  // 1/2 or 1
  return s;
}

// The inputs and expected output of iteration `it` on `rank`.
struct Iteration {
  OwnedTensor a;        // this rank's A_shard (all_gather_matmul) or A (matmul_reduce_scatter)
  OwnedTensor a_scale;  // float8: A's row-wise scale [rows, 1]
  OwnedTensor expected;
};

Iteration make_iteration(Backend& be, const EdgeCase& c, int rank, int it, const OwnedTensor& b,
                         const OwnedTensor& b_scale) {
  const int ws = c.ws;
  const int64_t a_rows = c.op == Op::kAllGatherMatmul ? c.rows() : c.rows() * ws;
  auto a_of = [&](int r) {
    return seeded({a_rows, c.k()}, c.dtype(), {71, uint64_t(it), uint64_t(r)}, Values::kSmallInts);
  };
  auto scale_of = [&](int r) {
    if (!c.float8) return OwnedTensor();
    OwnedTensor s = empty_host({a_rows, 1}, DType::kF32);
    for (int64_t i = 0; i < a_rows; ++i)
      set(s, i, power_of_two_scale(i + it + r));
    return s;
  };
  Iteration out;
  out.a = a_of(rank);
  out.a_scale = scale_of(rank);
  if (c.op == Op::kAllGatherMatmul) {
    std::vector<OwnedTensor> shards, scales;
    for (int r = 0; r < ws; ++r) {
      shards.push_back(a_of(r));
      if (c.float8) scales.push_back(scale_of(r));
    }
    const OwnedTensor gathered = concat(be, shards, 0);
    const OwnedTensor gathered_scale = c.float8 ? concat(be, scales, 0) : OwnedTensor();
    out.expected = empty_host({c.rows() * ws, c.n()}, c.out_dtype());
    reference_gemm(be, gathered, b, out.expected, gathered_scale.tensor, b_scale.tensor);
  } else {
    std::vector<OwnedTensor> products;
    for (int r = 0; r < ws; ++r) {
      products.push_back(empty_host({c.rows() * ws, c.n()}, DType::kF32));
      reference_gemm(be, a_of(r), b, products.back(), scale_of(r).tensor, b_scale.tensor);
    }
    out.expected = empty_host({c.rows(), c.n()}, c.out_dtype());
    reference_reduce_scatter(be, out.expected, products, 0, rank, ReduceOp::kSum);
  }
  return out;
}

// Ends a run whose calls went right so far where `ok`: whatever a failed run left in flight ends
// before the tensors go; then whether every output is the expected one (a host read, which
// synchronizes every stream: after the calls).
bool finish(Backend& be, bool ok, const std::vector<Iteration>& its,
            const std::vector<OwnedTensor>& outs) {
  try {
    be.synchronize();
  } catch (const Error&) {
    ok = false;
  }
  for (size_t it = 0; it < outs.size() && ok; ++it)
    ok = same_bits(outs[it], its[it].expected);
  return ok;
}

// Every rank tells whether its run went right; on rank 0, whether every rank's did (the others:
// their own).
bool all_ranks_right(OpContext& ctx, bool ok) {
  auto& store = ctx.group().store();
  store.set(fmt::format("ok/{}", ctx.rank()), ok ? "1" : "0");
  if (ctx.rank() != 0) return ok;
  for (int r = 0; r < ctx.world_size(); ++r)
    ok &= store.get(fmt::format("ok/{}", r), Millis(30'000)) == "1";
  return ok;
}

// How long the ranks that drop nothing wait before each op where flag waits are dropped: the data
// a dropped flag wait guarded (read as the native GEMM starts) is then a peer's of an earlier op.
constexpr Millis kPeerDelay{30};

// The event fault switch's stall for a slow machine's schedule: long enough for the blocked
// stream's next native GEMM to store its product (tens of ms under ASan on a loaded machine, where
// kFaultStall let a held push read the product before that GEMM overwrote it).
constexpr Millis kSlowStall{150};

// What a run drops: wait k (-1: none) of `waits`; an event wait's recorded work held back as
// `hold` says, stalling `stall` once released.
struct Drop {
  Waits waits;
  int64_t k = -1;
  cpu::testing::HoldBack hold = cpu::testing::HoldBack::kLastItem;
  Millis stall = cpu::kFaultStall;
};

// Runs the op calls_per_run(c, drop.waits) times, each call (with the writes of its inputs before
// it) with drop.k-th wait dropped; whether every result was right and nothing failed. *dropped:
// what a call dropped ("": none).
bool run_once(OpContext& ctx, const EdgeCase& c, const Drop& drop, std::string* dropped) {
  const Waits waits = drop.waits;
  const int iterations = calls_per_run(c, waits);
  Backend& be = ctx.backend();
  Stream& stream = ctx.stream();
  const OwnedTensor b = seeded({c.k(), c.n()}, c.dtype(), {72}, Values::kSmallInts,
                               c.float8 ? Layout::kTransposed : Layout::kContiguous);
  const OwnedTensor b_scale = c.float8 ? b_scale_of(c) : OwnedTensor();
  std::vector<Iteration> its;
  for (int it = 0; it < iterations; ++it)
    its.push_back(make_iteration(be, c, ctx.rank(), it, b, b_scale));
  const Tensor& a0 = its[0].a;
  OwnedTensor a = empty_host(a0.shape(), c.dtype());
  OwnedTensor a_scale = c.float8 ? empty_host({a0.size(0), 1}, DType::kF32) : OwnedTensor();
  std::vector<OwnedTensor> outs;
  for (int it = 0; it < iterations; ++it)
    outs.push_back(empty_host(its[it].expected->shape(), c.out_dtype()));
  bool ok = true;
  dropped->clear();
  auto reset = [&](int64_t k) {
    if (waits == Waits::kEvent) {
      cpu::testing::reset_event_waits(k, drop.hold, drop.stall);
    } else {
      cpu::testing::reset_flag_waits(k);
    }
  };
  try {
    for (int it = 0; it < iterations; ++it) {
      reset(drop.k);
      be.fill(a, kGarbage, stream);
      be.fill(outs[it], kGarbage, stream);
      be.copy(a, its[it].a, stream);
      if (c.float8) {
        be.fill(a_scale, kGarbage, stream);
        be.copy(a_scale, its[it].a_scale, stream);
      }
      if (waits == Waits::kFlag && ctx.rank() == 0 && it > 0) {
        // Rank 0's stream says when it reaches the call (its GEMM, which reads what a dropped
        // wait guarded, comes next), for the peers below.
        Store& store = ctx.group().store();
        cpu::as_cpu(stream, "publish")
            .enqueue(
                "publish", [&store, it] { store.set(fmt::format("reached/{}", it), "1"); },
                /*jitter=*/false);
      }
      if (waits == Waits::kFlag && ctx.rank() != 0) {
        // From the second call on (the first allocates the workspaces, a rendezvous of all
        // ranks), kPeerDelay behind rank 0's stream reaching the call: rank 0's stream lags its
        // host, and more so on a slow machine (ASan, load), so a delay from this rank's own
        // start let its data of the call land before rank 0's GEMM read it early.
        if (it > 0) ctx.group().store().get(fmt::format("reached/{}", it), Millis(30'000));
        std::this_thread::sleep_for(kPeerDelay);
      }
      if (c.op == Op::kAllGatherMatmul) {
        AllGatherMatmulOptions options;
        options.path = c.path;
        const Tensor bs[] = {b.tensor};
        const Tensor out_views[] = {outs[it].tensor};
        if (c.float8) {
          options.fast_accum = {true};
          const Tensor b_scales[] = {b_scale.tensor};
          all_gather_scaled_matmul(ctx, a, a_scale, bs, b_scales, out_views, {}, options);
        } else {
          all_gather_matmul(ctx, a, bs, out_views, {}, options);
        }
      } else {
        MatmulReduceScatterOptions options;
        options.path = c.path;
        if (c.float8) {
          options.fast_accum = true;
          scaled_matmul_reduce_scatter(ctx, a, a_scale, b, b_scale, outs[it], options);
        } else {
          matmul_reduce_scatter(ctx, a, b, outs[it], options);
        }
      }
      if (waits == Waits::kEvent && cpu::testing::dropped_event_wait()) *dropped = "an event wait";
      if (waits == Waits::kFlag && cpu::testing::dropped_flag_wait())
        *dropped = cpu::testing::dropped_flag_wait_name();
      reset(-1);
      be.fill(a, kGarbage, stream);  // the caller writes its input again
      if (c.float8) be.fill(a_scale, kGarbage, stream);
    }
    stream.synchronize();
  } catch (const Error& e) {
    ok = false;
  }
  return finish(be, ok, its, outs);
}

// What dropping each wait of `waits`, one at a time, did.
struct Drops {
  int64_t waits = 0;               // how many the op has (per call)
  std::vector<int64_t> unnoticed;  // those whose drop changed no result on any rank
  // Flag waits only: those whose drop changed no result and that wait on rank 0's own chunk of
  // A, which stream order covers (see FlagEdgesTest).
  std::vector<int64_t> own_chunk;
};

// The fault switch's name of a native GEMM's ready wait on rank 0's own chunk.
constexpr char kOwnChunkWait[] = "native GEMM's ready wait for chunk 0 ";

// What rank 0's drop did.
enum class Outcome {
  kNoticed,          // some rank computed a wrong result or failed
  kUnnoticed,        // every result right
  kOwnChunk,         // every result right, and the wait was on rank 0's own chunk of A
  kPastTheLastWait,  // the op has no such wait
  kFailed,           // a run with no wait dropped failed, or the harness did (a test failure)
};

// Rank 0 drops drop.k of each of its calls (k = -1: none, and every result must be right); the
// other ranks run the op as it is.
Outcome try_drop(const EdgeCase& c, const Drop& drop) {
  HarnessOptions options;
  options.group_timeout = Millis(2000);  // a rank that fails leaves its peers waiting this long
  options.run_timeout = Millis(60'000);
  options.context = context_of(c);
  // Rank 0's exit codes past 2 (gtest's own).
  constexpr int kUnnoticed = 3;
  constexpr int kPastTheLastWait = 4;
  constexpr int kOwnChunk = 5;
  auto statuses = run_ranks(
      c.ws,
      [&](OpContext& ctx) {
        std::string dropped;
        Drop mine = drop;
        if (ctx.rank() != 0) mine.k = -1;
        const bool any_wrong = !all_ranks_right(ctx, run_once(ctx, c, mine, &dropped));
        if (ctx.rank() != 0) return;
        if (drop.k < 0) {
          EXPECT_FALSE(any_wrong) << "a wrong result with no wait dropped";
          return;
        }
        std::fflush(stdout);
        if (dropped.empty()) ::_exit(kPastTheLastWait);
        if (!any_wrong) {
          std::printf("unnoticed %lld: %s\n", static_cast<long long>(drop.k), dropped.c_str());
          std::fflush(stdout);
          ::_exit(dropped.starts_with(kOwnChunkWait) ? kOwnChunk : kUnnoticed);
        }
      },
      options);
  EXPECT_EQ(statuses.size(), static_cast<size_t>(c.ws));
  if (statuses.empty()) return Outcome::kFailed;
  Outcome outcome = Outcome::kNoticed;
  if (statuses[0].exited) {
    switch (statuses[0].exit_code) {
      case kPastTheLastWait:
        return Outcome::kPastTheLastWait;
      case kUnnoticed:
        outcome = Outcome::kUnnoticed;
        statuses[0].exit_code = 0;
        break;
      case kOwnChunk:
        outcome = Outcome::kOwnChunk;
        statuses[0].exit_code = 0;
        break;
      default:
        break;
    }
  }
  EXPECT_RANKS_OK(statuses) << "wait " << drop.k;
  return ::testing::Test::HasFailure() ? Outcome::kFailed : outcome;
}

// Rank 0 drops each wait of `waits` in turn. An event wait's recorded work is held back first as
// its last item, and where that changes no result, as all of it (HoldBack), and where that changes
// none either, as all of it for kSlowStall: a drop is noticed where any of these schedules shows
// it. Stops at the first test failure (check HasFailure).
Drops drop_each(const EdgeCase& c, Waits waits) {
  Drops drops;
  if (try_drop(c, {waits}) == Outcome::kFailed) return drops;
  for (int64_t k = 0;; ++k) {
    Outcome outcome = try_drop(c, {waits, k, cpu::testing::HoldBack::kLastItem});
    if (waits == Waits::kEvent && outcome == Outcome::kUnnoticed)
      outcome = try_drop(c, {waits, k, cpu::testing::HoldBack::kUncovered});
    if (waits == Waits::kEvent && outcome == Outcome::kUnnoticed)
      outcome = try_drop(c, {waits, k, cpu::testing::HoldBack::kUncovered, kSlowStall});
    switch (outcome) {
      case Outcome::kFailed:
        return drops;
      case Outcome::kPastTheLastWait:
        drops.waits = k;
        return drops;
      case Outcome::kUnnoticed:
        drops.unnoticed.push_back(k);
        break;
      case Outcome::kOwnChunk:
        drops.own_chunk.push_back(k);
        break;
      case Outcome::kNoticed:
        break;
    }
  }
}

class EventEdgesTest : public ::testing::TestWithParam<EdgeCase> {
 protected:
  void SetUp() override {
    // The ranks inherit it; ctest sets each listed seed (ASYNCTP_JITTER_SEEDS).
    setenv("ASYNCTP_CPU_STREAM_JITTER", "1", /*overwrite=*/0);
    // The ranks (forked) inherit it: the ops' flags start as garbage, as on a GPU, until the op
    // zeroes them on its stream.
    cpu::testing::poison_allocations(true);
  }
  void TearDown() override { cpu::testing::poison_allocations(false); }
};

TEST_P(EventEdgesTest, DroppingAnyEventWaitFails) {
  const EdgeCase c = GetParam();
  const Drops drops = drop_each(c, Waits::kEvent);
  if (HasFailure()) return;
  const int64_t waits = drops.waits;
  std::printf("%s: %lld event waits, unnoticed when dropped: %s\n", case_name({c, 0}).c_str(),
              static_cast<long long>(waits),
              fmt::format("{}", fmt::join(drops.unnoticed, ", ")).c_str());
  if (c.path == PathChoice::kFallback) {
    EXPECT_EQ(waits, 0) << "the fallback runs on the op's stream alone";
    return;
  }
  std::vector<int64_t> redundant;
  if (c.path == PathChoice::kSplit) {
    // The split paths end with two waits of the op's stream: for the pushes (the caller may write
    // A or the staging again) and for the flag streams (OpContext::join_flag_streams). Each
    // covers the other's data: every push has its flag behind it on a flag stream, so the join
    // orders the stream after the pushes, and the flags the push wait leaves unjoined are raised
    // on their own streams, in order, only later, where the next call raises them on the same
    // streams. Either alone keeps a run of like calls right. The all-gather's flag-stream join
    // is needed where a native call follows, which raises the same ready flags on another stream
    // (SplitAllGatherMatmulJoinKeepsTheFlagsInOrder); the reduce-scatter's landed flags are the
    // split path's alone. Both waits stay, for a CUDA graph, which must join every stream it
    // forked.
    EXPECT_GE(waits, 4);
    redundant = {waits - 2, waits - 1};
  } else if (c.op == Op::kAllGatherMatmul) {
    // The native all_gather_matmul (one piece a shard): 0, the copy stream behind the caller's
    // writes of A_shard; 1 .. ws-2, flag stream 0 behind each push but the last (whose flag goes
    // on the copy stream itself); ws-1, the op's stream behind the pushes, which read A_shard;
    // ws, from 3 ranks on, the join of flag stream 0. That join guards no data in a run of like
    // calls, as here: its flags are writes only, each waited for by its owner's GEMM before that
    // rank's op ends, and the next call raises the same flags on the same streams, behind these.
    // It keeps a flag from stepping back where the next call raises it on another stream (a
    // returned A in one call and not the other, or another piece count: see the op), shown by
    // NativeAllGatherMatmulJoinKeepsTheFlagsInOrder; and a CUDA graph must join every stream it
    // forked.
    EXPECT_EQ(waits, c.ws == 2 ? 2 : c.ws + 1);
    if (c.ws > 2) redundant = {waits - 1};
  } else if (c.kernel_push) {
    // The native matmul_reduce_scatter pushed by its GEMM: one launch on the op's stream, no
    // other stream, no event wait.
    EXPECT_EQ(waits, 0);
  } else if (c.inline_pushes) {
    // The native matmul_reduce_scatter pushing inline (one copy stream, the flags on it): the
    // copy stream behind the op's stream (where the first op zeroes its done counters), and the
    // op's stream behind the copy stream (the next op's GEMM overwrites the product the pushes
    // read and counts in the counters they reset), at any world size.
    EXPECT_EQ(waits, 2);
  } else {
    // The native matmul_reduce_scatter (one piece a chunk, two push streams): first, each push
    // stream behind the op's stream: the first op zeroes its done counters there as it allocates
    // them, and a piece's counter reset on a flag stream (below) reaches the next op's push only
    // through the op's stream; then flag stream 0 behind a push that another piece follows on its
    // push stream (from 4 ranks on); then the op's stream behind each push stream (the next op's
    // GEMM overwrites the product the pushes read and counts in the counters they reset) and the
    // join of the flag stream, whose counter reset must precede the next op's GEMM: the next op's
    // push would otherwise read the stale full count and push rows that GEMM has not stored yet.
    EXPECT_EQ(waits, c.ws == 2 ? 2 : c.ws == 3 ? 4 : 6);
  }
  EXPECT_EQ(drops.unnoticed, redundant)
      << "dropping these event waits changed no result on any rank";
}

// float8: the all-gather's event waits also order the row-wise scales' writes and pushes. The
// native reduce-scatter's event waits are the bf16 case's (the scales live inside its GEMM, whose
// flag waits FlagEdgesTest drops with float8 too); its drop of the op's stream's wait for a push
// stream shows only where the next GEMM outpaces that push, which float8's K of 16 made too rare
// to rely on under AddressSanitizer.
INSTANTIATE_TEST_SUITE_P(
    Ops, EventEdgesTest,
    ::testing::ValuesIn(
        kernel_push_cases(float8_cases(inline_cases(edge_cases({{PathChoice::kSplit, {2, 4}},
                                                                {PathChoice::kFallback, {2, 4}},
                                                                {PathChoice::kNative, {2, 3, 4}}}),
                                                    {2, 4}),
                                       {Op::kAllGatherMatmul}, {2, 4}),
                          {2}, false)),
    case_name);

// One all_gather_matmul call of a two-call sequence: its path, whether it returns A, and the
// event waits it makes.
struct AgCall {
  PathChoice path;
  bool returns_a;
  int64_t waits;
};

// Two all_gather_matmul calls (bf16 shards of the native path's shape at ws `ws`); rank 0 drops
// the first call's join of its flag stream (its last event wait) where `drop`. The first call
// raises its flag to each peer on flag stream 0, the second on the copy stream (the native path,
// not copying a returned A after its GEMM: its last flag goes there, see the op): without the
// join, the second's flag
// lands before the first's, held back, which steps it back to the first's op number, and a peer,
// whose calls start 2 x kPeerDelay late, waits for the second's flag until its timeout (a third
// call's flag, one op ahead, would let it through). Whether every rank's results were right.
void expect_join_keeps_the_flags_in_order(int ws, const AgCall& first, const AgCall& second) {
  const EdgeCase c{Op::kAllGatherMatmul, PathChoice::kNative, ws};
  const AgCall calls[] = {first, second};
  for (const bool drop : {false, true}) {
    SCOPED_TRACE(drop ? "join dropped" : "nothing dropped");
    HarnessOptions options;
    options.group_timeout = Millis(2000);
    options.run_timeout = Millis(60'000);
    auto statuses = run_ranks(
        ws,
        [&](OpContext& ctx) {
          Backend& be = ctx.backend();
          const OwnedTensor b = seeded({c.k(), c.n()}, c.dtype(), {72}, Values::kSmallInts);
          // A returned A the GEMM cannot store (2 bytes off a 16-byte boundary): the op copies
          // it after the GEMM, the own rows on the copy stream, behind the last push.
          const int64_t a_numel = ws * c.rows() * c.k();
          OwnedTensor a_out_storage = empty_host({a_numel + 1}, c.dtype());
          const Tensor a_out = a_out_storage->narrow(0, 1, a_numel).view({ws * c.rows(), c.k()});
          // Made before the calls, and compared after them: the references and the comparisons
          // synchronize every stream.
          std::vector<Iteration> its;
          std::vector<OwnedTensor> outs;
          for (int it = 0; it < 2; ++it) {
            its.push_back(make_iteration(be, c, ctx.rank(), it, b, OwnedTensor()));
            outs.push_back(empty_host(its.back().expected->shape(), c.out_dtype()));
          }
          bool ok = true;
          try {
            for (int it = 0; it < 2; ++it) {
              const AgCall& call = calls[it];
              if (ctx.rank() != 0) std::this_thread::sleep_for(2 * kPeerDelay);
              const bool dropping = drop && it == 0 && ctx.rank() == 0;
              cpu::testing::reset_event_waits(dropping ? call.waits - 1 : -1,
                                              cpu::testing::HoldBack::kLastItem);
              AllGatherMatmulOptions agmm;
              agmm.path = call.path;
              const Tensor bs[] = {b.tensor};
              const Tensor out_views[] = {outs[it].tensor};
              all_gather_matmul(ctx, its[it].a, bs, out_views, call.returns_a ? a_out : Tensor(),
                                agmm);
              EXPECT_EQ(cpu::testing::event_waits(), call.waits) << "call " << it;
              if (dropping) {
                EXPECT_TRUE(cpu::testing::dropped_event_wait());
              }
              cpu::testing::reset_event_waits();
              ctx.stream().synchronize();
            }
          } catch (const Error&) {
            ok = false;
          }
          const bool all_right = all_ranks_right(ctx, finish(be, ok, its, outs));
          if (ctx.rank() == 0) {
            EXPECT_EQ(all_right, !drop);
          }
        },
        options);
    EXPECT_RANKS_OK(statuses);
  }
}

// The native all_gather_matmul's join of its flag stream, which like calls do not need (see
// DroppingAnyEventWaitFails), where consecutive calls raise a flag on different streams: at ws 3 a
// call that copies a returned A after its GEMM raises the flag of its push to r-2 on flag stream
// 0, one that does not, on the copy stream.
TEST_F(EventEdgesTest, NativeAllGatherMatmulJoinKeepsTheFlagsInOrder) {
  expect_join_keeps_the_flags_in_order(3, {PathChoice::kNative, true, 5},
                                       {PathChoice::kNative, false, 4});
}

// The split all_gather_matmul's join of its flag stream, which like calls do not need (see
// DroppingAnyEventWaitFails), before a native call: both raise the same ready flags (the push
// workspace's eager channel, numbered by one op count), the split path on flag stream 0, the
// native one (at ws 2, not returning A) on its copy stream.
TEST_F(EventEdgesTest, SplitAllGatherMatmulJoinKeepsTheFlagsInOrder) {
  expect_join_keeps_the_flags_in_order(2, {PathChoice::kSplit, false, 4},
                                       {PathChoice::kNative, false, 2});
}

class FlagEdgesTest : public EventEdgesTest {};

// Every flag wait of the native paths is needed: dropping any one of them on rank 0 (the ready
// and landed waits of its native GEMM, the push streams' waits for its done counters) makes some
// rank compute a wrong result, but for the ready waits on rank 0's own chunk, which the op raises
// on the GEMM's own stream before the GEMM (its edge rows, copied there first): stream order
// covers them.
TEST_P(FlagEdgesTest, DroppingAnyFlagWaitFails) {
  const EdgeCase c = GetParam();
  const Drops drops = drop_each(c, Waits::kFlag);
  if (HasFailure()) return;
  std::printf("%s: %lld flag waits, unnoticed when dropped: %s (on the own chunk: %s)\n",
              case_name({c, 0}).c_str(), static_cast<long long>(drops.waits),
              fmt::format("{}", fmt::join(drops.unnoticed, ", ")).c_str(),
              fmt::format("{}", fmt::join(drops.own_chunk, ", ")).c_str());
  EXPECT_GE(drops.waits, c.ws - 1);
  EXPECT_TRUE(drops.unnoticed.empty()) << "dropping these flag waits changed no result";
  if (c.op == Op::kMatmulReduceScatter) {
    EXPECT_TRUE(drops.own_chunk.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, FlagEdgesTest,
                         ::testing::ValuesIn(kernel_push_cases(
                             float8_cases(inline_cases(edge_cases({{PathChoice::kNative, {2, 4}}}),
                                                       {2, 4}),
                                          {Op::kAllGatherMatmul, Op::kMatmulReduceScatter}, {2, 4}),
                             {2, 3, 4}, true)),
                         case_name);

}  // namespace
}  // namespace asynctp
