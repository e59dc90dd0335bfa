// Futex waits on u32 words in memory that several processes map (the CPU backend's flags, the
// CPU symmetric memory's signals): a waiter sleeps in the kernel instead of spinning, so idle
// ranks and streams cost no CPU even with more of them than cores.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <ctime>

namespace asynctp::cpu {

// Sleeps while *addr holds `expected`, at most timeout_ms (a wake, a change or a signal ends it
// sooner). Shared (non-private) futex: the word may live in memory mapped by several processes.
inline void futex_wait(uint32_t* addr, uint32_t expected, int timeout_ms) {
  timespec ts{timeout_ms / 1000, (timeout_ms % 1000) * 1'000'000L};
  ::syscall(SYS_futex, addr, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void futex_wake(uint32_t* addr) {
  ::syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace asynctp::cpu
