// What bench and demo share: joining the job, device tensors filled with seeded random values,
// timing with events, comparing results, and agreeing on numbers across ranks.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/deadline.h"
#include "ops/context.h"
#include "ops/warm_up.h"  // max_over_ranks

namespace asynctp::tools {

struct Session {
  std::shared_ptr<Group> group;
  std::unique_ptr<OpContext> ctx;

  // Joins the job described by the environment (a single rank when run outside a launcher).
  // backend "auto" picks cuda when this build has it and a GPU is present, else cpu.
  static Session join(const std::string& backend);
  int rank() const { return group->rank(); }
  int world_size() const { return group->world_size(); }
};

// "auto" -> "cuda" or "cpu".
std::string resolve_backend(const std::string& backend);

// A device tensor of the context's backend.
OwnedTensor alloc(OpContext& ctx, Dims shape, DType dtype);
// Fills t with values uniform in [-scale, scale), determined by (seed, t's shape) alone.
void fill_random(OpContext& ctx, const Tensor& t, uint64_t seed, float scale = 1.0f);
// A host copy of t as f32 values (waits for the backend).
std::vector<float> to_host_f32(OpContext& ctx, const Tensor& t);
// ||a - b|| / ||b|| over f32 values (0 when both are zero; inf if a holds NaN).
double relative_error(const std::vector<float>& a, const std::vector<float>& b);

// The median of `values` (sorting them; the upper one of an even count). Throws when empty.
double median_of(std::vector<double>& values);
// Medians of several variants timed round-robin (every round runs every variant once, in the
// order round_order(balanced_orders(n), i), the same on every rank, each timed on its own): slow
// drifts of the GPU's clocks (power, heat) hit every variant alike, and within whole blocks of
// rounds (iters a multiple of the rows: n for even n, 2n for odd) every variant follows every
// other one about equally often (what ran just before leaves its data in L2 and sets the
// clocks). Before each timed run the ranks are aligned on the device (OpContext::align_ranks),
// so that a variant with communication does not pay for how far apart the ranks finished the
// previous one; then, with hide_cycles > 0, the stream spins that many device cycles
// (Backend::spin) while the host enqueues the run, so that its time is the device's alone.
// host_ms (optional): the median host time each variant's call took to return (its enqueueing,
// on an asynchronous backend).
// warmup_ms: after the `warmup` rounds, more rounds until that much time has passed (the same
// number on every rank). pace: after each timed run the host pauses pace x that run's time, so
// the GPU works at most 1/(1+pace) of the time: back to back (pace 0) a GPU reaches its power
// cap within a few hundred ms and lowers its SM clock, while short bursts from idle (as PyTorch's
// anchor script times) keep it up (see docs/DECISIONS.md D23). pause: how the host idles
// (core/deadline.h). timed(f), if given, is called after each timed run of variant f has
// completed (before any pause): the place to read events the variant recorded inside that run.
std::vector<double> median_ms_interleaved(OpContext& ctx,
                                          const std::vector<std::function<void()>>& fns, int warmup,
                                          int iters, std::vector<double>* host_ms = nullptr,
                                          double warmup_ms = 0, double pace = 0,
                                          HostPause pause = HostPause::kSpin,
                                          int64_t hide_cycles = 0,
                                          const std::function<void(size_t)>& timed = {});

// "MxKxN" -> {M, K, N}; throws naming the text.
std::vector<int64_t> parse_shape(const std::string& text);

}  // namespace asynctp::tools

namespace asynctp::tools {
// Peer ingress bandwidth in GB/s: every rank pulls `bytes_per_peer` from each peer's symmetric
// buffer at once (rank r starting at r+1, as the fused ops do); the slowest rank's rate.
double measure_peer_bandwidth(OpContext& ctx, size_t bytes_per_peer, int iters);
}  // namespace asynctp::tools
