// Logging through spdlog. Every line carries the rank once a rank is known, so the lines of
// several processes can be told apart. Level from ASYNCTP_LOG_LEVEL (trace, debug, info, warn,
// error, critical, off, in any case; default warn). Any other value is an error where a program
// starts (envvars::check_all); the logger itself, which must never throw, then logs at warn and
// says why.
#pragma once

#include <spdlog/spdlog.h>

namespace asynctp {

// The library's logger (created on first use, writes to stderr).
spdlog::logger& logger();

// Tags every later log line with "[rank R]".
void set_log_rank(int rank);

}  // namespace asynctp

#define ASYNCTP_LOG_DEBUG(...) ::asynctp::logger().debug(__VA_ARGS__)
#define ASYNCTP_LOG_INFO(...) ::asynctp::logger().info(__VA_ARGS__)
#define ASYNCTP_LOG_WARN(...) ::asynctp::logger().warn(__VA_ARGS__)
#define ASYNCTP_LOG_ERROR(...) ::asynctp::logger().error(__VA_ARGS__)
