// Which of the overlapped paths a fused op takes: the split pipeline (Path::kFused) or the
// native async-input GEMM (Path::kNative), chosen per problem from measurements, never from
// size thresholds.
//
// The first call of a problem (op, shape, dtypes, B layout, world size, GPU) in a process:
//   1. every rank looks the problem up in the on-disk cache; the ranks agree (one small
//      exchange through the store) and use the cached path if they all found the same one;
//   2. otherwise every rank runs both paths (one warm-up each, then kTuneRuns interleaved timed
//      runs, each after a device barrier and followed by an idle pause as long as the run
//      (kTunePace); kCloseCallRuns more when the two are within
//      kCloseCall), each path's time is its slowest rank's median, and the faster path is
//      taken (local rank 0 writes it to the cache).
// Later calls reuse the decision without any communication. Under CUDA-graph capture nothing can
// be measured or agreed on: an unknown problem then takes the native path and says so in the
// log (run the op once before capturing it to have the choice measured).
//
// The cache: $ASYNCTP_CACHE_DIR/dispatch.json, else $XDG_CACHE_HOME/asynctp/dispatch.json, else
// ~/.cache/asynctp/dispatch.json; ContextOptions::dispatch_cache overrides it ("off": none).
// ASYNCTP_PATH=native|fused|fallback (or an op's options.path) bypasses the choice altogether.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "ops/usage.h"

namespace asynctp {

class Context;

struct DispatchTiming {
  Path path = Path::kNative;
  double fused_us = 0;  // the slowest rank's median (0: not measured)
  double native_us = 0;
  bool from_disk = false;
};

class Dispatcher {
 public:
  // The disk cache's format and the paths its choices were measured on. Bumped whenever a change
  // to the paths can change which of them is faster, so that choices measured before are
  // measured again: 2 since the native GEMM's walk groups of 16 and the native AG's GEMM-first
  // order at ws 2 (and the choice by the slowest rank, which version 1 did not have).
  static constexpr int kCacheVersion = 2;
  static constexpr int kTuneRuns = 15;
  // Paths whose times differ by less than this fraction get kCloseCallRuns more rounds.
  static constexpr double kCloseCall = 0.03;
  static constexpr int kCloseCallRuns = 30;
  // After each tuning run the host idles kTunePace x that run's time. Back to back, an H200
  // reaches its power cap within a few hundred ms and runs at 1400-1650 MHz instead of 1980,
  // and there the ranking of the paths can flip: at ws 4 on 8192x8192x14336 the native path
  // measured 1% faster back to back but 18% slower at full clocks, where the bench (paced the
  // same way) and PyTorch's anchor script measure.
  static constexpr double kTunePace = 1.0;

  Dispatcher(Context& ctx, std::string cache_path);

  // The path for `key`; `run(path)` runs the op on that path (used for measuring; the caller
  // runs the chosen path itself afterwards).
  Path pick(const std::string& key, const std::function<void(Path)>& run);
  // What was decided for `key` in this process, if anything.
  std::optional<DispatchTiming> decision(const std::string& key) const;
  const std::string& cache_path() const { return cache_path_; }

  static std::string default_cache_path();

 private:
  std::optional<Path> disk_lookup(const std::string& key);
  void disk_store(const std::string& key, const DispatchTiming& timing);
  // Every rank's `values`, by rank (through the store; blocks, bounded by the timeout).
  std::vector<std::vector<double>> over_ranks(const std::vector<double>& values);

  Context& ctx_;
  std::string cache_path_;
  std::map<std::string, DispatchTiming> decisions_;
  bool cache_warned_ = false;  // an unusable cache file was reported
};

}  // namespace asynctp
