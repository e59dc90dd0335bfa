#include "runtime/launcher.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>

#include "core/deadline.h"
#include "core/error.h"
#include "runtime/hmac.h"
#include "runtime/rank_guardian.h"
#include "runtime/socket.h"

namespace asynctp {

namespace {

struct Rank {
  pid_t pid = -1;
  int out_fd = -1;  // read ends of the child's stdout/stderr pipes (-1 once closed)
  int err_fd = -1;
  std::string out_partial;
  std::string err_partial;
  bool exited = false;
  int status = 0;
};

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return fmt::format("was killed by signal {} (SIG{})", sig, name ? name : "?");
  }
  return fmt::format("ended with status {}", status);
}

int status_exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

void write_fd(int fd, const std::string& text) {
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

// Emits the complete lines of `partial` (prefixed), keeping the incomplete tail.
void flush_lines(std::string* partial, int out, const std::string& prefix, bool final) {
  std::string text;
  size_t start = 0;
  while (true) {
    const size_t nl = partial->find('\n', start);
    if (nl == std::string::npos) break;
    text += prefix;
    text.append(*partial, start, nl - start + 1);
    start = nl + 1;
  }
  partial->erase(0, start);
  if (final && !partial->empty()) {
    text += prefix + *partial + "\n";
    partial->clear();
  }
  if (!text.empty()) write_fd(out, text);
}

// File descriptors the launcher holds besides the ranks' pipes: stdio, the signalfd, the guardian's
// socket, and the next rank's two pipes while it is being started.
constexpr uint64_t kLauncherFds = 16;

// Every rank costs the launcher two descriptors (its stdout and stderr pipes) for its whole life:
// an --nproc the descriptor limit cannot hold is refused before anything is started.
void check_descriptor_limit(int nproc) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
  const uint64_t needed = 2 * static_cast<uint64_t>(nproc) + kLauncherFds;
  ASYNCTP_CHECK(needed <= limit.rlim_cur,
                "--nproc {} needs {} file descriptors (two output pipes per rank, {} for the "
                "launcher) but this process may open {} (RLIMIT_NOFILE; `ulimit -n` raises it)",
                nproc, needed, kLauncherFds, static_cast<uint64_t>(limit.rlim_cur));
}

std::string random_run_id() {
  std::random_device rd;
  return fmt::format("{:08x}{:04x}", rd(), rd() & 0xFFFF);
}

}  // namespace

int remove_shm_of_run(const std::string& run_id) {
  const std::string prefix = "asynctp-" + run_id + "-";
  int removed = 0;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  while (dirent* e = ::readdir(dir)) {
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) {
      if (::unlinkat(::dirfd(dir), e->d_name, 0) == 0) ++removed;
    }
  }
  ::closedir(dir);
  return removed;
}

int launch(const LaunchOptions& options) {
  ASYNCTP_CHECK(options.nproc >= 1, "--nproc must be at least 1, got {}", options.nproc);
  ASYNCTP_CHECK(!options.command.empty(), "no command to launch (give it after --)");
  ASYNCTP_CHECK(
      !options.timeout_s || (*options.timeout_s > 0 && *options.timeout_s <= kMaxTimeoutSeconds),
      "--timeout must be positive and at most 1e7 s, got {}", options.timeout_s.value_or(0));
  check_descriptor_limit(options.nproc);
  const int port = options.master_port > 0 ? options.master_port : net::pick_free_port();
  const std::string run_id = random_run_id();
  // The store admits only clients that know this (256 random bits, never derived from anything
  // an outside client can read, as the run id is).
  const std::string store_secret = random_hex_secret(32);

  // SIGINT/SIGTERM/SIGCHLD are read from a signalfd in the poll loop; children get the default
  // dispositions back before exec.
  sigset_t mask, old_mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGHUP);
  ASYNCTP_SYSCHECK(::sigprocmask(SIG_BLOCK, &mask, &old_mask), "sigprocmask");
  // Whatever happens below, the caller gets its signal mask back and the signalfd is closed.
  struct SignalRestore {
    sigset_t mask;
    int fd = -1;
    ~SignalRestore() {
      if (fd >= 0) ::close(fd);
      ::sigprocmask(SIG_SETMASK, &mask, nullptr);
    }
  } restore{old_mask};
  const int sig_fd = ::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  ASYNCTP_SYSCHECK(sig_fd, "signalfd");
  restore.fd = sig_fd;

  std::vector<char*> argv;
  for (const auto& a : options.command)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  // NOTE [ranks die with their launcher] (runtime/rank_guardian.h)
  RankGuardian guardian(options.nproc);
  const pid_t launcher_pid = ::getpid();
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto timed_out = [&] {
    return options.timeout_s &&
           Clock::now() - start >
               std::chrono::milliseconds(static_cast<int64_t>(*options.timeout_s * 1000));
  };
  // When a rank cannot be started, the ranks already started are stopped at once: SIGKILL to their
  // groups (they have not got far enough to need a grace), reaped, their pipes closed.
  std::vector<Rank> ranks;
  ranks.reserve(options.nproc);
  auto stop_started = [&] {
    for (size_t r = 0; r < ranks.size(); ++r) {
      ::kill(-ranks[r].pid, SIGKILL);
      while (::waitpid(ranks[r].pid, nullptr, 0) < 0 && errno == EINTR) {
      }
      guardian.reaped(static_cast<int>(r));
      ::close(ranks[r].out_fd);
      ::close(ranks[r].err_fd);
    }
    remove_shm_of_run(run_id);
  };
  for (int r = 0; r < options.nproc && !timed_out(); ++r) {
    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    const char* step = "pipe";
    pid_t pid = -1;
    if (::pipe2(out_pipe, O_CLOEXEC) == 0 && ::pipe2(err_pipe, O_CLOEXEC) == 0) {
      step = "fork";
      pid = ::fork();
    }
    if (pid < 0) {
      const int err = errno;
      for (const int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) {
        if (fd >= 0) ::close(fd);
      }
      const size_t started = ranks.size();
      stop_started();
      ASYNCTP_FAIL(
          "cannot start rank {} of {}: {} failed: {}; stopped the {} rank(s) "
          "already started",
          r, options.nproc, step, std::strerror(err), started);
    }
    if (pid == 0) {
      ::setpgid(0, 0);  // own process group: the launcher can stop the rank and its children
      // Die with the launcher; if it died before the prctl, the parent is already another one.
      if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != launcher_pid) ::_exit(1);
      ::dup2(out_pipe[1], STDOUT_FILENO);
      ::dup2(err_pipe[1], STDERR_FILENO);
      ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(options.nproc).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(options.nproc).c_str(), 1);
      ::setenv("GROUP_RANK", "0", 1);
      ::setenv("MASTER_ADDR", options.master_addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("ASYNCTP_RUN_ID", run_id.c_str(), 1);
      ::setenv("ASYNCTP_STORE_SECRET", store_secret.c_str(), 1);
      ::execvp(argv[0], argv.data());
      const std::string msg =
          fmt::format("asynctp launch: cannot run '{}': {}\n", argv[0], std::strerror(errno));
      write_fd(STDERR_FILENO, msg);
      ::_exit(127);
    }
    ::setpgid(pid, pid);
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    Rank& rank = ranks.emplace_back();
    rank.pid = pid;
    rank.out_fd = out_pipe[0];
    rank.err_fd = err_pipe[0];
    guardian.started(r, pid);
  }
  const int num_started = static_cast<int>(ranks.size());

  std::optional<Clock::time_point> kill_at;  // when to escalate SIGTERM to SIGKILL
  int exit_code = 0;
  bool stopping = false;
  int live = num_started;

  auto signal_all = [&](int sig) {
    for (auto& rk : ranks) {
      if (!rk.exited) ::kill(-rk.pid, sig);
    }
  };
  auto stop_all = [&](int code, const std::string& why) {
    if (stopping) return;
    stopping = true;
    exit_code = code;
    write_fd(STDERR_FILENO, "asynctp launch: " + why + "\n");
    signal_all(SIGTERM);
    kill_at =
        Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options.grace_s * 1000));
  };
  auto prefix = [&](int r) {
    return options.tag_output ? fmt::format("[rank {}] ", r) : std::string();
  };
  if (num_started < options.nproc) {
    stop_all(124, fmt::format("timeout after {:g} s while starting rank {} of {}; stopping the {} "
                              "rank(s) started",
                              *options.timeout_s, num_started, options.nproc, num_started));
  }

  while (live > 0 || std::any_of(ranks.begin(), ranks.end(),
                                 [](const Rank& rk) { return rk.out_fd >= 0 || rk.err_fd >= 0; })) {
    std::vector<pollfd> fds{{sig_fd, POLLIN, 0}};
    std::vector<std::pair<int, bool>> owners{{-1, false}};
    for (int r = 0; r < num_started; ++r) {
      if (ranks[r].out_fd >= 0) {
        fds.push_back({ranks[r].out_fd, POLLIN, 0});
        owners.push_back({r, false});
      }
      if (ranks[r].err_fd >= 0) {
        fds.push_back({ranks[r].err_fd, POLLIN, 0});
        owners.push_back({r, true});
      }
    }
    int wait_ms = 200;
    const int rc = ::poll(fds.data(), fds.size(), wait_ms);
    if (rc < 0 && errno != EINTR) break;
    for (size_t i = 1; rc > 0 && i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto [r, is_err] = owners[i];
      Rank& rk = ranks[r];
      int& fd = is_err ? rk.err_fd : rk.out_fd;
      std::string& partial = is_err ? rk.err_partial : rk.out_partial;
      char buf[65536];
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n > 0) {
        partial.append(buf, static_cast<size_t>(n));
        flush_lines(&partial, is_err ? STDERR_FILENO : STDOUT_FILENO, prefix(r), false);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        flush_lines(&partial, is_err ? STDERR_FILENO : STDOUT_FILENO, prefix(r), true);
        ::close(fd);
        fd = -1;
      }
    }
    if (rc > 0 && (fds[0].revents & POLLIN)) {
      signalfd_siginfo info;
      while (::read(sig_fd, &info, sizeof(info)) == sizeof(info)) {
        const int sig = static_cast<int>(info.ssi_signo);
        if (sig == SIGCHLD) continue;  // reaped below
        if (stopping) {
          signal_all(SIGKILL);  // a second interrupt: no more grace
        } else {
          stopping = true;
          exit_code = 128 + sig;
          write_fd(STDERR_FILENO,
                   fmt::format("asynctp launch: got SIG{}, forwarding it to every rank\n",
                               sigabbrev_np(sig)));
          signal_all(sig);
          kill_at = Clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(options.grace_s * 1000));
        }
      }
    }
    // Reap (only our own ranks: the launcher may be embedded in a process with other children).
    for (int r = 0; r < num_started; ++r) {
      Rank& rk = ranks[r];
      if (rk.exited) continue;
      int status = 0;
      if (::waitpid(rk.pid, &status, WNOHANG) != rk.pid) continue;
      rk.exited = true;
      rk.status = status;
      --live;
      ::kill(-rk.pid, SIGKILL);  // whatever the rank left running in its process group goes too
      guardian.reaped(r);
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && !stopping) {
        stop_all(status_exit_code(status),
                 fmt::format("rank {} (pid {}) {}; stopping the other ranks", r, rk.pid,
                             describe_status(status)));
      }
    }
    const auto now = Clock::now();
    if (!stopping && timed_out()) {
      stop_all(124, fmt::format("timeout after {:g} s; stopping every rank", *options.timeout_s));
    }
    if (kill_at && now >= *kill_at) {
      signal_all(SIGKILL);
      kill_at.reset();
    }
    if (live == 0) {
      // Every rank is gone: a grandchild that still holds a pipe open must not keep us waiting.
      for (auto& rk : ranks) {
        for (int* fd : {&rk.out_fd, &rk.err_fd}) {
          if (*fd < 0) continue;
          pollfd p{*fd, POLLIN, 0};
          if (::poll(&p, 1, 50) <= 0) {
            ::close(*fd);
            *fd = -1;
          }
        }
      }
    }
  }
  const int removed = remove_shm_of_run(run_id);
  if (removed > 0) {
    write_fd(STDERR_FILENO,
             fmt::format("asynctp launch: removed {} shared-memory segment(s) left by the job\n",
                         removed));
  }
  return exit_code;
}

}  // namespace asynctp
