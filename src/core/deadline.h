// Deadline: the one way the library bounds a wait. Every blocking call takes one (or a timeout
// that becomes one) and fails with a TimeoutError naming what it waited for once it passes.
#pragma once

#include <chrono>
#include <cstdlib>
#include <string>

#include <asynctp/errors.h>

namespace asynctp {

using Clock = std::chrono::steady_clock;

// The longest timeout in seconds (about 116 days): a deadline beyond it would overflow the
// clock's milliseconds, and it means no practical limit. ASYNCTP_TIMEOUT caps at it, --timeout
// and launch() refuse more.
inline constexpr double kMaxTimeoutSeconds = 1e7;

class Deadline {
 public:
  explicit Deadline(Millis timeout) : timeout_(timeout), end_(Clock::now() + timeout) {}
  bool expired() const { return Clock::now() >= end_; }
  // Milliseconds left, clamped to [0, INT_MAX] for poll().
  int remaining_ms() const {
    const auto left = std::chrono::duration_cast<Millis>(end_ - Clock::now()).count();
    return left <= 0 ? 0 : (left > 0x7FFFFFFF ? 0x7FFFFFFF : static_cast<int>(left));
  }
  Millis timeout() const { return timeout_; }
  // "2.5 s": the budget, for error messages.
  std::string describe() const;

 private:
  Millis timeout_;
  Clock::time_point end_;
};

// How the host passes a pause between timed GPU runs (the benchmark's and the dispatcher's
// pacing). kSpin keeps the thread on its core, as a training loop's host (and PyTorch's anchor
// script, which syncs on an event in a spin loop) is; kSleep lets the core idle, and a core that
// wakes from idle enqueues the next run's work more slowly (see docs/DECISIONS.md D23).
enum class HostPause { kSpin, kSleep };
void pause_host(std::chrono::duration<double, std::micro> length, HostPause how);

}  // namespace asynctp
