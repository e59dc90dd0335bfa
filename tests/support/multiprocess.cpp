#include "support/multiprocess.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>

#include "runtime/hmac.h"
#include "runtime/launcher.h"
#include "runtime/socket.h"
#include "runtime/store.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define ASYNCTP_TEST_LSAN 1
#endif

namespace asynctp::testing {

namespace {
// The failed parts (EXPECT/ASSERT failures) the running test has recorded so far.
int failed_parts() {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  if (test == nullptr) return 0;
  const ::testing::TestResult* result = test->result();
  int failed = 0;
  for (int i = 0; i < result->total_part_count(); ++i)
    failed += result->GetTestPartResult(i).failed() ? 1 : 0;
  return failed;
}
}  // namespace

std::string RankStatus::describe() const {
  if (timed_out) return fmt::format("rank {} did not finish in time (killed)", rank);
  if (exited) {
    const char* what = exit_code == kRankGtestFailure ? " (test assertion failed)"
                       : exit_code == kRankException  ? " (uncaught exception)"
                                                      : "";
    return fmt::format("rank {} exited with code {}{}", rank, exit_code, what);
  }
  return fmt::format("rank {} was killed by signal {}", rank, signal);
}

GroupOptions rank_group_options(const HarnessOptions& options, int rank) {
  GroupOptions g;
  g.timeout = options.group_timeout;
  g.serve_store = false;
  if (options.host_id) g.host_id = options.host_id(rank);
  return g;
}

std::vector<RankStatus> run_processes(int world_size,
                                      const std::function<void(const RendezvousInfo&)>& body,
                                      const HarnessOptions& options) {
  // A run id of our own, so that we can check the run left nothing in /dev/shm.
  std::random_device rd;
  const std::string run_id =
      !options.run_id.empty() ? options.run_id : fmt::format("t{:08x}{:04x}", rd(), rd() & 0xFFFF);
  ::setenv("ASYNCTP_RUN_ID", run_id.c_str(), 1);
  const std::string secret = random_hex_secret(32);
  int port = 0;
  net::Fd listener = net::tcp_listen("127.0.0.1", 0, &port);
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < world_size; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      ADD_FAILURE() << "fork failed for rank " << r;
      break;
    }
    if (pid == 0) {
      listener.reset();
      int code = 0;
      try {
        RendezvousInfo info;
        info.rank = r;
        info.world_size = world_size;
        info.local_rank = r;
        info.local_world_size = world_size;
        info.master_addr = "127.0.0.1";
        info.master_port = port;
        info.store_secret = secret;
        // The child inherits the test's failures so far (an earlier run_ranks of the same test
        // that failed): only a failure of this rank's own counts.
        const int failed_before = failed_parts();
        body(info);
        code = failed_parts() > failed_before ? kRankGtestFailure : 0;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] uncaught exception: %s\n", r, e.what());
        code = kRankException;
      }
#ifdef ASYNCTP_TEST_LSAN
      if (code == 0 && __lsan_do_recoverable_leak_check() != 0) code = kRankException;
#endif
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<RankStatus> statuses(pids.size());
  {
    StoreServer server(std::move(listener), secret);
    const auto deadline = std::chrono::steady_clock::now() + options.run_timeout;
    size_t done = 0;
    while (done < pids.size()) {
      for (size_t r = 0; r < pids.size(); ++r) {
        RankStatus& st = statuses[r];
        st.rank = static_cast<int>(r);
        if (st.exited || st.signal != 0 || st.timed_out) continue;
        int status = 0;
        if (::waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
        ++done;
        if (WIFEXITED(status)) {
          st.exited = true;
          st.exit_code = WEXITSTATUS(status);
        } else if (WIFSIGNALED(status)) {
          st.signal = WTERMSIG(status);
        }
      }
      if (done < pids.size() && std::chrono::steady_clock::now() > deadline) {
        for (size_t r = 0; r < pids.size(); ++r) {
          RankStatus& st = statuses[r];
          if (st.exited || st.signal != 0) continue;
          ::kill(pids[r], SIGKILL);
          ::waitpid(pids[r], nullptr, 0);
          st.timed_out = true;
          ++done;
        }
      }
      if (done < pids.size()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  ::unsetenv("ASYNCTP_RUN_ID");
  if (options.check_shm_left) {
    EXPECT_EQ(remove_shm_of_run(run_id), 0) << "the run left shared memory in /dev/shm";
  }
  return statuses;
}

std::vector<RankStatus> run_ranks(int world_size, const std::function<void(OpContext&)>& body,
                                  const HarnessOptions& options) {
  return run_processes(
      world_size,
      [&](const RendezvousInfo& info) {
        auto group = Group::create(info, rank_group_options(options, info.rank));
        auto ctx = OpContext::create(group, options.context);
        body(*ctx);
      },
      options);
}

::testing::AssertionResult all_ranks_ok(const std::vector<RankStatus>& statuses) {
  std::string failures;
  for (const auto& s : statuses) {
    if (!s.ok()) failures += s.describe() + "; ";
  }
  if (failures.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << failures;
}

}  // namespace asynctp::testing
