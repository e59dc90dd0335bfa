// The single-node launcher behind `asynctp launch`: starts N ranks of a command with the
// torchrun variables set (and ASYNCTP_RUN_ID and ASYNCTP_STORE_SECRET, fresh per job), tags their
// output lines with the rank, and stops the whole job as soon as one rank fails, on SIGINT/SIGTERM
// (forwarded to every rank), or at the timeout.
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
// exit code (or 128 + signal) when one fails; 124 on timeout; 128 + signal when interrupted.
// Removes the job's /dev/shm entries (asynctp-<run id>-*) before returning.
int launch(const LaunchOptions& options);

// Removes /dev/shm entries named "asynctp-<run_id>-*"; returns how many.
int remove_shm_of_run(const std::string& run_id);

}  // namespace asynctp
