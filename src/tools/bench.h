// What `asynctp bench`'s bf16 and float8 tables share: the anchor shapes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

struct ScaledBenchOptions {
  std::string scaling;           // "rowwise" or "tensorwise"
  std::string suite, op, shape;  // as select_shapes takes them
  int iters = 30;
  int warmup = 5;
  double warmup_ms = 0;
  double pace = 1;
  bool pace_sleep = false;
  bool json = false;
};

// The float8 table (bench_scaled.cpp): per shape, validation of the fused op against the unfused
// reference, then the scaled GEMM alone, the unfused baseline and the fused op timed side by side.
int run_scaled_bench(const ScaledBenchOptions& o, const std::string& backend);

}  // namespace asynctp::tools
