// NOTE [ranks die with their launcher]
// `asynctp launch` starts each rank in a process group of its own: the rank and whatever it starts
// (compile workers, data loaders). Three things end those groups when the launcher ends, however
// it ends:
// - the launcher itself kills a rank's group once it has reaped the rank, and every group when it
//   stops the job (a failed rank, the timeout, a signal, a spawn that failed);
// - each rank gets PR_SET_PDEATHSIG(SIGKILL) between fork and exec, so the rank process dies with
//   the launcher's thread, also when the launcher is SIGKILLed (the OOM killer, `kill -9`);
// - the guardian, a small process forked before the ranks, in a process group of its own, with
//   the launcher's signals blocked: the launcher tells it each rank's group as it starts it and
//   once it has reaped it, over a socket. When that socket reads EOF (the launcher is gone,
//   whatever ended it) the guardian SIGKILLs every group still listed. This is what reaches the
//   ranks' children, which PR_SET_PDEATHSIG does not.
// A rank's child that leaves its group (setsid, setpgid) is out of reach of all three.
#pragma once

#include <sys/types.h>

#include <vector>

namespace asynctp {

class RankGuardian {
 public:
  // Forks the guardian, which can list `num_ranks` groups, one slot per rank.
  explicit RankGuardian(int num_ranks);
  // Closes the socket (the guardian kills the groups still listed and exits) and reaps it.
  ~RankGuardian();
  RankGuardian(const RankGuardian&) = delete;
  RankGuardian& operator=(const RankGuardian&) = delete;

  // Rank `rank`'s process group is `pgid` (its pid): killed if the launcher dies.
  void started(int rank, pid_t pgid);
  // Rank `rank` was reaped and its group killed: the guardian forgets it (its id may be reused).
  void reaped(int rank);

  pid_t pid() const { return pid_; }

 private:
  void send(int rank, pid_t pgid);

  pid_t pid_ = -1;
  int fd_ = -1;  // the launcher's end of a SOCK_SEQPACKET pair
};

}  // namespace asynctp
