#include "runtime/rank_guardian.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "core/error.h"

namespace asynctp {

namespace {

// One message per event: rank `rank`'s group is now `pgid` (0: reaped, nothing to kill).
struct Message {
  int32_t rank;
  int32_t pgid;
};

// The guardian's whole life, in the forked child of a possibly multithreaded process: only
// async-signal-safe calls, and `groups` (num_ranks slots) was allocated before the fork.
[[noreturn]] void guard(int fd, pid_t* groups, int num_ranks) {
  // Out of the launcher's process group, so that a signal to that group (Ctrl-C, `kill -9 -PGID`)
  // leaves the guardian to clean up after it; the launcher's SIGINT/SIGTERM/SIGHUP stay blocked.
  ::setpgid(0, 0);
  // Hold nothing of the launcher's but the socket: no terminal, no pipe a reader waits on. The
  // socket leaves 0-2 first (a launcher started with stdio closed may have got it there).
  if (fd <= 2) {
    const int moved = ::fcntl(fd, F_DUPFD, 3);
    if (moved >= 0) fd = moved;
  }
  if (fd > 3) ::close_range(3, static_cast<unsigned>(fd) - 1, 0);
  ::close_range(static_cast<unsigned>(fd) + 1, ~0U, 0);
  const int null_fd = ::open("/dev/null", O_RDWR);
  if (null_fd >= 0) {
    for (int std_fd = 0; std_fd <= 2; ++std_fd) {
      if (std_fd != fd) ::dup2(null_fd, std_fd);
    }
    if (null_fd > 2) ::close(null_fd);
  }
  Message m;
  while (true) {
    const ssize_t n = ::recv(fd, &m, sizeof(m), 0);
    if (n == static_cast<ssize_t>(sizeof(m))) {
      if (m.rank >= 0 && m.rank < num_ranks) groups[m.rank] = m.pgid;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // EOF: every copy of the launcher's end is closed, so the launcher is gone
  }
  for (int r = 0; r < num_ranks; ++r) {
    if (groups[r] > 0) ::kill(-groups[r], SIGKILL);
  }
  ::_exit(0);
}

}  // namespace

RankGuardian::RankGuardian(int num_ranks) {
  ASYNCTP_CHECK(num_ranks >= 1, "RankGuardian: num_ranks must be at least 1, got {}", num_ranks);
  std::vector<pid_t> groups(num_ranks, 0);
  int sv[2];
  ASYNCTP_SYSCHECK(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv),
                   "socketpair for the launcher's guardian");
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(sv[0]);
    ::close(sv[1]);
    ASYNCTP_FAIL("fork of the launcher's guardian failed: {}", std::strerror(err));
  }
  if (pid == 0) {
    ::close(sv[0]);
    guard(sv[1], groups.data(), num_ranks);
  }
  ::close(sv[1]);
  pid_ = pid;
  fd_ = sv[0];
}

RankGuardian::~RankGuardian() {
  ::close(fd_);
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

void RankGuardian::started(int rank, pid_t pgid) {
  ASYNCTP_CHECK(pgid > 0, "RankGuardian: rank {} has no process group (pgid {})", rank, pgid);
  send(rank, pgid);
}

void RankGuardian::reaped(int rank) {
  send(rank, 0);
}

void RankGuardian::send(int rank, pid_t pgid) {
  const Message m{rank, pgid};
  // A guardian that is gone (killed by hand) leaves the launcher's own kills and each rank's
  // PR_SET_PDEATHSIG: the job goes on without it, and MSG_NOSIGNAL keeps SIGPIPE away.
  while (::send(fd_, &m, sizeof(m), MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
}

}  // namespace asynctp
