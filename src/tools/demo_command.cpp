// `asynctp demo`: a sequence-parallel MLP block forward, unfused and fused, compared.
//
//   x [T/ws, H] -AG-> [T, H] @ W1 [H, F/ws] -> SiLU -> @ W2 [F/ws, H] -RS-> [T/ws, H]
//
// Unfused: all_gather, GEMM, SiLU, GEMM, reduce_scatter. Fused: all_gather_matmul, SiLU,
// matmul_reduce_scatter. Exits non-zero when the two disagree beyond the dtype's tolerance.
//
// Timing: the six runs (each op unfused and fused, each block unfused and fused) interleaved
// round-robin in a balanced order (median_ms_interleaved), each run behind the ranks' alignment,
// back to back after --warmup-ms of warm-up on a GPU: the power-capped clocks of a training step,
// which hit every variant alike. Each block run also records an event between its three steps:
// where the block's time goes, read from the same timed runs.
#include <array>
#include <cstdio>
#include <functional>
#include <memory>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "ops/collectives.h"
#include "ops/fused_matmul.h"
#include "tools/commands.h"
#include "tools/options.h"
#include "tools/session.h"

namespace asynctp::tools {

namespace {

struct DemoOptions {
  int64_t tokens = 512;
  int64_t hidden = 256;
  int64_t ffn = 1024;
  std::string dtype = "bf16";
  std::string backend = "auto";
  int iters = 6;  // a multiple of the six variants: each follows every other equally often
  int warmup = 1;
  double warmup_ms = 300;  // GPU only
  bool json = false;
  double tolerance = -1;  // < 0: the dtype's default
};

void gemm(OpContext& ctx, const Tensor& a, const Tensor& b, const Tensor& d) {
  GemmArgs args;
  args.a = a;
  args.b = b;
  args.d = d;
  ctx.backend().gemm(args, ctx.stream());
}

int run_demo(const DemoOptions& o) {
  Session s = Session::join(o.backend);
  OpContext& ctx = *s.ctx;
  const int ws = s.world_size();
  const DType dtype = parse_dtype(o.dtype);
  ASYNCTP_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16,
                "--dtype must be f32, bf16 or f16, got {}", o.dtype);
  ASYNCTP_CHECK(o.tokens % ws == 0, "--tokens {} is not divisible by the world size {}", o.tokens,
                ws);
  ASYNCTP_CHECK(o.ffn % ws == 0, "--ffn {} is not divisible by the world size {}", o.ffn, ws);
  const int64_t t = o.tokens, h = o.hidden, f = o.ffn / ws;

  OwnedTensor x = alloc(ctx, {t / ws, h}, dtype);
  OwnedTensor w1 = alloc(ctx, {h, f}, dtype);
  OwnedTensor w2 = alloc(ctx, {f, h}, dtype);
  fill_random(ctx, x, 1000 + s.rank(), 1.0f);
  fill_random(ctx, w1, 2000 + s.rank(), 1.0f / std::sqrt(static_cast<float>(h)));
  fill_random(ctx, w2, 3000 + s.rank(), 1.0f / std::sqrt(static_cast<float>(f)));

  // Unfused buffers.
  OwnedTensor xf = alloc(ctx, {t, h}, dtype);
  OwnedTensor hid = alloc(ctx, {t, f}, dtype);
  OwnedTensor y = alloc(ctx, {t, h}, dtype);
  OwnedTensor out_ref = alloc(ctx, {t / ws, h}, dtype);
  // Fused buffers.
  OwnedTensor hid2 = alloc(ctx, {t, f}, dtype);
  OwnedTensor out = alloc(ctx, {t / ws, h}, dtype);

  auto unfused_ag_mm = [&] {
    all_gather(ctx, x, xf);
    gemm(ctx, xf, w1, hid);
  };
  auto unfused_mm_rs = [&] {
    gemm(ctx, hid, w2, y);
    reduce_scatter(ctx, y, out_ref, ReduceOp::kSum);
  };
  const Tensor w1s[] = {w1.tensor};
  const Tensor hids[] = {hid2.tensor};
  auto fused_ag_mm = [&] { all_gather_matmul(ctx, x, w1s, hids); };
  auto fused_mm_rs = [&] { matmul_reduce_scatter(ctx, hid2, w2, out); };
  // A block's three steps, with an event before each and after the last when `marks` is given
  // (the breakdown); `silu` is the unfused or the fused block's hidden activations.
  using Marks = std::array<std::unique_ptr<Event>, 4>;
  auto block = [&](const std::function<void()>& ag_mm, const Tensor& silu,
                   const std::function<void()>& mm_rs, Marks* marks) {
    auto mark = [&](int i) {
      if (marks != nullptr) (*marks)[i]->record(ctx.stream());
    };
    mark(0);
    ag_mm();
    mark(1);
    ctx.backend().unary(UnaryOp::kSilu, silu, silu, ctx.stream());
    mark(2);
    mm_rs();
    mark(3);
  };
  auto unfused_block = [&](Marks* m) { block(unfused_ag_mm, hid, unfused_mm_rs, m); };
  auto fused_block = [&](Marks* m) { block(fused_ag_mm, hid2, fused_mm_rs, m); };

  // Correctness first: one block each way on the same inputs.
  unfused_block(nullptr);
  fused_block(nullptr);
  const double err_hidden =
      max_over_ranks(*s.group, relative_error(to_host_f32(ctx, hid2), to_host_f32(ctx, hid)));
  const double err_out =
      max_over_ranks(*s.group, relative_error(to_host_f32(ctx, out), to_host_f32(ctx, out_ref)));
  const double tol = o.tolerance >= 0 ? o.tolerance : (dtype == DType::kF32 ? 1e-5 : 1e-2);
  const bool ok = err_hidden <= tol && err_out <= tol;

  // Each block run records an event before each of its three steps and after the last; after
  // each timed block run, its steps' times are read from them: the same runs as the block's own
  // time (each step's median need not add up to the block's exactly).
  std::array<Marks, 2> marks;
  for (auto& m : marks) {
    for (auto& e : m)
      e = ctx.backend().create_event(/*timing=*/true);
  }
  std::array<std::array<std::vector<double>, 3>, 2> step_runs;
  // The six runs, in this order (the indices of `ms` below); marks[b] and step_runs[b] are block
  // b's, b = 0 unfused, 1 fused.
  enum Run : size_t { kAgUnfused, kAgFused, kRsUnfused, kRsFused, kBlockUnfused, kBlockFused };
  auto read_steps = [&](size_t variant) {
    if (variant < kBlockUnfused) return;  // an op, not a block
    const size_t b = variant - kBlockUnfused;
    for (int j = 0; j < 3; ++j)
      step_runs[b][j].push_back(marks[b][j + 1]->elapsed_ms(*marks[b][j]));
  };
  const bool gpu = ctx.backend().name() != "cpu";
  const std::vector<double> ms = median_ms_interleaved(
      ctx,
      {unfused_ag_mm, fused_ag_mm, unfused_mm_rs, fused_mm_rs, [&] { unfused_block(&marks[0]); },
       [&] { fused_block(&marks[1]); }},
      o.warmup, o.iters, nullptr, gpu ? o.warmup_ms : 0.0, /*pace=*/0, HostPause::kSpin,
      /*hide_cycles=*/0, read_steps);
  auto slowest = [&](double v) { return max_over_ranks(*s.group, v); };
  // Per step, the median over the timed runs, the slowest rank.
  std::array<std::array<double, 3>, 2> step_ms{};
  for (int b = 0; b < 2; ++b) {
    for (int j = 0; j < 3; ++j)
      step_ms[b][j] = slowest(median_of(step_runs[b][j]));
  }

  struct Row {
    std::string op, path;
    double unfused_ms, fused_ms;
  };
  auto path_of = [&](const char* op) {
    auto last = ctx.usage().last(op);
    return last ? std::string(path_name(last->path)) : std::string("none");
  };
  std::vector<Row> rows;
  rows.push_back({"all_gather_matmul", path_of("all_gather_matmul"), slowest(ms[kAgUnfused]),
                  slowest(ms[kAgFused])});
  rows.push_back({"matmul_reduce_scatter", path_of("matmul_reduce_scatter"),
                  slowest(ms[kRsUnfused]), slowest(ms[kRsFused])});
  rows.push_back({"mlp_block", "-", slowest(ms[kBlockUnfused]), slowest(ms[kBlockFused])});
  static constexpr std::array<const char*, 3> kSteps = {"all_gather_matmul", "silu",
                                                        "matmul_reduce_scatter"};

  if (s.rank() == 0) {
    if (o.json) {
      nlohmann::json doc;
      doc["ok"] = ok;
      doc["backend"] = std::string(ctx.backend().name());
      doc["world_size"] = ws;
      doc["dtype"] = std::string(dtype_name(dtype));
      doc["shape"] = {{"tokens", t}, {"hidden", h}, {"ffn_per_rank", f}};
      doc["rel_error"] = {{"hidden", err_hidden}, {"out", err_out}, {"tolerance", tol}};
      nlohmann::json ops = nlohmann::json::array();
      for (const auto& r : rows) {
        ops.push_back({{"op", r.op},
                       {"path", r.path},
                       {"unfused_ms", r.unfused_ms},
                       {"fused_ms", r.fused_ms}});
      }
      doc["ops"] = ops;
      nlohmann::json steps = nlohmann::json::array();
      for (int j = 0; j < 3; ++j) {
        steps.push_back(
            {{"step", kSteps[j]}, {"unfused_ms", step_ms[0][j]}, {"fused_ms", step_ms[1][j]}});
      }
      doc["block_steps"] = steps;
      doc["timing"] = {{"iters", o.iters},
                       {"warmup", o.warmup},
                       {"warmup_ms", gpu ? o.warmup_ms : 0.0},
                       {"interleaved", true}};
      std::printf("%s\n", doc.dump().c_str());
    } else {
      std::printf("sequence-parallel MLP forward: T=%ld H=%ld F/ws=%ld, %s, %d ranks, backend %s\n",
                  static_cast<long>(t), static_cast<long>(h), static_cast<long>(f),
                  std::string(dtype_name(dtype)).c_str(), ws,
                  std::string(ctx.backend().name()).c_str());
      std::printf("%-24s %-9s %12s %12s\n", "op", "path", "unfused ms", "fused ms");
      for (const auto& r : rows) {
        std::printf("%-24s %-9s %12.3f %12.3f\n", r.op.c_str(), r.path.c_str(), r.unfused_ms,
                    r.fused_ms);
      }
      std::printf("the blocks' steps (medians of the same runs):\n");
      for (int j = 0; j < 3; ++j) {
        std::printf("  %-32s %12.3f %12.3f\n", kSteps[j], step_ms[0][j], step_ms[1][j]);
      }
      std::printf(
          "relative error fused vs unfused: hidden %.3g, output %.3g (tolerance %.3g): %s\n",
          err_hidden, err_out, tol, ok ? "OK" : "MISMATCH");
    }
    std::fflush(stdout);
  }
  return ok ? 0 : 1;
}

}  // namespace

Command add_demo_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo",
                                 "Run a sequence-parallel MLP forward unfused and fused, compare "
                                 "the results and time each op (run it under `asynctp launch`).");
  auto o = std::make_shared<DemoOptions>();
  add_integer_option(cmd, "--tokens", options::kTokens, &o->tokens,
                     "tokens T (divisible by the world size)")
      ->default_str(fmt::format("{}", o->tokens));
  add_integer_option(cmd, "--hidden", options::kHidden, &o->hidden, "hidden size H")
      ->default_str(fmt::format("{}", o->hidden));
  add_integer_option(cmd, "--ffn", options::kFfn, &o->ffn,
                     "FFN size F over all ranks (divisible by the world size)")
      ->default_str(fmt::format("{}", o->ffn));
  cmd->add_option("--dtype", o->dtype, "f32, bf16 or f16")->capture_default_str();
  cmd->add_option("--backend", o->backend, "auto, cpu or cuda")->capture_default_str();
  add_integer_option(cmd, "--iters", options::kIters, &o->iters,
                     "timed runs of each of the six (median reported; a multiple of 6 keeps the "
                     "interleaving balanced)")
      ->default_str(fmt::format("{}", o->iters));
  add_integer_option(cmd, "--warmup", options::kWarmup, &o->warmup,
                     "untimed rounds of the six runs before timing")
      ->default_str(fmt::format("{}", o->warmup));
  add_number_option(cmd, "--warmup-ms", options::kWarmupMs, &o->warmup_ms,
                    "on a GPU, keep warming up (whole rounds) until this many milliseconds have "
                    "passed, so that the timed runs see the clocks of sustained load")
      ->default_str(fmt::format("{}", o->warmup_ms));
  add_number_option(cmd, "--tolerance", options::kTolerance, &o->tolerance,
                    "largest relative error accepted (default: 1e-5 for f32, 1e-2 otherwise)");
  cmd->add_flag("--json", o->json, "print one JSON document (rank 0)");
  return {cmd, [o] { return run_demo(*o); }};
}

}  // namespace asynctp::tools
