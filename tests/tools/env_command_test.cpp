// `asynctp env`: the registry's table as the binary prints it (text, --json, --markdown), bad and
// unknown variables reported rather than fatal, README.md's table equal to `--markdown`, and no
// ASYNCTP_* variable read or set in the sources or scripts outside the registry.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/env.h"
#include "run_command.h"

#ifndef ASYNCTP_BIN
#error "ASYNCTP_BIN (the path of the asynctp binary) must be defined by the build"
#endif
#ifndef ASYNCTP_SOURCE_DIR
#error "ASYNCTP_SOURCE_DIR (the root of the source tree) must be defined by the build"
#endif

namespace asynctp {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using testing::Finished;
using ::testing::HasSubstr;
using ::testing::Not;

// Runs `asynctp env ARGS` with every registered variable unset except those in `set`.
Finished env_command(const std::vector<std::string>& args,
                     const std::map<std::string, std::string>& set = {}) {
  std::map<std::string, std::string> env;
  for (const EnvVar* var : envvars::kAll)
    env[std::string(var->name)] = testing::kUnset;
  for (char** entry = environ; *entry != nullptr; ++entry) {  // unknown ones, inherited
    const std::string_view assignment(*entry);
    const std::string_view name = assignment.substr(0, assignment.find('='));
    if (name.starts_with("ASYNCTP_")) env[std::string(name)] = testing::kUnset;
  }
  for (const auto& [name, value] : set)
    env[name] = value;
  std::vector<std::string> argv{ASYNCTP_BIN, "env"};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::run_command(argv, env);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(EnvCommand, Help) {
  const Finished help = env_command({"--help"});
  ASSERT_TRUE(help.exited && help.exit_code == 0) << help.describe();
  EXPECT_THAT(help.out, AllOf(HasSubstr("--json"), HasSubstr("--markdown"),
                              HasSubstr("ASYNCTP_* environment variables")));
}

TEST(EnvCommand, TextListsEveryVariable) {
  const Finished f = env_command({}, {{"ASYNCTP_PATH", "Native"}});
  ASSERT_TRUE(f.exited && f.exit_code == 0) << f.describe();
  for (const EnvVar* var : envvars::kAll) {
    EXPECT_THAT(f.out, HasSubstr(std::string(var->doc))) << var->name;
    EXPECT_THAT(f.out, HasSubstr(fmt::format("default: {}; allowed: {}", var->default_value,
                                             var->allowed())))
        << var->name;
  }
  EXPECT_THAT(f.out, AllOf(HasSubstr("ASYNCTP_PATH=Native\n"), HasSubstr("ASYNCTP_TIMEOUT unset")));
}

// The listing lands in logs: the store secret shows as its length only.
TEST(EnvCommand, TheStoreSecretIsHidden) {
  const std::string secret = "0123456789abcdef0123456789abcdef";
  for (const auto& args : {std::vector<std::string>{}, std::vector<std::string>{"--json"}}) {
    const Finished f = env_command(args, {{"ASYNCTP_STORE_SECRET", secret}});
    ASSERT_TRUE(f.exited && f.exit_code == 0) << f.describe();
    EXPECT_THAT(f.out, Not(HasSubstr(secret)));
    EXPECT_THAT(f.out, HasSubstr("(hidden, 32 characters)"));
  }
}

TEST(EnvCommand, JsonHasEveryVariableAndItsValue) {
  const Finished f = env_command({"--json"}, {{"ASYNCTP_GEMM_STREAMS", "2"}});
  ASSERT_TRUE(f.exited && f.exit_code == 0) << f.describe();
  const auto out = nlohmann::json::parse(f.out);
  EXPECT_TRUE(out.at("all_valid").get<bool>());
  EXPECT_TRUE(out.at("unknown").empty());
  const auto& vars = out.at("variables");
  ASSERT_EQ(vars.size(), std::size(envvars::kAll));
  for (size_t i = 0; i < vars.size(); ++i) {
    const EnvVar& var = *envvars::kAll[i];
    EXPECT_EQ(vars[i].at("name"), var.name);
    EXPECT_EQ(vars[i].at("default"), var.default_value);
    EXPECT_EQ(vars[i].at("allowed"), var.allowed());
    EXPECT_EQ(vars[i].at("doc"), var.doc);
    EXPECT_EQ(vars[i].at("scope"), var.scope == EnvVar::Scope::kTests ? "tests" : "library");
    EXPECT_TRUE(vars[i].at("error").is_null()) << var.name;
    if (var.name == "ASYNCTP_GEMM_STREAMS") {
      EXPECT_EQ(vars[i].at("value"), "2");
    } else {
      EXPECT_TRUE(vars[i].at("value").is_null()) << var.name;
    }
  }
}

// Bad values and a misspelt name: all reported, every variable still listed, exit status 1.
TEST(EnvCommand, BadAndUnknownVariablesAreReportedNotFatal) {
  const std::map<std::string, std::string> bad{{"ASYNCTP_MAX_WORKSPACE_MB", "inf"},
                                               {"ASYNCTP_LOG_LEVEL", "debg"},
                                               {"ASYNCTP_PUSH_STREAMS", "9"},
                                               {"ASYNCTP_TIMEOTU", "5"}};
  const Finished json = env_command({"--json"}, bad);
  ASSERT_TRUE(json.exited && json.exit_code == 1) << json.describe();
  const auto out = nlohmann::json::parse(json.out);
  EXPECT_FALSE(out.at("all_valid").get<bool>());
  EXPECT_EQ(out.at("unknown"), nlohmann::json::array({"ASYNCTP_TIMEOTU"}));
  std::map<std::string, std::string> errors;
  for (const auto& v : out.at("variables")) {
    if (!v.at("error").is_null()) errors[v.at("name")] = v.at("error");
  }
  ASSERT_EQ(errors.size(), 3u) << json.out;
  EXPECT_THAT(errors["ASYNCTP_MAX_WORKSPACE_MB"],
              HasSubstr("ASYNCTP_MAX_WORKSPACE_MB='inf' is not a finite number; allowed: a "
                        "number from 0 to 17592186044415, in MiB"));
  EXPECT_THAT(errors["ASYNCTP_LOG_LEVEL"], HasSubstr("'debg' is not one of the choices"));
  EXPECT_THAT(errors["ASYNCTP_PUSH_STREAMS"], HasSubstr("'9' is out of range"));

  const Finished text = env_command({}, bad);
  ASSERT_TRUE(text.exited && text.exit_code == 1) << text.describe();
  EXPECT_THAT(text.out,
              AllOf(HasSubstr("ASYNCTP_MAX_WORKSPACE_MB=inf\n  INVALID: "),
                    HasSubstr("ASYNCTP_TIMEOTU=5\n  UNKNOWN: asynctp has no variable of this "
                              "name"),
                    HasSubstr("ASYNCTP_SKIP_ASAN unset")));  // the last one is still listed
}

// README.md's table is the registry's: regenerate it with `asynctp env --markdown`.
TEST(EnvCommand, ReadmeTableIsTheRegistrys) {
  const Finished f = env_command({"--markdown"}, {{"ASYNCTP_PATH", "bogus"}});
  ASSERT_TRUE(f.exited && f.exit_code == 0) << f.describe();
  EXPECT_THAT(f.out, HasSubstr("| `ASYNCTP_TIMEOUT` | 300 |"));
  const std::string readme = read_file(fs::path(ASYNCTP_SOURCE_DIR) / "README.md");
  const std::string begin = "<!-- begin: asynctp env --markdown -->\n";
  const std::string end = "<!-- end: asynctp env --markdown -->";
  const size_t b = readme.find(begin);
  const size_t e = readme.find(end);
  ASSERT_NE(b, std::string::npos) << "README.md has no line " << begin;
  ASSERT_NE(e, std::string::npos) << "README.md has no line " << end;
  ASSERT_LT(b, e);
  EXPECT_EQ(readme.substr(b + begin.size(), e - b - begin.size()), f.out)
      << "README.md's table of variables differs from `asynctp env --markdown`: paste its output "
         "between the two markers";
}

// Every ASYNCTP_* variable the library reads goes through the registry: no getenv of one in
// src/; every one that src/ sets, and every one scripts/ and python/ read or set, is registered.
TEST(EnvCommand, EveryVariableInTheSourcesIsRegistered) {
  const fs::path root(ASYNCTP_SOURCE_DIR);
  const std::regex getenv_re(R"re(getenv\s*\(\s*"(ASYNCTP_\w+))re");
  const std::regex setenv_re(R"re(setenv\s*\(\s*"(ASYNCTP_\w+))re");
  const std::regex shell_re(R"re(\$\{?(ASYNCTP_\w+)|\b(ASYNCTP_\w+)=)re");
  const std::regex python_re(R"re((?:environ(?:\.get)?|getenv)\s*[\[(]\s*["'](ASYNCTP_\w+))re");
  std::vector<std::string> unregistered;
  std::vector<std::string> direct_reads;
  std::set<std::string> seen;
  const auto check = [&](const fs::path& path, const std::regex& re, bool is_read_in_src) {
    const std::string text = read_file(path);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
         ++it) {
      const std::string name = (*it)[1].matched ? (*it)[1].str() : (*it)[2].str();
      seen.insert(name);
      const std::string where = fmt::format("{} in {}", name, fs::relative(path, root).string());
      if (is_read_in_src) direct_reads.push_back(where);
      if (envvars::find(name) == nullptr) unregistered.push_back(where);
    }
  };
  size_t files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root / "src")) {
    const std::string ext = entry.path().extension().string();
    if (!entry.is_regular_file() || (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh"))
      continue;
    ++files;
    check(entry.path(), getenv_re, true);
    check(entry.path(), setenv_re, false);
  }
  for (const auto& entry : fs::recursive_directory_iterator(root / "scripts")) {
    if (!entry.is_regular_file() || entry.path().extension() != ".sh") continue;
    ++files;
    check(entry.path(), shell_re, false);
  }
  // The Python package cannot call the registry's accessors, but documents its variables there.
  if (fs::exists(root / "python")) {
    for (const auto& entry : fs::recursive_directory_iterator(root / "python")) {
      if (!entry.is_regular_file() || entry.path().extension() != ".py") continue;
      ++files;
      check(entry.path(), python_re, false);
    }
  }
  EXPECT_GT(files, 50u) << "the source tree was not found at " << root;
  EXPECT_TRUE(seen.count("ASYNCTP_RUN_ID")) << "the launcher's setenv was not seen";
  EXPECT_TRUE(seen.count("ASYNCTP_SHARED_GPUS")) << "scripts/gpu-check.sh was not seen";
  EXPECT_THAT(direct_reads, ::testing::IsEmpty()) << "read these through core/env.h";
  EXPECT_THAT(unregistered, ::testing::IsEmpty()) << "register these in core/env.h";
}

}  // namespace
}  // namespace asynctp
