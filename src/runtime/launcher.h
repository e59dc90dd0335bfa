// The single-node launcher behind `asynctp launch`: starts N ranks of a command with the
// torchrun variables set (and ASYNCTP_RUN_ID and ASYNCTP_STORE_SECRET, fresh per job), tags their
// output lines with the rank, and stops the whole job as soon as one rank fails, on SIGINT/SIGTERM
// (forwarded to every rank), or at the timeout. Each rank runs in a process group of its own,
// which ends with the launcher however the launcher ends (NOTE [ranks die with their launcher] in
// runtime/rank_guardian.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace asynctp {

struct LaunchOptions {
  int nproc = 1;
  std::vector<std::string> command;
  std::optional<double> timeout_s;  // whole-job limit; none = no limit
  std::string master_addr = "127.0.0.1";
  int master_port = 0;     // 0: a free port
  bool tag_output = true;  // prefix every output line with "[rank R] "
  double grace_s = 5.0;    // SIGTERM, then SIGKILL after this long
};

// Runs the job; returns the launcher's exit code: 0 when every rank exits 0; the failing rank's
// exit code (or 128 + signal) when one fails; 124 on timeout (which counts from before the first
// rank is started, so a slow start is bounded too); 128 + signal when interrupted.
// Throws before starting anything when the options are bad or --nproc needs more file
// descriptors than RLIMIT_NOFILE allows; throws naming the rank and the failed call when a rank
// cannot be started (pipe, fork), after killing and reaping the ranks already started.
// Removes the job's /dev/shm entries (asynctp-<run id>-*) before returning.
int launch(const LaunchOptions& options);

// Removes /dev/shm entries named "asynctp-<run_id>-*"; returns how many.
int remove_shm_of_run(const std::string& run_id);

}  // namespace asynctp
