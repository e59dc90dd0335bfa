// A rank for the tests of two jobs on one port (store_port_test.cpp): makes its group from the
// environment, as any program under torchrun or `asynctp launch` does, prints
// "ready rank=<r> run=<run id>", waits until the file argv[1] exists, passes a barrier with the
// other ranks, prints "done rank=<r>" and exits 0. Any error: printed on stderr, exit 1.
#include <cstdio>
#include <filesystem>
#include <thread>

#include <asynctp/group.h>

#include "core/deadline.h"
#include "core/error.h"

int main(int argc, char** argv) {
  using namespace asynctp;
  try {
    ASYNCTP_CHECK(argc == 2, "usage: {} <file to wait for>", argv[0]);
    GroupOptions options;
    options.timeout = Millis(30'000);
    auto group = Group::from_env(options);
    std::printf("ready rank=%d run=%s\n", group->rank(), group->run_id().c_str());
    std::fflush(stdout);
    const Deadline deadline(Millis(60'000));
    while (!std::filesystem::exists(argv[1])) {
      ASYNCTP_CHECK(!deadline.expired(), "{} did not appear within {}", argv[1],
                    deadline.describe());
      std::this_thread::sleep_for(Millis(20));
    }
    group->barrier("finish");
    std::printf("done rank=%d\n", group->rank());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
