// Two jobs on one port: the second job's ranks fail at once with an error that names the port
// and says another job holds it, and the first job, which holds it, finishes normally: under
// `asynctp launch`, and with the ranks started as torchrun starts them (the variables set by
// hand, the secret given in ASYNCTP_STORE_SECRET). The ranks are test_store_rank
// (store_rank.cpp); nothing of either job is left in /dev/shm.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "run_command.h"
#include "runtime/socket.h"

#ifndef ASYNCTP_BIN
#error "ASYNCTP_BIN (the path of the asynctp binary) must be defined by the build"
#endif
#ifndef ASYNCTP_STORE_RANK
#error "ASYNCTP_STORE_RANK (the path of test_store_rank) must be defined by the build"
#endif

namespace asynctp {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using testing::Child;
using testing::Finished;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::run_command;

const std::string kBin = ASYNCTP_BIN;
const std::string kRank = ASYNCTP_STORE_RANK;

// The variables torchrun gives rank `rank` of `ws` (its run id is "none" without --rdzv-id),
// with the job's secret.
std::map<std::string, std::string> torchrun_env(int rank, int ws, int port,
                                                const std::string& secret) {
  auto env = testing::unset_rendezvous_env();
  env["RANK"] = env["LOCAL_RANK"] = env["GROUP_RANK"] = std::to_string(rank);
  env["WORLD_SIZE"] = env["LOCAL_WORLD_SIZE"] = std::to_string(ws);
  env["MASTER_ADDR"] = "127.0.0.1";
  env["MASTER_PORT"] = std::to_string(port);
  env["TORCHELASTIC_RUN_ID"] = "none";
  env["ASYNCTP_STORE_SECRET"] = secret;
  return env;
}

// A file that does not exist yet, removed at the end of the test.
class FlagFile {
 public:
  FlagFile()
      : path_(std::filesystem::temp_directory_path() /
              fmt::format("asynctp-store-port-{}-{}", ::getpid(), counter_++)) {
    std::filesystem::remove(path_);
  }
  ~FlagFile() { std::filesystem::remove(path_); }
  std::string path() const { return path_.string(); }
  void create() const { std::ofstream(path_) << "go\n"; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

std::vector<std::string> run_ids_in(const std::string& out) {
  std::vector<std::string> ids;
  const std::regex re("run=([0-9a-zA-Z._-]+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it) {
    ids.push_back((*it)[1]);
  }
  return ids;
}

// /dev/shm entries of the runs.
std::vector<std::string> shm_of_runs(const std::vector<std::string>& run_ids) {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    for (const auto& id : run_ids) {
      if (name.rfind("asynctp-" + id + "-", 0) == 0) found.push_back(name);
    }
  }
  return found;
}

TEST(TwoJobsOnOnePort, UnderTheLauncherTheSecondFailsAtOnceAndTheFirstFinishes) {
  const int port = net::pick_free_port();
  const std::string p = std::to_string(port);
  FlagFile first_may_finish, second_may_finish;
  Child first(
      {kBin, "launch", "--nproc", "3", "--master-port", p, "--", kRank, first_may_finish.path()},
      testing::unset_rendezvous_env());
  ASSERT_TRUE(first.wait_for_stdout("ready", 3, Millis(30'000))) << first.out();

  const Finished second = run_command(
      {kBin, "launch", "--nproc", "3", "--master-port", p, "--", kRank, second_may_finish.path()},
      testing::unset_rendezvous_env(), Millis(30'000));
  EXPECT_TRUE(second.exited && second.exit_code != 0) << second.describe();
  // "At once": far below the ranks' 30 s store timeout.
  EXPECT_LT(second.seconds, 10.0) << second.describe();
  EXPECT_THAT(
      second.err,
      AnyOf(HasSubstr(fmt::format("port {} is taken (another job or program holds it)", port)),
            HasSubstr(fmt::format("port {} is held by another job's store", port))))
      << second.describe();
  EXPECT_THAT(second.out, Not(HasSubstr("ready"))) << "a rank of the second job joined a store";

  first_may_finish.create();
  const Finished done = first.wait(Millis(30'000));
  EXPECT_TRUE(done.exited && done.exit_code == 0) << done.describe();
  for (int r = 0; r < 3; ++r)
    EXPECT_THAT(done.out, HasSubstr(fmt::format("done rank={}", r))) << done.describe();
  const auto ids = run_ids_in(done.out);
  ASSERT_EQ(ids.size(), 3u) << done.describe();
  EXPECT_TRUE(shm_of_runs(ids).empty());
}

TEST(TwoJobsOnOnePort, TorchrunStyleEveryRankOfTheSecondFailsAtOnceNamingThePort) {
  const int port = net::pick_free_port();
  const std::string first_secret(64, 'a'), second_secret(64, 'b');
  FlagFile first_may_finish, second_may_finish;
  std::vector<std::unique_ptr<Child>> first;
  for (int r = 0; r < 2; ++r) {
    first.push_back(
        std::make_unique<Child>(std::vector<std::string>{kRank, first_may_finish.path()},
                                torchrun_env(r, 2, port, first_secret)));
  }
  for (auto& rank : first)
    ASSERT_TRUE(rank->wait_for_stdout("ready", 1, Millis(30'000))) << rank->out();

  // Each rank of the second job on its own, so that each one's own error is seen.
  const Finished rank0 = run_command({kRank, second_may_finish.path()},
                                     torchrun_env(0, 2, port, second_secret), Millis(30'000));
  EXPECT_TRUE(rank0.exited && rank0.exit_code == 1) << rank0.describe();
  EXPECT_LT(rank0.seconds, 5.0) << rank0.describe();
  EXPECT_THAT(rank0.err,
              HasSubstr(fmt::format("rank 0: cannot serve the job's store: cannot listen on "
                                    "127.0.0.1:{}: port {} is taken (another job or program "
                                    "holds it)",
                                    port, port)));
  const Finished rank1 = run_command({kRank, second_may_finish.path()},
                                     torchrun_env(1, 2, port, second_secret), Millis(30'000));
  EXPECT_TRUE(rank1.exited && rank1.exit_code == 1) << rank1.describe();
  EXPECT_LT(rank1.seconds, 5.0) << rank1.describe();
  EXPECT_THAT(rank1.err,
              AllOf(HasSubstr(fmt::format("the store at 127.0.0.1:{} refused this rank", port)),
                    HasSubstr(fmt::format("port {} is held by another job's store", port))));
  // A rank given no secret at all is told how to give one.
  auto no_secret = torchrun_env(1, 2, port, "");
  no_secret["ASYNCTP_STORE_SECRET"] = testing::kUnset;
  const Finished unset = run_command({kRank, second_may_finish.path()}, no_secret, Millis(30'000));
  EXPECT_TRUE(unset.exited && unset.exit_code == 1) << unset.describe();
  EXPECT_THAT(unset.err, HasSubstr("ASYNCTP_STORE_SECRET is not set, and this job has 2 ranks"));

  first_may_finish.create();
  std::string out;
  for (auto& rank : first) {
    const Finished done = rank->wait(Millis(30'000));
    EXPECT_TRUE(done.exited && done.exit_code == 0) << done.describe();
    out += done.out;
  }
  EXPECT_THAT(out, AllOf(HasSubstr("done rank=0"), HasSubstr("done rank=1")));
  const auto ids = run_ids_in(out);
  ASSERT_EQ(ids.size(), 2u) << out;
  EXPECT_EQ(ids[0], ids[1]);
  EXPECT_TRUE(shm_of_runs(ids).empty());
}

}  // namespace
}  // namespace asynctp
