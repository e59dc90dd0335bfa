// The CPU backend's /dev/shm segments (NOTE [cpu symmetric memory segments]): a peer's segment
// that is not one the backend made for that peer is refused before it is mapped; segments whose
// creator is provably dead are swept, a live creator's never; a rank killed during the
// allocation leaves a segment that the next job sweeps. Nothing is left in /dev/shm afterwards.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <thread>

#include "runtime/launcher.h"
#include "support/multiprocess.h"
#include "support/tensor_testing.h"
#include "symm/cpu_symmetric_memory.h"
#include "symm/symmetric_memory.h"

namespace asynctp {
namespace {

using testing::error_of;
using ::testing::HasSubstr;

std::string fresh_run_id(const std::string& what) {
  std::random_device rd;
  return fmt::format("t{}{:08x}", what, rd());
}

bool shm_exists(const std::string& name) {
  return std::filesystem::exists("/dev/shm" + (name[0] == '/' ? name : "/" + name));
}

// /dev/shm entries whose names start with `prefix` (no leading '/').
std::vector<std::string> shm_starting_with(const std::string& prefix) {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) found.push_back(name);
  }
  return found;
}

// Creates /dev/shm/<name> with exactly `mode` and `bytes`, owned by `uid` (-1: this user).
void plant(const std::string& name, mode_t mode, size_t bytes, uid_t uid = static_cast<uid_t>(-1)) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0) << name << ": " << std::strerror(errno);
  EXPECT_EQ(::fchmod(fd, mode), 0);  // past the umask
  EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
  if (uid != static_cast<uid_t>(-1)) {
    EXPECT_EQ(::fchown(fd, uid, uid), 0) << std::strerror(errno);
  }
  ::close(fd);
}

// Rank 1 publishes a planted segment (or any text) as its share of rank 0's next allocation,
// exactly where the backend's own rank 1 would; rank 0 must refuse it, naming segment and peer.
TEST(SymmSegmentTest, PlantedPeerSegmentsAreRefusedBeforeTheyAreMapped) {
  constexpr size_t kBytes = 64;
  const size_t total = signal_pad_bytes(2) + kBytes;
  struct Case {
    std::string what;
    mode_t mode;
    size_t bytes;
    uid_t uid;
    std::string expected;  // in rank 0's error
  };
  std::vector<Case> cases{
      {"world-writable", 0666, total, static_cast<uid_t>(-1),
       "its mode 0666 lets other users at it (segments are created 0600)"},
      {"group-readable", 0640, total, static_cast<uid_t>(-1), "its mode 0640 lets other users"},
      {"too small", 0600, 1, static_cast<uid_t>(-1),
       fmt::format("it has 1 bytes where the allocation's segments have {}", total)},
      {"too large", 0600, total + 4096, static_cast<uid_t>(-1),
       fmt::format("it has {} bytes where the allocation's segments have {}", total + 4096, total)},
  };
  // Only root can give a file away; as anyone else the owner check has no other user's file.
  if (::geteuid() == 0) {
    cases.push_back({"another user's", 0600, total, 65534,
                     "it belongs to uid 65534, not to this process's uid 0"});
  }
  auto statuses = testing::run_ranks(2, [&](OpContext& ctx) {
    auto allocator = make_cpu_symm_allocator(ctx.group());
    Store& store = ctx.group().store();
    for (size_t c = 0; c < cases.size(); ++c) {
      const Case& tc = cases[c];
      if (ctx.rank() == 1) {
        const std::string key = ctx.group().next_key("symm/cpu");  // rank 0's allocate takes it
        const std::string name =
            cpu_segment_name(ctx.group().run_id(), key.substr(key.rfind('/') + 1), 1);
        plant(name, tc.mode, tc.bytes, tc.uid);
        store.set(fmt::format("test/planted/{}", c), name);
        store.set(fmt::format("{}/1", key), fmt::format("{} {}", name, kBytes));
        store.get(fmt::format("test/checked/{}", c));
        EXPECT_EQ(::shm_unlink(name.c_str()), 0) << tc.what;
      } else {
        const std::string msg = error_of([&] { allocator->allocate(kBytes); });
        const std::string name = store.get(fmt::format("test/planted/{}", c));
        EXPECT_THAT(msg, HasSubstr(fmt::format("rank 0: refusing peer 1's shared memory '{}': {}",
                                               name, tc.expected)))
            << tc.what;
        store.set(fmt::format("test/checked/{}", c), "1");
      }
    }
    // Published names and sizes that are not a segment of this allocation and this peer.
    const std::vector<std::string> published{
        "/etc/passwd 64",
        fmt::format("/asynctp-{}-999-r1-p1-t1-n1 64", ctx.group().run_id()),  // another allocation
        "",
        "no-space",
    };
    for (size_t c = 0; c < published.size(); ++c) {
      if (ctx.rank() == 1) {
        const std::string key = ctx.group().next_key("symm/cpu");
        store.set(fmt::format("{}/1", key), published[c]);
        store.set(fmt::format("test/published/{}", c), key);
      } else {
        const std::string msg = error_of([&] { allocator->allocate(kBytes); });
        const std::string key = store.get(fmt::format("test/published/{}", c));
        EXPECT_THAT(msg, HasSubstr(fmt::format("symmetric allocation {}: rank 0 got '{}' for peer "
                                               "1 (key '{}/1'), which is not '/asynctp-{}-",
                                               key, published[c], key, ctx.group().run_id())));
      }
    }
    // A size that is not a number is named too (it was an "unexpected error: stoull").
    if (ctx.rank() == 1) {
      const std::string key = ctx.group().next_key("symm/cpu");
      const std::string name =
          cpu_segment_name(ctx.group().run_id(), key.substr(key.rfind('/') + 1), 1);
      store.set(fmt::format("{}/1", key), name + " 64x");
    } else {
      EXPECT_THAT(error_of([&] { allocator->allocate(kBytes); }),
                  HasSubstr(" 64x' for peer 1 (key '"));
    }
    // The same ranks still allocate and share memory once the peer is the backend itself.
    auto sm = allocator->allocate(kBytes);
    static_cast<char*>(sm->buffer_ptr(ctx.rank()))[0] = static_cast<char>('a' + ctx.rank());
    sm->barrier(0, ctx.stream());
    ctx.stream().synchronize();
    EXPECT_EQ(static_cast<char*>(sm->buffer_ptr(1 - ctx.rank()))[0], 'a' + 1 - ctx.rank());
    sm->barrier(0, ctx.stream());
    ctx.stream().synchronize();
  });
  EXPECT_RANKS_OK(statuses);
}

// A child that creates its segment for `rank` of run `run_id`, tells its name through a pipe and
// exits; reaped unless `zombie`. Returns the segment's name (no leading '/'). The name comes from
// the child, not from /dev/shm: a test running beside this one sweeps too, and may remove the
// segment of a dead child before this process looks.
std::string plant_from_child(const std::string& run_id, int rank, bool zombie, pid_t* pid_out) {
  int fds[2];
  if (::pipe(fds) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return "";
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const std::string name = cpu_segment_name(run_id, "0", rank);
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    const bool told =
        ::write(fds[1], name.data(), name.size()) == static_cast<ssize_t>(name.size());
    ::_exit(fd >= 0 && told ? 0 : 1);
  }
  ::close(fds[1]);
  *pid_out = pid;
  std::string name;
  char buf[256];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;)
    name.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  siginfo_t info{};
  // Exited, and (for the zombie) not reaped: WNOWAIT leaves it for the caller.
  ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | (zombie ? WNOWAIT : 0));
  EXPECT_EQ(info.si_status, 0) << "the child could not create its segment";
  EXPECT_TRUE(name.starts_with(fmt::format("/asynctp-{}-0-r{}-p{}-", run_id, rank, pid))) << name;
  return name.empty() ? "" : name.substr(1);
}

TEST(SymmSegmentTest, SweepRemovesOnlySegmentsWhoseCreatorIsProvablyDead) {
  const std::string run = fresh_run_id("sweep");
  pid_t dead_pid = 0, zombie_pid = 0;
  const std::string dead = plant_from_child(run, 0, false, &dead_pid);
  const std::string zombie = plant_from_child(run, 1, true, &zombie_pid);
  // This process is alive: its segment stays.
  const std::string live = cpu_segment_name(run, "0", 2).substr(1);
  plant("/" + live, 0600, 1);
  // This process's pid with another start time: the pid was reused, the creator is dead.
  std::smatch m;
  ASSERT_TRUE(std::regex_match(live, m, std::regex(R"(.*-p(\d+)-t(\d+)-n(\d+))"))) << live;
  const std::string reused = fmt::format("asynctp-{}-0-r3-p{}-t{}-n{}", run, m[1].str(),
                                         std::stoull(m[2].str()) + 1, m[3].str());
  plant("/" + reused, 0600, 1);
  // A dead pid in another pid namespace cannot be looked up: left alone.
  const std::string other_ns = fmt::format("asynctp-{}-0-r4-p{}-t1-n1", run, dead_pid);
  plant("/" + other_ns, 0600, 1);
  // Names that carry no creator are not the sweep's.
  const std::string unnamed = fmt::format("asynctp-{}-0-r5", run);
  plant("/" + unnamed, 0600, 1);
  std::string foreign;
  if (::geteuid() == 0) {  // a dead creator's segment of another user: not this user's to remove
    foreign = fmt::format("asynctp-{}-0-r6-p{}-t{}-n{}", run, dead_pid, 1, m[3].str());
    plant("/" + foreign, 0600, 1, 65534);
  }

  // Any allocation on the machine sweeps too (a test running beside this one may be first): the
  // count is not this call's alone, what is left is.
  sweep_dead_segments();
  EXPECT_FALSE(shm_exists(dead)) << "the creator exited and was reaped";
  EXPECT_FALSE(shm_exists(zombie)) << "the creator is a zombie";
  EXPECT_FALSE(shm_exists(reused)) << "the creator's pid belongs to a later process";
  EXPECT_TRUE(shm_exists(live));
  EXPECT_TRUE(shm_exists(other_ns));
  EXPECT_TRUE(shm_exists(unnamed));
  if (!foreign.empty()) {
    EXPECT_TRUE(shm_exists(foreign));
  }

  ::waitpid(zombie_pid, nullptr, 0);
  remove_shm_of_run(run);
  EXPECT_EQ(shm_starting_with("asynctp-" + run + "-"), std::vector<std::string>{});
}

// Under torchrun there is no launcher to remove a run's segments: a rank killed between creating
// its segment and the unlink leaves it in /dev/shm, and the next job's allocation removes it.
TEST(SymmSegmentTest, ARankKilledDuringTheAllocationLeavesWhatTheNextJobSweeps) {
  testing::HarnessOptions killed;
  killed.run_id = fresh_run_id("killed");
  killed.check_shm_left = false;
  const std::string prefix = "asynctp-" + killed.run_id + "-";
  auto statuses = testing::run_ranks(
      2,
      [&](OpContext& ctx) {
        if (ctx.rank() == 1) return;  // never allocates: rank 0 waits for it
        // SIGKILL as soon as this rank's segment exists, before any peer could map it.
        std::thread killer([&] {
          const std::string own = fmt::format("-r0-p{}-", ::getpid());
          while (true) {
            for (const auto& name : shm_starting_with(prefix)) {
              if (name.find(own) != std::string::npos) ::kill(::getpid(), SIGKILL);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        });
        killer.detach();
        auto allocator = make_cpu_symm_allocator(ctx.group());
        allocator->allocate(64);
        ADD_FAILURE() << "the allocation returned";
      },
      killed);
  ASSERT_EQ(statuses.size(), 2u);
  EXPECT_EQ(statuses[0].signal, SIGKILL) << statuses[0].describe();
  EXPECT_TRUE(statuses[1].ok()) << statuses[1].describe();
  // The killed rank's segment, unless an allocation running beside this test swept it already.
  EXPECT_LE(shm_starting_with(prefix).size(), 1u);

  auto next = testing::run_ranks(
      2, [](OpContext& ctx) { make_cpu_symm_allocator(ctx.group())->allocate(64); });
  EXPECT_RANKS_OK(next);
  EXPECT_EQ(shm_starting_with(prefix), std::vector<std::string>{}) << "the next job swept nothing";
  remove_shm_of_run(killed.run_id);
}

}  // namespace
}  // namespace asynctp
