#include "core/log.h"

#include <algorithm>
#include <iterator>
#include <memory>
#include <optional>
#include <string>

#include <spdlog/sinks/stdout_sinks.h>

#include "core/env.h"
#include "core/error.h"

namespace asynctp {

namespace {

// ASYNCTP_LOG_LEVEL's choices are listed in the order of spdlog's levels.
static_assert(envvars::kLogLevelChoices[spdlog::level::trace] == "trace" &&
              envvars::kLogLevelChoices[spdlog::level::warn] == "warn" &&
              envvars::kLogLevelChoices[spdlog::level::err] == "error" &&
              envvars::kLogLevelChoices[spdlog::level::off] == "off" &&
              std::size(envvars::kLogLevelChoices) == spdlog::level::n_levels);

spdlog::level::level_enum level_named(std::string_view name) {
  const auto* const first = std::begin(envvars::kLogLevelChoices);
  const auto* const it = std::find(first, std::end(envvars::kLogLevelChoices), name);
  ASYNCTP_CHECK(it != std::end(envvars::kLogLevelChoices), "no log level is named '{}'", name);
  return static_cast<spdlog::level::level_enum>(it - first);
}

std::shared_ptr<spdlog::logger> make_logger() {
  auto logger = std::make_shared<spdlog::logger>("asynctp",
                                                 std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_pattern("asynctp %L: %v");
  // An invalid level must neither turn logging off nor throw from every later log call: the
  // logger starts at warn and says why.
  const std::optional<std::string> problem = envvars::kLogLevel.problem();
  logger->set_level(problem ? spdlog::level::warn : level_named(envvars::kLogLevel.choice()));
  if (problem) logger->warn("{}; logging at warn", *problem);
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
