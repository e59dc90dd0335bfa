// Errors: every failed precondition throws asynctp::Error with the file, line, failed expression
// and a message that names the offending argument and value. Messages survive release builds.
#pragma once

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace asynctp {

// Base of every error the library throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A wait (store, signal, barrier, rank startup) that ran past its deadline. The message names the
// rank that waited and, where there is one, the peer and channel it waited on. After one from a
// device wait (signal, barrier, chunk flag) the ranks' signal pads and chunk flags no longer
// agree — a late peer may still raise one — so the op's group cannot be trusted for further
// collective work: drop its Context (and Group) and start anew.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A buffer (a symmetric workspace, the chunk flags, a scratch buffer) that an op would have to
// grow while its stream is being captured into a CUDA graph, where nothing may allocate or
// rendezvous. The message names the buffer and the bytes it needs. Nothing was enqueued; run the
// op once, or reserve for it (reserve_all_gather_matmul, reserve_matmul_reduce_scatter), before
// capturing it.
class CaptureError : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] void throw_check_failure(const char* file, int line, const char* expr,
                                      const std::string& message);
[[noreturn]] void throw_timeout(const char* file, int line, const std::string& message);
[[noreturn]] void throw_capture(const char* file, int line, const std::string& message);
std::string_view short_path(const char* file);
}  // namespace detail

}  // namespace asynctp

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
