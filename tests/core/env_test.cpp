// The registry of ASYNCTP_* variables (core/env.h): each entry well formed, each kind's parser on
// good values, every kind of bad value, unset and empty, and the messages of the errors.
#include "core/env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <set>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "support/env_testing.h"

namespace asynctp {
namespace {

using asynctp::testing::ScopedSetEnv;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// Variables of each kind, with ranges of their own, under names no real code reads.
constexpr std::string_view kTestChoices[] = {"alpha", "beta"};
constexpr EnvVar kInt{.name = "ASYNCTP_TEST_INT",
                      .kind = EnvVar::Kind::kInteger,
                      .default_value = "3",
                      .doc = "test",
                      .min = -2,
                      .max = 1000};
constexpr EnvVar kNum{.name = "ASYNCTP_TEST_NUM",
                      .kind = EnvVar::Kind::kNumber,
                      .default_value = "1.5",
                      .doc = "test",
                      .unit = "MiB",
                      .min = 0,
                      .max = 17592186044415.0};
constexpr EnvVar kFlag{
    .name = "ASYNCTP_TEST_FLAG", .kind = EnvVar::Kind::kFlag, .default_value = "1", .doc = "test"};
constexpr EnvVar kChoice{.name = "ASYNCTP_TEST_CHOICE",
                         .kind = EnvVar::Kind::kChoice,
                         .default_value = "beta",
                         .doc = "test",
                         .choices = kTestChoices};
constexpr EnvVar kName{.name = "ASYNCTP_TEST_NAME",
                       .kind = EnvVar::Kind::kName,
                       .default_value = "made up",
                       .doc = "test"};

TEST(EnvRegistry, EveryEntryIsWellFormed) {
  std::set<std::string_view> names;
  for (const EnvVar* var : envvars::kAll) {
    SCOPED_TRACE(std::string(var->name));
    EXPECT_TRUE(var->name.starts_with("ASYNCTP_"));
    EXPECT_TRUE(names.insert(var->name).second) << "registered twice";
    EXPECT_EQ(envvars::find(var->name), var);
    EXPECT_FALSE(var->doc.empty());
    EXPECT_EQ(var->doc.find('\n'), std::string_view::npos) << "the doc is one line";
    EXPECT_FALSE(var->default_value.empty()) << "the default (or what unset means) is shown";
    switch (var->kind) {
      case EnvVar::Kind::kInteger:
        // Integer bounds are compared as doubles: they must be exact ones.
        EXPECT_EQ(var->min, std::trunc(var->min));
        EXPECT_EQ(var->max, std::trunc(var->max));
        EXPECT_LT(std::fabs(var->min), 9007199254740992.0);
        EXPECT_LT(std::fabs(var->max), 9007199254740992.0);
        [[fallthrough]];
      case EnvVar::Kind::kNumber:
        EXPECT_LT(var->min, var->max);
        break;
      case EnvVar::Kind::kChoice:
        EXPECT_GE(var->choices.size(), 2u);
        for (std::string_view c : var->choices) {
          EXPECT_TRUE(std::none_of(c.begin(), c.end(), [](char x) { return x >= 'A' && x <= 'Z'; }))
              << "choices are canonical in lower case: " << c;
        }
        break;
      default:
        EXPECT_TRUE(var->choices.empty());
    }
  }
  EXPECT_EQ(envvars::find("ASYNCTP_NO_SUCH_VARIABLE"), nullptr);
}

// Every default is valid in the variable's own syntax: with the variable unset, its accessor
// returns it and does not throw.
TEST(EnvRegistry, DefaultsParse) {
  for (const EnvVar* var : envvars::kAll) {
    SCOPED_TRACE(std::string(var->name));
    const testing::ScopedUnsetEnv unset(std::string(var->name));
    EXPECT_EQ(var->problem(), std::nullopt);
    switch (var->kind) {
      case EnvVar::Kind::kInteger:
        EXPECT_EQ(var->integer(), std::stoll(std::string(var->default_value)));
        break;
      case EnvVar::Kind::kNumber:
        EXPECT_EQ(var->number(), std::stod(std::string(var->default_value)));
        break;
      case EnvVar::Kind::kFlag:
        EXPECT_NO_THROW(var->flag());
        break;
      case EnvVar::Kind::kChoice:
        EXPECT_EQ(var->choice(), var->default_value);
        break;
      case EnvVar::Kind::kName:
      case EnvVar::Kind::kText:
        EXPECT_EQ(var->text(), std::nullopt);
        break;
    }
  }
  const testing::ScopedUnsetEnv unset("ASYNCTP_TIMEOUT");
  EXPECT_EQ(envvars::kTimeout.number(), 300);
  EXPECT_EQ(envvars::kMaxWorkspaceMb.number(), 2048);  // checked on its own: it is in the README
}

TEST(EnvVarTest, UnsetAndEmptyMeanTheDefault) {
  {
    const testing::ScopedUnsetEnv unset("ASYNCTP_TEST_INT");
    EXPECT_EQ(kInt.raw(), std::nullopt);
    EXPECT_EQ(kInt.integer(), 3);
  }
  const ScopedSetEnv empty("ASYNCTP_TEST_INT", "");
  EXPECT_EQ(kInt.raw(), std::nullopt);
  EXPECT_EQ(kInt.integer(), 3);
  EXPECT_EQ(kInt.problem(), std::nullopt);
}

TEST(EnvVarTest, IntegerGoodValues) {
  for (const auto& [text, value] : std::vector<std::pair<const char*, int64_t>>{
           {"0", 0}, {"-2", -2}, {"1000", 1000}, {"007", 7}}) {
    const ScopedSetEnv set("ASYNCTP_TEST_INT", text);
    EXPECT_EQ(kInt.integer(), value) << text;
    EXPECT_EQ(kInt.problem(), std::nullopt) << text;
  }
}

TEST(EnvVarTest, IntegerBadValuesAreNamed) {
  const std::vector<std::pair<const char*, const char*>> bad{
      {"x", "is not an integer"},   {"2 ", "is not an integer"},
      {" 2", "is not an integer"},  {"+2", "is not an integer"},
      {"1.5", "is not an integer"}, {"0x10", "is not an integer"},
      {"4M", "is not an integer"},  {"1001", "is out of range"},
      {"-3", "is out of range"},    {"99999999999999999999999", "is out of range"},
  };
  for (const auto& [text, what] : bad) {
    const ScopedSetEnv set("ASYNCTP_TEST_INT", text);
    const std::string message =
        fmt::format("ASYNCTP_TEST_INT='{}' {}; allowed: an integer from -2 to 1000", text, what);
    EXPECT_THAT([] { kInt.integer(); }, ThrowsMessage<Error>(HasSubstr(message))) << text;
    EXPECT_EQ(kInt.problem(), message) << text;
  }
}

TEST(EnvVarTest, NumberGoodValues) {
  for (const auto& [text, value] :
       std::vector<std::pair<const char*, double>>{{"0", 0},
                                                   {"0.5", 0.5},
                                                   {"2048", 2048},
                                                   {"1e3", 1000},
                                                   {"17592186044415", 17592186044415.0}}) {
    const ScopedSetEnv set("ASYNCTP_TEST_NUM", text);
    EXPECT_EQ(kNum.number(), value) << text;
  }
}

TEST(EnvVarTest, NumberBadValuesAreNamedWithReadableBounds) {
  const std::string allowed = "allowed: a number from 0 to 17592186044415, in MiB";
  const std::vector<std::pair<const char*, const char*>> bad{
      {"inf", "is not a finite number"},  // no special word for this variable
      {"nan", "is not a finite number"},
      {"abc", "is not a number"},
      {"10s", "is not a number"},
      {"0x10", "is not a number"},
      {" 1", "is not a number"},
      {"-0.5", "is out of range"},
      {"17592186044416", "is out of range"},  // 2^44 MiB: the bytes would not fit in 64 bits
      {"1e400", "is out of range"},
  };
  for (const auto& [text, what] : bad) {
    const ScopedSetEnv set("ASYNCTP_TEST_NUM", text);
    EXPECT_THAT([] { kNum.number(); }, ThrowsMessage<Error>(HasSubstr(fmt::format(
                                           "ASYNCTP_TEST_NUM='{}' {}; {}", text, what, allowed))))
        << text;
  }
}

// A real variable: an infinite workspace limit is an error, never 0 bytes (which would quietly
// send every op to the fallback) nor a wrapped-around size.
TEST(EnvVarTest, MaxWorkspaceIsCheckedAndFitsInBytes) {
  for (const char* text : {"inf", "17592186044416", "1e300", "-1"}) {
    const ScopedSetEnv set("ASYNCTP_MAX_WORKSPACE_MB", text);
    EXPECT_THAT([] { envvars::kMaxWorkspaceMb.number(); },
                ThrowsMessage<Error>(AllOf(HasSubstr("ASYNCTP_MAX_WORKSPACE_MB"), HasSubstr(text),
                                           HasSubstr("17592186044415"))))
        << text;
  }
  const ScopedSetEnv set("ASYNCTP_MAX_WORKSPACE_MB", "17592186044415");
  const double bytes = envvars::kMaxWorkspaceMb.number() * 1024.0 * 1024.0;
  EXPECT_LT(bytes, 18446744073709551616.0);  // 2^64
}

TEST(EnvVarTest, TimeoutTakesInfAndRefusesZero) {
  for (const char* text : {"inf", "INF", "Inf"}) {
    const ScopedSetEnv set("ASYNCTP_TIMEOUT", text);
    EXPECT_TRUE(std::isinf(envvars::kTimeout.number())) << text;
  }
  {
    const ScopedSetEnv set("ASYNCTP_TIMEOUT", "0.0001");
    EXPECT_EQ(envvars::kTimeout.number(), 0.0001);
  }
  for (const char* text : {"0", "-1", "infinity", "nan", "1e400"}) {
    const ScopedSetEnv set("ASYNCTP_TIMEOUT", text);
    EXPECT_THAT([] { envvars::kTimeout.number(); },
                ThrowsMessage<Error>(HasSubstr(fmt::format("ASYNCTP_TIMEOUT='{}' is", text))))
        << text;
    EXPECT_THAT(*envvars::kTimeout.problem(),
                HasSubstr("allowed: a number > 0, or inf, in seconds"));
  }
}

TEST(EnvVarTest, Flags) {
  for (const char* text : {"1", "true", "TRUE", "Yes", "on"}) {
    const ScopedSetEnv set("ASYNCTP_TEST_FLAG", text);
    EXPECT_TRUE(kFlag.flag()) << text;
  }
  for (const char* text : {"0", "false", "False", "NO", "off"}) {
    const ScopedSetEnv set("ASYNCTP_TEST_FLAG", text);
    EXPECT_FALSE(kFlag.flag()) << text;
  }
  for (const char* text : {"2", "enable", "y", "00"}) {
    const ScopedSetEnv set("ASYNCTP_TEST_FLAG", text);
    EXPECT_THAT([] { kFlag.flag(); },
                ThrowsMessage<Error>(HasSubstr(fmt::format(
                    "ASYNCTP_TEST_FLAG='{}' is not a flag; allowed: 1, true, yes or on; 0, false, "
                    "no or off (any case)",
                    text))))
        << text;
  }
}

TEST(EnvVarTest, ChoicesInAnyCaseGiveTheCanonicalSpelling) {
  for (const char* text : {"alpha", "ALPHA", "Alpha"}) {
    const ScopedSetEnv set("ASYNCTP_TEST_CHOICE", text);
    EXPECT_EQ(kChoice.choice(), "alpha") << text;
  }
  for (const char* text : {"alph", "alpha ", "gamma"}) {
    const ScopedSetEnv set("ASYNCTP_TEST_CHOICE", text);
    EXPECT_THAT([] { kChoice.choice(); },
                ThrowsMessage<Error>(HasSubstr(fmt::format(
                    "ASYNCTP_TEST_CHOICE='{}' is not one of the choices; allowed: alpha or beta "
                    "(any case)",
                    text))))
        << text;
  }
  // The log level: DEBUG is debug, a misspelt level is an error (the logger then stays at warn).
  {
    const ScopedSetEnv set("ASYNCTP_LOG_LEVEL", "DEBUG");
    EXPECT_EQ(envvars::kLogLevel.choice(), "debug");
  }
  const ScopedSetEnv set("ASYNCTP_LOG_LEVEL", "debg");
  EXPECT_THAT(envvars::kLogLevel.problem().value_or(""),
              HasSubstr("ASYNCTP_LOG_LEVEL='debg' is not one of the choices"));
}

TEST(EnvVarTest, NamesAndText) {
  for (const char* text : {"t0123abcd", "run-7.a_b"}) {
    const ScopedSetEnv set("ASYNCTP_TEST_NAME", text);
    EXPECT_EQ(kName.text(), text);
  }
  const std::string too_long(65, 'a');
  for (const std::string& text : {std::string("a/b"), std::string("a b"), too_long}) {
    const ScopedSetEnv set("ASYNCTP_TEST_NAME", text.c_str());
    EXPECT_THAT([] { kName.text(); }, ThrowsMessage<Error>(HasSubstr("is not a name"))) << text;
  }
  const ScopedSetEnv set("ASYNCTP_HOST_ID", "rack 3/node 7");  // any text
  EXPECT_EQ(envvars::kHostId.text(), "rack 3/node 7");
}

TEST(EnvVarTest, LongValuesAreShortenedInMessages) {
  const std::string digits(400, '9');
  const ScopedSetEnv set("ASYNCTP_TEST_INT", digits.c_str());
  const std::string message = kInt.problem().value_or("");
  EXPECT_THAT(message, AllOf(HasSubstr("... (400 characters)"), HasSubstr("is out of range")));
  EXPECT_LT(message.size(), 200u);
}

TEST(EnvVarTest, AccessorOfAnotherKindIsRefused) {
  EXPECT_THAT([] { envvars::kTimeout.integer(); },
              ThrowsMessage<Error>(HasSubstr("ASYNCTP_TIMEOUT cannot be read with "
                                             "EnvVar::integer()")));
  EXPECT_THAT([] { envvars::kPath.flag(); }, ThrowsMessage<Error>(HasSubstr("ASYNCTP_PATH")));
  EXPECT_THAT([] { kFlag.text(); }, ThrowsMessage<Error>(HasSubstr("ASYNCTP_TEST_FLAG")));
}

TEST(EnvVarTest, AllowedInWords) {
  EXPECT_EQ(envvars::kGemmStreams.allowed(), "1 or 2");
  EXPECT_EQ(envvars::kPushStreams.allowed(), "an integer from 1 to 4");
  EXPECT_EQ(envvars::kPath.allowed(), "auto, native, split, fallback or unfused (any case)");
  EXPECT_EQ(envvars::kSkipAsan.allowed(), "0 or 1");
  EXPECT_EQ(envvars::kStorePort.allowed(), "an integer from 0 to 65535");
}

// Command-line numbers go through the same parser: the message names the option as typed.
TEST(EnvVarTest, OptionValuesAreParsedAsVariablesAre) {
  constexpr EnvVar kOption{.name = "--limit",
                           .kind = EnvVar::Kind::kNumber,
                           .default_value = "",
                           .doc = "test",
                           .unit = "seconds",
                           .min = 0,
                           .max = 1e7,
                           .min_exclusive = true};
  EXPECT_EQ(parse_number(kOption, "2.5e3"), 2500.0);
  for (const char* text : {"nan", "inf", "-inf", "1e16", "1e400", "0", "-1", "3s", ""}) {
    EXPECT_THAT([&] { parse_number(kOption, text); },
                ThrowsMessage<Error>(HasSubstr(
                    fmt::format("--limit '{}' is ", text) +
                    std::string(std::string_view(text) == "3s" || std::string_view(text).empty()
                                    ? "not a number"
                                    : ""))))
        << text;
  }
  EXPECT_THAT([&] { parse_number(kOption, "1e400"); },
              ThrowsMessage<Error>(HasSubstr(
                  "--limit '1e400' is out of range; allowed: a number > 0 and <= 10000000, in "
                  "seconds")));
  EXPECT_EQ(parse_integer(kInt, "-2"), -2);
  EXPECT_THAT([&] { parse_integer(kInt, "1001"); },
              ThrowsMessage<Error>(HasSubstr("ASYNCTP_TEST_INT='1001' is out of range")));
  EXPECT_THAT([&] { parse_integer(kNum, "1"); },
              ThrowsMessage<Error>(HasSubstr("ASYNCTP_TEST_NUM cannot be read with")));
}

// check_all reports every invalid library variable at once, one a line; test-scope ones and
// valid ones are not reported.
TEST(EnvVarTest, CheckAllNamesEveryInvalidVariable) {
  {
    const ScopedSetEnv level("ASYNCTP_LOG_LEVEL", "DEBUG");
    const ScopedSetEnv skip("ASYNCTP_SKIP_ASAN", "maybe");  // tests only
    EXPECT_NO_THROW(envvars::check_all());
  }
  const ScopedSetEnv level("ASYNCTP_LOG_LEVEL", "verbose");
  const ScopedSetEnv workspace("ASYNCTP_MAX_WORKSPACE_MB", "inf");
  EXPECT_THAT([] { envvars::check_all(); },
              ThrowsMessage<Error>(
                  AllOf(HasSubstr("ASYNCTP_MAX_WORKSPACE_MB='inf' is not a finite number"),
                        HasSubstr("\nASYNCTP_LOG_LEVEL='verbose' is not one of the choices"))));
}

// The logger reads its level once, at first use: each case runs in a fresh process.
TEST(EnvVarDeathTest, LogLevelIsCaseInsensitiveAndABadOneKeepsWarn) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        ::setenv("ASYNCTP_LOG_LEVEL", "DEBUG", 1);
        std::exit(logger().level());
      },
      ::testing::ExitedWithCode(spdlog::level::debug), "");
  EXPECT_EXIT(
      {
        ::setenv("ASYNCTP_LOG_LEVEL", "DEBG", 1);
        std::exit(logger().level());
      },
      ::testing::ExitedWithCode(spdlog::level::warn),
      "ASYNCTP_LOG_LEVEL='DEBG' is not one of the choices.*logging at warn");
  EXPECT_EXIT(
      {
        ::setenv("ASYNCTP_LOG_LEVEL", "off", 1);
        std::exit(logger().level());
      },
      ::testing::ExitedWithCode(spdlog::level::off), "");
}

}  // namespace
}  // namespace asynctp
