// Deterministic pseudo-random numbers for test and benchmark inputs: the same values on every
// machine and rank for the same seed (no std:: distribution, whose output is
// implementation-defined).
#pragma once

#include <cstdint>

namespace asynctp {

// splitmix64 (Steele, Lea, Flood 2014): advances `state` and returns the next well-mixed word.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) with 53 random bits.
inline double uniform01(uint64_t& state) {
  return static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;
}

}  // namespace asynctp
