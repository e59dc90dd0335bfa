// Multi-process test harness: runs a test body on N ranks, one forked process each, connected
// through a store served by the test process itself, exactly as a real job (real processes,
// real shared memory, real signals). Each rank's failures print with its rank; the parent
// asserts on every rank's exit status, and that no shared memory of the run is left behind.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <asynctp/group.h>
#include "ops/context.h"

namespace asynctp::testing {

struct RankStatus {
  int rank = 0;
  bool exited = false;  // exited normally (else killed by a signal, or by the harness timeout)
  int exit_code = -1;   // when exited
  int signal = 0;       // when killed
  bool timed_out = false;

  bool ok() const { return exited && exit_code == 0; }
  std::string describe() const;
};

struct HarnessOptions {
  // Whole-run limit: ranks still running after it are killed and reported.
  Millis run_timeout{120'000};
  // The group's timeout for every wait (store, signals, barriers).
  Millis group_timeout{20'000};
  // Node identity per rank (default: all on one node).
  std::function<std::string(int rank)> host_id;
  ContextOptions context;
  // The run's id (ASYNCTP_RUN_ID); empty: a fresh one.
  std::string run_id;
  // Whether the harness checks that the run left nothing in /dev/shm (removing what it left). A
  // test in which a rank dies on purpose before unlinking its segment checks that itself.
  bool check_shm_left = true;
};

// Exit codes a rank's body process ends with.
inline constexpr int kRankGtestFailure = 1;
inline constexpr int kRankException = 2;

// Runs body(info) in `world_size` processes; returns each rank's status. Asserts (non-fatally)
// that no /dev/shm entry of the run remains afterwards (unless options.check_shm_left is off).
std::vector<RankStatus> run_processes(int world_size,
                                      const std::function<void(const RendezvousInfo&)>& body,
                                      const HarnessOptions& options = {});

// Runs body(ctx) on every rank with a Group and OpContext built from the options.
std::vector<RankStatus> run_ranks(int world_size, const std::function<void(OpContext&)>& body,
                                  const HarnessOptions& options = {});

// The group options a rank of run_processes should use (store served by the harness).
GroupOptions rank_group_options(const HarnessOptions& options, int rank);

// gtest assertion: every rank exited 0.
::testing::AssertionResult all_ranks_ok(const std::vector<RankStatus>& statuses);

}  // namespace asynctp::testing

#define EXPECT_RANKS_OK(statuses) EXPECT_TRUE(::asynctp::testing::all_ranks_ok(statuses))
#define ASSERT_RANKS_OK(statuses) ASSERT_TRUE(::asynctp::testing::all_ranks_ok(statuses))
