#include "core/deadline.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "core/env.h"
#include "core/error.h"

namespace asynctp {

std::string Deadline::describe() const {
  return fmt::format("{:g} s", static_cast<double>(timeout_.count()) / 1000.0);
}

Millis default_timeout() {
  const double seconds = envvars::kTimeout.number();
  // "inf" (or anything huge) means no practical limit: cap it so that a Deadline's end time
  // cannot overflow the clock. A tiny positive value still gets 1 ms, not an expired deadline.
  return Millis(std::max<int64_t>(1, std::llround(std::min(seconds, kMaxTimeoutSeconds) * 1000.0)));
}

void pause_host(std::chrono::duration<double, std::micro> length, HostPause how) {
  if (length.count() <= 0) return;
  if (how == HostPause::kSleep) {
    std::this_thread::sleep_for(length);
    return;
  }
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(length);
  while (Clock::now() < until) {
  }
}

}  // namespace asynctp
