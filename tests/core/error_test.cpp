// Error macros, Deadline and the default timeout.
#include "core/error.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "core/deadline.h"

namespace asynctp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using ::testing::ThrowsMessage;

TEST(Errors, CheckThrowsWithMessageLocationAndExpression) {
  const int width = 7;
  EXPECT_NO_THROW(ASYNCTP_CHECK(width == 7, "unused"));
  EXPECT_THAT([&] { ASYNCTP_CHECK(width % 2 == 0, "width {} is odd", width); },
              ThrowsMessage<Error>(AllOf(StartsWith("width 7 is odd ("),
                                         HasSubstr("tests/core/error_test.cpp:"),
                                         HasSubstr("check failed: width % 2 == 0)"))));
}

TEST(Errors, CheckEvaluatesItsMessageOnlyOnFailure) {
  int formatted = 0;
  auto count = [&] { return ++formatted; };
  ASYNCTP_CHECK(true, "{}", count());
  EXPECT_EQ(formatted, 0);
  EXPECT_THROW(ASYNCTP_CHECK(false, "{}", count()), Error);
  EXPECT_EQ(formatted, 1);
}

TEST(Errors, FailHasNoExpression) {
  EXPECT_THAT([] { ASYNCTP_FAIL("bad value {}", 42); },
              ThrowsMessage<Error>(AllOf(StartsWith("bad value 42 (tests/core/error_test.cpp:"),
                                         Not(HasSubstr("check failed")))));
}

TEST(Errors, TimeoutIsAnError) {
  EXPECT_THAT([] { ASYNCTP_TIMEOUT("rank {} waited for '{}'", 3, "key"); },
              ThrowsMessage<TimeoutError>(StartsWith("rank 3 waited for 'key' (tests/")));
  // Callers that catch Error see timeouts too.
  EXPECT_THROW(ASYNCTP_TIMEOUT("x"), Error);
  EXPECT_THROW(ASYNCTP_TIMEOUT("x"), std::runtime_error);
  // A plain check failure is not a timeout.
  bool caught_timeout = false;
  try {
    ASYNCTP_FAIL("x");
  } catch (const TimeoutError&) {
    caught_timeout = true;
  } catch (const Error&) {
  }
  EXPECT_FALSE(caught_timeout);
}

TEST(Errors, SyscheckAddsTheErrnoText) {
  auto failing_call = [] {
    errno = ENOENT;
    return -1;
  };
  EXPECT_THAT([&] { ASYNCTP_SYSCHECK(failing_call(), "opening '{}'", "/nope"); },
              ThrowsMessage<Error>(AllOf(StartsWith("opening '/nope': No such file or directory"),
                                         HasSubstr("check failed: failing_call()"))));
  EXPECT_NO_THROW(ASYNCTP_SYSCHECK(0, "fine"));
  EXPECT_NO_THROW(ASYNCTP_SYSCHECK(5, "fine"));
}

TEST(Errors, ShortPathIsRelativeToTheTree) {
  EXPECT_EQ(detail::short_path("/home/u/asynctp/src/ops/x.cpp"), "src/ops/x.cpp");
  EXPECT_EQ(detail::short_path("/a/tests/core/y.cpp"), "tests/core/y.cpp");
  // The innermost root wins: a checkout under a folder called src.
  EXPECT_EQ(detail::short_path("/src/work/asynctp/src/core/z.cpp"), "src/core/z.cpp");
  EXPECT_EQ(detail::short_path("plain.cpp"), "plain.cpp");
}

TEST(Deadline, DescribeExpiryAndRemaining) {
  const Deadline long_one(Millis(60'000));
  EXPECT_FALSE(long_one.expired());
  EXPECT_GT(long_one.remaining_ms(), 59'000);
  EXPECT_LE(long_one.remaining_ms(), 60'000);
  EXPECT_EQ(long_one.timeout(), Millis(60'000));
  EXPECT_EQ(long_one.describe(), "60 s");
  EXPECT_EQ(Deadline(Millis(2500)).describe(), "2.5 s");
  EXPECT_EQ(Deadline(Millis(1)).describe(), "0.001 s");

  const Deadline short_one(Millis(20));
  std::this_thread::sleep_for(Millis(30));
  EXPECT_TRUE(short_one.expired());
  EXPECT_EQ(short_one.remaining_ms(), 0);
  EXPECT_TRUE(Deadline(Millis(0)).expired());
  EXPECT_EQ(Deadline(Millis(-5)).remaining_ms(), 0);
}

// Sets (or unsets) an environment variable for one test, restoring it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(DefaultTimeout, FromEnvironment) {
  {
    ScopedEnv env("ASYNCTP_TIMEOUT", nullptr);
    EXPECT_EQ(default_timeout(), Millis(300'000));
  }
  {
    ScopedEnv env("ASYNCTP_TIMEOUT", "");
    EXPECT_EQ(default_timeout(), Millis(300'000));
  }
  {
    ScopedEnv env("ASYNCTP_TIMEOUT", "12");
    EXPECT_EQ(default_timeout(), Millis(12'000));
  }
  {
    ScopedEnv env("ASYNCTP_TIMEOUT", "0.25");
    EXPECT_EQ(default_timeout(), Millis(250));
  }
  {
    ScopedEnv env("ASYNCTP_TIMEOUT", "2.01");  // 2.01 * 1000 is just below 2010 in binary
    EXPECT_EQ(default_timeout(), Millis(2010));
  }
  {
    // A tiny but positive timeout must not become 0 ms (an already expired deadline).
    ScopedEnv env("ASYNCTP_TIMEOUT", "0.0001");
    EXPECT_GE(default_timeout(), Millis(1));
  }
  {
    // "inf" means no practical limit; it must not overflow (a deadline still lies ahead).
    ScopedEnv env("ASYNCTP_TIMEOUT", "inf");
    const Millis timeout = default_timeout();
    EXPECT_GE(timeout, Millis(86'400'000));
    EXPECT_FALSE(Deadline(timeout).expired());
    EXPECT_GT(Deadline(timeout).remaining_ms(), 0);
  }
}

TEST(DefaultTimeout, MalformedValueIsNamed) {
  for (const char* bad : {"abc", "10s", "-3", "0", "nan"}) {
    ScopedEnv env("ASYNCTP_TIMEOUT", bad);
    EXPECT_THAT([] { default_timeout(); },
                ThrowsMessage<Error>(AllOf(HasSubstr(fmt::format("ASYNCTP_TIMEOUT='{}' is", bad)),
                                           HasSubstr("allowed: a number > 0, or inf, in seconds"))))
        << bad;
  }
}

}  // namespace
}  // namespace asynctp
