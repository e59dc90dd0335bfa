// What `asynctp bench`'s bf16 and float8 tables share: the anchor shapes.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tools/session.h"

namespace asynctp::tools {

struct BenchShape {
  std::string op, label;  // op: "ag-mm" or "mm-rs"
  int64_t m, k, n;        // of the whole (gathered / unscattered) product
};

// The shapes of ../shared/anchors/RESULTS.md (PyTorch's own measurements), for world size ws.
std::vector<BenchShape> anchor_shapes(int ws);
// The shapes a bench command line asks for: --suite (with an optional op: both when empty), or
// one op with --shape MxKxN. Throws naming what is missing or unknown.
std::vector<BenchShape> select_shapes(const std::string& suite, const std::string& op,
                                      const std::string& shape, int ws);

// The timed columns of one shape: each a call, where its median goes, and its name.
struct BenchColumns {
  std::vector<std::function<void()>> fns;
  std::vector<double*> slots;
  std::vector<std::string> names;
  void add(std::function<void()> fn, double* slot, std::string name) {
    fns.push_back(std::move(fn));
    slots.push_back(slot);
    names.push_back(std::move(name));
  }
};

// How the columns are timed (median_ms_interleaved's knobs; warmup_ms and pace on GPUs only).
struct BenchTiming {
  int iters = 30;
  int warmup = 5;
  double warmup_ms = 0;
  double pace = 1;
  bool pace_sleep = false;
  // Device clock cycles each timed run starts behind its barrier (GPU only; 0: none): its host
  // enqueueing then falls in that delay, and the time is the device's alone.
  int64_t hide_launch = 0;
  // The delay the timing applies on `ctx`'s backend (none on the CPU backend), as the JSON says.
  int64_t hide_launch_on(OpContext& ctx) const {
    return ctx.backend().device().is_cuda() ? hide_launch : 0;
  }
};

// Adds, where `graphed` is given and the backend is CUDA, a column replaying it from a CUDA graph
// (median into *graph_ms, named "graph"); then times every column round-robin: each median,
// slowest rank, into its slot, and each call's median host time (us) into host_us[name].
void time_columns(Session& s, BenchColumns columns, const BenchTiming& timing,
                  const std::function<void()>* graphed, double* graph_ms,
                  std::map<std::string, double>* host_us);

// The fused op's split and native paths, each run once into `out` after `out` was filled with NaN
// (an element a path leaves unwritten then shows as an infinite error), error_of() measuring it
// on every rank against the caller's reference. The native path counts as unable to run where the
// op says so (PathUnavailableError: a shape, dtype or accumulation off its contract, alike on
// every rank, its reason printed by rank 0 where `say_why`); any other failure propagates. An
// error is NaN only where the native path cannot run.
struct PathErrors {
  double split = NAN;
  double native = NAN;
};
PathErrors check_paths(Session& s, const Tensor& out,
                       const std::function<void(PathChoice)>& fused_with,
                       const std::function<double()>& error_of, bool say_why);
// fused_with(path) into `out`, filled with NaN first (see check_paths).
void run_into_nan(OpContext& ctx, const Tensor& out, const std::function<void()>& run);
// "-" for NaN, else microseconds with one decimal.
std::string us_or_dash(double ms);

// Each rank's timeline of the fused op (its own step marks, ops/trace.h, median over 15 runs
// started together, device and, in brackets, host times) to stderr, on its split path, on its
// native path (where `native`: it can run) and as auto chooses, fused_with(path) running it.
void print_path_traces(Session& s, const BenchShape& shape, bool native,
                       const std::function<void(PathChoice)>& fused_with);

struct ScaledBenchOptions {
  std::string scaling;           // "rowwise" or "tensorwise"
  std::string suite, op, shape;  // as select_shapes takes them
  BenchTiming timing;
  bool json = false;
  // Every GEMM timed (the scaled GEMM alone, the baseline's, the fused ops') may accumulate fast
  // (GemmArgs::fast_accum): the setting PyTorch's float8 path runs with (use_fast_accum=True).
  bool fast_accum = false;
  bool trace = false;  // print_path_traces after timing (GPU only)
  bool graph = true;   // the auto op replayed from a CUDA graph, a column (GPU only)
};

// The float8 table (bench_scaled.cpp): per shape, validation of the fused op against the unfused
// reference, then the scaled GEMM alone, the unfused baseline and the fused op timed side by side.
int run_scaled_bench(const ScaledBenchOptions& o, const std::string& backend);

}  // namespace asynctp::tools
