// `asynctp bench --scaled rowwise|tensorwise`: the float8 fused ops on e4m3 operands with f32
// scales and a bf16 output, timed like the bf16 table (bench_command.cpp: every column
// round-robin in one loop, median of --iters, slowest rank, paced by --pace):
//   gemm      the scaled GEMM alone on the whole problem (cuBLASLt on CUDA): the bar, since the
//             fused op should cost little more than it
//   ngemm     with --fast-accum, the native kernel alone on the whole problem, every chunk present
//             (it accumulates fast only): ngemm / gemm is the kernel against cuBLASLt, and
//             native - ngemm what the path adds to the kernel (its chunk walk and flags, the
//             communication and, mm-rs, the own chunk's sum of the peers' parts)
//   baseline  ag-mm: all_gather of A (and of its row-wise scales), then the scaled GEMM;
//             mm-rs: the scaled GEMM, then reduce_scatter
//   auto      all_gather_scaled_matmul / scaled_matmul_reduce_scatter as the dispatcher chooses
//   split     the fused op forced onto the split path
//   native    the fused op forced onto the native path, where it can run ("-" otherwise: exact
//             accumulation, a shape off its contract)
//   graph     the auto op replayed from a CUDA graph (CUDA only)
//
// Scales: rowwise, A's one per row ([rows, 1]) and B's one per column ([1, N]); tensorwise, one
// element each. --fast-accum lets every column's GEMMs accumulate fast (GemmArgs::fast_accum), as
// PyTorch's float8 path does (use_fast_accum=True); without it every GEMM accumulates exactly.
// The table's title and the JSON's "fast_accum" say which was timed. B is stored K-major ([N, K]
// viewed as [K, N]), the layout float8 GEMMs take natively. Validation: each path of the fused op
// (auto, split, native) against baseline, all rounded to bf16 from f32 products of the same
// float8 values, so they differ only by rounding order.
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "ops/collectives.h"
#include "ops/fused_matmul.h"
#include "tools/bench.h"
#include "tools/session.h"

namespace asynctp::tools {

namespace {

struct ScaledResult {
  BenchShape shape;
  std::string path;
  double err = 0, err_split = 0, err_native = NAN;  // NAN: the native path cannot run
  double gemm_ms = 0, native_gemm_ms = NAN, baseline_ms = 0, fused_ms = 0, split_ms = 0,
         native_ms = NAN, graph_ms = NAN;
  std::map<std::string, double> host_us;
};

ScaledResult bench_scaled_shape(Session& s, const ScaledBenchOptions& o, const BenchShape& shape) {
  OpContext& ctx = *s.ctx;
  const int ws = s.world_size();
  const int64_t m = shape.m, k = shape.k, n = shape.n, rows = m / ws;
  ASYNCTP_CHECK(m % ws == 0, "{}: M={} is not divisible by the world size {}", shape.label, m, ws);
  const bool ag = shape.op == "ag-mm";
  const bool rowwise = o.scaling == "rowwise";
  ScaledResult r;
  r.shape = shape;
  std::vector<OwnedTensor> keep;
  auto make = [&](Dims dims, DType dt) -> Tensor {
    keep.push_back(alloc(ctx, dims, dt));
    return keep.back();
  };
  const DType f8 = DType::kF8E4M3, out_dt = DType::kBF16;
  // A: ag-mm, this rank's shard [M/ws, K]; mm-rs, [M, K]. B [K, N], K-major.
  const Tensor a = make(ag ? Dims{rows, k} : Dims{m, k}, f8);
  const Tensor b_storage = make({n, k}, f8);
  const Tensor b = b_storage.t();
  fill_random(ctx, a, 3000017ull * (ag ? 1 : 2) + s.rank(), 4.0f);
  fill_random(ctx, b_storage, 4000037ull + (ag ? 0 : s.rank()), 4.0f);
  const Tensor a_scale = make(rowwise ? Dims{a.size(0), 1} : Dims{1}, DType::kF32);
  const Tensor b_scale = make(rowwise ? Dims{1, n} : Dims{1}, DType::kF32);
  fill_random(ctx, a_scale, 5000011ull + s.rank(), 1.0f / 32);
  fill_random(ctx, b_scale, 6000011ull, 1.0f / std::sqrt(static_cast<float>(k)));
  const Dims out_dims = ag ? Dims{m, n} : Dims{rows, n};
  const Tensor fused_out = make(out_dims, out_dt), base_out = make(out_dims, out_dt);

  // The unfused pieces: the gathered A and scales (ag-mm), the whole product (mm-rs).
  const Tensor a_full = ag ? make({m, k}, f8) : Tensor();
  const Tensor a_scale_full = ag && rowwise ? make({m, 1}, DType::kF32) : a_scale;
  const Tensor product = ag ? Tensor() : make({m, n}, out_dt);
  auto scaled_gemm = [&](const Tensor& lhs, const Tensor& lhs_scale, const Tensor& d) {
    GemmArgs args;
    args.a = lhs;
    args.b = b;
    args.d = d;
    args.a_scale = lhs_scale;
    args.b_scale = b_scale;
    args.fast_accum = o.fast_accum;
    ctx.backend().gemm(args, ctx.stream());
  };
  AllGatherMatmulOptions ag_options;
  if (o.fast_accum) ag_options.fast_accum = {true};
  MatmulReduceScatterOptions rs_options;
  rs_options.fast_accum = o.fast_accum;
  std::function<void()> gemm_fn, base_fn, fused_fn;
  std::function<void(PathChoice)> fused_with;
  if (ag) {
    gemm_fn = [&] { scaled_gemm(a_full, a_scale_full, base_out); };
    base_fn = [&] {
      all_gather(ctx, a, a_full);
      if (rowwise) all_gather(ctx, a_scale, a_scale_full);
      gemm_fn();
    };
    fused_with = [&](PathChoice path) {
      AllGatherMatmulOptions options = ag_options;
      options.path = path;
      all_gather_scaled_matmul(ctx, a, a_scale, b, b_scale, fused_out, {}, options);
    };
  } else {
    gemm_fn = [&] { scaled_gemm(a, a_scale, product); };
    base_fn = [&] {
      gemm_fn();
      reduce_scatter(ctx, product, base_out, ReduceOp::kSum);
    };
    fused_with = [&](PathChoice path) {
      MatmulReduceScatterOptions options = rs_options;
      options.path = path;
      scaled_matmul_reduce_scatter(ctx, a, a_scale, b, b_scale, fused_out, options);
    };
  }
  // An explicit auto, which ASYNCTP_PATH does not override.
  fused_fn = [&] { fused_with(PathChoice::kAuto); };

  base_fn();
  const auto base_h = to_host_f32(ctx, base_out);
  auto error_of = [&] {
    return max_over_ranks(*s.group, relative_error(to_host_f32(ctx, fused_out), base_h));
  };
  const PathErrors paths =
      check_paths(s, fused_out, fused_with, error_of, !o.json && ctx.backend().device().is_cuda());
  r.err_split = paths.split;
  r.err_native = paths.native;
  run_into_nan(ctx, fused_out, fused_fn);
  r.err = error_of();
  const char* op_name = ag ? "all_gather_scaled_matmul" : "scaled_matmul_reduce_scatter";
  const auto last = ctx.usage().last(op_name);
  r.path = last ? std::string(path_name(last->path)) : "none";
  ASYNCTP_CHECK(r.err <= 1e-2 && r.err_split <= 1e-2 && !(r.err_native > 1e-2),  // NaN: cannot run
                "{} {} ({}): the fused float8 result differs from the unfused one by {:.3g} "
                "(auto), {:.3g} (split), {:.3g} (native) (relative; tolerance 1e-2)",
                shape.op, shape.label, o.scaling, r.err, r.err_split, r.err_native);

  BenchColumns columns;
  columns.add(gemm_fn, &r.gemm_ms, "gemm");
  // The native kernel alone: the whole problem (the gathered A and its scales, as the baseline
  // left them), every chunk present, into the baseline's output, checked against the baseline's
  // result first (mm-rs: reduce-scattered as the baseline does).
  ChunkedGemmArgs native_alone;
  native_alone.a = ag ? a_full : a;
  native_alone.a_scale = ag ? a_scale_full : a_scale;
  native_alone.b = b;
  native_alone.b_scale = b_scale;
  native_alone.d = ag ? base_out : product;
  if (o.fast_accum && ctx.backend().native_gemm_unsupported(native_alone).empty()) {
    run_into_nan(ctx, native_alone.d,
                 [&] { ctx.backend().native_gemm(native_alone, ctx.stream()); });
    if (!ag) reduce_scatter(ctx, product, base_out, ReduceOp::kSum);
    const double err = max_over_ranks(*s.group, relative_error(to_host_f32(ctx, base_out), base_h));
    ASYNCTP_CHECK(err <= 1e-2,
                  "{} {} ({}): the native kernel alone differs from the unfused result by {:.3g} "
                  "(relative; tolerance 1e-2)",
                  shape.op, shape.label, o.scaling, err);
    columns.add([&] { ctx.backend().native_gemm(native_alone, ctx.stream()); }, &r.native_gemm_ms,
                "native_gemm");
  }
  columns.add(base_fn, &r.baseline_ms, "baseline");
  columns.add(fused_fn, &r.fused_ms, "auto");
  columns.add([&] { fused_with(PathChoice::kSplit); }, &r.split_ms, "split_path");
  if (!std::isnan(r.err_native))
    columns.add([&] { fused_with(PathChoice::kNative); }, &r.native_ms, "native_path");
  time_columns(s, std::move(columns), o.timing, o.graph ? &fused_fn : nullptr, &r.graph_ms,
               &r.host_us);
  if (o.trace && ctx.backend().device().is_cuda())
    print_path_traces(s, shape, !std::isnan(r.err_native), fused_with);
  return r;
}

}  // namespace

int run_scaled_bench(const ScaledBenchOptions& o, const std::string& backend) {
  ASYNCTP_CHECK(o.scaling == "rowwise" || o.scaling == "tensorwise",
                "--scaled must be rowwise or tensorwise, got '{}'", o.scaling);
  Session s = Session::join(backend);
  OpContext& ctx = *s.ctx;
  if (s.rank() == 0 && !o.json) {
    std::printf(
        "asynctp bench --scaled %s: %d ranks, backend %s (%s), f8e4m3 in, bf16 out, %s "
        "accumulation, median of %d runs, slowest rank, times in us\n",
        o.scaling.c_str(), s.world_size(), std::string(ctx.backend().name()).c_str(),
        ctx.backend().hardware().c_str(), o.fast_accum ? "fast" : "exact f32", o.timing.iters);
    std::printf("%-6s %-26s %-16s %8s %8s %9s %8s %8s %8s %8s %7s %7s %8s  %s\n", "op", "shape",
                "MxKxN", "gemm", "ngemm", "baseline", "split", "native", "auto", "graph", "a/gemm",
                "base/a", "err", "auto took");
    std::fflush(stdout);
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const BenchShape& shape : select_shapes(o.suite, o.op, o.shape, s.world_size())) {
    const ScaledResult r = bench_scaled_shape(s, o, shape);
    auto num = [](double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); };
    rows.push_back({{"op", shape.op},
                    {"label", shape.label},
                    {"M", shape.m},
                    {"K", shape.k},
                    {"N", shape.n},
                    {"scaling", o.scaling},
                    {"fast_accum", o.fast_accum},
                    {"path", r.path},
                    {"rel_error_fused_vs_baseline", r.err},
                    {"rel_error_split_path", r.err_split},
                    {"rel_error_native_path", num(r.err_native)},
                    {"gemm_ms", r.gemm_ms},
                    {"native_gemm_ms", num(r.native_gemm_ms)},
                    {"baseline_ms", r.baseline_ms},
                    {"fused_ms", r.fused_ms},
                    {"split_path_ms", r.split_ms},
                    {"native_path_ms", num(r.native_ms)},
                    {"fused_graph_ms", num(r.graph_ms)},
                    {"fused_over_gemm", r.fused_ms / r.gemm_ms},
                    {"baseline_over_fused", r.baseline_ms / r.fused_ms},
                    {"host_us", r.host_us}});
    if (s.rank() == 0 && !o.json) {
      const std::string dims = fmt::format("{}x{}x{}", shape.m, shape.k, shape.n);
      std::printf("%-6s %-26s %-16s %8.1f %8s %9.1f %8.1f %8s %8.1f %8s %7.3f %7.3f %8.1e  %s\n",
                  shape.op.c_str(), shape.label.c_str(), dims.c_str(), r.gemm_ms * 1e3,
                  us_or_dash(r.native_gemm_ms).c_str(), r.baseline_ms * 1e3, r.split_ms * 1e3,
                  us_or_dash(r.native_ms).c_str(), r.fused_ms * 1e3, us_or_dash(r.graph_ms).c_str(),
                  r.fused_ms / r.gemm_ms, r.baseline_ms / r.fused_ms, r.err, r.path.c_str());
      std::fflush(stdout);
    }
  }
  if (s.rank() == 0 && o.json) {
    const nlohmann::json doc{{"world_size", s.world_size()},
                             {"backend", std::string(ctx.backend().name())},
                             {"hardware", ctx.backend().hardware()},
                             {"scaling", o.scaling},
                             {"fast_accum", o.fast_accum},
                             {"iters", o.timing.iters},
                             {"pace", o.timing.pace},
                             {"hide_launch_cycles", o.timing.hide_launch_on(ctx)},
                             {"results", rows}};
    std::printf("%s\n", doc.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace asynctp::tools
