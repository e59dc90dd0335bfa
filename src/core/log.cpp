#include "core/log.h"

#include <cstdlib>
#include <memory>
#include <string>

#include <spdlog/sinks/stdout_sinks.h>

namespace asynctp {

namespace {
std::shared_ptr<spdlog::logger> make_logger() {
  auto logger = std::make_shared<spdlog::logger>("asynctp",
                                                 std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_pattern("asynctp %L: %v");
  auto level = spdlog::level::warn;
  if (const char* env = std::getenv("ASYNCTP_LOG_LEVEL"); env != nullptr && *env != '\0') {
    level = spdlog::level::from_str(env);
  }
  logger->set_level(level);
  return logger;
}
}  // namespace

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = make_logger();
  return *instance;
}

void set_log_rank(int rank) {
  logger().set_pattern(fmt::format("asynctp %L [rank {}]: %v", rank));
}

}  // namespace asynctp
