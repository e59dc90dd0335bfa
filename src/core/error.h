// The checks that throw the public errors (asynctp/errors.h): every failed precondition throws
// asynctp::Error with the file, line, failed expression and a message that names the offending
// argument and value. Messages survive release builds. Also the fmt formatters of the public
// value types that messages name (DType, Dims).
#pragma once

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <asynctp/dims.h>
#include <asynctp/dtype.h>
#include <asynctp/errors.h>

namespace asynctp::detail {
[[noreturn]] void throw_check_failure(const char* file, int line, const char* expr,
                                      const std::string& message);
[[noreturn]] void throw_timeout(const char* file, int line, const std::string& message);
[[noreturn]] void throw_capture(const char* file, int line, const std::string& message);
[[noreturn]] void throw_path_unavailable(const char* file, int line, const std::string& message);
std::string_view short_path(const char* file);
}  // namespace asynctp::detail

template <>
struct fmt::formatter<asynctp::DType> : fmt::formatter<std::string_view> {
  auto format(asynctp::DType d, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(asynctp::dtype_name(d), ctx);
  }
};

template <>
struct fmt::formatter<asynctp::Dims> : fmt::formatter<std::string> {
  auto format(const asynctp::Dims& d, format_context& ctx) const {
    return fmt::formatter<std::string>::format(d.to_string(), ctx);
  }
};

// ASYNCTP_CHECK(cond, "format {}", args...): throws asynctp::Error when cond is false.
#define ASYNCTP_CHECK(cond, ...)                                          \
  do {                                                                    \
    if (!(cond)) [[unlikely]] {                                           \
      ::asynctp::detail::throw_check_failure(__FILE__, __LINE__, #cond,   \
                                             ::fmt::format(__VA_ARGS__)); \
    }                                                                     \
  } while (0)

// ASYNCTP_FAIL("format {}", args...): unconditional failure with the same context.
#define ASYNCTP_FAIL(...) \
  ::asynctp::detail::throw_check_failure(__FILE__, __LINE__, nullptr, ::fmt::format(__VA_ARGS__))

// ASYNCTP_TIMEOUT("format {}", args...): throws asynctp::TimeoutError.
#define ASYNCTP_TIMEOUT(...) \
  ::asynctp::detail::throw_timeout(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))

// ASYNCTP_CAPTURE_CHECK(cond, "format {}", args...): throws asynctp::CaptureError when cond is
// false (cond: the buffer need not grow, or the stream is not capturing).
#define ASYNCTP_CAPTURE_CHECK(cond, ...)                                                \
  do {                                                                                  \
    if (!(cond)) [[unlikely]] {                                                         \
      ::asynctp::detail::throw_capture(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
    }                                                                                   \
  } while (0)

// ASYNCTP_PATH_CHECK(cond, "format {}", args...): throws asynctp::PathUnavailableError when cond
// is false (cond: the path the caller asked for can run the call).
#define ASYNCTP_PATH_CHECK(cond, ...)                                                            \
  do {                                                                                           \
    if (!(cond)) [[unlikely]] {                                                                  \
      ::asynctp::detail::throw_path_unavailable(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
    }                                                                                            \
  } while (0)

// ASYNCTP_SYSCHECK(expr, "context"): for POSIX calls returning -1 on failure; adds errno text.
#define ASYNCTP_SYSCHECK(expr, ...)                                                          \
  do {                                                                                       \
    if ((expr) == -1) [[unlikely]] {                                                         \
      int saved_errno_ = errno;                                                              \
      ::asynctp::detail::throw_check_failure(                                                \
          __FILE__, __LINE__, #expr,                                                         \
          ::fmt::format("{}: {}", ::fmt::format(__VA_ARGS__), std::strerror(saved_errno_))); \
    }                                                                                        \
  } while (0)
