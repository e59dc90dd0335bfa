#include "core/error.h"

#include <cstring>

namespace asynctp::detail {

std::string_view short_path(const char* file) {
  std::string_view path(file);
  // Report paths relative to the source tree: ".../src/ops/x.cpp" -> "src/ops/x.cpp".
  for (std::string_view root : {"/src/", "/tests/", "/tools/"}) {
    if (auto pos = path.rfind(root); pos != std::string_view::npos) return path.substr(pos + 1);
  }
  return path;
}

void throw_check_failure(const char* file, int line, const char* expr, const std::string& message) {
  if (expr == nullptr) {
    throw Error(fmt::format("{} ({}:{})", message, short_path(file), line));
  }
  throw Error(fmt::format("{} ({}:{}: check failed: {})", message, short_path(file), line, expr));
}

void throw_timeout(const char* file, int line, const std::string& message) {
  throw TimeoutError(fmt::format("{} ({}:{})", message, short_path(file), line));
}

void throw_capture(const char* file, int line, const std::string& message) {
  throw CaptureError(fmt::format("{} ({}:{})", message, short_path(file), line));
}

void throw_path_unavailable(const char* file, int line, const std::string& message) {
  throw PathUnavailableError(fmt::format("{} ({}:{})", message, short_path(file), line));
}

}  // namespace asynctp::detail
