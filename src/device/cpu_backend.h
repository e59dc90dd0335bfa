// The CPU backend: host memory, asynchronous streams (worker threads, NOTE [cpu streams] in
// device/cpu_streams.h), a reference GEMM that accumulates in f32 in
// plain k order. It is the ground truth the CUDA backend is tested against, and with the CPU
// symmetric memory it runs the fused ops' real schedules across processes in CI.
#pragma once

#include "device/backend.h"

namespace asynctp {

// rank: this process's rank on its node, which seeds its streams' jitter.
std::unique_ptr<Backend> make_cpu_backend(int rank = 0);

namespace cpu::testing {
// Test-only: whether Backend::allocate fills what it returns with kPoisonByte (off by default).
// A GPU allocation's contents are undefined; read as flags, these bytes are already raised (a
// positive int32), so a wait that runs before the flags' zeroing goes through at once.
inline constexpr unsigned char kPoisonByte = 0x5A;
void poison_allocations(bool on);
// Test-only: whether the CPU backends made from now on say that their timings tell the paths
// apart (Backend::times_paths; off by default), so that `auto` measures the ops' routes with the
// dispatcher as on a GPU: what the tests of that plumbing need. Forked ranks inherit it.
void time_paths(bool on);
}  // namespace cpu::testing

}  // namespace asynctp
