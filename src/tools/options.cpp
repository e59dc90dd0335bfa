#include "tools/options.h"

#include <functional>
#include <limits>

#include "core/error.h"

namespace asynctp::tools {

namespace {

// The registry's message, as CLI11 reports a bad option (exit code and "Run with --help").
template <typename Parse>
auto parse_or_validation_error(Parse&& parse) {
  try {
    return parse();
  } catch (const Error& e) {
    // e.what() ends with where the registry threw: the user needs the first part.
    std::string message = e.what();
    if (const size_t at = message.rfind(" (src/core/env.cpp:"); at != std::string::npos)
      message.resize(at);
    throw CLI::ValidationError(message);
  }
}

CLI::Option* add_parsed(CLI::App* cmd, const std::string& flags, const EnvVar& spec,
                        std::function<void(const std::string&)> store,
                        const std::string& description, const std::string& type_name) {
  ASYNCTP_CHECK(flags.find(spec.name) != std::string::npos,
                "option spec {} does not name any of the flags '{}'", spec.name, flags);
  CLI::Option* option = cmd->add_option(
      flags,
      [store = std::move(store)](const CLI::results_t& results) {
        for (const std::string& text : results)
          store(text);
        return true;
      },
      description);
  option->type_name(type_name)->type_size(1)->expected(1);
  return option;
}

template <typename Int>
CLI::Option* add_integer(CLI::App* cmd, const std::string& flags, const EnvVar& spec, Int* target,
                         const std::string& description) {
  static_assert(sizeof(Int) <= sizeof(int64_t));
  ASYNCTP_CHECK(spec.min >= static_cast<double>(std::numeric_limits<Int>::min()) &&
                    spec.max <= static_cast<double>(std::numeric_limits<Int>::max()),
                "option {}: its range does not fit its target", spec.name);
  return add_parsed(
      cmd, flags, spec,
      [&spec, target](const std::string& text) {
        *target =
            static_cast<Int>(parse_or_validation_error([&] { return parse_integer(spec, text); }));
      },
      description, "INT");
}

}  // namespace

CLI::Option* add_integer_option(CLI::App* cmd, const std::string& flags, const EnvVar& spec,
                                int* target, const std::string& description) {
  return add_integer(cmd, flags, spec, target, description);
}

CLI::Option* add_integer_option(CLI::App* cmd, const std::string& flags, const EnvVar& spec,
                                int64_t* target, const std::string& description) {
  return add_integer(cmd, flags, spec, target, description);
}

CLI::Option* add_integer_option(CLI::App* cmd, const std::string& flags, const EnvVar& spec,
                                uint64_t* target, const std::string& description) {
  return add_integer(cmd, flags, spec, target, description);
}

CLI::Option* add_integer_option(CLI::App* cmd, const std::string& flags, const EnvVar& spec,
                                std::optional<size_t>* target, const std::string& description) {
  ASYNCTP_CHECK(spec.min >= 0, "option {}: its range does not fit its target", spec.name);
  return add_parsed(
      cmd, flags, spec,
      [&spec, target](const std::string& text) {
        *target = static_cast<size_t>(
            parse_or_validation_error([&] { return parse_integer(spec, text); }));
      },
      description, "INT");
}

CLI::Option* add_number_option(CLI::App* cmd, const std::string& flags, const EnvVar& spec,
                               double* target, const std::string& description) {
  return add_parsed(
      cmd, flags, spec,
      [&spec, target](const std::string& text) {
        *target = parse_or_validation_error([&] { return parse_number(spec, text); });
      },
      description, "FLOAT");
}

CLI::Option* add_numbers_option(CLI::App* cmd, const std::string& flags, const EnvVar& spec,
                                std::vector<double>* target, const std::string& description) {
  CLI::Option* option = add_parsed(
      cmd, flags, spec,
      [&spec, target](const std::string& text) {
        target->push_back(parse_or_validation_error([&] { return parse_number(spec, text); }));
      },
      description, "FLOAT");
  option->expected(1, -1)->allow_extra_args(true);
  return option;
}

}  // namespace asynctp::tools
