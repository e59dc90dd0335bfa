// `asynctp bench`: for each shape, validates, then times side by side (CUDA events or host
// clocks, every column round-robin in one loop, median of --iters after --warmup, slowest rank):
//   gemm        the GEMM alone (cuBLASLt on CUDA)
//   collective  the collective alone (NCCL on CUDA)
//   baseline    collective + GEMM (or GEMM + collective), in the same process
//   ngemm       the native async-input GEMM alone, every chunk present (CUDA on Hopper only)
//   ngsig       the same kernel as the native path launches it, with its chunk walk and flags
//               (all up) but no communication (mm-rs: with its done counters per piece and its
//               own chunk's reduction, reading P's other chunks as the peers' parts)
//   split       the fused op on the split-GEMM pipeline (path split)
//   native      the fused op on the native path (one async-input GEMM), where it can run
//   auto        the fused op as the dispatcher chooses (the path it took is printed)
//   graph       the auto op replayed from a CUDA graph (CUDA only)
//   floor       max(GEMM, bytes over the measured peer bandwidth)
//
//   ag-mm: A_shard [M/ws, K] -AG-> [M, K] @ B [K, N] -> [M, N]    bytes in per rank: (ws-1)/ws*M*K
//   mm-rs: A [M, K] @ B [K, N] -> [M, N] -RS-> [M/ws, N]           bytes out per rank:
//   (ws-1)/ws*M*N
//
// Validation: the fused result and the baseline against an f32 reference (the unfused path on
// f32 copies of the inputs), fused against baseline, and for mm-rs two fused runs bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "ops/collectives.h"
#include "ops/fused_matmul.h"
#include "ops/matmul_common.h"
#include "tools/bench.h"
#include "tools/commands.h"
#include "tools/options.h"
#include "tools/session.h"
#ifdef ASYNCTP_WITH_CUDA
#include "device/cuda/cuda_graph.h"
#endif

namespace asynctp::tools {

// The shapes of ../shared/anchors/RESULTS.md (PyTorch's own measurements), for world size ws.
std::vector<BenchShape> anchor_shapes(int ws) {
  return {
      {"ag-mm", "seed-4096x3584x8192", 4096, 8192, 3584},
      {"ag-mm", "seed-2048x3584x8192", 2048, 8192, 3584},
      {"ag-mm", "l3-8b-ffn-up", 8192, 4096, 2 * 14336 / ws},
      {"ag-mm", "l3-70b-ffn-up", 8192, 8192, 2 * 28672 / ws},
      {"ag-mm", "l3-70b-qkv", 8192, 8192, (8192 + 2 * 1024) / ws},
      {"mm-rs", "seed-like-4096x8192x3584", 4096, 3584, 8192},
      {"mm-rs", "l3-8b-ffn-down", 8192, 14336 / ws, 4096},
      {"mm-rs", "l3-70b-ffn-down", 8192, 28672 / ws, 8192},
      {"mm-rs", "l3-70b-attn-out", 8192, 8192 / ws, 8192},
  };
}

std::vector<BenchShape> select_shapes(const std::string& suite, const std::string& op,
                                      const std::string& shape, int ws) {
  std::vector<BenchShape> shapes;
  if (!suite.empty()) {
    ASYNCTP_CHECK(suite == "anchors", "unknown --suite '{}' (known: anchors)", suite);
    for (const auto& sh : anchor_shapes(ws)) {
      if (op.empty() || op == sh.op) shapes.push_back(sh);
    }
  } else {
    ASYNCTP_CHECK(!op.empty() && !shape.empty(),
                  "give an op (ag-mm or mm-rs) and --shape MxKxN, or --suite");
    const auto d = parse_shape(shape);
    shapes.push_back({op, shape, d[0], d[1], d[2]});
  }
  return shapes;
}

void time_columns(Session& s, BenchColumns columns, const BenchTiming& timing,
                  const std::function<void()>* graphed, double* graph_ms,
                  std::map<std::string, double>* host_us) {
  OpContext& ctx = *s.ctx;
  const bool gpu = ctx.backend().device().is_cuda();
#ifdef ASYNCTP_WITH_CUDA
  std::optional<cuda::Graph> graph;
  if (graphed != nullptr && gpu) {
    graph.emplace();
    graph->begin_capture(ctx.stream());
    (*graphed)();
    graph->end_capture();
    columns.add([&] { graph->replay(ctx.stream()); }, graph_ms, "graph");
  }
#endif
  std::vector<double> host_ms;
  const std::vector<double> medians = median_ms_interleaved(
      ctx, columns.fns, timing.warmup, timing.iters, &host_ms, gpu ? timing.warmup_ms : 0.0,
      gpu ? timing.pace : 0.0, timing.pace_sleep ? HostPause::kSleep : HostPause::kSpin,
      timing.hide_launch_on(ctx));
  for (size_t i = 0; i < columns.slots.size(); ++i) {
    *columns.slots[i] = max_over_ranks(*s.group, medians[i]);
    (*host_us)[columns.names[i]] = max_over_ranks(*s.group, host_ms[i]) * 1e3;
  }
}

void run_into_nan(OpContext& ctx, const Tensor& out, const std::function<void()>& run) {
  ctx.backend().fill(out, NAN, ctx.stream());
  run();
}

PathErrors check_paths(Session& s, const Tensor& out,
                       const std::function<void(PathChoice)>& fused_with,
                       const std::function<double()>& error_of, bool say_why) {
  OpContext& ctx = *s.ctx;
  PathErrors e;
  run_into_nan(ctx, out, [&] { fused_with(PathChoice::kSplit); });
  e.split = error_of();
  try {
    run_into_nan(ctx, out, [&] { fused_with(PathChoice::kNative); });
  } catch (const PathUnavailableError& err) {
    if (s.rank() == 0 && say_why) std::printf("  (%s)\n", err.what());
    return e;
  }
  e.native = error_of();
  return e;
}

std::string us_or_dash(double ms) {
  return std::isnan(ms) ? std::string("-") : fmt::format("{:.1f}", ms * 1e3);
}

namespace {

// The op's own step marks, median over runs started together, printed by every rank: where the
// time of one run goes, on the device and (in brackets) on the host.
void print_trace(OpContext& ctx, int rank, const std::string& what,
                 const std::function<void()>& run) {
  constexpr int kRuns = 15;
  OpTrace trace(ctx.backend());
  std::vector<std::string> labels;
  std::vector<std::vector<double>> device, host;
  for (int i = 0; i < kRuns; ++i) {
    ctx.align_ranks();
    trace.clear();
    ctx.set_trace(&trace);
    run();
    ctx.set_trace(nullptr);
    const auto marks = trace.read();
    if (i == 0) {
      for (const auto& m : marks)
        labels.push_back(m.label);
      device.resize(marks.size());
      host.resize(marks.size());
    }
    for (size_t j = 0; j < marks.size() && j < labels.size(); ++j) {
      device[j].push_back(marks[j].device_ms);
      host[j].push_back(marks[j].host_ms);
    }
  }
  auto median_us = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return 1e3 * v[v.size() / 2];
  };
  std::string line;
  for (size_t j = 0; j < labels.size(); ++j) {
    line += fmt::format("{}{} {:.1f} ({:.1f})", j ? " | " : "", labels[j], median_us(device[j]),
                        median_us(host[j]));
  }
  std::fprintf(stderr, "trace rank %d %s (us after start: device (host), median of %d): %s\n", rank,
               what.c_str(), kRuns, line.c_str());
}

}  // namespace

void print_path_traces(Session& s, const BenchShape& shape, bool native,
                       const std::function<void(PathChoice)>& fused_with) {
  std::vector<std::pair<const char*, PathChoice>> paths{{"split", PathChoice::kSplit}};
  if (native) paths.push_back({"native", PathChoice::kNative});
  paths.push_back({"auto", PathChoice::kAuto});
  for (const auto& [name, path] : paths)
    print_trace(*s.ctx, s.rank(), fmt::format("{} {} {}", shape.op, shape.label, name),
                [&, path = path] { fused_with(path); });
}

namespace {

struct BenchOptions {
  std::string op;  // empty with --suite: both
  std::string shape;
  std::string suite;
  std::string dtype;  // empty: bf16 (the float8 table refuses any other)
  std::string backend = "auto";
  BenchTiming timing;
  bool json = false;
  bool graph = true;
  bool trace = false;
  // all_gather_matmul's native path once more with this push_piece_bytes (a column of its own,
  // timed in the same loop).
  std::optional<size_t> native_pieces;
  std::string scaled;       // non-empty: the float8 table (bench_scaled.cpp) instead
  bool fast_accum = false;  // the float8 table's GEMMs accumulate fast
};

using Shape = BenchShape;

struct Result {
  Shape shape;
  std::string path;
  double err_fused = 0, err_baseline = 0, err_fused_vs_baseline = 0;
  bool deterministic = true;
  double gemm_ms = 0, split_gemm_ms = 0, collective_ms = 0, baseline_ms = 0, fused_ms = 0,
         graph_ms = NAN, floor_ms = 0;
  double native_gemm_ms = NAN, split_ms = NAN, native_ms = NAN, native_pieces_ms = NAN;
  // The native kernel as the native path launches it (chunk walk from the path's pivot, own
  // chunk in place and every ready flag already up for AG+MM, completion counters for MM+RS),
  // without the communication: what the path adds to the GEMM is native - this.
  double native_gemm_signalled_ms = NAN;
  // Median host time of each timed call, slowest rank (json only): where a path's enqueueing
  // takes longer than the GPU needs to reach its first kernel, the GPU waits for the host.
  std::map<std::string, double> host_us;
  double err_split = NAN, err_native = NAN;
  double comm_bytes = 0;
};

void gemm(OpContext& ctx, const Tensor& a, const Tensor& b, const Tensor& d,
          Stream* stream = nullptr) {
  GemmArgs args;
  args.a = a;
  args.b = b;
  args.d = d;
  ctx.backend().gemm(args, stream != nullptr ? *stream : ctx.stream());
}

bool bitwise_equal(OpContext& ctx, const Tensor& x, const Tensor& y) {
  OwnedTensor hx = empty_host(x.shape(), x.dtype()), hy = empty_host(y.shape(), y.dtype());
  ctx.backend().copy(hx, x, ctx.stream());
  ctx.backend().copy(hy, y, ctx.stream());
  ctx.backend().synchronize();
  return std::memcmp(hx->data(), hy->data(), x.nbytes()) == 0;
}

Result bench_shape(Session& s, const BenchOptions& o, DType dtype, const Shape& shape,
                   double bandwidth_gbps) {
  OpContext& ctx = *s.ctx;
  const int ws = s.world_size();
  const int64_t m = shape.m, k = shape.k, n = shape.n;
  ASYNCTP_CHECK(m % ws == 0, "{}: M={} is not divisible by the world size {}", shape.label, m, ws);
  Result r;
  r.shape = shape;
  std::vector<OwnedTensor> keep;
  auto make = [&](Dims dims, DType dt) -> Tensor {
    keep.push_back(alloc(ctx, dims, dt));
    return keep.back();
  };
  auto f32_copy = [&](const Tensor& t) {
    Tensor c = make(t.shape(), DType::kF32);
    ctx.backend().copy(c, t, ctx.stream());
    return c;
  };
  const bool ag = shape.op == "ag-mm";
  Tensor a = make(ag ? Dims{m / ws, k} : Dims{m, k}, dtype);
  Tensor b = make({k, n}, dtype);
  fill_random(ctx, a, 1000003ull * (ag ? 1 : 2) + s.rank(), 1.0f);
  fill_random(ctx, b, 2000003ull + (ag ? 0 : s.rank()), 1.0f / std::sqrt(static_cast<float>(k)));
  const Dims out_dims = ag ? Dims{m, n} : Dims{m / ws, n};
  Tensor fused_out = make(out_dims, dtype), base_out = make(out_dims, dtype);
  Tensor a_full = ag ? make({m, k}, dtype) : Tensor();
  Tensor product = ag ? Tensor() : make({m, n}, dtype);

  std::function<void()> gemm_fn, split_fn, coll_fn, base_fn, fused_fn;
  // The same GEMM as ws row chunks, without communication, on the streams the fused ops use:
  // what splitting costs.
  const int64_t rows = m / ws;
  auto fork = ctx.backend().create_event();
  auto join = ctx.backend().create_event();
  split_fn = [&] {
    fork->record(ctx.stream());
    fork->block(ctx.gemm_stream(1));
    for (int p = 0; p < ws; ++p) {
      Stream& stream = ctx.gemm_stream(p);
      if (ag) {
        gemm(ctx, a_full.narrow(0, p * rows, rows), b, base_out.narrow(0, p * rows, rows), &stream);
      } else {
        gemm(ctx, a.narrow(0, p * rows, rows), b, product.narrow(0, p * rows, rows), &stream);
      }
    }
    join->record(ctx.gemm_stream(1));
    join->block(ctx.stream());
  };
  const char* op_name = ag ? "all_gather_matmul" : "matmul_reduce_scatter";
  std::function<void(PathChoice)> fused_with;
  if (ag) {
    gemm_fn = [&] { gemm(ctx, a_full, b, base_out); };
    coll_fn = [&] { all_gather(ctx, a, a_full); };
    fused_with = [&](PathChoice path) {
      const Tensor bs[] = {b};
      const Tensor outs[] = {fused_out};
      all_gather_matmul(ctx, a, bs, outs, {}, {.gather_dim = 0, .path = path});
    };
    r.comm_bytes = static_cast<double>(ws - 1) / ws * m * k * element_size(dtype);
  } else {
    gemm_fn = [&] { gemm(ctx, a, b, product); };
    coll_fn = [&] { reduce_scatter(ctx, product, base_out, ReduceOp::kSum); };
    fused_with = [&](PathChoice path) {
      matmul_reduce_scatter(ctx, a, b, fused_out, {.path = path});
    };
    r.comm_bytes = static_cast<double>(ws - 1) / ws * m * n * element_size(dtype);
  }
  fused_fn = [&] { fused_with(PathChoice::kAuto); };
  // AG+MM's native path with --native-pieces (validated with the native path, timed beside it).
  const std::function<void()> native_pieces_fn = [&] {
    const Tensor bs[] = {b};
    const Tensor outs[] = {fused_out};
    all_gather_matmul(ctx, a, bs, outs, {},
                      {.path = PathChoice::kNative, .push_piece_bytes = o.native_pieces});
  };
  // The native kernel alone on the whole problem, every chunk present.
  ChunkedGemmArgs native_alone;
  native_alone.a = ag ? a_full : a;
  native_alone.b = b;
  native_alone.d = ag ? base_out : product;
  const bool native_gemm_ok = ctx.backend().native_gemm_unsupported(native_alone).empty();
  ChunkedGemmArgs native_signalled = native_alone;
  native_signalled.chunk_rows = rows;
  native_signalled.first_chunk = ag ? s.rank() : (s.rank() + 1) % ws;
  native_signalled.rank = s.rank();
  Buffer flag_buf;
  bool native_signalled_ok = false;
  if (native_gemm_ok) {  // a backend with the native GEMM has the flag operations
    const int count = 2 * ws * detail::kMaxPushPieces;  // mm-rs: done, then landed flags
    flag_buf = ctx.backend().allocate(count * sizeof(uint32_t));
    auto* flags = static_cast<uint32_t*>(flag_buf.data());
    ctx.backend().zero_flags(flags, count, ctx.stream());
    if (ag) {
      for (int p = 0; p < ws; ++p)
        ctx.backend().write_flag(flags + p, 1, ctx.stream());
      native_signalled.ready = flags;
      native_signalled.own_a = a;
      native_signalled.own_chunk = s.rank();
    } else {
      // As the path runs it: done counted per piece (from 0: each run zeroes them first, as the
      // path's pushes reset them), the own chunk last, adding the parts (here P's other chunks,
      // every flag up) and storing the reduced chunk (into the baseline's output).
      const detail::RsPieces pieces =
          detail::native_rs_pieces(n, static_cast<size_t>(rows * n) * element_size(dtype));
      uint32_t* landed = flags + ws * detail::kMaxPushPieces;
      for (int i = 0; i < ws * pieces.count; ++i)
        ctx.backend().write_flag(landed + i, 1, ctx.stream());
      detail::set_native_rs_reduction(native_signalled, s.rank(), ws, pieces,
                                      product.view({ws, rows, n}), base_out.view({rows, n}), flags,
                                      landed, 1, 0, false);
    }
    native_signalled_ok = ctx.backend().native_gemm_unsupported(native_signalled).empty();
  }
  base_fn = ag ? std::function<void()>([&] {
    coll_fn();
    gemm_fn();
  })
               : std::function<void()>([&] {
                   gemm_fn();
                   coll_fn();
                 });

  // Validation: f32 reference through the unfused path on f32 copies of the inputs.
  {
    const size_t kept_before = keep.size();
    const Tensor a32 = f32_copy(a), b32 = f32_copy(b);
    const Tensor ref = make(out_dims, DType::kF32);
    if (ag) {
      const Tensor bs[] = {b32};
      const Tensor outs[] = {ref};
      all_gather_matmul(ctx, a32, bs, outs, {}, {.gather_dim = 0, .path = PathChoice::kFallback});
    } else {
      matmul_reduce_scatter(ctx, a32, b32, ref, {.path = PathChoice::kFallback});
    }
    const auto ref_h = to_host_f32(ctx, ref);
    // Each explicit path against the reference.
    auto error_of = [&] {
      return max_over_ranks(*s.group, relative_error(to_host_f32(ctx, fused_out), ref_h));
    };
    const PathErrors paths = check_paths(s, fused_out, fused_with, error_of,
                                         !o.json && ctx.backend().device().is_cuda());
    r.err_split = paths.split;
    r.err_native = paths.native;
    if (!std::isnan(r.err_native) && ag && o.native_pieces) {
      run_into_nan(ctx, fused_out, native_pieces_fn);
      r.err_native = std::max(r.err_native, error_of());
    }
    base_fn();
    run_into_nan(ctx, fused_out, fused_fn);
    const auto fused_h = to_host_f32(ctx, fused_out);
    const auto base_h = to_host_f32(ctx, base_out);
    r.err_fused = max_over_ranks(*s.group, relative_error(fused_h, ref_h));
    r.err_baseline = max_over_ranks(*s.group, relative_error(base_h, ref_h));
    r.err_fused_vs_baseline = max_over_ranks(*s.group, relative_error(fused_h, base_h));
    if (!ag) {
      // The same call as fused_fn (an explicit auto, which ASYNCTP_PATH does not override),
      // into another tensor.
      const Tensor again = make(out_dims, dtype);
      matmul_reduce_scatter(ctx, a, b, again, {.path = PathChoice::kAuto});
      r.deterministic =
          max_over_ranks(*s.group, bitwise_equal(ctx, again, fused_out) ? 0.0 : 1.0) == 0.0;
    }
    auto last = ctx.usage().last(op_name);
    r.path = last ? std::string(path_name(last->path)) : "none";
    ctx.backend().synchronize();
    keep.resize(kept_before);  // free the reference copies
  }
  const double tol = dtype == DType::kF32 ? 1e-5 : 1e-2;
  ASYNCTP_CHECK(r.err_fused <= tol && r.deterministic,
                "{} {}: the fused result is wrong: relative error {:.3g} against the f32 reference "
                "(tolerance {:.3g}), deterministic: {}",
                shape.op, shape.label, r.err_fused, tol, r.deterministic);
  ASYNCTP_CHECK(
      r.err_split <= tol && !(r.err_native > tol),
      "{} {}: a path is wrong: relative error against the f32 reference {:.3g} (fused) and {:.3g} "
      "(native), tolerance {:.3g}",
      shape.op, shape.label, r.err_split, r.err_native, tol);

  // Every variant timed round-robin in one loop (see median_ms_interleaved): timed one after the
  // other, the later ones would run on a hotter, slower GPU (see docs/DECISIONS.md D23).
  BenchColumns columns;
  columns.add(gemm_fn, &r.gemm_ms, "gemm");
  columns.add(split_fn, &r.split_gemm_ms, "split_gemm");
  columns.add(coll_fn, &r.collective_ms, "collective");
  columns.add(base_fn, &r.baseline_ms, "baseline");
  columns.add(fused_fn, &r.fused_ms, "auto");
  columns.add([&] { fused_with(PathChoice::kSplit); }, &r.split_ms, "split_path");
  if (!std::isnan(r.err_native)) {
    columns.add([&] { fused_with(PathChoice::kNative); }, &r.native_ms, "native_path");
    if (ag && o.native_pieces)
      columns.add(native_pieces_fn, &r.native_pieces_ms, "native_pieces_path");
  }
  if (native_gemm_ok) {
    columns.add([&] { ctx.backend().native_gemm(native_alone, ctx.stream()); }, &r.native_gemm_ms,
                "native_gemm");
  }
  if (native_signalled_ok) {
    columns.add(
        [&] {
          // (mm-rs: the done counters back to 0, one batched stream write; the CPU backend's
          // GEMM refuses a count left over from the run before)
          if (!ag)
            ctx.backend().zero_flags(native_signalled.done, ws * detail::kMaxPushPieces,
                                     ctx.stream());
          ctx.backend().native_gemm(native_signalled, ctx.stream());
        },
        &r.native_gemm_signalled_ms, "native_gemm_signalled");
  }
  time_columns(s, std::move(columns), o.timing, o.graph ? &fused_fn : nullptr, &r.graph_ms,
               &r.host_us);
  const bool gpu = ctx.backend().device().is_cuda();
  const double comm_ms = bandwidth_gbps > 0 ? r.comm_bytes / (bandwidth_gbps * 1e9) * 1e3 : 0.0;
  r.floor_ms = std::max(r.gemm_ms, comm_ms);
  if (o.trace && gpu) print_path_traces(s, shape, !std::isnan(r.err_native), fused_with);
  return r;
}

nlohmann::json to_json(const Result& r) {
  auto num = [](double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); };
  return {{"op", r.shape.op},
          {"label", r.shape.label},
          {"M", r.shape.m},
          {"K", r.shape.k},
          {"N", r.shape.n},
          {"path", r.path},
          {"rel_error_fused", r.err_fused},
          {"rel_error_baseline", r.err_baseline},
          {"rel_error_fused_vs_baseline", r.err_fused_vs_baseline},
          {"deterministic", r.deterministic},
          {"gemm_ms", r.gemm_ms},
          {"split_gemm_ms", r.split_gemm_ms},
          {"collective_ms", r.collective_ms},
          {"baseline_ms", r.baseline_ms},
          {"fused_ms", r.fused_ms},
          {"native_gemm_ms", num(r.native_gemm_ms)},
          {"native_gemm_signalled_ms", num(r.native_gemm_signalled_ms)},
          {"host_us", r.host_us},
          {"split_path_ms", num(r.split_ms)},
          {"native_path_ms", num(r.native_ms)},
          {"native_pieces_path_ms", num(r.native_pieces_ms)},
          {"rel_error_split_path", num(r.err_split)},
          {"rel_error_native_path", num(r.err_native)},
          {"fused_graph_ms", num(r.graph_ms)},
          {"floor_ms", r.floor_ms},
          {"comm_bytes", r.comm_bytes},
          {"fused_over_floor", r.fused_ms / r.floor_ms},
          {"baseline_over_fused", r.baseline_ms / r.fused_ms}};
}

int run_bench(const BenchOptions& o) {
  ASYNCTP_CHECK(!o.fast_accum || !o.scaled.empty(),
                "--fast-accum is for the float8 table: give --scaled rowwise or tensorwise too");
  if (!o.scaled.empty()) {
    // The float8 table has its own operands (e4m3 in, bf16 out) and no pieces column.
    ASYNCTP_CHECK(o.dtype.empty(), "--dtype {} is for the 16-bit table; --scaled times e4m3 inputs",
                  o.dtype);
    ASYNCTP_CHECK(!o.native_pieces, "--native-pieces is for the 16-bit table, not --scaled");
    return run_scaled_bench({.scaling = o.scaled,
                             .suite = o.suite,
                             .op = o.op,
                             .shape = o.shape,
                             .timing = o.timing,
                             .json = o.json,
                             .fast_accum = o.fast_accum,
                             .trace = o.trace,
                             .graph = o.graph},
                            o.backend);
  }
  Session s = Session::join(o.backend);
  OpContext& ctx = *s.ctx;
  const DType dtype = parse_dtype(o.dtype.empty() ? "bf16" : o.dtype);
  ASYNCTP_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16,
                "--dtype must be f32, bf16 or f16, got {}", o.dtype);
  const std::vector<Shape> shapes = select_shapes(o.suite, o.op, o.shape, s.world_size());
  // Peer ingress bandwidth, measured once: every rank pulls 64 MiB from each peer at once.
  const double bandwidth = measure_peer_bandwidth(ctx, size_t{64} << 20, o.timing.iters);
  if (s.rank() == 0 && !o.json) {
    // The hardware says where timings compare (and, where ranks share GPUs, that they do not).
    std::printf(
        "asynctp bench: %d ranks, backend %s (%s), %s, peer ingress bandwidth %.1f GB/s, median "
        "of %d runs, slowest rank, times in us\n",
        s.world_size(), std::string(ctx.backend().name()).c_str(), ctx.backend().hardware().c_str(),
        std::string(dtype_name(dtype)).c_str(), bandwidth, o.timing.iters);
    // With --native-pieces, the native path with pieces gets a column beside the native one.
    std::printf("%-6s %-26s %-16s %8s %8s %8s %9s %8s %8s%s %8s %8s %8s %7s %7s %8s  %s\n", "op",
                "shape", "MxKxN", "gemm", "ngemm", "coll", "baseline", "split", "native",
                o.native_pieces ? "   npiece" : "", "auto", "graph", "floor", "a/floor", "base/a",
                "err", "auto took");
    std::fflush(stdout);
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& shape : shapes) {
    const Result r = bench_shape(s, o, dtype, shape, bandwidth);
    rows.push_back(to_json(r));
    if (s.rank() == 0 && !o.json) {
      const std::string dims = fmt::format("{}x{}x{}", r.shape.m, r.shape.k, r.shape.n);
      const std::string npiece =
          o.native_pieces ? fmt::format(" {:>8}", us_or_dash(r.native_pieces_ms)) : std::string();
      std::printf(
          "%-6s %-26s %-16s %8.1f %8s %8.1f %9.1f %8s %8s%s %8.1f %8s %8.1f %7.3f %7.3f %8.1e  "
          "%s\n",
          r.shape.op.c_str(), r.shape.label.c_str(), dims.c_str(), r.gemm_ms * 1e3,
          us_or_dash(r.native_gemm_ms).c_str(), r.collective_ms * 1e3, r.baseline_ms * 1e3,
          us_or_dash(r.split_ms).c_str(), us_or_dash(r.native_ms).c_str(), npiece.c_str(),
          r.fused_ms * 1e3, us_or_dash(r.graph_ms).c_str(), r.floor_ms * 1e3,
          r.fused_ms / r.floor_ms, r.baseline_ms / r.fused_ms, r.err_fused, r.path.c_str());
      std::fflush(stdout);
    }
  }
  if (s.rank() == 0 && o.json) {
    nlohmann::json doc{{"world_size", s.world_size()},
                       {"backend", std::string(ctx.backend().name())},
                       {"hardware", ctx.backend().hardware()},
                       {"dtype", std::string(dtype_name(dtype))},
                       {"iters", o.timing.iters},
                       {"pace", o.timing.pace},
                       {"pace_host", o.timing.pace_sleep ? "sleep" : "spin"},
                       {"hide_launch_cycles", o.timing.hide_launch_on(ctx)},
                       {"warmup_ms", o.timing.warmup_ms},
                       {"peer_bandwidth_GBps", bandwidth},
                       {"results", rows}};
    std::printf("%s\n", doc.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("bench",
                         "Validate, then time the GEMM, the collective, the unfused baseline, the "
                         "fused op (and its CUDA-graph replay) side by side, with the floor "
                         "max(GEMM, bytes / peer bandwidth) (run it under `asynctp launch`).");
  auto o = std::make_shared<BenchOptions>();
  cmd->add_option("op", o->op,
                  "ag-mm (all-gather + matmul) or mm-rs (matmul + reduce-scatter); with --suite, "
                  "restricts the suite to that op")
      ->check(CLI::IsMember({"ag-mm", "mm-rs"}));
  cmd->add_option("--shape", o->shape, "MxKxN of the whole (gathered / unscattered) product");
  cmd->add_option("--suite", o->suite,
                  "a set of shapes: 'anchors' (the shapes of PyTorch's anchor measurements)");
  cmd->add_option("--dtype", o->dtype, "f32, bf16 or f16 (default: bf16)");
  cmd->add_option("--backend", o->backend, "auto, cpu or cuda")->capture_default_str();
  add_integer_option(cmd, "--iters", options::kIters, &o->timing.iters,
                     "timed runs (median reported)")
      ->default_str(fmt::format("{}", o->timing.iters));
  add_integer_option(cmd, "--warmup", options::kWarmup, &o->timing.warmup, "untimed runs first")
      ->default_str(fmt::format("{}", o->timing.warmup));
  add_number_option(cmd, "--warmup-ms", options::kWarmupMs, &o->timing.warmup_ms,
                    "on a GPU, keep warming up (whole rounds) until this many milliseconds have "
                    "passed per shape")
      ->default_str(fmt::format("{}", o->timing.warmup_ms));
  add_number_option(cmd, "--pace", options::kPace, &o->timing.pace,
                    "on a GPU, idle this many times each timed run's duration after it: 1 keeps an "
                    "H200 under its power cap, at the clocks of short bursts (as PyTorch's anchor "
                    "script measures); 0 runs back to back (sustained load, power-capped clocks)")
      ->default_str(fmt::format("{}", o->timing.pace));
  cmd->add_flag("--pace-sleep", o->timing.pace_sleep,
                "sleep through the pace instead of spinning (a core that idled enqueues the next "
                "run more slowly, as the JSON's host_us shows)");
  add_integer_option(cmd, "--hide-launch", options::kHideLaunch, &o->timing.hide_launch,
                     "on a GPU, start each timed run this many device clock cycles behind its "
                     "barrier (a one-thread spin, as torch.cuda._sleep), so that its time holds "
                     "none of the host's enqueueing, only the device's (0: off)")
      ->default_str("0");
  add_integer_option(
      cmd, "--native-pieces", options::kNativePieces, &o->native_pieces,
      "also time all_gather_matmul's native path with its shards pushed in pieces of "
      "at least this many bytes (ASYNCTP_PUSH_PIECE_BYTES for one column: "
      "native_pieces_path_ms in the JSON)");
  cmd->add_option("--scaled", o->scaled,
                  "rowwise or tensorwise: time the float8 fused ops (f8e4m3 operands, f32 scales, "
                  "bf16 out) against the scaled GEMM alone and the unfused baseline instead");
  cmd->add_flag("--fast-accum", o->fast_accum,
                "with --scaled: let every float8 GEMM timed (alone, in the baseline and in the "
                "fused ops) accumulate fast, as PyTorch's _scaled_mm with use_fast_accum=True "
                "(cuBLASLt's fast accumulation; the CPU backend accumulates in f32 either way); "
                "the table and the JSON (\"fast_accum\") say which was timed");
  cmd->add_flag("--json", o->json, "print one JSON document (rank 0)");
  cmd->add_flag("!--no-graph", o->graph, "skip the CUDA-graph replay");
  cmd->add_flag("--trace", o->trace,
                "on a GPU, after timing, print each rank's timeline of the split, native and "
                "auto paths (the ops' own step marks, device and host times, median of 15 "
                "runs) to stderr");
  cmd->footer(
      "Examples:\n  asynctp launch --nproc 4 -- asynctp bench ag-mm --shape 4096x8192x3584\n"
      "  asynctp launch --nproc 4 -- asynctp bench --suite anchors --json");
  return {cmd, [o] { return run_bench(*o); }};
}

}  // namespace asynctp::tools
