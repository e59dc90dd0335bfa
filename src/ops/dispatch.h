// Which of the overlapped paths a fused op takes: the split pipeline (Path::kFused) or the
// native async-input GEMM (Path::kNative), chosen per problem from measurements, never from
// size thresholds.
//
// The first call of a problem (op, shape, dtypes, B layout, world size, GPU) in a process:
//   1. every rank looks the problem up in the on-disk cache; the ranks agree (one small
//      all-reduce) and use the cached path if they all found the same one;
//   2. otherwise every rank runs both paths (one warm-up each, then kTuneRuns interleaved timed
//      runs), the per-path medians are averaged over the ranks, and the faster path is taken
//      (local rank 0 writes it to the cache).
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
  double fused_us = 0;  // mean over ranks of the per-rank median (0: not measured)
  double native_us = 0;
  bool from_disk = false;
};

class Dispatcher {
 public:
  static constexpr int kTuneRuns = 15;

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
  // Sum of a few doubles over the ranks (through the store; blocks, bounded by the timeout).
  std::vector<double> sum_over_ranks(std::vector<double> values);

  Context& ctx_;
  std::string cache_path_;
  std::map<std::string, DispatchTiming> decisions_;
};

}  // namespace asynctp
