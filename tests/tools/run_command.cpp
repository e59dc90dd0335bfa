#include "run_command.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"

namespace asynctp::testing {

std::string Finished::describe() const {
  std::string how = timed_out ? "timed out (killed)"
                    : exited  ? fmt::format("exit {}", exit_code)
                              : fmt::format("signal {}", signal);
  return fmt::format("{} after {:.2f} s\n--- stdout ---\n{}\n--- stderr ---\n{}", how, seconds,
                     out.substr(0, 4000), err.substr(0, 4000));
}

Child::Child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env)
    : start_(Clock::now()) {
  ASYNCTP_CHECK(!argv.empty(), "no command");
  int out_pipe[2], err_pipe[2];
  ASYNCTP_SYSCHECK(::pipe2(out_pipe, O_CLOEXEC), "pipe");
  ASYNCTP_SYSCHECK(::pipe2(err_pipe, O_CLOEXEC), "pipe");
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<char*> args;
  for (const auto& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    if (env.count(name) == 0) env_strings.push_back(entry);
  }
  for (const auto& [name, value] : env) {
    if (value != kUnset) env_strings.push_back(name + "=" + value);
  }
  std::vector<char*> envp;
  for (auto& e : env_strings)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);

  pid_ = ::fork();
  ASYNCTP_SYSCHECK(pid_, "fork");
  if (pid_ == 0) {
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    // The launcher under test blocks signals itself; start it with a clean mask.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execvpe(args[0], args.data(), envp.data());
    const char msg[] = "run_command: exec failed\n";
    [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, msg, sizeof(msg) - 1);
    ::_exit(126);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  out_fd_ = out_pipe[0];
  err_fd_ = err_pipe[0];
}

Child::~Child() {
  if (!reaped_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
  if (err_fd_ >= 0) ::close(err_fd_);
}

bool Child::pump(int ms) {
  pollfd fds[2];
  int n = 0;
  if (out_fd_ >= 0) fds[n++] = {out_fd_, POLLIN, 0};
  if (err_fd_ >= 0) fds[n++] = {err_fd_, POLLIN, 0};
  if (n == 0) return false;
  const int rc = ::poll(fds, n, ms);
  if (rc <= 0) return true;
  for (int i = 0; i < n; ++i) {
    if (fds[i].revents == 0) continue;
    const bool is_out = fds[i].fd == out_fd_;
    char buf[65536];
    const ssize_t got = ::read(fds[i].fd, buf, sizeof(buf));
    if (got > 0) {
      (is_out ? out_ : err_).append(buf, static_cast<size_t>(got));
    } else if (got == 0 || errno != EINTR) {
      ::close(fds[i].fd);
      (is_out ? out_fd_ : err_fd_) = -1;
    }
  }
  return out_fd_ >= 0 || err_fd_ >= 0;
}

bool Child::wait_for_stdout(const std::string& needle, int count, Millis limit) {
  const Deadline deadline(limit);
  auto occurrences = [&] {
    int found = 0;
    for (size_t pos = out_.find(needle); pos != std::string::npos;
         pos = out_.find(needle, pos + needle.size())) {
      ++found;
    }
    return found;
  };
  while (occurrences() < count) {
    if (deadline.expired() || !pump(std::min(deadline.remaining_ms(), 50))) {
      return occurrences() >= count;
    }
  }
  return true;
}

Finished Child::wait(Millis limit) {
  const Deadline deadline(limit);
  Finished f;
  int status = 0;
  while (true) {
    pump(20);
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) break;
    if (deadline.expired()) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      f.timed_out = true;
      break;
    }
  }
  reaped_ = true;
  f.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  // Whatever is still buffered in the pipes (a grandchild may hold them open: bounded).
  const Deadline drain(Millis(2000));
  while (!drain.expired() && pump(20)) {
  }
  if (!f.timed_out) {
    if (WIFEXITED(status)) {
      f.exited = true;
      f.exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
      f.signal = WTERMSIG(status);
    }
  }
  f.out = out_;
  f.err = err_;
  return f;
}

Finished run_command(const std::vector<std::string>& argv,
                     const std::map<std::string, std::string>& env, Millis limit) {
  Child child(argv, env);
  return child.wait(limit);
}

std::map<std::string, std::string> unset_rendezvous_env() {
  std::map<std::string, std::string> env;
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                           "MASTER_PORT", "ASYNCTP_RUN_ID", "ASYNCTP_STORE_PORT",
                           "ASYNCTP_STORE_SECRET", "TORCHELASTIC_USE_AGENT_STORE"}) {
    env[name] = kUnset;
  }
  return env;
}

}  // namespace asynctp::testing
