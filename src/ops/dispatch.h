// Which path a fused op takes under PathChoice::kAuto: the split pipeline (Path::kSplit), the
// native async-input GEMM (Path::kNative) or the unfused fallback (NCCL + one GEMM,
// Path::kFallback), chosen per problem from measurements, never from size thresholds. The native
// matmul_reduce_scatter runs two ways, both measured where both can run (ContextOptions::
// kernel_push auto): copy streams push the peers' rows, or the GEMM pushes them itself. Each way
// of running a problem is a Route.
//
// The first call of a problem (op, shape, dtypes, B layout, variant, world size, GPU) in a
// process, given the paths that can run it on each rank (the candidates: those every rank can
// run):
//   1. every rank looks the problem up in the on-disk cache; the ranks agree (one small
//      exchange through the store, which also tells each rank what the others can run) and use
//      the cached path if they all found the same one and it is still a candidate;
//   2. otherwise every rank runs every candidate (two warm-ups each, then tuning_rounds() rounds,
//      each running every candidate once in a balanced order, each run after a device barrier and
//      a device spin as long as twice the host's enqueueing of a run (so that the device time
//      holds none of it), and followed by an idle pause of pace() times its length
//      (ASYNCTP_TUNE_PACE, the same on every rank; at 0, the default, back to back, after
//      kSustainedWarmupMs of back-to-back rounds); kCloseCallRuns more rounds when the two fastest
//      are within kCloseCall), each path's device time and host time (how long the host takes to
//      enqueue the run) are its slowest rank's medians, and two paths are taken (ties: the earlier
//      candidate; local rank 0 writes them to the cache, with the pace they were measured at: an
//      entry of another pace is measured anew):
//        - for eager calls, the least device + host time. An eager op costs a step its device
//          time where the GPU is behind the host, and its host time where the GPU waits for the
//          host (small ops among an eager step's many small kernels); the regime is unknown at
//          the choice, and the least sum is the path whose loss in the worse regime is smaller
//          (docs/DECISIONS.md D30);
//        - for calls captured into a CUDA graph, the least device time: a replay enqueues none
//          of the op's host work.
// Later calls reuse the decisions without any communication. (A process that takes them from the
// cache runs the captured path once, eagerly, where it differs from the eager one: a capture
// cannot allocate what that path needs on its first run.) Under CUDA-graph capture nothing can
// be measured or agreed on: an unknown problem then takes the first candidate and says so in the
// log (run the op once before capturing it to have the choice measured). On a backend whose
// timings say nothing (Backend::times_paths: the CPU backend) the ops do not ask: they take
// native where it can run, else split, else the fallback.
//
// The cache: $ASYNCTP_CACHE_DIR/dispatch.json, else $XDG_CACHE_HOME/asynctp/dispatch.json, else
// ~/.cache/asynctp/dispatch.json; ContextOptions::dispatch_cache overrides it ("off": none). An
// entry names its eager and captured routes ("path", "captured_path": route_name) and holds each
// measured route's "<route>_us" and "<route>_host_us".
// ASYNCTP_PATH=native|split|fallback (or an op's options.path) bypasses the choice altogether.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <asynctp/context.h>

namespace asynctp {

class OpContext;

// A way to run a problem: its path, and for the native matmul_reduce_scatter whether its GEMM
// pushes the peers' rows itself (ContextOptions::kernel_push) rather than copy streams.
struct Route {
  Path path = Path::kNative;
  bool kernel_push = false;  // (native only)

  constexpr Route() = default;
  constexpr Route(Path p, bool gemm_pushes = false)  // NOLINT(google-explicit-constructor)
      : path(p), kernel_push(gemm_pushes) {}
  friend constexpr bool operator==(const Route&, const Route&) = default;
};

// "native", "split", "fallback", or "native_push" (the native GEMM's own pushes): the routes'
// names in the dispatch cache and the logs.
std::string_view route_name(Route r);
std::ostream& operator<<(std::ostream& os, Route r);

struct DispatchTiming {
  Route path = Path::kNative;           // eager calls' route: the least device + host time
  Route captured_path = Path::kNative;  // captured calls' route: the least device time
  double split_us = 0;                  // device time, the slowest rank's median (0: not measured)
  double native_us = 0;
  double native_push_us = 0;
  double fallback_us = 0;
  double split_host_us = 0;  // host time to enqueue a run, the slowest rank's median
  double native_host_us = 0;
  double native_push_host_us = 0;
  double fallback_host_us = 0;
  bool from_disk = false;
  double pace = 1.0;       // the tuning's pace (Dispatcher::pace())
  double warmup_ms = 0.0;  // how long its back-to-back warm-up took on this rank (pace 0)

  double& us(Route r) { return of(r, split_us, native_us, native_push_us, fallback_us); }
  double us(Route r) const { return const_cast<DispatchTiming*>(this)->us(r); }
  double& host_us(Route r) {
    return of(r, split_host_us, native_host_us, native_push_host_us, fallback_host_us);
  }
  double host_us(Route r) const { return const_cast<DispatchTiming*>(this)->host_us(r); }
  // The route for a call that is (`captured`) or is not being captured into a CUDA graph.
  Route path_for(bool captured) const { return captured ? captured_path : path; }

 private:
  // Route r's one of these.
  static double& of(Route r, double& split, double& native, double& native_push, double& fallback) {
    if (r.path == Path::kSplit) return split;
    if (r.path == Path::kNative) return r.kernel_push ? native_push : native;
    return fallback;
  }
};

class Dispatcher {
 public:
  // The disk cache's format and the paths its choices were measured on. Bumped whenever a change
  // to the paths can change which of them is faster, or to the file's layout, so that choices
  // measured before are measured again.
  static constexpr int kCacheVersion = 6;
  // Rounds of the first measurement: at least kTuneRuns, whole blocks of the balanced orders
  // (core/balanced_orders.h) for that many candidates (16 for two, 18 for three, 16 for four).
  static constexpr int kTuneRuns = 15;
  static int tuning_rounds(size_t candidates);
  // The two fastest paths, if their times differ by less than this fraction, get kCloseCallRuns
  // more rounds.
  static constexpr double kCloseCall = 0.03;
  static constexpr int kCloseCallRuns = 30;
  // After each tuning run the host idles pace() x that run's time (ASYNCTP_TUNE_PACE, 0 by
  // default). Back to back the GPU reaches its power cap and the ranking of the paths can flip
  // (see docs/DECISIONS.md D22); a training step runs its GPUs flat out, so by default the paths
  // are ranked at the clocks of that load: every rank first runs rounds of the candidates back
  // to back until it has done so for kSustainedWarmupMs (the GPU's power cap is reached within a
  // few hundred ms), then times the rounds with no pause. At pace 1 they are ranked at the
  // clocks of short bursts, those the bench (paced the same way) and PyTorch's anchor script
  // measure at.
  static constexpr double kSustainedWarmupMs = 300.0;
  // The longest spin a tuning run starts behind (twice the host's enqueueing of a run, so that
  // the device time holds none of it), in µs.
  static constexpr double kMaxHideUs = 100'000.0;
  double pace() const { return pace_; }

  Dispatcher(OpContext& ctx, std::string cache_path);

  // The route for `key`, one of `offered` (the routes this rank can run: not empty, none twice;
  // ties go to the earlier) that every rank offered, for an eager call or, where the context's
  // stream is capturing, a captured one; `run(route)` runs the op that way (used for measuring;
  // the caller runs the chosen route itself afterwards). A single route offered is taken as it
  // is, unmeasured and unrecorded, without talking to the other ranks.
  Route pick(const std::string& key, std::span<const Route> offered,
             const std::function<void(Route)>& run);
  // What was decided for `key` in this process, if anything.
  std::optional<DispatchTiming> decision(const std::string& key) const;
  const std::string& cache_path() const { return cache_path_; }

  static std::string default_cache_path();

 private:
  // The cached (eager, captured) routes of `key`, if any.
  std::optional<std::pair<Route, Route>> disk_lookup(const std::string& key);
  void disk_store(const std::string& key, const DispatchTiming& timing);
  // Every rank's `values`, by rank (through the store; blocks, bounded by the timeout).
  std::vector<std::vector<double>> over_ranks(const std::vector<double>& values);

  OpContext& ctx_;
  std::string cache_path_;
  const double pace_;
  std::map<std::string, DispatchTiming> decisions_;
  bool cache_warned_ = false;  // an unusable cache file was reported
};

}  // namespace asynctp
