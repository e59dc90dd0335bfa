// Tensor helpers for tests: deterministic seeded contents (so that any rank can rebuild any other
// rank's inputs), element access in logical order for any strides, non-contiguous layouts, and a
// bit-for-bit comparison that names the first element that differs. Every host access first waits
// for the work enqueued on the CPU backend's streams (cpu::testing::synchronize_all).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/buffer.h"
#include "core/error.h"
#include "core/random.h"
#include "device/cpu_streams.h"

namespace asynctp::testing {

// A well-mixed hash of one 64-bit word (one splitmix64 step from state x).
inline uint64_t mix64(uint64_t x) {
  return splitmix64(x);
}

// One seed from several parts (test case, tensor, rank, ...).
inline uint64_t seed_of(std::initializer_list<uint64_t> parts) {
  uint64_t h = 0x2545F4914F6CDD1Dull;
  for (uint64_t p : parts)
    h = mix64(h ^ p);
  return h;
}

enum class Values : uint8_t {
  kSmallInts,  // integers in [-3, 3]: every sum of a few products is exact in any order
  kRandom,     // in (-2, 2), full mantissas over several binades: sums depend on their order
  kQuarters,   // multiples of 1/4 in [-2, 2]: exact in float8 e4m3, products exact in f32
  kPositive,   // uniform in [0.25, 2): for scales
};

inline float seeded_value(uint64_t seed, int64_t index, Values kind) {
  const uint64_t h = mix64(seed ^ mix64(static_cast<uint64_t>(index)));
  switch (kind) {
    case Values::kSmallInts:
      return static_cast<float>(static_cast<int>(h % 7) - 3);
    case Values::kRandom: {
      // sign * 1.m * 2^-e: a full 24-bit significand and exponents spread over 8 binades, so
      // that sums (not only products) round differently in different orders.
      const float significand = 1.0f + static_cast<float>(h >> 41) * 0x1p-23f;
      const float magnitude = std::ldexp(significand, -static_cast<int>((h >> 1) & 7));
      return (h & 1) != 0 ? -magnitude : magnitude;
    }
    case Values::kQuarters:
      return static_cast<float>(static_cast<int>(h % 17) - 8) * 0.25f;
    case Values::kPositive:
      return 0.25f + static_cast<float>(h >> 40) * 0x1p-24f * 1.75f;
  }
  return 0.0f;
}

// Element offset (in elements) of the `linear`-th element of t in row-major logical order.
inline int64_t offset_of(const Tensor& t, int64_t linear) {
  int64_t offset = 0;
  for (int d = t.dim() - 1; d >= 0; --d) {
    const int64_t size = t.shape()[d];
    offset += (linear % size) * t.strides()[d];
    linear /= size;
  }
  return offset;
}

inline float get(const Tensor& t, int64_t linear) {
  cpu::testing::synchronize_all();
  const char* p = static_cast<const char*>(t.data()) + offset_of(t, linear) * t.element_size();
  return dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T v;
    std::memcpy(&v, p, sizeof(T));
    return to_float(v);
  });
}

// Stores value rounded to t's dtype (as the library's casts round).
inline void set(const Tensor& t, int64_t linear, float value) {
  cpu::testing::synchronize_all();
  char* p = static_cast<char*>(t.data()) + offset_of(t, linear) * t.element_size();
  dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = from_float<T>(value);
    std::memcpy(p, &v, sizeof(T));
  });
}

// The raw bits of one element, widened.
inline uint32_t bits_at(const Tensor& t, int64_t linear) {
  cpu::testing::synchronize_all();
  const char* p = static_cast<const char*>(t.data()) + offset_of(t, linear) * t.element_size();
  uint32_t bits = 0;
  std::memcpy(&bits, p, t.element_size());  // little-endian: the low bytes
  return bits;
}

inline void fill_seeded(const Tensor& t, uint64_t seed, Values kind) {
  for (int64_t i = 0; i < t.numel(); ++i)
    set(t, i, seeded_value(seed, i, kind));
}

inline void fill_value(const Tensor& t, float value) {
  for (int64_t i = 0; i < t.numel(); ++i)
    set(t, i, value);
}

inline std::vector<float> to_vector(const Tensor& t) {
  cpu::testing::synchronize_all();
  std::vector<float> out(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i)
    out[i] = get(t, i);
  return out;
}

// A tensor of `shape` whose last two dims are stored transposed (column-major matrices): the
// view of a contiguous [.., cols, rows] allocation.
inline OwnedTensor empty_transposed(Dims shape, DType dtype) {
  Dims storage = shape;
  std::swap(storage[storage.size() - 1], storage[storage.size() - 2]);
  OwnedTensor owned = empty_host(storage, dtype);
  owned.tensor = owned.tensor.transpose(-1, -2);
  return owned;
}

// A tensor of `shape` whose rows (last dim) are padded by `pad` elements: not contiguous, but
// with unit inner stride.
inline OwnedTensor empty_padded(Dims shape, DType dtype, int64_t pad) {
  Dims storage = shape;
  storage[storage.size() - 1] += pad;
  OwnedTensor owned = empty_host(storage, dtype);
  owned.tensor = owned.tensor.narrow(-1, 0, shape.back());
  return owned;
}

// Same shape, dtype and bits at every element (NaNs of the same pattern compare equal).
inline ::testing::AssertionResult same_bits(const Tensor& actual, const Tensor& expected) {
  cpu::testing::synchronize_all();  // empty tensors too: work queued before may read other inputs
  if (actual.shape() != expected.shape() || actual.dtype() != expected.dtype()) {
    return ::testing::AssertionFailure()
           << "got " << actual.describe() << ", expected " << expected.describe();
  }
  int64_t mismatches = 0;
  std::string first;
  for (int64_t i = 0; i < actual.numel(); ++i) {
    if (bits_at(actual, i) == bits_at(expected, i)) continue;
    if (mismatches++ == 0) {
      first =
          fmt::format("first at linear index {}: got {} (bits {:#x}), expected {} (bits {:#x})", i,
                      get(actual, i), bits_at(actual, i), get(expected, i), bits_at(expected, i));
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatches << " of " << actual.numel() << " elements of "
                                       << actual.describe() << " differ; " << first;
}

// The message of the asynctp::Error fn throws, or a note saying it threw nothing (or something
// else), so that EXPECT_THAT(error_of(...), HasSubstr(...)) reports what happened.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not an asynctp::Error: ") + e.what() + ">";
  }
  return "<no error thrown>";
}

}  // namespace asynctp::testing
