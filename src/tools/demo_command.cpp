// `asynctp demo`: a sequence-parallel MLP block forward, unfused and fused, compared.
//
//   x [T/ws, H] -AG-> [T, H] @ W1 [H, F/ws] -> SiLU -> @ W2 [F/ws, H] -RS-> [T/ws, H]
//
// Unfused: all_gather, GEMM, SiLU, GEMM, reduce_scatter. Fused: all_gather_matmul, SiLU,
// matmul_reduce_scatter. Exits non-zero when the two disagree beyond the dtype's tolerance.
#include <cstdio>

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
  int iters = 5;
  int warmup = 1;
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
  auto unfused_block = [&] {
    unfused_ag_mm();
    ctx.backend().unary(UnaryOp::kSilu, hid, hid, ctx.stream());
    unfused_mm_rs();
  };
  auto fused_block = [&] {
    fused_ag_mm();
    ctx.backend().unary(UnaryOp::kSilu, hid2, hid2, ctx.stream());
    fused_mm_rs();
  };

  // Correctness first: one block each way on the same inputs.
  unfused_block();
  fused_block();
  const double err_hidden =
      max_over_ranks(*s.group, relative_error(to_host_f32(ctx, hid2), to_host_f32(ctx, hid)));
  const double err_out =
      max_over_ranks(*s.group, relative_error(to_host_f32(ctx, out), to_host_f32(ctx, out_ref)));
  const double tol = o.tolerance >= 0 ? o.tolerance : (dtype == DType::kF32 ? 1e-5 : 1e-2);
  const bool ok = err_hidden <= tol && err_out <= tol;

  struct Row {
    std::string op, path;
    double unfused_ms, fused_ms;
  };
  auto path_of = [&](const char* op) {
    auto last = ctx.usage().last(op);
    return last ? std::string(path_name(last->path)) : std::string("none");
  };
  std::vector<Row> rows;
  rows.push_back({"all_gather_matmul", path_of("all_gather_matmul"),
                  max_over_ranks(*s.group, median_ms(ctx, unfused_ag_mm, o.warmup, o.iters)),
                  max_over_ranks(*s.group, median_ms(ctx, fused_ag_mm, o.warmup, o.iters))});
  rows.push_back({"matmul_reduce_scatter", path_of("matmul_reduce_scatter"),
                  max_over_ranks(*s.group, median_ms(ctx, unfused_mm_rs, o.warmup, o.iters)),
                  max_over_ranks(*s.group, median_ms(ctx, fused_mm_rs, o.warmup, o.iters))});
  rows.push_back({"mlp_block", "-",
                  max_over_ranks(*s.group, median_ms(ctx, unfused_block, o.warmup, o.iters)),
                  max_over_ranks(*s.group, median_ms(ctx, fused_block, o.warmup, o.iters))});

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
                     "timed runs per measurement (median reported)")
      ->default_str(fmt::format("{}", o->iters));
  add_integer_option(cmd, "--warmup", options::kWarmup, &o->warmup, "untimed runs before timing")
      ->default_str(fmt::format("{}", o->warmup));
  add_number_option(cmd, "--tolerance", options::kTolerance, &o->tolerance,
                    "largest relative error accepted (default: 1e-5 for f32, 1e-2 otherwise)");
  cmd->add_flag("--json", o->json, "print one JSON document (rank 0)");
  return {cmd, [o] { return run_demo(*o); }};
}

}  // namespace asynctp::tools
