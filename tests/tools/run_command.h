// Runs a command as a child process with its stdout and stderr captured, for tests of the
// `asynctp` binary: wait for it with a limit, watch its output while it runs, signal it.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "core/deadline.h"

namespace asynctp::testing {

struct Finished {
  bool exited = false;  // exited normally (else killed by a signal, or by the limit)
  int exit_code = -1;
  int signal = 0;
  bool timed_out = false;  // still running at the limit: killed
  double seconds = 0;      // from start to exit
  std::string out;
  std::string err;

  // "exit 3", "signal 9", "timed out": for assertion messages, with the output.
  std::string describe() const;
};

class Child {
 public:
  // Starts argv[0] (looked up in PATH) with the environment of this process plus `env`
  // (a value of nullptr-like "\x01unset" removes the variable).
  explicit Child(const std::vector<std::string>& argv,
                 const std::map<std::string, std::string>& env = {});
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  // Waits until the captured stdout holds `needle` at least `count` times; false at the limit
  // or when the child ends first.
  bool wait_for_stdout(const std::string& needle, int count, Millis limit);
  // Waits for the child to end; past the limit, kills it (SIGKILL) and says so.
  Finished wait(Millis limit);
  void send(int sig) const { ::kill(pid_, sig); }
  const std::string& out() const { return out_; }

 private:
  // Reads what is available within `ms` milliseconds; false once both pipes are closed.
  bool pump(int ms);

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  std::string out_;
  std::string err_;
  Clock::time_point start_;
  bool reaped_ = false;
};

// Runs a command to completion (limit: kill and report).
Finished run_command(const std::vector<std::string>& argv,
                     const std::map<std::string, std::string>& env = {},
                     Millis limit = Millis(60'000));

inline constexpr const char* kUnset = "\x01unset";

// The variables a rank reads to find its job (torchrun's and asynctp's), each set to kUnset: a
// command started with them inherits none from whatever runs the tests.
std::map<std::string, std::string> unset_rendezvous_env();

}  // namespace asynctp::testing
