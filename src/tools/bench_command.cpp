// `asynctp bench ag-mm|mm-rs --shape MxKxN`: validates the fused op against the unfused
// baseline, then times side by side (median of --iters, slowest rank): the GEMM alone, the
// collective alone, the baseline (collective + GEMM), the fused op, and prints the floor
// max(GEMM, bytes over the measured peer bandwidth).
//
//   ag-mm: A_shard [M/ws, K] -AG-> [M, K] @ B [K, N] -> [M, N]
//   mm-rs: A [M, K] @ B [K, N] -> [M, N] -RS-> [M/ws, N]
#include <cstdio>

#include <nlohmann/json.hpp>

#include "ops/collectives.h"
#include "ops/fused_matmul.h"
#include "tools/commands.h"
#include "tools/session.h"

namespace asynctp::tools {

namespace {

struct BenchOptions {
  std::string op;
  std::string shape;
  std::string dtype = "bf16";
  std::string backend = "auto";
  int iters = 20;
  int warmup = 3;
  bool json = false;
};

struct BenchResult {
  std::string op;
  int64_t m = 0, k = 0, n = 0;
  std::string path;
  double rel_error = 0, gemm_ms = 0, collective_ms = 0, baseline_ms = 0, fused_ms = 0, floor_ms = 0,
         bandwidth_gbps = 0;
};

void gemm(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& d) {
  GemmArgs args;
  args.a = a;
  args.b = b;
  args.d = d;
  ctx.backend().gemm(args, ctx.stream());
}

BenchResult bench_one(Session& s, const BenchOptions& o, DType dtype, int64_t m, int64_t k, int64_t n) {
  Context& ctx = *s.ctx;
  const int ws = s.world_size();
  ASYNCTP_CHECK(m % ws == 0, "M={} is not divisible by the world size {}", m, ws);
  BenchResult r;
  r.op = o.op;
  r.m = m;
  r.k = k;
  r.n = n;
  const size_t esize = element_size(dtype);
  std::function<void()> gemm_fn, coll_fn, base_fn, fused_fn;
  std::vector<OwnedTensor> keep;
  auto make = [&](Dims shape, uint64_t seed, float scale) -> Tensor {
    keep.push_back(alloc(ctx, shape, dtype));
    if (seed != 0) fill_random(ctx, keep.back(), seed, scale);
    return keep.back();
  };
  double comm_bytes = 0;
  Tensor fused_out, ref_out;
  const char* op_name;
  if (o.op == "ag-mm") {
    op_name = "all_gather_matmul";
    const Tensor a_shard = make({m / ws, k}, 11 + s.rank(), 1.0f);
    const Tensor b = make({k, n}, 101, 1.0f / std::sqrt(static_cast<float>(k)));
    const Tensor a_full = make({m, k}, 0, 0);
    ref_out = make({m, n}, 0, 0);
    fused_out = make({m, n}, 0, 0);
    gemm_fn = [&ctx, a_full, b, ref_out] { gemm(ctx, a_full, b, ref_out); };
    coll_fn = [&ctx, a_full, a_shard] { all_gather(ctx, a_full, a_shard); };
    base_fn = [gemm_fn, coll_fn] { coll_fn(); gemm_fn(); };
    fused_fn = [&ctx, a_shard, b, fused_out] {
      const Tensor bs[] = {b};
      const Tensor outs[] = {fused_out};
      all_gather_matmul(ctx, a_shard, bs, outs);
    };
    comm_bytes = static_cast<double>(ws - 1) / ws * m * k * esize;
  } else {
    op_name = "matmul_reduce_scatter";
    const Tensor a = make({m, k}, 21 + s.rank(), 1.0f);
    const Tensor b = make({k, n}, 201 + s.rank(), 1.0f / std::sqrt(static_cast<float>(k)));
    const Tensor product = make({m, n}, 0, 0);
    ref_out = make({m / ws, n}, 0, 0);
    fused_out = make({m / ws, n}, 0, 0);
    gemm_fn = [&ctx, a, b, product] { gemm(ctx, a, b, product); };
    coll_fn = [&ctx, product, ref_out] { reduce_scatter(ctx, ref_out, product, ReduceOp::kSum); };
    base_fn = [gemm_fn, coll_fn] { gemm_fn(); coll_fn(); };
    fused_fn = [&ctx, a, b, fused_out] { matmul_reduce_scatter(ctx, a, b, fused_out); };
    comm_bytes = static_cast<double>(ws - 1) / ws * m * n * esize;
  }
  // Validate before timing.
  base_fn();
  fused_fn();
  r.rel_error = max_over_ranks(*s.group, relative_error(to_host_f32(ctx, fused_out), to_host_f32(ctx, ref_out)));
  const double tol = dtype == DType::kF32 ? 1e-5 : 1e-2;
  ASYNCTP_CHECK(r.rel_error <= tol, "{} {}x{}x{}: fused result differs from the baseline: relative "
                "error {:.3g} > {:.3g}", o.op, m, k, n, r.rel_error, tol);
  auto last = ctx.usage().last(op_name);
  r.path = last ? std::string(path_name(last->path)) : "none";
  auto timed = [&](const std::function<void()>& fn) {
    return max_over_ranks(*s.group, median_ms(ctx, fn, o.warmup, o.iters));
  };
  r.gemm_ms = timed(gemm_fn);
  r.collective_ms = timed(coll_fn);
  r.baseline_ms = timed(base_fn);
  r.fused_ms = timed(fused_fn);
  r.bandwidth_gbps = measure_peer_bandwidth(ctx, static_cast<size_t>(comm_bytes / std::max(ws - 1, 1)), o.iters);
  const double comm_ms = r.bandwidth_gbps > 0 ? comm_bytes / (r.bandwidth_gbps * 1e9) * 1e3 : 0.0;
  r.floor_ms = std::max(r.gemm_ms, comm_ms);
  return r;
}

int run_bench(const BenchOptions& o) {
  Session s = Session::join(o.backend);
  const DType dtype = parse_dtype(o.dtype);
  ASYNCTP_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16,
                "--dtype must be f32, bf16 or f16, got {}", o.dtype);
  const auto dims = parse_shape(o.shape);
  const BenchResult r = bench_one(s, o, dtype, dims[0], dims[1], dims[2]);
  if (s.rank() == 0) {
    if (o.json) {
      nlohmann::json doc{{"op", r.op},
                         {"shape", {{"M", r.m}, {"K", r.k}, {"N", r.n}}},
                         {"dtype", std::string(dtype_name(dtype))},
                         {"world_size", s.world_size()},
                         {"backend", std::string(s.ctx->backend().name())},
                         {"path", r.path},
                         {"rel_error", r.rel_error},
                         {"gemm_ms", r.gemm_ms},
                         {"collective_ms", r.collective_ms},
                         {"baseline_ms", r.baseline_ms},
                         {"fused_ms", r.fused_ms},
                         {"floor_ms", r.floor_ms},
                         {"peer_bandwidth_GBps", r.bandwidth_gbps},
                         {"fused_over_floor", r.fused_ms / r.floor_ms},
                         {"baseline_over_fused", r.baseline_ms / r.fused_ms}};
      std::printf("%s\n", doc.dump().c_str());
    } else {
      std::printf("%s %ldx%ldx%ld %s on %d ranks (%s), path %s, rel. error %.3g\n", r.op.c_str(),
                  static_cast<long>(r.m), static_cast<long>(r.k), static_cast<long>(r.n),
                  std::string(dtype_name(dtype)).c_str(), s.world_size(),
                  std::string(s.ctx->backend().name()).c_str(), r.path.c_str(), r.rel_error);
      std::printf("%10s %12s %10s %10s %10s %12s %14s\n", "gemm ms", "collective ms", "baseline", "fused",
                  "floor", "fused/floor", "baseline/fused");
      std::printf("%10.3f %12.3f %10.3f %10.3f %10.3f %12.2f %14.2f\n", r.gemm_ms, r.collective_ms,
                  r.baseline_ms, r.fused_ms, r.floor_ms, r.fused_ms / r.floor_ms, r.baseline_ms / r.fused_ms);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench",
                                 "Validate, then time the unfused baseline and the fused op side by "
                                 "side (run it under `asynctp launch`).");
  auto o = std::make_shared<BenchOptions>();
  cmd->add_option("op", o->op, "ag-mm (all-gather + matmul) or mm-rs (matmul + reduce-scatter)")
      ->required()->check(CLI::IsMember({"ag-mm", "mm-rs"}));
  cmd->add_option("--shape", o->shape, "MxKxN of the whole (gathered / unscattered) product")->required();
  cmd->add_option("--dtype", o->dtype, "f32, bf16 or f16")->capture_default_str();
  cmd->add_option("--backend", o->backend, "auto, cpu or cuda")->capture_default_str();
  cmd->add_option("--iters", o->iters, "timed runs (median reported)")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", o->warmup, "untimed runs first")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", o->json, "print one JSON document (rank 0)");
  return {cmd, [o] { return run_bench(*o); }};
}

}  // namespace asynctp::tools
