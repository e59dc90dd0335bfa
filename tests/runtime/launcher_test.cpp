// launch() called in-process, its output captured: the environment every rank gets, output
// tagging, exit codes, stopping the job, and /dev/shm cleanup. tests/tools runs the same through
// the `asynctp launch` binary (signals sent to the launcher, --help, the demo).
#include "runtime/launcher.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/deadline.h"
#include "core/error.h"

namespace asynctp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::ThrowsMessage;

struct Launched {
  int code = -1;
  std::string out;
  std::string err;
  double seconds = 0;
};

std::string read_all(int fd) {
  std::string text;
  ::lseek(fd, 0, SEEK_SET);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0)
    text.append(buf, static_cast<size_t>(n));
  return text;
}

// Runs launch() with this process's stdout and stderr sent to temporary files.
Launched run_launch(const LaunchOptions& options) {
  std::fflush(stdout);
  std::fflush(stderr);
  FILE* out_file = std::tmpfile();
  FILE* err_file = std::tmpfile();
  const int saved_out = ::dup(STDOUT_FILENO);
  const int saved_err = ::dup(STDERR_FILENO);
  ::dup2(::fileno(out_file), STDOUT_FILENO);
  ::dup2(::fileno(err_file), STDERR_FILENO);
  Launched result;
  const auto start = Clock::now();
  try {
    result.code = launch(options);
  } catch (...) {
    ::dup2(saved_out, STDOUT_FILENO);
    ::dup2(saved_err, STDERR_FILENO);
    throw;
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  ::dup2(saved_out, STDOUT_FILENO);
  ::dup2(saved_err, STDERR_FILENO);
  ::close(saved_out);
  ::close(saved_err);
  result.out = read_all(::fileno(out_file));
  result.err = read_all(::fileno(err_file));
  std::fclose(out_file);
  std::fclose(err_file);
  return result;
}

LaunchOptions sh(int nproc, const std::string& script) {
  LaunchOptions options;
  options.nproc = nproc;
  options.command = {"/bin/sh", "-c", script};
  return options;
}

std::string fresh_token() {
  std::random_device rd;
  return fmt::format("{:08x}", rd());
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

TEST(Launch, OptionsAreChecked) {
  LaunchOptions options = sh(0, "true");
  EXPECT_THAT([&] { launch(options); },
              ThrowsMessage<Error>(HasSubstr("--nproc must be at least 1, got 0")));
  options = sh(1, "true");
  options.command.clear();
  EXPECT_THAT([&] { launch(options); },
              ThrowsMessage<Error>(HasSubstr("no command to launch (give it after --)")));
  options = sh(1, "true");
  options.timeout_s = -2;
  EXPECT_THAT(
      [&] { launch(options); },
      ThrowsMessage<Error>(HasSubstr("--timeout must be positive and at most 1e7 s, got -2")));
  for (double bad :
       {1e16, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    options.timeout_s = bad;
    EXPECT_THAT([&] { launch(options); },
                ThrowsMessage<Error>(HasSubstr("--timeout must be positive and at most 1e7 s")))
        << bad;
  }
}

TEST(Launch, EveryRankGetsTheTorchrunVariables) {
  LaunchOptions options =
      sh(3,
         "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR "
         "$MASTER_PORT $ASYNCTP_RUN_ID\"");
  options.master_port = 23456;
  const Launched run = run_launch(options);
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_EQ(run.err, "");
  const auto lines = lines_of(run.out);
  ASSERT_EQ(lines.size(), 3u) << run.out;
  std::map<int, std::string> by_rank;
  std::string run_id;
  const std::regex line_re(R"(\[rank (\d)\] (\d) 3 (\d) 3 0 127\.0\.0\.1 23456 ([0-9a-f]{12}))");
  for (const auto& line : lines) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, line_re)) << line;
    EXPECT_EQ(m[1], m[2]) << line;  // the prefix names the rank the line came from
    EXPECT_EQ(m[2], m[3]) << line;  // LOCAL_RANK == RANK on one node
    if (run_id.empty()) run_id = m[4];
    EXPECT_EQ(m[4], run_id) << "every rank gets the same run id";
    by_rank[std::stoi(m[1])] = line;
  }
  EXPECT_EQ(by_rank.size(), 3u);
}

// The store secret: 256 random bits, the same on every rank of a job, fresh for every job, and
// nothing like the run id (which the store publishes).
TEST(Launch, EveryJobGetsAFreshStoreSecret) {
  std::set<std::string> secrets;
  for (int job = 0; job < 2; ++job) {
    const Launched run = run_launch(sh(3, "echo \"$ASYNCTP_STORE_SECRET $ASYNCTP_RUN_ID\""));
    ASSERT_EQ(run.code, 0) << run.err;
    const auto lines = lines_of(run.out);
    ASSERT_EQ(lines.size(), 3u) << run.out;
    std::set<std::string> in_job;
    const std::regex line_re(R"(\[rank \d\] ([0-9a-f]{64}) ([0-9a-f]{12}))");
    for (const auto& line : lines) {
      std::smatch m;
      ASSERT_TRUE(std::regex_match(line, m, line_re)) << line;
      EXPECT_EQ(std::string(m[1]).find(std::string(m[2])), std::string::npos) << line;
      in_job.insert(m[1]);
    }
    ASSERT_EQ(in_job.size(), 1u) << "the ranks of one job got different secrets: " << run.out;
    secrets.insert(*in_job.begin());
  }
  EXPECT_EQ(secrets.size(), 2u) << "two jobs got the same secret";
}

TEST(Launch, PicksOneFreePortForAllRanks) {
  const Launched run = run_launch(sh(4, "echo port=$MASTER_PORT addr=$MASTER_ADDR"));
  ASSERT_EQ(run.code, 0) << run.err;
  const auto lines = lines_of(run.out);
  ASSERT_EQ(lines.size(), 4u);
  const std::regex port_re(R"(\[rank \d\] port=(\d+) addr=127\.0\.0\.1)");
  std::string port;
  for (const auto& line : lines) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, port_re)) << line;
    if (port.empty()) port = m[1];
    EXPECT_EQ(m[1], port);
  }
  EXPECT_GT(std::stoi(port), 0);
}

TEST(Launch, OutputLinesArePrefixedAndNeverTorn) {
  // Four ranks each write 400 numbered lines to stdout and stderr at once, in pieces; every line
  // must come out whole, with its rank's prefix, each rank's lines in order.
  const Launched run = run_launch(sh(4,
                                     "i=0; while [ $i -lt 400 ]; do printf 'line %d of rank "
                                     "%d\\n' $i $RANK; printf 'err %d\\n' $i >&2; i=$((i+1)); "
                                     "done; printf 'tail without newline'"));
  ASSERT_EQ(run.code, 0) << run.err.substr(0, 2000);
  std::map<int, int> next;
  int tails = 0;
  for (const auto& line : lines_of(run.out)) {
    std::smatch m;
    static const std::regex line_re(R"(\[rank (\d)\] line (\d+) of rank (\d))");
    static const std::regex tail_re(R"(\[rank \d\] tail without newline)");
    if (std::regex_match(line, tail_re)) {
      ++tails;
      continue;
    }
    ASSERT_TRUE(std::regex_match(line, m, line_re)) << "torn or untagged line: '" << line << "'";
    const int rank = std::stoi(m[1]);
    EXPECT_EQ(m[3], m[1]);
    EXPECT_EQ(std::stoi(m[2]), next[rank]++) << "rank " << rank << "'s lines out of order";
  }
  EXPECT_EQ(tails, 4);  // a last line without newline still gets its prefix and a newline
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(next[r], 400) << "rank " << r;
  const auto err_lines = lines_of(run.err);
  EXPECT_EQ(err_lines.size(), 1600u);
  for (const auto& line : err_lines) {
    ASSERT_TRUE(std::regex_match(line, std::regex(R"(\[rank \d\] err \d+)"))) << line;
  }
}

TEST(Launch, NoPrefixWhenTaggingIsOff) {
  LaunchOptions options = sh(2, "echo plain; echo also >&2");
  options.tag_output = false;
  const Launched run = run_launch(options);
  ASSERT_EQ(run.code, 0);
  EXPECT_EQ(run.out, "plain\nplain\n");
  EXPECT_EQ(run.err, "also\nalso\n");
}

TEST(Launch, FailingRankStopsTheOthersAndGivesItsExitCode) {
  const Launched run = run_launch(sh(4, "[ \"$RANK\" = 1 ] && exit 3; exec sleep 30"));
  EXPECT_EQ(run.code, 3);
  EXPECT_THAT(run.err, AllOf(HasSubstr("asynctp launch: rank 1 (pid "),
                             HasSubstr("exited with code 3; stopping the other ranks")));
  EXPECT_LT(run.seconds, 10.0) << "the other ranks were not stopped";
}

TEST(Launch, KilledRankIsNamedWithItsSignal) {
  const Launched run = run_launch(sh(4, "[ \"$RANK\" = 2 ] && kill -9 $$; exec sleep 30"));
  EXPECT_EQ(run.code, 128 + 9);
  EXPECT_THAT(run.err, HasSubstr("was killed by signal 9 (SIGKILL); stopping the other ranks"));
  EXPECT_THAT(run.err, HasSubstr("rank 2 (pid "));
  EXPECT_LT(run.seconds, 10.0);
}

TEST(Launch, RanksThatIgnoreSigtermAreKilledAfterTheGrace) {
  LaunchOptions options =
      sh(3, "trap '' TERM; if [ \"$RANK\" = 0 ]; then sleep 0.3; exit 5; fi; sleep 30");
  options.grace_s = 0.5;
  const Launched run = run_launch(options);
  EXPECT_EQ(run.code, 5);
  EXPECT_GE(run.seconds, 0.7) << "the other ranks did not ignore SIGTERM";
  EXPECT_LT(run.seconds, 10.0) << "SIGKILL did not follow the grace period";
}

TEST(Launch, TimeoutStopsEveryRankWith124) {
  LaunchOptions options = sh(3, "exec sleep 30");
  options.timeout_s = 0.5;
  const Launched run = run_launch(options);
  EXPECT_EQ(run.code, 124);
  EXPECT_THAT(run.err, HasSubstr("asynctp launch: timeout after 0.5 s; stopping every rank"));
  EXPECT_GE(run.seconds, 0.45);
  EXPECT_LT(run.seconds, 10.0);
}

TEST(Launch, MissingCommandFailsClearly) {
  LaunchOptions options;
  options.nproc = 2;
  options.command = {"/nonexistent/asynctp-no-such-program", "--flag"};
  const Launched run = run_launch(options);
  EXPECT_EQ(run.code, 127);
  EXPECT_THAT(run.err,
              HasSubstr("asynctp launch: cannot run '/nonexistent/asynctp-no-such-program': "
                        "No such file or directory"));
  EXPECT_THAT(run.err, HasSubstr("exited with code 127"));
}

TEST(Launch, AllRanksSucceeding) {
  const Launched run = run_launch(sh(8, "exit 0"));
  EXPECT_EQ(run.code, 0);
  EXPECT_EQ(run.out, "");
  EXPECT_EQ(run.err, "");
}

TEST(Launch, GrandchildrenHoldingThePipeDoNotKeepTheLauncherWaiting) {
  // The rank exits at once but leaves a background process with its stdout open.
  const Launched run = run_launch(sh(2, "sleep 30 & echo started"));
  EXPECT_EQ(run.code, 0);
  EXPECT_EQ(lines_of(run.out).size(), 2u);
  EXPECT_LT(run.seconds, 10.0);
}

// ---------------------------------------------------------------------------------------------
// Starting ranks: the descriptor limit, a spawn that fails half way, the timeout while starting.

// Lowers this process's RLIMIT_NOFILE (soft) for one scope; `spare` descriptors stay free above
// those open now, padding with copies of stdin up to `min_open` open ones first.
class LoweredDescriptorLimit {
 public:
  LoweredDescriptorLimit(rlim_t spare, int min_open) {
    ::getrlimit(RLIMIT_NOFILE, &saved_);
    while (open_count() < min_open)
      padding_.push_back(::dup(STDIN_FILENO));
    rlimit lowered = saved_;
    lowered.rlim_cur = static_cast<rlim_t>(open_count()) + spare;
    ::setrlimit(RLIMIT_NOFILE, &lowered);
  }
  explicit LoweredDescriptorLimit(rlim_t limit) {
    ::getrlimit(RLIMIT_NOFILE, &saved_);
    rlimit lowered = saved_;
    lowered.rlim_cur = limit;
    ::setrlimit(RLIMIT_NOFILE, &lowered);
  }
  ~LoweredDescriptorLimit() {
    ::setrlimit(RLIMIT_NOFILE, &saved_);
    for (const int fd : padding_)
      ::close(fd);
  }

 private:
  static int open_count() {
    int n = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd"))
      ++n;
    return n - 1;  // the iterator's own descriptor
  }
  rlimit saved_{};
  std::vector<int> padding_;
};

// Processes (zombies aside: they are dead) whose command line holds `token`.
std::vector<pid_t> live_processes_with(const std::string& token) {
  std::vector<pid_t> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cmdline(entry.path() / "cmdline");
    std::string args((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
    if (args.find(token) == std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const auto paren = line.rfind(')');
    if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z') continue;
    found.push_back(std::stoi(name));
  }
  return found;
}

// Waits up to `limit` for every process holding `token` to be gone; returns those still there.
std::vector<pid_t> wait_gone(const std::string& token, Millis limit) {
  const Deadline deadline(limit);
  auto left = live_processes_with(token);
  while (!left.empty() && !deadline.expired()) {
    ::usleep(20'000);
    left = live_processes_with(token);
  }
  return left;
}

TEST(Launch, NprocBeyondTheDescriptorLimitIsRefusedBeforeAnythingStarts) {
  const std::string marker = ::testing::TempDir() + "/asynctp_launch_" + fresh_token();
  LaunchOptions options = sh(100, ": > " + marker + ".$RANK; exec sleep 30");
  std::string message;
  {
    LoweredDescriptorLimit limit(64);
    try {
      launch(options);
    } catch (const Error& e) {
      message = e.what();
    }
  }
  EXPECT_THAT(message, HasSubstr("--nproc 100 needs 216 file descriptors (two output pipes per "
                                 "rank, 16 for the launcher) but this process may open 64"));
  EXPECT_FALSE(std::filesystem::exists(marker + ".0")) << "a rank was started";
}

TEST(Launch, FailedSpawnStopsTheRanksAlreadyStartedAtOnce) {
  // 8 ranks fit the limit (2 * 8 + 16 descriptors), but only 10 descriptors are free: the pipes
  // of the fourth rank or so run out. Each rank (and the child it starts) carries a token in its
  // command line, so that the test can see whether any is left.
  const std::string token = "asynctp-spawn-test-" + fresh_token();
  LaunchOptions options;
  options.nproc = 8;
  options.command = {"/bin/sh", "-c", "sh -c 'sleep 30' " + token + "-child & wait", token};
  std::string message;
  const auto start = Clock::now();
  {
    LoweredDescriptorLimit limit(10, 2 * 8 + 16);
    try {
      launch(options);
    } catch (const Error& e) {
      message = e.what();
    }
  }
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      message, m,
      std::regex(R"(cannot start rank (\d) of 8: pipe failed: Too many open files; stopped the )"
                 R"((\d) rank\(s\) already started)")))
      << message;
  EXPECT_EQ(m[1], m[2]);
  EXPECT_GE(std::stoi(m[1]), 1) << message;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5.0);
  // The ranks are reaped before launch() returns; their children got the same SIGKILL but die on
  // their own time, which a loaded machine stretches.
  EXPECT_EQ(wait_gone(token, Millis(2000)), std::vector<pid_t>{}) << "a started rank is left";
}

TEST(Launch, TimeoutCountsWhileTheRanksAreStarted) {
  // 256 forks take longer than a millisecond: the timeout falls while the ranks are started.
  LaunchOptions options = sh(256, "exec sleep 30");
  options.timeout_s = 0.001;
  const Launched run = run_launch(options);
  EXPECT_EQ(run.code, 124);
  EXPECT_THAT(run.err,
              AllOf(HasSubstr("asynctp launch: timeout after 0.001 s while starting rank "),
                    HasSubstr(" of 256; stopping the ")));
  EXPECT_LT(run.seconds, 10.0);
}

// ---------------------------------------------------------------------------------------------
// /dev/shm

std::string fresh_run_id() {
  return "test" + fresh_token();
}

bool shm_exists(const std::string& name) {
  return std::filesystem::exists("/dev/shm/" + name);
}

void create_shm(const std::string& name) {
  std::ofstream("/dev/shm/" + name) << "x";
}

TEST(Launch, RemoveShmOfRunRemovesOnlyThatRun) {
  const std::string id = fresh_run_id();
  create_shm(fmt::format("asynctp-{}-0-r0", id));
  create_shm(fmt::format("asynctp-{}-0-r1", id));
  create_shm(fmt::format("asynctp-{}x-0-r0", id));  // another run whose id starts the same
  create_shm(fmt::format("other-{}-0-r0", id));
  EXPECT_EQ(remove_shm_of_run(id), 2);
  EXPECT_FALSE(shm_exists(fmt::format("asynctp-{}-0-r0", id)));
  EXPECT_FALSE(shm_exists(fmt::format("asynctp-{}-0-r1", id)));
  EXPECT_TRUE(shm_exists(fmt::format("asynctp-{}x-0-r0", id)));
  EXPECT_TRUE(shm_exists(fmt::format("other-{}-0-r0", id)));
  EXPECT_EQ(remove_shm_of_run(id), 0);
  EXPECT_EQ(remove_shm_of_run(id + "x"), 1);
  std::filesystem::remove(fmt::format("/dev/shm/other-{}-0-r0", id));
}

TEST(Launch, RemovesWhatAFailedJobLeftInDevShm) {
  // Each rank leaves a segment named as the CPU backend names them; rank 2 fails once all
  // three exist.
  const Launched run = run_launch(
      sh(3,
         "echo id=$ASYNCTP_RUN_ID; : > /dev/shm/asynctp-$ASYNCTP_RUN_ID-7-r$RANK; "
         "[ \"$RANK\" != 2 ] && exec sleep 30; "
         "while [ $(ls /dev/shm | grep -c \"^asynctp-$ASYNCTP_RUN_ID-7-\") -lt 3 ]; do sleep 0.01; "
         "done; exit 1"));
  EXPECT_EQ(run.code, 1);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(run.out, m, std::regex("id=([0-9a-f]+)"))) << run.out;
  const std::string id = m[1];
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(shm_exists(fmt::format("asynctp-{}-7-r{}", id, r))) << "rank " << r;
  }
  EXPECT_THAT(run.err, HasSubstr("removed 3 shared-memory segment(s) left by the job"));
}

TEST(Launch, SaysNothingAboutShmWhenNothingWasLeft) {
  const Launched run = run_launch(sh(2, "true"));
  EXPECT_THAT(run.err, Not(HasSubstr("shared-memory")));
}

}  // namespace
}  // namespace asynctp
