// Pieces of the C ABI tests: the ranks' bootstrap (the torchrun variables, a free port for rank
// 0's store), host tensors described by asynctp_tensor, integer-valued inputs (so
// every product and sum is exact in f32 whatever the summation order, and exact in bf16 while
// below 256), and the unfused references on plain row-major f32 vectors.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include <asynctp/group.h>
#include "asynctp/asynctp_c.h"
#include "runtime/socket.h"
#include "support/multiprocess.h"

namespace asynctp::capi_testing {

#define C_ASSERT_OK(call) ASSERT_EQ((call), ASYNCTP_OK) << #call << ": " << asynctp_last_error()
#define C_EXPECT_OK(call) EXPECT_EQ((call), ASYNCTP_OK) << #call << ": " << asynctp_last_error()

using Shape = std::vector<int64_t>;

inline int64_t numel(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

inline size_t dtype_size(asynctp_dtype dtype) {
  switch (dtype) {
    case ASYNCTP_F32:
      return 4;
    case ASYNCTP_BF16:
    case ASYNCTP_F16:
      return 2;
    default:
      return 1;
  }
}

// A contiguous host tensor of any dtype with its descriptor.
struct HostTensor {
  Shape shape;
  asynctp_dtype dtype = ASYNCTP_F32;
  std::vector<uint8_t> bytes;

  HostTensor() = default;
  HostTensor(Shape s, asynctp_dtype d)
      : shape(std::move(s)), dtype(d), bytes(numel(shape) * dtype_size(d)) {}

  asynctp_tensor desc() const {
    asynctp_tensor t{};
    t.data = const_cast<uint8_t*>(bytes.data());
    t.dtype = dtype;
    t.device_type = ASYNCTP_DEVICE_CPU;
    t.device_index = 0;
    t.ndim = static_cast<int32_t>(shape.size());
    int64_t stride = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      t.shape[d] = shape[d];
      t.strides[d] = stride;
      stride *= shape[d];
    }
    return t;
  }
};

inline asynctp_tensor no_tensor() {
  asynctp_tensor t{};
  t.ndim = -1;
  return t;
}

// bf16 of a value exact in bf16 (small integers and halves): the top half of its f32 bits.
inline uint16_t to_bf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return static_cast<uint16_t>(bits >> 16);
}
inline float from_bf16(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

// float8 e4m3fn patterns of small exact values, and what they stand for.
inline constexpr uint8_t kF8Bits[] = {0xC0, 0xB8, 0xB0, 0x00, 0x30, 0x38, 0x3C, 0x40};
inline constexpr float kF8Values[] = {-2.0f, -1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f, 2.0f};

// Values in -2..2 from (seed, index): any rank rebuilds any rank's inputs.
inline int small_int(uint64_t seed, int64_t i) {
  return static_cast<int>((seed * 2654435761u + static_cast<uint64_t>(i) * 40503u) >> 7 & 0xFF) %
             5 -
         2;
}

// f32 values of `shape` from seed, and the host tensor of `dtype` holding them.
inline std::vector<float> seeded_values(const Shape& shape, uint64_t seed) {
  std::vector<float> v(numel(shape));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(small_int(seed, static_cast<int64_t>(i)));
  return v;
}

inline HostTensor host_of(const std::vector<float>& values, const Shape& shape,
                          asynctp_dtype dtype) {
  HostTensor t(shape, dtype);
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == ASYNCTP_F32) {
      std::memcpy(t.bytes.data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t b = to_bf16(values[i]);
      std::memcpy(t.bytes.data() + 2 * i, &b, 2);
    }
  }
  return t;
}

inline std::vector<float> values_of(const HostTensor& t) {
  std::vector<float> v(numel(t.shape));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.dtype == ASYNCTP_F32) {
      std::memcpy(&v[i], t.bytes.data() + 4 * i, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, t.bytes.data() + 2 * i, 2);
      v[i] = from_bf16(b);
    }
  }
  return v;
}

inline int wrap(int dim, size_t ndim) {
  return dim < 0 ? dim + static_cast<int>(ndim) : dim;
}

// Concatenation of `parts` (each of `shape`) along dim.
inline std::vector<float> concat(const std::vector<std::vector<float>>& parts, const Shape& shape,
                                 int dim) {
  dim = wrap(dim, shape.size());
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d)
    outer *= shape[d];
  for (size_t d = dim + 1; d < shape.size(); ++d)
    inner *= shape[d];
  const int64_t block = shape[dim] * inner;
  std::vector<float> out;
  for (int64_t o = 0; o < outer; ++o)
    for (const auto& p : parts)
      out.insert(out.end(), p.begin() + o * block, p.begin() + (o + 1) * block);
  return out;
}

// Slice r of `ws` along dim of a tensor of `shape`.
inline std::vector<float> slice(const std::vector<float>& full, const Shape& shape, int dim, int r,
                                int ws) {
  dim = wrap(dim, shape.size());
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d)
    outer *= shape[d];
  for (size_t d = dim + 1; d < shape.size(); ++d)
    inner *= shape[d];
  const int64_t part = shape[dim] / ws * inner;
  std::vector<float> out;
  for (int64_t o = 0; o < outer; ++o) {
    const auto start = full.begin() + o * shape[dim] * inner + r * part;
    out.insert(out.end(), start, start + part);
  }
  return out;
}

// [.., M, K] @ [K, N] -> [.., M, N], row-major.
inline std::vector<float> matmul(const std::vector<float>& a, const std::vector<float>& b,
                                 int64_t k, int64_t n) {
  const int64_t rows = static_cast<int64_t>(a.size()) / k;
  std::vector<float> out(rows * n, 0.0f);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t l = 0; l < k; ++l)
        acc += a[i * k + l] * b[l * n + j];
      out[i * n + j] = acc;
    }
  return out;
}

// A port nobody listens on now, for rank 0's own store when a group comes from the variables
// (below the ephemeral range: see net::pick_free_port).
inline int free_port() {
  return net::pick_free_port();
}

// The torchrun variables of rank info.rank of ws, rank 0 serving the store on port, and the
// store secret every rank of the run shares (as `asynctp launch` would set it).
inline void set_env(const RendezvousInfo& info, int ws, int port) {
  ::setenv("RANK", std::to_string(info.rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(ws).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(info.rank).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(ws).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("ASYNCTP_STORE_SECRET", info.store_secret.c_str(), 1);
}

// The exit code of a rank whose group could not form because the port free_port() found was
// gone by the time rank 0 listened on it: a test running beside it (ctest -j) bound it in
// between, and rank 0 found it taken or a rank reached that test's store instead.
inline constexpr int kRankPortLost = 75;

inline bool port_lost(const std::string& error) {
  return error.find("is taken") != std::string::npos ||
         error.find("belongs to another job") != std::string::npos;
}

// Runs body(info, group) in ws processes, each with a group made from the torchrun variables
// (rank 0 serving the store on a free port) with `timeout_ms`; body destroys the group. A run
// whose port was lost (kRankPortLost) is run again on another, up to three times in all.
// Returns each rank's status. pick_port: where each attempt's port comes from.
inline std::vector<testing::RankStatus> run_env_ranks(
    int ws, int64_t timeout_ms,
    const std::function<void(const RendezvousInfo&, asynctp_group)>& body,
    const std::function<int()>& pick_port = free_port) {
  constexpr int kAttempts = 3;
  for (int attempt = 1;; ++attempt) {
    const int port = pick_port();
    auto statuses = testing::run_processes(ws, [&](const RendezvousInfo& info) {
      set_env(info, ws, port);
      asynctp_group group = nullptr;
      const asynctp_status status = asynctp_group_from_env(timeout_ms, &group);
      if (status != ASYNCTP_OK && attempt < kAttempts && port_lost(asynctp_last_error())) {
        std::_Exit(kRankPortLost);
      }
      ASSERT_EQ(status, ASYNCTP_OK) << "asynctp_group_from_env: " << asynctp_last_error();
      body(info, group);
    });
    const bool lost = std::any_of(statuses.begin(), statuses.end(), [](const auto& s) {
      return s.exited && s.exit_code == kRankPortLost;
    });
    if (!lost) return statuses;
  }
}

// A CPU context over group (NULL, with a failure recorded, if it cannot be made).
inline asynctp_context cpu_context(asynctp_group group, int64_t max_workspace_bytes = -1) {
  asynctp_context_options o;
  asynctp_context_options_init(&o);
  o.backend = "cpu";
  o.dispatch_cache = "off";
  o.max_workspace_bytes = max_workspace_bytes;
  asynctp_context ctx = nullptr;
  EXPECT_EQ(asynctp_context_create(group, &o, &ctx), ASYNCTP_OK) << asynctp_last_error();
  return ctx;
}

inline std::string last_error() {
  return asynctp_last_error();
}

// The call returns status and its last error contains text.
#define EXPECT_STATUS(call, status, text)                                                   \
  do {                                                                                      \
    EXPECT_EQ((call), (status)) << #call;                                                   \
    EXPECT_NE(last_error().find(text), std::string::npos) << #call << ": " << last_error(); \
  } while (0)

}  // namespace asynctp::capi_testing
