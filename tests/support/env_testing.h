// Environment variables in tests: a variable unset (or set) for one scope and given back its old
// value (or unset again) when the scope ends, whatever the test did with it meanwhile.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace asynctp::testing {

class ScopedUnsetEnv {
 public:
  explicit ScopedUnsetEnv(std::string name) : name_(std::move(name)) {
    if (const char* v = std::getenv(name_.c_str())) saved_ = v;
    ::unsetenv(name_.c_str());
  }
  ~ScopedUnsetEnv() {
    if (saved_) {
      ::setenv(name_.c_str(), saved_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedUnsetEnv(const ScopedUnsetEnv&) = delete;
  ScopedUnsetEnv& operator=(const ScopedUnsetEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> saved_;
};

// Sets a variable for one scope (the ScopedUnsetEnv restores its old value afterwards).
class ScopedSetEnv {
 public:
  ScopedSetEnv(const char* name, const char* value) : restore_(name) { ::setenv(name, value, 1); }

 private:
  ScopedUnsetEnv restore_;
};

}  // namespace asynctp::testing
