// The C ABI at world sizes 1-4, on the CPU backend, through asynctp_* calls only (the harness
// forks the ranks and serves the store): groups from the torchrun variables and from a host
// store behind C callbacks, subgroups, every op and collective against the unfused reference
// computed here, the statuses and messages of bad calls, and what ran and what is held.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "capi/capi_testing.h"
#include "core/error.h"
#include "runtime/store.h"
#include "support/multiprocess.h"

namespace asynctp::capi_testing {
namespace {

using asynctp::testing::HarnessOptions;
using asynctp::testing::run_processes;

// ---- bootstraps -------------------------------------------------------------------------------

enum class Bootstrap { kEnv, kStore };

constexpr int64_t kTimeoutMs = 20'000;

// The host framework's store: a TCP store client (the harness serves it) behind the C callbacks.
struct HostStore {
  HostStore(const std::string& host, int port, int rank, const std::string& secret)
      : store(host, port, Millis(kTimeoutMs), rank, secret) {}

  TcpStore store;
  std::string last;  // what get returned, valid until the next callback

  static int status_of_current() {
    try {
      throw;
    } catch (const TimeoutError&) {
      return ASYNCTP_ERROR_TIMEOUT;
    } catch (...) {
      return 1;
    }
  }
  static int set(void* user, const char* key, const void* value, size_t len) {
    try {
      static_cast<HostStore*>(user)->store.set(key,
                                               std::string(static_cast<const char*>(value), len));
      return 0;
    } catch (...) {
      return status_of_current();
    }
  }
  static int get(void* user, const char* key, int64_t timeout_ms, const void** value, size_t* len) {
    try {
      auto* s = static_cast<HostStore*>(user);
      s->last = s->store.get(key, Millis(timeout_ms));
      *value = s->last.data();
      *len = s->last.size();
      return 0;
    } catch (...) {
      return status_of_current();
    }
  }
  static int add(void* user, const char* key, int64_t delta, int64_t* result) {
    try {
      *result = static_cast<HostStore*>(user)->store.add(key, delta);
      return 0;
    } catch (...) {
      return status_of_current();
    }
  }
  static int check(void* user, const char* key, int32_t* is_set) {
    try {
      *is_set = static_cast<HostStore*>(user)->store.check({key}) ? 1 : 0;
      return 0;
    } catch (...) {
      return status_of_current();
    }
  }
  static int erase(void* user, const char* key) {
    try {
      static_cast<HostStore*>(user)->store.erase(key);
      return 0;
    } catch (...) {
      return status_of_current();
    }
  }
  asynctp_store_callbacks callbacks() {
    asynctp_store_callbacks cb{};
    cb.struct_size = sizeof(cb);
    cb.user = this;
    cb.set = &HostStore::set;
    cb.get = &HostStore::get;
    cb.add = &HostStore::add;
    cb.check = &HostStore::check;
    cb.erase = &HostStore::erase;
    return cb;
  }
};

// Runs body(ctx, rank, ws) on every rank, with a CPU context over a group from `how` (from the
// variables: run again on another port when a test beside it took the picked one).
template <typename Body>
void run_c(int ws, Bootstrap how, Body body, int64_t timeout_ms = kTimeoutMs) {
  auto with_group = [&](const RendezvousInfo& info, asynctp_group group) {
    int32_t rank = -1, world = -1;
    C_ASSERT_OK(asynctp_group_rank(group, &rank));
    C_ASSERT_OK(asynctp_group_world_size(group, &world));
    EXPECT_EQ(rank, info.rank);
    EXPECT_EQ(world, ws);
    asynctp_context_options o;
    asynctp_context_options_init(&o);
    o.backend = "cpu";
    o.dispatch_cache = "off";
    asynctp_context ctx = nullptr;
    C_ASSERT_OK(asynctp_context_create(group, &o, &ctx));
    // The context keeps the group alive: the handle may go first.
    C_ASSERT_OK(asynctp_group_destroy(group));
    body(ctx, rank, world);
    C_EXPECT_OK(asynctp_context_destroy(ctx));
  };
  if (how == Bootstrap::kEnv) {
    EXPECT_RANKS_OK(run_env_ranks(ws, timeout_ms, with_group));
    return;
  }
  auto statuses = run_processes(
      ws,
      [&](const RendezvousInfo& info) {
        HostStore host(info.master_addr, info.master_port, info.rank, info.store_secret);
        const asynctp_store_callbacks cb = host.callbacks();
        asynctp_group group = nullptr;
        C_ASSERT_OK(asynctp_group_from_store(&cb, info.rank, ws, info.rank, timeout_ms, &group));
        with_group(info, group);
      },
      HarnessOptions{});
  EXPECT_RANKS_OK(statuses);
}

// ---- the ops against the unfused reference ----------------------------------------------------

class CapiOps : public ::testing::TestWithParam<std::tuple<int, Bootstrap>> {};

// A_shard [.., s@g, .., K] gathered on g, times two Bs; the gathered A returned; every path.
void check_all_gather_matmul(asynctp_context ctx, int rank, int ws, Shape shard, int g,
                             asynctp_dtype dtype, int32_t path) {
  const int64_t k = shard.back();
  const int64_t ns[] = {5, 3};
  std::vector<std::vector<float>> shards;
  for (int r = 0; r < ws; ++r)
    shards.push_back(seeded_values(shard, 100 + r));
  Shape full = shard;
  full[wrap(g, shard.size())] *= ws;
  const std::vector<float> a = concat(shards, shard, g);
  const HostTensor a_shard = host_of(shards[rank], shard, dtype);
  std::vector<HostTensor> bs, outs;
  for (int i = 0; i < 2; ++i) {
    bs.push_back(host_of(seeded_values({k, ns[i]}, 7 + i), {k, ns[i]}, dtype));
    Shape out_shape = full;
    out_shape.back() = ns[i];
    outs.emplace_back(out_shape, dtype);
  }
  HostTensor a_out(full, dtype);
  const asynctp_tensor b_desc[] = {bs[0].desc(), bs[1].desc()};
  const asynctp_tensor out_desc[] = {outs[0].desc(), outs[1].desc()};
  const asynctp_tensor a_desc = a_shard.desc(), a_out_desc = a_out.desc();
  C_ASSERT_OK(asynctp_all_gather_matmul(ctx, &a_desc, b_desc, 2, out_desc, &a_out_desc, g, path,
                                        ASYNCTP_CONTEXT_STREAM));
  C_ASSERT_OK(asynctp_synchronize(ctx));  // the host reads the result
  EXPECT_EQ(values_of(a_out), a) << "gathered A, path " << path;
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(values_of(outs[i]), matmul(a, seeded_values({k, ns[i]}, 7 + i), k, ns[i]))
        << "out " << i << ", path " << path;
}

TEST_P(CapiOps, AllGatherMatmul) {
  const auto [ws, how] = GetParam();
  run_c(ws, how, [](asynctp_context ctx, int rank, int ws) {
    for (int32_t path : {ASYNCTP_PATH_SPLIT, ASYNCTP_PATH_FALLBACK, ASYNCTP_PATH_DEFAULT}) {
      check_all_gather_matmul(ctx, rank, ws, {3, 8}, 0, ASYNCTP_F32, path);
      check_all_gather_matmul(ctx, rank, ws, {2, 3, 8}, 1, ASYNCTP_BF16, path);
    }
    char reason[8];
    int32_t last = -2;
    C_ASSERT_OK(asynctp_last_path(ctx, "all_gather_matmul", &last, reason, sizeof(reason)));
    EXPECT_GE(last, ASYNCTP_PATH_SPLIT);
    // Every call counted under its path: 2 on the split path (at ws 1 there is nothing to
    // overlap), 2 on the fallback, 2 wherever the default took them.
    size_t needed = 0;
    C_ASSERT_OK(asynctp_usage_json(ctx, nullptr, 0, &needed));
    std::string text(needed, '\0');
    C_ASSERT_OK(asynctp_usage_json(ctx, text.data(), text.size(), &needed));
    ASSERT_EQ(std::strlen(text.c_str()), needed - 1);
    const auto usage = nlohmann::json::parse(text.c_str());
    ASSERT_TRUE(usage.contains("all_gather_matmul")) << text;
    int64_t total = 0;
    for (const auto& [path, count] : usage["all_gather_matmul"].items())
      total += count.get<int64_t>();
    EXPECT_EQ(total, 6) << text;
    if (ws > 1) {
      EXPECT_GE(usage["all_gather_matmul"].value("split", 0), 2) << text;
    }
    EXPECT_GE(usage["all_gather_matmul"].value("fallback", 0), 2) << text;
    // Cut to fit: the first bytes and a NUL.
    char small[5];
    C_ASSERT_OK(asynctp_usage_json(ctx, small, sizeof(small), &needed));
    EXPECT_EQ(std::string(small), text.substr(0, 4));

    // The host profile: empty while off; on, each call through the C ABI is filed under its
    // op and path, its first phase the descriptors' checks ("entry > run").
    C_ASSERT_OK(asynctp_host_profile_json(ctx, nullptr, 0, &needed));
    EXPECT_EQ(needed, 3u);  // "{}"
    C_ASSERT_OK(asynctp_host_profile_set(ctx, 1));
    check_all_gather_matmul(ctx, rank, ws, {3, 8}, 0, ASYNCTP_F32, ASYNCTP_PATH_FALLBACK);
    C_ASSERT_OK(asynctp_host_profile_json(ctx, nullptr, 0, &needed));
    std::string profile_text(needed, '\0');
    C_ASSERT_OK(asynctp_host_profile_json(ctx, profile_text.data(), needed, &needed));
    const auto profile = nlohmann::json::parse(profile_text.c_str());
    const auto& fallback = profile["all_gather_matmul"]["fallback"];
    EXPECT_EQ(fallback["calls"], 1) << profile_text;
    EXPECT_EQ(fallback["phases"][0]["from"], "entry") << profile_text;
    EXPECT_EQ(fallback["phases"][0]["to"], "run") << profile_text;
    C_ASSERT_OK(asynctp_host_profile_set(ctx, 0));
    C_ASSERT_OK(asynctp_host_profile_json(ctx, nullptr, 0, &needed));
    EXPECT_EQ(needed, 3u);
    EXPECT_EQ(asynctp_host_profile_set(ctx, 2), ASYNCTP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(asynctp_last_error()).find("enabled is 2"), std::string::npos);
    EXPECT_EQ(asynctp_host_profile_json(ctx, nullptr, 4, &needed), ASYNCTP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(asynctp_last_error()).find("buf is NULL but len is 4"),
              std::string::npos);
  });
}

// all_gather_matmul_swiglu: A_shard [s, k] gathered on dim 0, B_gate_up [k, 2n]; out = silu(P
// [.., :n]) * P[.., n:] and the products P returned; reserved first. Integer inputs: P is exact,
// and out (computed in f32, rounded once) within a rounding of the reference in f32.
void check_all_gather_matmul_swiglu(asynctp_context ctx, int rank, int ws, asynctp_dtype dtype,
                                    int32_t path) {
  const Shape shard{3, 8};
  const int64_t k = 8, n = 8;  // N % 8 == 0: the native path takes a row-major B
  std::vector<std::vector<float>> shards;
  for (int r = 0; r < ws; ++r)
    shards.push_back(seeded_values(shard, 300 + r));
  const std::vector<float> a = concat(shards, shard, 0);
  const std::vector<float> b = seeded_values({k, 2 * n}, 310);
  const HostTensor a_shard = host_of(shards[rank], shard, dtype);
  const HostTensor b_gate_up = host_of(b, {k, 2 * n}, dtype);
  HostTensor out({3 * ws, n}, dtype), pre({3 * ws, 2 * n}, dtype);
  const asynctp_tensor a_desc = a_shard.desc(), b_desc = b_gate_up.desc(), out_desc = out.desc(),
                       pre_desc = pre.desc(), none = no_tensor();
  C_ASSERT_OK(asynctp_reserve_all_gather_matmul_swiglu(ctx, &a_desc, &b_desc, 0, 0,
                                                       ASYNCTP_CONTEXT_STREAM));
  C_ASSERT_OK(asynctp_all_gather_matmul_swiglu(ctx, &a_desc, &b_desc, &out_desc, &pre_desc, &none,
                                               0, path, ASYNCTP_CONTEXT_STREAM));
  C_ASSERT_OK(asynctp_synchronize(ctx));
  const std::vector<float> p = matmul(a, b, k, 2 * n);
  EXPECT_EQ(values_of(pre), p) << "products, path " << path;
  const std::vector<float> got = values_of(out);
  const float tolerance = dtype == ASYNCTP_F32 ? 1e-6f : 1e-2f;
  for (int64_t i = 0; i < 3 * ws; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float g = p[i * 2 * n + j], u = p[i * 2 * n + n + j];
      const float expected = g / (1.0f + std::exp(-g)) * u;
      EXPECT_NEAR(got[i * n + j], expected, tolerance * (1.0f + std::fabs(expected)))
          << "out[" << i << ", " << j << "], path " << path;
    }
  }
}

TEST_P(CapiOps, AllGatherMatmulSwiglu) {
  const auto [ws, how] = GetParam();
  run_c(ws, how, [](asynctp_context ctx, int rank, int ws) {
    for (int32_t path : {ASYNCTP_PATH_SPLIT, ASYNCTP_PATH_FALLBACK, ASYNCTP_PATH_DEFAULT})
      check_all_gather_matmul_swiglu(ctx, rank, ws, ASYNCTP_F32, path);
    check_all_gather_matmul_swiglu(ctx, rank, ws, ASYNCTP_BF16, ASYNCTP_PATH_NATIVE);
    int32_t last = -2;
    C_ASSERT_OK(asynctp_last_path(ctx, "all_gather_matmul_swiglu", &last, nullptr, 0));
    EXPECT_EQ(last, ASYNCTP_PATH_NATIVE);
    // B with an odd number of columns: no gate | up split.
    const HostTensor a_shard({3, 8}, ASYNCTP_F32), b({8, 5}, ASYNCTP_F32),
        out({3 * ws, 2}, ASYNCTP_F32);
    const asynctp_tensor a_desc = a_shard.desc(), b_desc = b.desc(), out_desc = out.desc();
    EXPECT_EQ(asynctp_all_gather_matmul_swiglu(ctx, &a_desc, &b_desc, &out_desc, nullptr, nullptr,
                                               0, ASYNCTP_PATH_DEFAULT, ASYNCTP_CONTEXT_STREAM),
              ASYNCTP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(asynctp_last_error()).find("2N columns"), std::string::npos)
        << asynctp_last_error();
  });
}

// swiglu_backward: [dG | dU] from P = [G | U] and out's gradient, each rank alone; an output over
// an input is an invalid argument naming both.
TEST_P(CapiOps, SwigluBackward) {
  const auto [ws, how] = GetParam();
  run_c(ws, how, [](asynctp_context ctx, int rank, int ws) {
    const int64_t rows = 4, n = 6;
    const std::vector<float> p = seeded_values({rows, 2 * n}, 320 + rank);
    const std::vector<float> d = seeded_values({rows, n}, 330 + rank);
    const HostTensor pre = host_of(p, {rows, 2 * n}, ASYNCTP_F32);
    const HostTensor grad_out = host_of(d, {rows, n}, ASYNCTP_F32);
    HostTensor grad_pre({rows, 2 * n}, ASYNCTP_F32);
    const asynctp_tensor p_desc = pre.desc(), d_desc = grad_out.desc(), g_desc = grad_pre.desc();
    C_ASSERT_OK(asynctp_swiglu_backward(ctx, &d_desc, &p_desc, &g_desc, ASYNCTP_CONTEXT_STREAM));
    C_ASSERT_OK(asynctp_synchronize(ctx));
    const std::vector<float> got = values_of(grad_pre);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const float g = p[i * 2 * n + j], u = p[i * 2 * n + n + j], dv = d[i * n + j];
        const float s = 1.0f / (1.0f + std::exp(-g));
        EXPECT_NEAR(got[i * 2 * n + j], dv * u * s * (1.0f + g * (1.0f - s)), 1e-5f)
            << "dG[" << i << ", " << j << "]";
        EXPECT_NEAR(got[i * 2 * n + n + j], dv * g * s, 1e-5f) << "dU[" << i << ", " << j << "]";
      }
    }
    EXPECT_EQ(asynctp_swiglu_backward(ctx, &d_desc, &p_desc, &p_desc, ASYNCTP_CONTEXT_STREAM),
              ASYNCTP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(asynctp_last_error()).find("grad_gate_up"), std::string::npos)
        << asynctp_last_error();
  });
}

// out = RS(g)(As[0] @ Bs[0] + As[1] @ Bs[1]), sum and avg.
void check_matmul_reduce_scatter(asynctp_context ctx, int rank, int ws, Shape a_shape, int g,
                                 asynctp_dtype dtype, int32_t op, int32_t path) {
  const int64_t n = 4 * ws;
  const int64_t ks[] = {a_shape.back(), a_shape.back() + 2};
  Shape p_shape = a_shape;
  p_shape.back() = n;
  std::vector<float> sum(numel(p_shape), 0.0f);
  std::vector<HostTensor> as, bs;
  for (int r = 0; r < ws; ++r) {
    for (int i = 0; i < 2; ++i) {
      Shape ai = a_shape;
      ai.back() = ks[i];
      const auto a = seeded_values(ai, 200 + 10 * r + i);
      const auto b = seeded_values({ks[i], n}, 300 + 10 * r + i);
      const auto p = matmul(a, b, ks[i], n);
      for (size_t j = 0; j < sum.size(); ++j)
        sum[j] += p[j];
      if (r == rank) {
        as.push_back(host_of(a, ai, dtype));
        bs.push_back(host_of(b, {ks[i], n}, dtype));
      }
    }
  }
  std::vector<float> want = slice(sum, p_shape, g, rank, ws);
  if (op == ASYNCTP_REDUCE_AVG)
    for (float& v : want)
      v /= static_cast<float>(ws);
  Shape out_shape = p_shape;
  out_shape[wrap(g, p_shape.size())] /= ws;
  HostTensor out(out_shape, ASYNCTP_F32);
  const asynctp_tensor a_desc[] = {as[0].desc(), as[1].desc()};
  const asynctp_tensor b_desc[] = {bs[0].desc(), bs[1].desc()};
  const asynctp_tensor out_desc = out.desc();
  C_ASSERT_OK(asynctp_matmul_reduce_scatter(ctx, a_desc, b_desc, 2, &out_desc, op, g, path,
                                            ASYNCTP_CONTEXT_STREAM));
  C_ASSERT_OK(asynctp_synchronize(ctx));  // the host reads the result
  const std::vector<float> got = values_of(out);
  ASSERT_EQ(got.size(), want.size());
  for (size_t j = 0; j < got.size(); ++j)
    ASSERT_NEAR(got[j], want[j], 1e-6f * std::abs(want[j])) << "element " << j << ", path " << path;
}

TEST_P(CapiOps, MatmulReduceScatter) {
  const auto [ws, how] = GetParam();
  run_c(ws, how, [](asynctp_context ctx, int rank, int ws) {
    for (int32_t path : {ASYNCTP_PATH_SPLIT, ASYNCTP_PATH_FALLBACK}) {
      check_matmul_reduce_scatter(ctx, rank, ws, {2 * ws, 6}, 0, ASYNCTP_F32, ASYNCTP_REDUCE_SUM,
                                  path);
      check_matmul_reduce_scatter(ctx, rank, ws, {2, 3, 6}, -1, ASYNCTP_BF16, ASYNCTP_REDUCE_AVG,
                                  path);
    }
    int32_t last = -2;
    C_ASSERT_OK(asynctp_last_path(ctx, "matmul_reduce_scatter", &last, nullptr, 0));
    EXPECT_EQ(last, ASYNCTP_PATH_FALLBACK);
    C_ASSERT_OK(asynctp_last_path(ctx, "no_such_op", &last, nullptr, 0));
    EXPECT_EQ(last, -1);
  });
}

// float8 (e4m3fn) A and B of exact small values, tensor-wise scales; exact and with fast
// accumulation allowed (the f32 sums of these values are exact either way).
TEST_P(CapiOps, ScaledOps) {
  const auto [ws, how] = GetParam();
  run_c(ws, how, [](asynctp_context ctx, int rank, int ws) {
    const int64_t s = 4, k = 16, n = 8;
    auto f8 = [](const Shape& shape, uint64_t seed, std::vector<float>* values) {
      HostTensor t(shape, ASYNCTP_F8E4M3);
      values->resize(t.bytes.size());
      for (size_t i = 0; i < t.bytes.size(); ++i) {
        const int idx = small_int(seed, static_cast<int64_t>(i)) + 2 + (i % 3 == 0 ? 3 : 0);
        t.bytes[i] = kF8Bits[idx];
        (*values)[i] = kF8Values[idx];
      }
      return t;
    };
    auto scalar = [](float v) { return host_of({v}, {1}, ASYNCTP_F32); };
    const HostTensor a_scale = scalar(0.5f), b_scale = scalar(2.0f);
    const asynctp_tensor a_scale_d = a_scale.desc(), b_scale_d = b_scale.desc();
    // all_gather_scaled_matmul: A_shard [s, k] gathered on 0.
    std::vector<std::vector<float>> shard_values(ws);
    std::vector<HostTensor> shards;
    for (int r = 0; r < ws; ++r)
      shards.push_back(f8({s, k}, 500 + r, &shard_values[r]));
    std::vector<float> b_values;
    const HostTensor b = f8({k, n}, 600, &b_values);
    HostTensor out({ws * s, n}, ASYNCTP_F32);
    const asynctp_tensor a_d = shards[rank].desc(), b_d = b.desc(), out_d = out.desc();
    const asynctp_tensor none = no_tensor();
    const int32_t fast[] = {1};
    for (const int32_t* fast_accum : {static_cast<const int32_t*>(nullptr), fast}) {
      C_ASSERT_OK(asynctp_all_gather_scaled_matmul(ctx, &a_d, &a_scale_d, &b_d, &b_scale_d, 1,
                                                   &out_d, &none, 0, fast_accum, ASYNCTP_PATH_SPLIT,
                                                   ASYNCTP_CONTEXT_STREAM));
      C_ASSERT_OK(asynctp_synchronize(ctx));  // the host reads the result
      EXPECT_EQ(values_of(out), matmul(concat(shard_values, {s, k}, 0), b_values, k, n))
          << "fast_accum " << (fast_accum != nullptr);
    }
    // scaled_matmul_reduce_scatter: A [ws*s, k] on every rank, scattered on 0.
    std::vector<float> sum(ws * s * n, 0.0f);
    HostTensor my_a, my_b;
    for (int r = 0; r < ws; ++r) {
      std::vector<float> av, bv;
      HostTensor at = f8({ws * s, k}, 700 + r, &av);
      HostTensor bt = f8({k, n}, 800 + r, &bv);
      const auto p = matmul(av, bv, k, n);
      for (size_t j = 0; j < sum.size(); ++j)
        sum[j] += p[j];
      if (r == rank) {
        my_a = std::move(at);
        my_b = std::move(bt);
      }
    }
    HostTensor rs_out({s, n}, ASYNCTP_F32);
    const asynctp_tensor ma = my_a.desc(), mb = my_b.desc(), ro = rs_out.desc();
    for (int32_t path : {ASYNCTP_PATH_SPLIT, ASYNCTP_PATH_FALLBACK}) {
      for (int32_t fast_accum : {0, 1}) {
        C_ASSERT_OK(asynctp_scaled_matmul_reduce_scatter(ctx, &ma, &a_scale_d, &mb, &b_scale_d, &ro,
                                                         ASYNCTP_REDUCE_SUM, 0, fast_accum, path,
                                                         ASYNCTP_CONTEXT_STREAM));
        C_ASSERT_OK(asynctp_synchronize(ctx));  // the host reads the result
        EXPECT_EQ(values_of(rs_out), slice(sum, {ws * s, n}, 0, rank, ws))
            << "path " << path << ", fast_accum " << fast_accum;
      }
    }
  });
}

TEST_P(CapiOps, Collectives) {
  const auto [ws, how] = GetParam();
  run_c(ws, how, [](asynctp_context ctx, int rank, int ws) {
    const Shape shard = {2, 3, 4};
    std::vector<std::vector<float>> parts;
    for (int r = 0; r < ws; ++r)
      parts.push_back(seeded_values(shard, 900 + r));
    for (int dim : {0, 1, -1}) {
      Shape full = shard;
      full[wrap(dim, 3)] *= ws;
      const HostTensor in = host_of(parts[rank], shard, ASYNCTP_BF16);
      HostTensor out(full, ASYNCTP_BF16);
      const asynctp_tensor in_d = in.desc(), out_d = out.desc();
      C_ASSERT_OK(asynctp_all_gather(ctx, &in_d, &out_d, dim, ASYNCTP_CONTEXT_STREAM));
      C_ASSERT_OK(asynctp_synchronize(ctx));  // the host reads the result
      EXPECT_EQ(values_of(out), concat(parts, shard, dim)) << "all_gather dim " << dim;
    }
    // reduce_scatter of [2, 3*ws, 4] on dim 1, and all_reduce, summed in f32.
    const Shape big = {2, 3 * ws, 4};
    std::vector<float> sum(numel(big), 0.0f);
    for (int r = 0; r < ws; ++r) {
      const auto v = seeded_values(big, 1000 + r);
      for (size_t j = 0; j < sum.size(); ++j)
        sum[j] += v[j];
    }
    const HostTensor in = host_of(seeded_values(big, 1000 + rank), big, ASYNCTP_F32);
    HostTensor out({2, 3, 4}, ASYNCTP_F32);
    const asynctp_tensor in_d = in.desc(), out_d = out.desc();
    C_ASSERT_OK(
        asynctp_reduce_scatter(ctx, &in_d, &out_d, ASYNCTP_REDUCE_SUM, 1, ASYNCTP_CONTEXT_STREAM));
    C_ASSERT_OK(asynctp_synchronize(ctx));  // the host reads the result
    EXPECT_EQ(values_of(out), slice(sum, big, 1, rank, ws));
    // On the caller's stream: the CPU backend takes any handle (its one stream is eager), given
    // per call or set on the context.
    HostTensor inout = in;
    const asynctp_tensor io_d = inout.desc();
    C_ASSERT_OK(asynctp_all_reduce(ctx, &io_d, ASYNCTP_REDUCE_SUM, nullptr));
    C_ASSERT_OK(asynctp_synchronize(ctx));  // the host reads the result
    EXPECT_EQ(values_of(inout), sum);
    C_ASSERT_OK(asynctp_context_set_stream(ctx, nullptr));
    HostTensor out2({2, 3, 4}, ASYNCTP_F32);
    const asynctp_tensor out2_d = out2.desc();
    C_ASSERT_OK(
        asynctp_reduce_scatter(ctx, &in_d, &out2_d, ASYNCTP_REDUCE_SUM, 1, ASYNCTP_CONTEXT_STREAM));
    C_ASSERT_OK(asynctp_synchronize(ctx));  // the host reads the result
    EXPECT_EQ(values_of(out2), slice(sum, big, 1, rank, ws));
    C_ASSERT_OK(asynctp_barrier(ctx, ASYNCTP_CONTEXT_STREAM));
    C_ASSERT_OK(asynctp_barrier(ctx, nullptr));
    C_ASSERT_OK(asynctp_synchronize(ctx));
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CapiOps,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(Bootstrap::kEnv, Bootstrap::kStore)),
                         [](const ::testing::TestParamInfo<std::tuple<int, Bootstrap>>& info) {
                           return fmt::format(
                               "ws{}_{}", std::get<0>(info.param),
                               std::get<1>(info.param) == Bootstrap::kEnv ? "env" : "store");
                         });

}  // namespace
}  // namespace asynctp::capi_testing
