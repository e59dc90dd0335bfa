#include "core/deadline.h"

#include <fmt/format.h>

#include "core/error.h"

namespace asynctp {

std::string Deadline::describe() const {
  return fmt::format("{:g} s", static_cast<double>(timeout_.count()) / 1000.0);
}

Millis default_timeout() {
  if (const char* env = std::getenv("ASYNCTP_TIMEOUT"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const double seconds = std::strtod(env, &end);
    ASYNCTP_CHECK(end != env && *end == '\0' && seconds > 0,
                  "ASYNCTP_TIMEOUT must be a positive number of seconds, got '{}'", env);
    return Millis(static_cast<int64_t>(seconds * 1000.0));
  }
  return Millis(300'000);
}

}  // namespace asynctp
