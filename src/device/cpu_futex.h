// Futex waits on u32 words in memory that several processes map (the CPU backend's flags, the
// CPU symmetric memory's signals): a waiter sleeps in the kernel instead of spinning, so idle
// ranks and streams cost no CPU even with more of them than cores.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <ctime>

#include "core/deadline.h"

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

// Waits until up(value) holds for *word (acquire loads), sleeping on the futex between changes (at
// most 50 ms at a time: a writer in a process that wakes no one is still seen). False once
// `deadline` has passed with up() still false.
template <typename Up>
bool wait_word(const uint32_t* word, Up up, const Deadline& deadline) {
  auto* w = const_cast<uint32_t*>(word);
  std::atomic_ref<uint32_t> flag(*w);
  for (uint32_t v = flag.load(std::memory_order_acquire); !up(v);
       v = flag.load(std::memory_order_acquire)) {
    if (deadline.expired()) return false;
    futex_wait(w, v, std::min(deadline.remaining_ms() + 1, 50));
  }
  return true;
}

}  // namespace asynctp::cpu
