// The C ABI's groups and handles: subgroups of a 2 x 2 mesh, bad calls (descriptors, handles,
// options, op preconditions) with their statuses and messages, a timeout, and memory stats.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "capi/capi_testing.h"
#include "support/multiprocess.h"

namespace asynctp::capi_testing {
namespace {

// A 2 x 2 mesh at ws 4: TP groups {0, 1} and {2, 3} (rows), DP groups {0, 2} and {1, 3}
// (columns), both alive at once; an all_gather_matmul in each checked against its members'
// shards.
TEST(CapiGroups, SubgroupsOfAMesh) {
  auto statuses = run_env_ranks(4, 20'000, [&](const RendezvousInfo& info, asynctp_group world) {
    const int r = info.rank;
    const int32_t row[] = {r / 2 * 2, r / 2 * 2 + 1};
    const int32_t col[] = {r % 2, r % 2 + 2};
    asynctp_group tp = nullptr, dp = nullptr;
    C_ASSERT_OK(asynctp_group_split(world, row, 2, &tp));
    C_ASSERT_OK(asynctp_group_split(world, col, 2, &dp));
    int32_t tp_rank = -1, dp_rank = -1, tp_ws = -1;
    C_ASSERT_OK(asynctp_group_rank(tp, &tp_rank));
    C_ASSERT_OK(asynctp_group_rank(dp, &dp_rank));
    C_ASSERT_OK(asynctp_group_world_size(tp, &tp_ws));
    EXPECT_EQ(tp_rank, r % 2);
    EXPECT_EQ(dp_rank, r / 2);
    EXPECT_EQ(tp_ws, 2);
    asynctp_context tp_ctx = cpu_context(tp);
    asynctp_context dp_ctx = cpu_context(dp);
    ASSERT_NE(tp_ctx, nullptr);
    ASSERT_NE(dp_ctx, nullptr);
    // Each rank's shard is seeded by its world rank; the gathered A is its group's members' shards
    // in group order.
    auto run = [&](asynctp_context ctx, const int32_t* members) {
      const Shape shard = {3, 4};
      const HostTensor a = host_of(seeded_values(shard, 40 + r), shard, ASYNCTP_F32);
      const auto b_values = seeded_values({4, 2}, 77);
      const HostTensor b = host_of(b_values, {4, 2}, ASYNCTP_F32);
      HostTensor out({6, 2}, ASYNCTP_F32);
      const asynctp_tensor ad = a.desc(), bd = b.desc(), od = out.desc();
      C_ASSERT_OK(asynctp_all_gather_matmul(ctx, &ad, &bd, 1, &od, nullptr, 0, ASYNCTP_PATH_SPLIT,
                                            ASYNCTP_CONTEXT_STREAM));
      const std::vector<std::vector<float>> parts = {seeded_values(shard, 40 + members[0]),
                                                     seeded_values(shard, 40 + members[1])};
      C_ASSERT_OK(asynctp_synchronize(ctx));  // the host reads the result
      EXPECT_EQ(values_of(out), matmul(concat(parts, shard, 0), b_values, 4, 2));
    };
    run(tp_ctx, row);
    run(dp_ctx, col);
    run(tp_ctx, row);
    C_EXPECT_OK(asynctp_context_destroy(dp_ctx));
    C_EXPECT_OK(asynctp_context_destroy(tp_ctx));
    C_EXPECT_OK(asynctp_group_destroy(dp));
    C_EXPECT_OK(asynctp_group_destroy(tp));
    C_EXPECT_OK(asynctp_group_destroy(world));
  });
  EXPECT_RANKS_OK(statuses);
}

// Every bad call returns its status and a message naming what was wrong, and leaves the context
// usable.
TEST(CapiErrors, StatusesAndMessages) {
  auto statuses = run_env_ranks(2, 20'000, [&](const RendezvousInfo& info, asynctp_group group) {
    // Bad handles: NULL, and one destroyed.
    int32_t rank = 0;
    EXPECT_STATUS(asynctp_group_rank(nullptr, &rank), ASYNCTP_ERROR_INVALID_ARGUMENT,
                  "group is NULL");
    EXPECT_STATUS(asynctp_group_rank(group, nullptr), ASYNCTP_ERROR_INVALID_ARGUMENT,
                  "rank is NULL");
    // Bad options.
    asynctp_context_options o;
    asynctp_context_options_init(&o);
    asynctp_context ctx = nullptr;
    o.backend = "tpu";
    EXPECT_STATUS(asynctp_context_create(group, &o, &ctx), ASYNCTP_ERROR_INVALID_ARGUMENT,
                  "options->backend is \"tpu\"");
    if (!asynctp_cuda_available()) {
      o.backend = "cuda";
      EXPECT_STATUS(asynctp_context_create(group, &o, &ctx), ASYNCTP_ERROR_UNSUPPORTED,
                    "options->backend is \"cuda\"");
    }
    asynctp_context_options_init(&o);
    o.path = 9;
    EXPECT_STATUS(asynctp_context_create(group, &o, &ctx), ASYNCTP_ERROR_INVALID_ARGUMENT,
                  "path is 9");
    asynctp_context_options_init(&o);
    o.device_index = -2;
    EXPECT_STATUS(asynctp_context_create(group, &o, &ctx), ASYNCTP_ERROR_INVALID_ARGUMENT,
                  "options->device_index is -2");
    asynctp_context_options_init(&o);
    o.struct_size = 3;
    EXPECT_STATUS(asynctp_context_create(group, &o, &ctx), ASYNCTP_ERROR_INVALID_ARGUMENT,
                  "options->struct_size is 3");
    EXPECT_EQ(ctx, nullptr);

    ctx = cpu_context(group, 1 << 20);
    ASSERT_NE(ctx, nullptr);
    C_ASSERT_OK(asynctp_group_destroy(group));
    EXPECT_STATUS(asynctp_group_destroy(group), ASYNCTP_ERROR_INVALID_ARGUMENT,
                  "is not a live asynctp_group");

    const HostTensor a = host_of(seeded_values({3, 4}, 1), {3, 4}, ASYNCTP_F32);
    const HostTensor b = host_of(seeded_values({4, 2}, 2), {4, 2}, ASYNCTP_F32);
    HostTensor out({6, 2}, ASYNCTP_F32);
    const asynctp_tensor ad = a.desc(), bd = b.desc(), od = out.desc();
    auto agmm = [&](const asynctp_tensor& a_desc, const asynctp_tensor& b_desc,
                    const asynctp_tensor& out_desc) {
      return asynctp_all_gather_matmul(ctx, &a_desc, &b_desc, 1, &out_desc, nullptr, 0,
                                       ASYNCTP_PATH_DEFAULT, ASYNCTP_CONTEXT_STREAM);
    };
    EXPECT_STATUS(asynctp_context_set_stream(ctx, ASYNCTP_CONTEXT_STREAM),
                  ASYNCTP_ERROR_INVALID_ARGUMENT, "only op calls may pass");
    // Bad descriptors, each field.
    asynctp_tensor bad = ad;
    bad.ndim = 9;
    EXPECT_STATUS(agmm(bad, bd, od), ASYNCTP_ERROR_INVALID_ARGUMENT, "a_shard.ndim is 9");
    bad = ad;
    bad.ndim = -1;
    EXPECT_STATUS(agmm(bad, bd, od), ASYNCTP_ERROR_INVALID_ARGUMENT, "a_shard is required");
    bad = bd;
    bad.dtype = 7;
    EXPECT_STATUS(agmm(ad, bad, od), ASYNCTP_ERROR_INVALID_ARGUMENT, "bs[0].dtype is 7");
    bad = od;
    bad.device_type = 5;
    EXPECT_STATUS(agmm(ad, bd, bad), ASYNCTP_ERROR_INVALID_ARGUMENT, "outs[0].device_type is 5");
    bad = od;
    bad.device_type = ASYNCTP_DEVICE_CUDA;
    EXPECT_STATUS(agmm(ad, bd, bad), ASYNCTP_ERROR_INVALID_ARGUMENT,
                  "outs[0] is on cuda:0, but the context runs on cpu");
    bad = ad;
    bad.data = nullptr;
    EXPECT_STATUS(agmm(bad, bd, od), ASYNCTP_ERROR_INVALID_ARGUMENT,
                  "a_shard.data is NULL but the tensor has 12 elements");
    bad = ad;
    bad.shape[0] = -3;
    EXPECT_STATUS(agmm(bad, bd, od), ASYNCTP_ERROR_INVALID_ARGUMENT, "a_shard.shape[0] is -3");
    bad = ad;
    bad.strides[1] = -1;
    EXPECT_STATUS(agmm(bad, bd, od), ASYNCTP_ERROR_INVALID_ARGUMENT, "a_shard.strides[1] is -1");
    EXPECT_STATUS(asynctp_all_gather_matmul(ctx, &ad, &bd, 0, &od, nullptr, 0, ASYNCTP_PATH_DEFAULT,
                                            ASYNCTP_CONTEXT_STREAM),
                  ASYNCTP_ERROR_INVALID_ARGUMENT, "num_bs is 0");
    EXPECT_STATUS(
        asynctp_all_gather_matmul(ctx, &ad, &bd, 1, &od, nullptr, 0, 17, ASYNCTP_CONTEXT_STREAM),
        ASYNCTP_ERROR_INVALID_ARGUMENT, "path is 17");
    EXPECT_STATUS(asynctp_all_reduce(ctx, &od, 4, ASYNCTP_CONTEXT_STREAM),
                  ASYNCTP_ERROR_INVALID_ARGUMENT, "reduce_op is 4");
    EXPECT_STATUS(asynctp_barrier(nullptr, ASYNCTP_CONTEXT_STREAM), ASYNCTP_ERROR_INVALID_ARGUMENT,
                  "ctx");
    // Valid, but not on the path asked for: f32 operands on the native path.
    EXPECT_STATUS(asynctp_all_gather_matmul(ctx, &ad, &bd, 1, &od, nullptr, 0, ASYNCTP_PATH_NATIVE,
                                            ASYNCTP_CONTEXT_STREAM),
                  ASYNCTP_ERROR_UNSUPPORTED,
                  "the native path was requested but cannot run: inputs are not bf16, f16 or "
                  "float8 e4m3; got inputs = f32");
    // Valid, but not served: the scaled form gathering the contraction dim.
    const HostTensor f8a({3, 4}, ASYNCTP_F8E4M3), f8b({8, 2}, ASYNCTP_F8E4M3);
    const HostTensor scale = host_of({1.0f}, {1}, ASYNCTP_F32);
    const asynctp_tensor f8ad = f8a.desc(), f8bd = f8b.desc(), sd = scale.desc();
    HostTensor f8out({3, 2}, ASYNCTP_F32);
    const asynctp_tensor f8od = f8out.desc();
    EXPECT_STATUS(
        asynctp_all_gather_scaled_matmul(ctx, &f8ad, &sd, &f8bd, &sd, 1, &f8od, nullptr, -1,
                                         nullptr, ASYNCTP_PATH_DEFAULT, ASYNCTP_CONTEXT_STREAM),
        ASYNCTP_ERROR_UNSUPPORTED, "gather_dim -1 is a_shard's contraction dim");
    // fast_accum flags are 0 or 1, each named.
    const int32_t bad_fast[] = {2};
    EXPECT_STATUS(
        asynctp_all_gather_scaled_matmul(ctx, &f8ad, &sd, &f8bd, &sd, 1, &f8od, nullptr, 0,
                                         bad_fast, ASYNCTP_PATH_DEFAULT, ASYNCTP_CONTEXT_STREAM),
        ASYNCTP_ERROR_INVALID_ARGUMENT, "fast_accum[0] is 2, expected 0 or 1");
    EXPECT_STATUS(
        asynctp_scaled_matmul_reduce_scatter(ctx, &f8ad, &sd, &f8bd, &sd, &f8od, ASYNCTP_REDUCE_SUM,
                                             0, -1, ASYNCTP_PATH_DEFAULT, ASYNCTP_CONTEXT_STREAM),
        ASYNCTP_ERROR_INVALID_ARGUMENT, "fast_accum is -1, expected 0 or 1");
    // An op's own precondition: B's K does not match A's.
    const HostTensor b_bad = host_of(seeded_values({5, 2}, 2), {5, 2}, ASYNCTP_F32);
    const asynctp_tensor bbd = b_bad.desc();
    EXPECT_EQ(agmm(ad, bbd, od), ASYNCTP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(last_error().find("asynctp_all_gather_matmul: "), std::string::npos) << last_error();
    // A good call still works (on both ranks: the bad ones failed before any communication),
    // and clears the last error.
    C_ASSERT_OK(agmm(ad, bd, od));
    EXPECT_EQ(last_error(), "");

    C_EXPECT_OK(asynctp_context_destroy(ctx));
    EXPECT_STATUS(asynctp_synchronize(ctx), ASYNCTP_ERROR_INVALID_ARGUMENT,
                  "is not a live asynctp_context");
    EXPECT_STATUS(asynctp_context_destroy(nullptr), ASYNCTP_ERROR_INVALID_ARGUMENT, "ctx is NULL");
  });
  EXPECT_RANKS_OK(statuses);
}

// Operands that share memory: an output over an input or over another output is an invalid
// argument whose message names both (the op's own check), at ws 1 and 2; descriptors that only
// touch pass.
TEST(CapiErrors, OverlappingOperands) {
  for (const int ws : {1, 2}) {
    auto statuses = run_env_ranks(ws, 20'000, [&](const RendezvousInfo&, asynctp_group group) {
      asynctp_context ctx = cpu_context(group);
      ASSERT_NE(ctx, nullptr);
      // Every operand a view of one buffer of 256 f32, at an element offset.
      HostTensor pool({256}, ASYNCTP_F32);
      auto at = [&](int64_t offset, const Shape& shape) {
        asynctp_tensor t = HostTensor(shape, ASYNCTP_F32).desc();
        t.data = pool.bytes.data() + offset * 4;
        return t;
      };
      // A_shard [3, 4] at 0, B [4, 2] at 16, outs [3ws, 2] at 32, A_out [3ws, 4] at 64.
      const asynctp_tensor a = at(0, {3, 4}), b = at(16, {4, 2}), out = at(32, {3 * ws, 2});
      const asynctp_tensor a_out = at(64, {3 * ws, 4});
      auto agmm = [&](const asynctp_tensor& out_desc, const asynctp_tensor* a_out_desc) {
        return asynctp_all_gather_matmul(ctx, &a, &b, 1, &out_desc, a_out_desc, 0,
                                         ASYNCTP_PATH_DEFAULT, ASYNCTP_CONTEXT_STREAM);
      };
      C_ASSERT_OK(agmm(out, &a_out));
      C_ASSERT_OK(asynctp_synchronize(ctx));
      EXPECT_STATUS(agmm(at(2, {3 * ws, 2}), &a_out), ASYNCTP_ERROR_INVALID_ARGUMENT,
                    "asynctp_all_gather_matmul: all_gather_matmul: outs[0] (f32[");
      EXPECT_NE(last_error().find(") overlaps A_shard (f32[3, 4] strides [4, 1] on cpu, bytes ["),
                std::string::npos)
          << last_error();
      // A_out's first row is out's last.
      const asynctp_tensor a_out_on_out = at(32 + 6 * ws - 2, {3 * ws, 4});
      EXPECT_STATUS(agmm(out, &a_out_on_out), ASYNCTP_ERROR_INVALID_ARGUMENT,
                    ") overlaps A_out (f32[");
      // matmul_reduce_scatter: out over B; then the output right after B.
      const asynctp_tensor rs_a = at(0, {2 * ws, 4});
      auto mmrs = [&](const asynctp_tensor& out_desc) {
        return asynctp_matmul_reduce_scatter(ctx, &rs_a, &b, 1, &out_desc, ASYNCTP_REDUCE_SUM, 0,
                                             ASYNCTP_PATH_DEFAULT, ASYNCTP_CONTEXT_STREAM);
      };
      EXPECT_STATUS(mmrs(at(20, {2, 2})), ASYNCTP_ERROR_INVALID_ARGUMENT,
                    "matmul_reduce_scatter: out (f32[2, 2] strides [2, 1] on cpu, bytes [");
      EXPECT_NE(last_error().find(") overlaps B (f32[4, 2]"), std::string::npos) << last_error();
      C_EXPECT_OK(mmrs(at(24, {2, 2})));
      // all_gather into memory that holds its input.
      const asynctp_tensor in = at(0, {2, 4}), gathered = at(4, {2 * ws, 4});
      EXPECT_STATUS(asynctp_all_gather(ctx, &in, &gathered, 0, ASYNCTP_CONTEXT_STREAM),
                    ASYNCTP_ERROR_INVALID_ARGUMENT, "all_gather: output (f32[");
      C_EXPECT_OK(asynctp_synchronize(ctx));
      C_EXPECT_OK(asynctp_context_destroy(ctx));
      C_EXPECT_OK(asynctp_group_destroy(group));
    });
    EXPECT_RANKS_OK(statuses) << "ws " << ws;
  }
}

// A peer that never joins the collective: the waiting rank gets ASYNCTP_ERROR_TIMEOUT naming
// the wait.
// The harness itself: a port that another program took between free_port() and rank 0's listen
// (here a listener held for the first attempt) makes the run start again on another port. (In
// the first attempt rank 1 waits on the held listener, which never answers, until its 2 s
// timeout, and reports that failure; the run that counts is the second.)
TEST(CapiHarness, ARunWhosePortWasTakenStartsAgainOnAnother) {
  int held_port = 0;
  const net::Fd held = net::tcp_listen("127.0.0.1", 0, &held_port);
  std::vector<int> picked;
  auto statuses = run_env_ranks(
      2, 2'000, [&](const RendezvousInfo&, asynctp_group group) { asynctp_group_destroy(group); },
      [&] {
        picked.push_back(picked.empty() ? held_port : free_port());
        return picked.back();
      });
  EXPECT_RANKS_OK(statuses);
  ASSERT_EQ(picked.size(), 2u);
  EXPECT_EQ(picked[0], held_port);
  EXPECT_NE(picked[1], held_port);
}

TEST(CapiErrors, TimeoutStatus) {
  auto statuses = run_env_ranks(2, 1'500, [&](const RendezvousInfo& info, asynctp_group group) {
    asynctp_context ctx = cpu_context(group);
    ASSERT_NE(ctx, nullptr);
    const HostTensor in = host_of(seeded_values({2, 2}, 1), {2, 2}, ASYNCTP_F32);
    HostTensor out({4, 2}, ASYNCTP_F32);
    const asynctp_tensor id = in.desc(), od = out.desc();
    if (info.rank == 0) {
      EXPECT_STATUS(asynctp_all_gather(ctx, &id, &od, 0, ASYNCTP_CONTEXT_STREAM),
                    ASYNCTP_ERROR_TIMEOUT, "rank 0");
    }
    // Rank 1 skips the collective; both stay until rank 0 has given up, then leave without
    // further collective work (the group is not to be trusted after a timeout).
    std::this_thread::sleep_for(std::chrono::milliseconds(info.rank == 1 ? 4'000 : 0));
    asynctp_context_destroy(ctx);
    asynctp_group_destroy(group);
  });
  EXPECT_RANKS_OK(statuses);
}

}  // namespace
}  // namespace asynctp::capi_testing
