// Who is at the other end of a Unix socket (SO_PEERCRED), and which rank of a group that is:
// the check the CUDA descriptor exchange makes before it hands a descriptor of GPU memory to a
// peer, or takes one from it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "core/error.h"
#include "runtime/socket.h"

namespace asynctp::net {
namespace {

using ::testing::HasSubstr;

TEST(PeerCredentials, AreThoseOfTheProcessAtTheOtherEnd) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  Fd a(fds[0]), b(fds[1]);
  const PeerCredentials peer = peer_credentials(a.get());
  EXPECT_EQ(peer.pid, ::getpid());
  EXPECT_EQ(peer.uid, ::getuid());
  EXPECT_EQ(peer.gid, ::getgid());
  EXPECT_THROW(peer_credentials(-1), Error);
}

TEST(PeerCredentials, ARankIsItsPidUnderThisUser) {
  const std::vector<int64_t> pids{100, 200, 300};
  std::string problem;
  // Rank 0 accepting: any other rank will do.
  EXPECT_EQ(rank_of_peer({200, 1000, 1000}, 1000, pids, 0, -1, &problem), 1);
  EXPECT_EQ(rank_of_peer({300, 1000, 1000}, 1000, pids, 0, -1, &problem), 2);
  // Rank 0 connecting to rank 2: only rank 2 will do.
  EXPECT_EQ(rank_of_peer({300, 1000, 1000}, 1000, pids, 0, 2, &problem), 2);
  EXPECT_FALSE(rank_of_peer({200, 1000, 1000}, 1000, pids, 0, 2, &problem));
  EXPECT_EQ(problem, "the peer (pid 200) is rank 1, not rank 2");
  // Another user, even with a rank's pid (a pid reused in another namespace, say).
  EXPECT_FALSE(rank_of_peer({200, 0, 0}, 1000, pids, 0, -1, &problem));
  EXPECT_EQ(problem, "the peer (pid 200) runs as user 0, not as this job's user 1000");
  // A process of this user that is no rank, and this rank itself.
  EXPECT_FALSE(rank_of_peer({999, 1000, 1000}, 1000, pids, 0, -1, &problem));
  EXPECT_EQ(problem, "the peer (pid 999, user 1000) is no rank of this group");
  EXPECT_FALSE(rank_of_peer({100, 1000, 1000}, 1000, pids, 0, -1, &problem));
  // A pid of 0 (a peer in another pid namespace) matches nothing.
  EXPECT_FALSE(rank_of_peer({0, 1000, 1000}, 1000, std::vector<int64_t>{5, 0}, 0, -1, &problem));
  EXPECT_THAT(
      [&] {
        rank_of_peer({1, 1, 1}, 1, pids, 3, -1, &problem);
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("my rank 3 is outside the 3 ranks")));
}

}  // namespace
}  // namespace asynctp::net
