// `asynctp env`: every ASYNCTP_* variable of the registry (src/core/env.h) with its current value,
// default, allowed values and doc, then any ASYNCTP_* variable that is set but unknown. A bad
// value or an unknown name is reported (and makes the exit status 1), never a crash.
// `--markdown` prints README.md's table.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/env.h"
#include "tools/commands.h"

namespace asynctp::tools {
namespace {

struct EnvCommandOptions {
  bool json = false;
  bool markdown = false;
};

// ASYNCTP_* variables set in this process that the registry does not know: a misspelt name is
// otherwise ignored without a word.
std::vector<std::string> unknown_variables() {
  std::vector<std::string> names;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view assignment(*entry);
    const std::string_view name = assignment.substr(0, assignment.find('='));
    if (name.starts_with("ASYNCTP_") && envvars::find(name) == nullptr) names.emplace_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool for_tests_only(const EnvVar& var) {
  return var.scope == EnvVar::Scope::kTests;
}

// A table cell: '|' would end the cell early.
std::string cell(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

void print_markdown() {
  std::printf("| Variable | Default | Allowed | Meaning |\n");
  std::printf("|---|---|---|---|\n");
  for (const EnvVar* var : envvars::kAll) {
    const std::string meaning = for_tests_only(*var)
                                    ? fmt::format("Tests and scripts only. {}", var->doc)
                                    : std::string(var->doc);
    std::printf("%s\n", fmt::format("| `{}` | {} | {} | {} |", var->name, cell(var->default_value),
                                    cell(var->allowed()), cell(meaning))
                            .c_str());
  }
}

// The value to show: the store secret only by its length, since this listing lands in logs.
std::optional<std::string> shown_value(const EnvVar& var) {
  std::optional<std::string> value = var.raw();
  if (value && &var == &envvars::kStoreSecret) {
    value = fmt::format("(hidden, {} characters)", value->size());
  }
  return value;
}

// Returns whether every set variable is valid.
bool print_json() {
  nlohmann::ordered_json vars = nlohmann::ordered_json::array();
  bool all_valid = true;
  for (const EnvVar* var : envvars::kAll) {
    const std::optional<std::string> value = shown_value(*var);
    const std::optional<std::string> problem = var->problem();
    all_valid = all_valid && !problem;
    vars.push_back({
        {"name", var->name},
        {"value", value ? nlohmann::ordered_json(*value) : nlohmann::ordered_json(nullptr)},
        {"default", var->default_value},
        {"allowed", var->allowed()},
        {"doc", var->doc},
        {"scope", for_tests_only(*var) ? "tests" : "library"},
        {"error", problem ? nlohmann::ordered_json(*problem) : nlohmann::ordered_json(nullptr)},
    });
  }
  const std::vector<std::string> unknown = unknown_variables();
  all_valid = all_valid && unknown.empty();
  const nlohmann::ordered_json out = {
      {"variables", vars}, {"unknown", unknown}, {"all_valid", all_valid}};
  std::printf("%s\n", out.dump(2).c_str());
  return all_valid;
}

bool print_text() {
  bool all_valid = true;
  for (const EnvVar* var : envvars::kAll) {
    const std::optional<std::string> value = shown_value(*var);
    const std::optional<std::string> problem = var->problem();
    all_valid = all_valid && !problem;
    std::printf("%s\n", fmt::format("{}{}{}", var->name, value ? "=" + *value : " unset",
                                    for_tests_only(*var) ? "  (tests and scripts only)" : "")
                            .c_str());
    if (problem) std::printf("  INVALID: %s\n", problem->c_str());
    std::printf("  %s\n", std::string(var->doc).c_str());
    std::printf(
        "%s\n",
        fmt::format("  default: {}; allowed: {}", var->default_value, var->allowed()).c_str());
  }
  for (const std::string& name : unknown_variables()) {
    std::printf("%s=%s\n  UNKNOWN: asynctp has no variable of this name\n", name.c_str(),
                std::getenv(name.c_str()));
    all_valid = false;
  }
  return all_valid;
}

}  // namespace

Command add_env_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "env",
      "List the ASYNCTP_* environment variables: current value (or unset), default, allowed "
      "values and what each does. Exits 1, after listing all, when a set value is invalid or an "
      "ASYNCTP_* variable that asynctp does not know is set.");
  auto o = std::make_shared<EnvCommandOptions>();
  auto* json = cmd->add_flag("--json", o->json, "print the list as JSON");
  cmd->add_flag("--markdown", o->markdown, "print the table of README.md (no current values)")
      ->excludes(json);
  cmd->footer("Example: ASYNCTP_PATH=native asynctp env");
  return {cmd, [o] {
            if (o->markdown) {
              print_markdown();
              return 0;
            }
            return (o->json ? print_json() : print_text()) ? 0 : 1;
          }};
}

}  // namespace asynctp::tools
