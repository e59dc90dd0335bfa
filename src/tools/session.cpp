#include "tools/session.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>

#include "core/balanced_orders.h"
#include "core/random.h"

#ifdef ASYNCTP_WITH_CUDA
#include "device/cuda/cuda_backend.h"
#endif

namespace asynctp::tools {

std::string resolve_backend(const std::string& backend) {
  if (backend != "auto") return backend;
#ifdef ASYNCTP_WITH_CUDA
  if (cuda_device_count() > 0) return "cuda";
#endif
  return "cpu";
}

Session Session::join(const std::string& backend) {
  Session s;
  s.group = Group::from_env();
  ContextOptions options;
  options.backend = resolve_backend(backend);
  s.ctx = OpContext::create(s.group, options);
  return s;
}

OwnedTensor alloc(OpContext& ctx, Dims shape, DType dtype) {
  Buffer buffer =
      ctx.backend().allocate(static_cast<size_t>(shape.product()) * element_size(dtype));
  Tensor view = buffer.view(shape, dtype);
  return {std::move(buffer), view};
}

void fill_random(OpContext& ctx, const Tensor& t, uint64_t seed, float scale) {
  // Values are made (and rounded to t's dtype) on the host, then copied as they are: a backend
  // copy between host and device memory does not convert.
  OwnedTensor host = empty_host(t.shape(), t.dtype());
  uint64_t state = seed * 0x2545F4914F6CDD1Dull + 1;
  dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = host->data_as<T>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      p[i] = from_float<T>(static_cast<float>((2.0 * uniform01(state) - 1.0) * scale));
    }
  });
  ctx.backend().copy(t, host.tensor, ctx.stream());
  ctx.backend().synchronize();
}

std::vector<float> to_host_f32(OpContext& ctx, const Tensor& t) {
  OwnedTensor host = empty_host(t.shape(), t.dtype());
  ctx.backend().copy(host.tensor, t, ctx.stream());
  ctx.backend().synchronize();
  std::vector<float> out(t.numel());
  dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = host->data_as<T>();
    for (int64_t i = 0; i < t.numel(); ++i)
      out[i] = to_float(p[i]);
  });
  return out;
}

double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  ASYNCTP_CHECK(a.size() == b.size(), "relative_error of {} and {} values", a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

std::vector<double> median_ms_interleaved(OpContext& ctx,
                                          const std::vector<std::function<void()>>& fns, int warmup,
                                          int iters, std::vector<double>* host_ms, double warmup_ms,
                                          double pace, HostPause pause, int64_t hide_cycles,
                                          const std::function<void(size_t)>& timed) {
  ASYNCTP_CHECK(iters > 0 && warmup >= 0 && warmup_ms >= 0,
                "iters must be positive, warmup and warmup_ms non-negative (got {}, {}, {})", iters,
                warmup, warmup_ms);
  auto start = ctx.backend().create_event(/*timing=*/true);
  auto stop = ctx.backend().create_event(/*timing=*/true);
  auto round = [&] {
    for (const auto& fn : fns)
      fn();
  };
  const auto began = std::chrono::steady_clock::now();
  for (int i = 0; i < warmup; ++i)
    round();
  ctx.backend().synchronize();
  // Keep the GPU busy for warmup_ms in all: a GPU that comes out of a pause (validation, the
  // previous shape's set-up) runs its first few hundred milliseconds of heavy work at reduced
  // clocks (see docs/DECISIONS.md D23).
  if (warmup_ms > 0) warm_up_for(ctx, round, warmup_ms, began);
  ctx.group().barrier("bench");
  std::vector<std::vector<double>> times(fns.size()), host(fns.size());
  // Each round runs the variants in the next order of a balanced design, the same on every rank
  // (the ops are collective): what runs just before a variant, and the state it leaves in L2,
  // clocks and copy engines, is every other variant about equally often. (A fixed or shuffled
  // order gives a variant the same neighbours in every run: see docs/DECISIONS.md D23.)
  const std::vector<std::vector<size_t>> orders = balanced_orders(fns.size());
  for (int i = 0; i < iters; ++i) {
    for (const size_t f : round_order(orders, static_cast<size_t>(i))) {
      ctx.align_ranks();
      // The run's enqueueing hidden behind a device delay: the time is the device's alone.
      if (hide_cycles > 0) ctx.backend().spin(hide_cycles, ctx.stream());
      start->record(ctx.stream());
      const auto called = std::chrono::steady_clock::now();
      fns[f]();
      host[f].push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - called)
              .count());
      stop->record(ctx.stream());
      stop->synchronize();
      times[f].push_back(stop->elapsed_ms(*start));
      if (timed) timed(f);
      if (pace > 0)
        pause_host(std::chrono::duration<double, std::milli>(pace * times[f].back()), pause);
    }
  }
  std::vector<double> medians;
  for (auto& t : times)
    medians.push_back(median_of(t));
  if (host_ms != nullptr) {
    host_ms->clear();
    for (auto& t : host)
      host_ms->push_back(median_of(t));
  }
  return medians;
}

double median_of(std::vector<double>& values) {
  ASYNCTP_CHECK(!values.empty(), "median_of: no values");
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> dims;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t x = text.find('x', start);
    const std::string part =
        text.substr(start, x == std::string::npos ? std::string::npos : x - start);
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    ASYNCTP_CHECK(ec == std::errc() && ptr == part.data() + part.size() && v > 0,
                  "shape '{}' must be MxKxN with positive integers", text);
    dims.push_back(v);
    if (x == std::string::npos) break;
    start = x + 1;
  }
  ASYNCTP_CHECK(dims.size() == 3, "shape '{}' must be MxKxN (three sizes), got {}", text,
                dims.size());
  return dims;
}

}  // namespace asynctp::tools

namespace asynctp::tools {

double measure_peer_bandwidth(OpContext& ctx, size_t bytes_per_peer, int iters) {
  const int ws = ctx.world_size();
  if (ws == 1) return 0.0;
  const int64_t n = static_cast<int64_t>(bytes_per_peer / 4);
  SymmetricMemory& sm = ctx.workspace().get(static_cast<size_t>(n) * 4, ctx.stream());
  OwnedTensor dst = alloc(ctx, {ws, n}, DType::kF32);
  ctx.backend().fill(sm.buffer(ctx.rank(), {n}, DType::kF32), 1.0f, ctx.stream());
  sm.barrier(0, ctx.stream());
  // Every rank starts each run together (device barrier): unaligned, a rank's pulls overlap a
  // varying share of its peers' (see docs/DECISIONS.md D23).
  const double ms = median_ms_interleaved(
      ctx, {[&] {
        for (int i = 1; i < ws; ++i) {
          const int peer = (ctx.rank() + i) % ws;
          ctx.backend().copy(dst->select(0, peer), sm.buffer(peer, {n}, DType::kF32), ctx.stream());
        }
      }},
      3, iters)[0];
  sm.barrier(0, ctx.stream());
  const double slowest = max_over_ranks(ctx.group(), ms);
  return static_cast<double>(n) * 4 * (ws - 1) / (slowest * 1e-3) / 1e9;
}

}  // namespace asynctp::tools
