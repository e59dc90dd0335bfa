// The fused ops on real GPUs (label gpu): every op against an f64 host reference on 2 and 4
// GPUs, every gather/scatter dim, 2-D and 3-D, bf16 and f16, float8; determinism of
// matmul_reduce_scatter; capture and replay in a CUDA graph; a rank that never joins an op makes
// the others fail with the timeout error. Skips, saying why, without enough GPUs.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/deadline.h"
#include "device/cuda/cuda_graph.h"
#include "ops/collectives.h"
#include "ops/cuda/gpu_testing.h"
#include "ops/fused_matmul.h"
#include "ops/matmul_common.h"
#include "ops/op_testing.h"
#include "support/multiprocess.h"

namespace asynctp::testing {
namespace {

// Waits meant to succeed are bounded by ASYNCTP_TIMEOUT (at least 30 s), so that a sanitizer
// run, which slows every kernel down, can lengthen them; a test of a timeout passes its own.
HarnessOptions gpu_options(std::optional<Millis> group_timeout = std::nullopt) {
  HarnessOptions o;
  o.context.backend = "cuda";
  o.group_timeout = group_timeout.value_or(std::max(Millis(30'000), default_timeout()));
  o.run_timeout = std::max(Millis(180'000), 2 * o.group_timeout);
  return o;
}

// Index math over row-major shapes.
std::vector<int64_t> unravel(int64_t linear, const Dims& shape) {
  std::vector<int64_t> idx(shape.size());
  for (int d = shape.size() - 1; d >= 0; --d) {
    idx[d] = linear % shape[d];
    linear /= shape[d];
  }
  return idx;
}
int64_t ravel(const std::vector<int64_t>& idx, const Dims& shape) {
  int64_t linear = 0;
  for (int d = 0; d < shape.size(); ++d)
    linear = linear * shape[d] + idx[d];
  return linear;
}

// The gathered A (row-major values) from every rank's shard, shards placed along dim g.
std::vector<float> gather_host(const std::vector<std::vector<float>>& shards,
                               const Dims& shard_shape, int g) {
  Dims full = shard_shape;
  full[g] *= static_cast<int64_t>(shards.size());
  std::vector<float> out(full.product());
  for (size_t r = 0; r < shards.size(); ++r) {
    for (int64_t i = 0; i < shard_shape.product(); ++i) {
      auto idx = unravel(i, shard_shape);
      idx[g] += static_cast<int64_t>(r) * shard_shape[g];
      out[ravel(idx, full)] = shards[r][i];
    }
  }
  return out;
}

// Chunk `part` of `whole` (row-major values of `shape`) along dim g into ws parts.
std::vector<double> chunk_host(const std::vector<double>& whole, const Dims& shape, int g, int ws,
                               int part) {
  Dims chunk = shape;
  chunk[g] /= ws;
  std::vector<double> out(chunk.product());
  for (int64_t i = 0; i < chunk.product(); ++i) {
    auto idx = unravel(i, chunk);
    idx[g] += part * chunk[g];
    out[i] = whole[ravel(idx, shape)];
  }
  return out;
}

std::vector<float> values_of(Dims shape, DType dtype, uint64_t seed, Values kind) {
  OwnedTensor t = empty_host(shape, dtype);
  fill_seeded(t, seed, kind);
  return to_vector(t);
}

// ---- all_gather_matmul ----------------------------------------------------------------------

struct AgCase {
  int ws;
  std::vector<int64_t> shard;  // A_shard shape
  int gather_dim;
  DType dtype;
  int num_b;
  bool return_a;
  // The native path pushes each shard in as many pieces as it may (push_piece_bytes 1).
  bool pieces = false;
};

std::string ag_name(const ::testing::TestParamInfo<AgCase>& info) {
  const auto& c = info.param;
  std::string shape;
  for (auto d : c.shard)
    shape += std::to_string(d) + "x";
  return fmt::format("ws{}_{}g{}_{}_b{}{}{}", c.ws, shape, c.gather_dim, dtype_name(c.dtype),
                     c.num_b, c.return_a ? "_retA" : "", c.pieces ? "_pieces" : "");
}

class AllGatherMatmulGpu : public ::testing::TestWithParam<AgCase> {};

TEST_P(AllGatherMatmulGpu, MatchesHostReference) {
  const AgCase c = GetParam();
  SKIP_UNLESS_GPUS(c.ws);
  const Dims shard_shape(std::span<const int64_t>(c.shard));
  HarnessOptions options = gpu_options();
  if (c.pieces) options.context.push_piece_bytes = 1;
  auto statuses = run_ranks(
      c.ws,
      [&](OpContext& ctx) {
        const int ws = ctx.world_size();
        const int g = c.gather_dim < 0 ? c.gather_dim + shard_shape.size() : c.gather_dim;
        Dims full = shard_shape;
        full[g] *= ws;
        const int64_t k = full.back();
        const int64_t rows = full.product() / k;
        std::vector<std::vector<float>> shards;
        for (int r = 0; r < ws; ++r)
          shards.push_back(values_of(shard_shape, c.dtype, seed_of({1, static_cast<uint64_t>(r)}),
                                     Values::kRandom));
        const auto gathered = gather_host(shards, shard_shape, g);

        DeviceTensor a =
            upload_seeded(ctx, shard_shape, c.dtype,
                          seed_of({1, static_cast<uint64_t>(ctx.rank())}), Values::kRandom);
        std::vector<DeviceTensor> bs;
        std::vector<Tensor> b_views, out_views;
        std::vector<OwnedTensor> outs;
        const int64_t ns[] = {80, 48, 112};
        for (int i = 0; i < c.num_b; ++i) {
          bs.push_back(upload_seeded(ctx, {k, ns[i]}, c.dtype,
                                     seed_of({2, static_cast<uint64_t>(i)}), Values::kRandom));
          b_views.push_back(*bs.back());
          Dims out_shape = full;
          out_shape[out_shape.size() - 1] = ns[i];
          outs.push_back(device_empty(ctx, out_shape, c.dtype));
          out_views.push_back(outs.back());
        }
        OwnedTensor a_out = c.return_a ? device_empty(ctx, full, c.dtype) : OwnedTensor{};
        // The native path where it can run (row gather with no batch dims before g), and the split
        // one.
        std::vector<PathChoice> paths{PathChoice::kSplit};
        bool rows_only = g != static_cast<int>(shard_shape.size()) - 1;
        for (int d = 0; d < g; ++d)
          rows_only = rows_only && shard_shape[d] == 1;
        if (rows_only) paths.push_back(PathChoice::kNative);
        for (PathChoice path : paths) {
          SCOPED_TRACE(fmt::format("path {}", path_choice_name(path)));
          // NaN first: a path that leaves rows unwritten must not pass on the previous path's.
          for (const Tensor& o : out_views)
            ctx.backend().fill(o, std::nanf(""), ctx.stream());
          if (c.return_a) ctx.backend().fill(a_out, std::nanf(""), ctx.stream());
          all_gather_matmul(ctx, *a, b_views, out_views, c.return_a ? a_out.tensor : Tensor(),
                            {.gather_dim = c.gather_dim, .path = path});
          EXPECT_EQ(ctx.usage().last("all_gather_matmul")->path,
                    path == PathChoice::kNative ? Path::kNative : Path::kSplit);
          for (int i = 0; i < c.num_b; ++i) {
            std::vector<double> expected(rows * ns[i], 0.0);
            host_gemm_add(gathered, to_vector(bs[i].host), expected, rows, k, ns[i]);
            const OwnedTensor got = download(ctx, out_views[i]);
            EXPECT_LT(rel_error(got, expected), 1e-2) << "B " << i;
          }
          if (c.return_a) {
            const OwnedTensor got = download(ctx, a_out);
            EXPECT_EQ(to_vector(got), gathered) << "the returned A is not the gathered A";
          }
        }
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

std::vector<AgCase> ag_cases() {
  std::vector<AgCase> cases;
  for (int ws : {2, 4}) {
    for (DType dt : {DType::kBF16, DType::kF16}) {
      cases.push_back({ws, {96, 128}, 0, dt, 1, false});
      cases.push_back({ws, {96, 64}, 1, dt, 1, false});  // contraction-dim gather
      cases.push_back({ws, {2, 48, 64}, 0, dt, 3, true});
      cases.push_back({ws, {2, 48, 64}, 1, dt, 1, true});  // sequence dim of 3-D activations
      cases.push_back({ws, {2, 48, 64}, 2, dt, 3, false});
    }
    cases.push_back(
        {ws, {512, 256}, 0, DType::kBF16, 1, false});  // big enough for real chunk GEMMs
    cases.push_back(
        {ws, {300, 136}, 0, DType::kF16, 2, true});  // chunks that straddle 128-row tiles
    // Whole tiles: the native path reads the own chunk in place and returns A from the pushes.
    cases.push_back({ws, {256, 64}, 0, DType::kBF16, 2, true});
    // Shards pushed in pieces: 4 whole-tile pieces; 3 pieces, the last one short (44 rows), with
    // a chunk grid off the tile grid (the own shard's edge rows also copied into its slot).
    cases.push_back({ws, {512, 256}, 0, DType::kBF16, 2, true, true});
    cases.push_back({ws, {300, 136}, 0, DType::kF16, 1, false, true});
  }
  // World size 8 (the usual tensor-parallel degree in a node): fewer cases, each one starts 8
  // processes; every gather dim, both dtypes, the tails and the native path's whole tiles.
  cases.push_back({8, {96, 128}, 0, DType::kBF16, 1, false});
  cases.push_back({8, {96, 64}, 1, DType::kF16, 1, false});
  cases.push_back({8, {2, 48, 64}, 1, DType::kBF16, 1, true});
  cases.push_back({8, {2, 48, 64}, 2, DType::kF16, 3, false});
  cases.push_back({8, {512, 256}, 0, DType::kBF16, 1, false});
  cases.push_back({8, {300, 136}, 0, DType::kF16, 2, true});
  cases.push_back({8, {256, 64}, 0, DType::kBF16, 2, true});
  cases.push_back({8, {512, 256}, 0, DType::kBF16, 1, true, true});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, AllGatherMatmulGpu, ::testing::ValuesIn(ag_cases()), ag_name);

// ---- matmul_reduce_scatter ------------------------------------------------------------------

struct RsCase {
  int ws;
  std::vector<int64_t> a;  // A shape (K last)
  int64_t n;
  int scatter_dim;
  DType dtype;
  ReduceOp op;
  int pairs;
};

std::string rs_name(const ::testing::TestParamInfo<RsCase>& info) {
  const auto& c = info.param;
  std::string shape;
  for (auto d : c.a)
    shape += std::to_string(d) + "x";
  return fmt::format("ws{}_{}n{}_s{}_{}_{}_p{}", c.ws, shape, c.n, c.scatter_dim,
                     dtype_name(c.dtype), reduce_op_name(c.op), c.pairs);
}

class MatmulReduceScatterGpu : public ::testing::TestWithParam<RsCase> {};

TEST_P(MatmulReduceScatterGpu, MatchesHostReferenceAndIsDeterministic) {
  const RsCase c = GetParam();
  SKIP_UNLESS_GPUS(c.ws);
  const Dims a_shape(std::span<const int64_t>(c.a));
  auto statuses = run_ranks(
      c.ws,
      [&](OpContext& ctx) {
        const int ws = ctx.world_size();
        const int64_t k = a_shape.back();
        const int64_t rows = a_shape.product() / k;
        Dims product = a_shape;
        product[product.size() - 1] = c.n;
        const int g = c.scatter_dim < 0 ? c.scatter_dim + product.size() : c.scatter_dim;
        // Every rank's partial product, summed in f64: the exact reduce-scatter input.
        std::vector<double> total(product.product(), 0.0);
        for (int r = 0; r < ws; ++r) {
          for (int p = 0; p < c.pairs; ++p) {
            const auto av = values_of(
                a_shape, c.dtype, seed_of({3, static_cast<uint64_t>(r), static_cast<uint64_t>(p)}),
                Values::kRandom);
            const auto bv = values_of(
                {k, c.n}, c.dtype, seed_of({4, static_cast<uint64_t>(r), static_cast<uint64_t>(p)}),
                Values::kRandom);
            host_gemm_add(av, bv, total, rows, k, c.n, c.op == ReduceOp::kAvg ? 1.0 / ws : 1.0);
          }
        }
        const auto expected = chunk_host(total, product, g, ws, ctx.rank());

        std::vector<DeviceTensor> as, bs;
        std::vector<Tensor> a_views, b_views;
        for (int p = 0; p < c.pairs; ++p) {
          const uint64_t r = static_cast<uint64_t>(ctx.rank());
          as.push_back(upload_seeded(ctx, a_shape, c.dtype,
                                     seed_of({3, r, static_cast<uint64_t>(p)}), Values::kRandom));
          bs.push_back(upload_seeded(ctx, {k, c.n}, c.dtype,
                                     seed_of({4, r, static_cast<uint64_t>(p)}), Values::kRandom));
          a_views.push_back(*as.back());
          b_views.push_back(*bs.back());
        }
        Dims out_shape = product;
        out_shape[g] /= ws;
        OwnedTensor out = device_empty(ctx, out_shape, c.dtype);
        OwnedTensor again = device_empty(ctx, out_shape, c.dtype);
        std::vector<PathChoice> paths{PathChoice::kSplit};
        // Native: one product, row scatter, every owner's rows a whole number of 128-row tiles.
        bool rows_only = g != static_cast<int>(product.size()) - 1;
        for (int d = 0; d < g; ++d)
          rows_only = rows_only && product[d] == 1;
        if (rows_only && c.pairs == 1 && (rows / ws) % 128 == 0) {
          paths.push_back(PathChoice::kNative);
        }
        for (PathChoice path : paths) {
          SCOPED_TRACE(fmt::format("path {}", path_choice_name(path)));
          const MatmulReduceScatterOptions options{
              .reduce_op = c.op, .scatter_dim = c.scatter_dim, .path = path};
          ctx.backend().fill(out, std::nanf(""), ctx.stream());
          ctx.backend().fill(again, std::nanf(""), ctx.stream());
          matmul_reduce_scatter(ctx, a_views, b_views, out, options);
          matmul_reduce_scatter(ctx, a_views, b_views, again, options);
          EXPECT_EQ(ctx.usage().last("matmul_reduce_scatter")->path,
                    path == PathChoice::kNative ? Path::kNative : Path::kSplit);
          const OwnedTensor got = download(ctx, out);
          EXPECT_LT(rel_error(got, expected), 1e-2);
          EXPECT_TRUE(same_bits(download(ctx, again), got)) << "two runs gave different bits";
        }
      },
      gpu_options());
  EXPECT_RANKS_OK(statuses);
}

std::vector<RsCase> rs_cases() {
  std::vector<RsCase> cases;
  for (int ws : {2, 4}) {
    for (DType dt : {DType::kBF16, DType::kF16}) {
      cases.push_back({ws, {128, 96}, 64, 0, dt, ReduceOp::kSum, 1});
      cases.push_back({ws, {64, 96}, 128, 1, dt, ReduceOp::kAvg, 1});  // output-column scatter
      // The scattered outer dim must divide by the world size: as many batches as ranks.
      cases.push_back({ws, {ws, 64, 48}, 80, 0, dt, ReduceOp::kSum, 1});
      cases.push_back({ws, {2, 64, 48}, 80, 1, dt, ReduceOp::kAvg, 2});  // sum of two products
      cases.push_back({ws, {2, 32, 48}, 128, 2, dt, ReduceOp::kSum, 1});
    }
    cases.push_back({ws, {512, 256}, 384, 0, DType::kBF16, ReduceOp::kSum, 1});
    cases.push_back({ws, {1024, 72}, 200, 0, DType::kF16, ReduceOp::kAvg, 1});  // K and N tails of
                                                                                // the native GEMM
    cases.push_back({ws, {1, 1024, 64}, 96, 1, DType::kBF16, ReduceOp::kSum, 1});
  }
  // The native path's pieces by columns: 2048-row chunks of 2304 columns (9.4 MB) pushed in two
  // (1280 and 1024 columns); chunks of 40 m-tiles (the walk's groups must divide them: 20).
  cases.push_back({2, {4096, 64}, 2304, 0, DType::kBF16, ReduceOp::kSum, 1});
  cases.push_back({2, {10240, 64}, 512, 0, DType::kBF16, ReduceOp::kSum, 1});
  // Column pieces at ws 4 (chunks of 1024 x 4096: two pieces of 4 MiB) and chunks of 4 m-tiles
  // at ws 8.
  cases.push_back({4, {4096, 64}, 4096, 0, DType::kBF16, ReduceOp::kSum, 1});
  cases.push_back({8, {4096, 64}, 512, 0, DType::kF16, ReduceOp::kAvg, 1});
  // World size 8: every scatter dim, both reductions and dtypes, the native GEMM's tails.
  cases.push_back({8, {128, 96}, 64, 0, DType::kBF16, ReduceOp::kSum, 1});
  cases.push_back({8, {64, 96}, 128, 1, DType::kF16, ReduceOp::kAvg, 1});
  cases.push_back({8, {8, 64, 48}, 80, 0, DType::kBF16, ReduceOp::kSum, 1});
  cases.push_back({8, {2, 64, 48}, 80, 1, DType::kF16, ReduceOp::kAvg, 2});
  cases.push_back({8, {2, 32, 48}, 128, 2, DType::kBF16, ReduceOp::kSum, 1});
  cases.push_back({8, {512, 256}, 384, 0, DType::kBF16, ReduceOp::kSum, 1});
  cases.push_back({8, {1024, 72}, 200, 0, DType::kF16, ReduceOp::kAvg, 1});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, MatmulReduceScatterGpu, ::testing::ValuesIn(rs_cases()), rs_name);

// ---- float8 ---------------------------------------------------------------------------------

// The row-major values of t^T [cols, rows] from those of t [rows, cols] (B [k, n] from its
// K-major storage [n, k]).
std::vector<float> rows_of_transpose(const std::vector<float>& t, int64_t rows, int64_t cols) {
  std::vector<float> out(rows * cols);
  for (int64_t i = 0; i < cols; ++i)
    for (int64_t j = 0; j < rows; ++j)
      out[i * rows + j] = t[j * cols + i];
  return out;
}

class ScaledGpu : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(ScaledGpu, BothOpsMatchHostReference) {
  const auto [row_a, col_b] = GetParam();
  SKIP_UNLESS_GPUS(2);
  auto statuses = run_ranks(
      2,
      [&](OpContext& ctx) {
        const int ws = ctx.world_size();
        const int64_t ms = 64, k = 128, n = 96;
        const uint64_t r = static_cast<uint64_t>(ctx.rank());
        // all_gather_scaled_matmul: A_shard [ms, k] e4m3 with its scale, B [k, n] stored
        // column-major.
        DeviceTensor a =
            upload_seeded(ctx, {ms, k}, DType::kF8E4M3, seed_of({5, r}), Values::kQuarters);
        DeviceTensor sa =
            row_a ? upload_seeded(ctx, {ms, 1}, DType::kF32, seed_of({6, r}), Values::kPositive)
                  : upload_seeded(ctx, {}, DType::kF32, seed_of({6, 0}), Values::kPositive);
        DeviceTensor b =
            upload_seeded(ctx, {n, k}, DType::kF8E4M3, seed_of({7}), Values::kQuarters);
        const Tensor b_t = (*b).t();  // [k, n], column-major
        DeviceTensor sb =
            col_b ? upload_seeded(ctx, {1, n}, DType::kF32, seed_of({8}), Values::kPositive)
                  : upload_seeded(ctx, {}, DType::kF32, seed_of({8}), Values::kPositive);
        OwnedTensor out = device_empty(ctx, {ms * ws, n}, DType::kBF16);
        const Tensor bs[] = {b_t};
        const Tensor b_scales[] = {*sb};
        const Tensor outs[] = {out.tensor};
        all_gather_scaled_matmul(ctx, *a, *sa, bs, b_scales, outs);
        // Reference: every rank's shard and scale rebuilt on the host.
        const std::vector<float> bkn = rows_of_transpose(to_vector(b.host), n, k);
        const auto sbv = to_vector(sb.host);
        std::vector<double> expected(ms * ws * n, 0.0);
        for (int q = 0; q < ws; ++q) {
          const auto av = values_of({ms, k}, DType::kF8E4M3, seed_of({5, static_cast<uint64_t>(q)}),
                                    Values::kQuarters);
          const auto sav =
              row_a ? values_of({ms, 1}, DType::kF32, seed_of({6, static_cast<uint64_t>(q)}),
                                Values::kPositive)
                    : values_of({}, DType::kF32, seed_of({6, 0}), Values::kPositive);
          std::vector<double> part(ms * n, 0.0);
          host_gemm_add(av, bkn, part, ms, k, n);
          for (int64_t i = 0; i < ms; ++i)
            for (int64_t j = 0; j < n; ++j)
              expected[(q * ms + i) * n + j] =
                  part[i * n + j] * sav[row_a ? i : 0] * sbv[col_b ? j : 0];
        }
        EXPECT_LT(rel_error(download(ctx, out), expected), 1e-2);

        // scaled_matmul_reduce_scatter: A [ms*ws, k] e4m3 with its scale, B^T [n, k].
        DeviceTensor a2 =
            upload_seeded(ctx, {ms * ws, k}, DType::kF8E4M3, seed_of({9, r}), Values::kQuarters);
        DeviceTensor sa2 =
            row_a
                ? upload_seeded(ctx, {ms * ws, 1}, DType::kF32, seed_of({10, r}), Values::kPositive)
                : upload_seeded(ctx, {}, DType::kF32, seed_of({10, r}), Values::kPositive);
        OwnedTensor out2 = device_empty(ctx, {ms, n}, DType::kBF16);
        scaled_matmul_reduce_scatter(ctx, *a2, *sa2, b_t, *sb, out2);
        std::vector<double> total(ms * ws * n, 0.0);
        for (int q = 0; q < ws; ++q) {
          const auto av = values_of({ms * ws, k}, DType::kF8E4M3,
                                    seed_of({9, static_cast<uint64_t>(q)}), Values::kQuarters);
          const auto sav =
              row_a ? values_of({ms * ws, 1}, DType::kF32, seed_of({10, static_cast<uint64_t>(q)}),
                                Values::kPositive)
                    : values_of({}, DType::kF32, seed_of({10, static_cast<uint64_t>(q)}),
                                Values::kPositive);
          std::vector<double> part(ms * ws * n, 0.0);
          host_gemm_add(av, bkn, part, ms * ws, k, n);
          for (int64_t i = 0; i < ms * ws; ++i)
            for (int64_t j = 0; j < n; ++j)
              total[i * n + j] += part[i * n + j] * sav[row_a ? i : 0] * sbv[col_b ? j : 0];
        }
        EXPECT_LT(
            rel_error(download(ctx, out2), chunk_host(total, {ms * ws, n}, 0, ws, ctx.rank())),
            1e-2);
      },
      gpu_options());
  EXPECT_RANKS_OK(statuses);
}

// Fast accumulation (cuBLASLt's, GemmArgs::fast_accum, and the native kernel's, which has no
// other) on a long K of random float8 values, where it rounds differently from the exact f32
// accumulation: both ops on every path, exact and fast (native: fast only), against an f64 host
// reference. The exact result is within the
// bf16 output's rounding; fast accumulation keeps a narrower running sum in the tensor cores
// (about 14 mantissa bits on Hopper), whose error over K = 4096 random terms stays near
// sqrt(K) * 2^-14 (4e-3) of the result's norm: 2e-2 bounds it with room, and bounds the
// difference between the fast and the exact result too.
TEST_P(ScaledGpu, FastAccumulationStaysNearTheExactResult) {
  const auto [row_a, col_b] = GetParam();
  SKIP_UNLESS_GPUS(2);
  auto statuses = run_ranks(
      2,
      [&](OpContext& ctx) {
        const int ws = ctx.world_size();
        // Chunks of 128 rows: the native MM+RS on single CTAs; of 256: on CTA pairs.
        for (const int64_t ms : {int64_t{128}, int64_t{256}}) {
          SCOPED_TRACE(fmt::format("chunks of {} rows", ms));
          const int64_t k = 4096, n = 128;
          const uint64_t r = static_cast<uint64_t>(ctx.rank());
          auto a_scale_of = [&](uint64_t rank, int64_t rows) {
            return row_a ? values_of({rows, 1}, DType::kF32, seed_of({32, rank}), Values::kPositive)
                         : values_of({}, DType::kF32, seed_of({32, 0}), Values::kPositive);
          };
          DeviceTensor b =
              upload_seeded(ctx, {n, k}, DType::kF8E4M3, seed_of({31}), Values::kRandom);
          const Tensor b_t = (*b).t();  // [k, n], column-major
          DeviceTensor sb =
              col_b ? upload_seeded(ctx, {1, n}, DType::kF32, seed_of({33}), Values::kPositive)
                    : upload_seeded(ctx, {}, DType::kF32, seed_of({33}), Values::kPositive);
          const std::vector<float> bkn = rows_of_transpose(to_vector(b.host), n, k);
          const auto sbv = to_vector(sb.host);
          // rows x n of (a @ B) scaled, for rank q's A of `rows` rows (seed `tag`).
          auto product = [&](uint64_t tag, uint64_t q, int64_t rows) {
            const auto av =
                values_of({rows, k}, DType::kF8E4M3, seed_of({tag, q}), Values::kRandom);
            const auto sav = a_scale_of(q, rows);
            std::vector<double> p(rows * n, 0.0);
            host_gemm_add(av, bkn, p, rows, k, n);
            for (int64_t i = 0; i < rows; ++i)
              for (int64_t j = 0; j < n; ++j)
                p[i * n + j] *= sav[row_a ? i : 0] * sbv[col_b ? j : 0];
            return p;
          };
          auto upload_a_scale = [&](int64_t rows) {
            return row_a ? upload_seeded(ctx, {rows, 1}, DType::kF32, seed_of({32, r}),
                                         Values::kPositive)
                         : upload_seeded(ctx, {}, DType::kF32, seed_of({32, 0}), Values::kPositive);
          };
          auto close = [](const Tensor& actual, const std::vector<double>& expected, double tol,
                          const std::string& what) {
            const double err = rel_error(actual, expected);
            EXPECT_LT(err, tol) << what;
          };

          // all_gather_scaled_matmul: A_shard [ms, k].
          DeviceTensor a =
              upload_seeded(ctx, {ms, k}, DType::kF8E4M3, seed_of({30, r}), Values::kRandom);
          DeviceTensor sa = upload_a_scale(ms);
          std::vector<double> ag_expected;
          for (int q = 0; q < ws; ++q) {
            const auto p = product(30, static_cast<uint64_t>(q), ms);
            ag_expected.insert(ag_expected.end(), p.begin(), p.end());
          }
          // scaled_matmul_reduce_scatter: A [ms * ws, k] on every rank, scattered on dim 0.
          DeviceTensor a2 =
              upload_seeded(ctx, {ms * ws, k}, DType::kF8E4M3, seed_of({34, r}), Values::kRandom);
          DeviceTensor sa2 = upload_a_scale(ms * ws);
          std::vector<double> total(ms * ws * n, 0.0);
          for (int q = 0; q < ws; ++q) {
            const auto p = product(34, static_cast<uint64_t>(q), ms * ws);
            for (size_t i = 0; i < total.size(); ++i)
              total[i] += p[i];
          }
          const auto rs_expected = chunk_host(total, {ms * ws, n}, 0, ws, ctx.rank());

          for (PathChoice path : {PathChoice::kNative, PathChoice::kSplit, PathChoice::kFallback}) {
            std::vector<double> ag_exact, rs_exact;
            for (bool fast : {false, true}) {
              // The native GEMM accumulates float8 in the fast mode only: asked for without it, the
              // ops refuse, saying why.
              if (path == PathChoice::kNative && !fast) {
                const Tensor bs[] = {b_t};
                const Tensor b_scales[] = {*sb};
                OwnedTensor out = device_empty(ctx, {ms * ws, n}, DType::kBF16);
                const Tensor outs[] = {out.tensor};
                EXPECT_THAT(
                    [&] {
                      all_gather_scaled_matmul(ctx, *a, *sa, bs, b_scales, outs, {},
                                               {.path = path});
                    },
                    ::testing::ThrowsMessage<PathUnavailableError>(
                        ::testing::HasSubstr("float8 without fast accumulation")));
                OwnedTensor out2 = device_empty(ctx, {ms, n}, DType::kBF16);
                EXPECT_THAT(
                    [&] {
                      scaled_matmul_reduce_scatter(ctx, *a2, *sa2, b_t, *sb, out2, {.path = path});
                    },
                    ::testing::ThrowsMessage<PathUnavailableError>(
                        ::testing::HasSubstr("float8 without fast accumulation")));
                continue;
              }
              const std::string what =
                  fmt::format("{}, {}", path_choice_name(path), fast ? "fast" : "exact");
              OwnedTensor out = device_empty(ctx, {ms * ws, n}, DType::kBF16);
              AllGatherMatmulOptions ag;
              ag.path = path;
              if (fast) ag.fast_accum = {true};
              const Tensor bs[] = {b_t};
              const Tensor b_scales[] = {*sb};
              const Tensor outs[] = {out.tensor};
              all_gather_scaled_matmul(ctx, *a, *sa, bs, b_scales, outs, {}, ag);
              const OwnedTensor ag_out = download(ctx, out);
              close(ag_out, ag_expected, fast ? 2e-2 : 1e-2, "all_gather_scaled_matmul " + what);

              OwnedTensor out2 = device_empty(ctx, {ms, n}, DType::kBF16);
              MatmulReduceScatterOptions rs;
              rs.path = path;
              rs.fast_accum = fast;
              scaled_matmul_reduce_scatter(ctx, *a2, *sa2, b_t, *sb, out2, rs);
              const OwnedTensor rs_out = download(ctx, out2);
              close(rs_out, rs_expected, fast ? 2e-2 : 1e-2,
                    "scaled_matmul_reduce_scatter " + what);

              std::vector<double> ag_values(ag_out->numel()), rs_values(rs_out->numel());
              for (int64_t i = 0; i < ag_out->numel(); ++i)
                ag_values[i] = get(ag_out, i);
              for (int64_t i = 0; i < rs_out->numel(); ++i)
                rs_values[i] = get(rs_out, i);
              if (path == PathChoice::kNative) {
                expect_path(ctx, "all_gather_scaled_matmul", Path::kNative);
                expect_path(ctx, "scaled_matmul_reduce_scatter", Path::kNative);
              } else if (!fast) {
                ag_exact = std::move(ag_values);
                rs_exact = std::move(rs_values);
              } else {
                close(ag_out, ag_exact, 2e-2, "all_gather_scaled_matmul fast vs exact, " + what);
                close(rs_out, rs_exact, 2e-2,
                      "scaled_matmul_reduce_scatter fast vs exact, " + what);
              }
            }
          }
        }
      },
      gpu_options());
  EXPECT_RANKS_OK(statuses);
}

INSTANTIATE_TEST_SUITE_P(Scales, ScaledGpu,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()));

// ---- CUDA graphs ----------------------------------------------------------------------------

TEST(FusedOpsGpu, CapturedInACudaGraphAndReplayedWithNewInputs) {
  SKIP_UNLESS_GPUS(2);
  for (int ws : {2, 4, 8}) {
    for (PathChoice path : {PathChoice::kSplit, PathChoice::kNative, PathChoice::kAuto}) {
      SCOPED_TRACE(fmt::format("path {}", path_choice_name(path)));
      if (gpu_rank_slots() < ws) continue;
      auto statuses = run_ranks(
          ws,
          [&](OpContext& ctx) {
            const int64_t ms = 128, k = 256, n = 192;
            const uint64_t r = static_cast<uint64_t>(ctx.rank());
            DeviceTensor a =
                upload_seeded(ctx, {ms, k}, DType::kBF16, seed_of({11, r}), Values::kRandom);
            DeviceTensor b =
                upload_seeded(ctx, {k, n}, DType::kBF16, seed_of({12}), Values::kRandom);
            OwnedTensor ag_out = device_empty(ctx, {ms * ctx.world_size(), n}, DType::kBF16);
            DeviceTensor h = upload_seeded(ctx, {ms * ctx.world_size(), k}, DType::kBF16,
                                           seed_of({13, r}), Values::kRandom);
            OwnedTensor rs_out = device_empty(ctx, {ms, n}, DType::kBF16);
            const Tensor bs[] = {*b};
            const Tensor outs[] = {ag_out.tensor};
            auto step = [&] {
              all_gather_matmul(ctx, *a, bs, outs, {}, {.path = path});
              matmul_reduce_scatter(ctx, *h, *b, rs_out, {.path = path});
            };
            step();  // sizes the workspace and tunes the GEMMs outside the capture
            ctx.backend().synchronize();
            cuda::Graph graph;
            graph.begin_capture(ctx.stream());
            step();
            graph.end_capture();
            // New inputs in the same buffers, then replay twice.
            DeviceTensor a2 =
                upload_seeded(ctx, {ms, k}, DType::kBF16, seed_of({21, r}), Values::kRandom);
            DeviceTensor h2 = upload_seeded(ctx, {ms * ctx.world_size(), k}, DType::kBF16,
                                            seed_of({23, r}), Values::kRandom);
            ctx.backend().copy(*a, *a2, ctx.stream());
            ctx.backend().copy(*h, *h2, ctx.stream());
            graph.replay(ctx.stream());
            graph.replay(ctx.stream());
            ctx.backend().synchronize();
            const int ws_ = ctx.world_size();
            std::vector<std::vector<float>> shards;
            for (int q = 0; q < ws_; ++q)
              shards.push_back(values_of({ms, k}, DType::kBF16,
                                         seed_of({21, static_cast<uint64_t>(q)}), Values::kRandom));
            const auto gathered = gather_host(shards, {ms, k}, 0);
            std::vector<double> ag_expected(ms * ws_ * n, 0.0);
            host_gemm_add(gathered, to_vector(b.host), ag_expected, ms * ws_, k, n);
            EXPECT_LT(rel_error(download(ctx, ag_out), ag_expected), 1e-2);
            std::vector<double> total(ms * ws_ * n, 0.0);
            for (int q = 0; q < ws_; ++q) {
              host_gemm_add(values_of({ms * ws_, k}, DType::kBF16,
                                      seed_of({23, static_cast<uint64_t>(q)}), Values::kRandom),
                            to_vector(b.host), total, ms * ws_, k, n);
            }
            EXPECT_LT(rel_error(download(ctx, rs_out),
                                chunk_host(total, {ms * ws_, n}, 0, ws_, ctx.rank())),
                      1e-2);
          },
          gpu_options());
      EXPECT_RANKS_OK(statuses) << "world size " << ws;
    }
  }
}

// ---- dispatch -------------------------------------------------------------------------------

// The first auto call of a problem measures every path (native, fused, fallback; the native
// matmul_reduce_scatter both ways it pushes) on every rank and agrees on the fastest; later calls
// reuse it; a new process finds it in the disk cache. At world sizes 1 and 2, as far as there are
// GPUs.
TEST(FusedOpsGpu, DispatcherMeasuresOnceAndCachesOnDisk) {
  SKIP_UNLESS_GPUS(1);
  for (const int ws : {1, 2}) {
    if (gpu_rank_slots() < ws) continue;
    char dir_template[] = "/tmp/asynctp-dispatch-XXXXXX";
    ASSERT_NE(::mkdtemp(dir_template), nullptr);
    const std::string cache = std::string(dir_template) + "/dispatch.json";
    HarnessOptions options = gpu_options();
    options.context.dispatch_cache = cache;
    for (int round = 0; round < 2; ++round) {
      auto statuses = run_ranks(
          ws,
          [&](OpContext& ctx) {
            const uint64_t r = static_cast<uint64_t>(ctx.rank());
            DeviceTensor a =
                upload_seeded(ctx, {512, 512}, DType::kBF16, seed_of({31, r}), Values::kRandom);
            DeviceTensor b =
                upload_seeded(ctx, {512, 768}, DType::kBF16, seed_of({32}), Values::kRandom);
            OwnedTensor out = device_empty(ctx, {512 * ws, 768}, DType::kBF16);
            const Tensor bs[] = {*b};
            const Tensor outs[] = {out.tensor};
            for (int i = 0; i < 3; ++i)
              all_gather_matmul(ctx, *a, bs, outs);
            const auto last = ctx.usage().last("all_gather_matmul");
            ASSERT_TRUE(last.has_value());
            EXPECT_EQ(ctx.usage().count("all_gather_matmul", last->path), 3)
                << "the choice changed between calls";
            const std::string key =
                fmt::format("all_gather_matmul|{}x768x512|bf16->bf16|B row|ws{}|", 512 * ws, ws) +
                ctx.backend().hardware();
            // Ranks sharing a GPU measure (and cache) under a hardware of their own.
            EXPECT_EQ(ctx.backend().hardware().find("shared by") != std::string::npos,
                      cuda_ranks_per_gpu() > 1)
                << ctx.backend().hardware();
            const auto decision = ctx.dispatcher().decision(key);
            ASSERT_TRUE(decision.has_value()) << key;
            EXPECT_EQ(decision->path, last->path);
            if (round == 0) {
              EXPECT_FALSE(decision->from_disk);
              EXPECT_GT(decision->split_us, 0);
              EXPECT_GT(decision->native_us, 0);
              EXPECT_GT(decision->fallback_us, 0);
            } else {
              EXPECT_TRUE(decision->from_disk)
                  << "the second process did not find the cached choice";
            }
            // The native matmul_reduce_scatter's two routes (ContextOptions::kernel_push auto):
            // copy streams pushing and the GEMM pushing, both measured.
            OwnedTensor scattered = device_empty(ctx, {512 / ws, 768}, DType::kBF16);
            for (int i = 0; i < 3; ++i)
              matmul_reduce_scatter(ctx, *a, *b, scattered);
            const auto rs_last = ctx.usage().last("matmul_reduce_scatter");
            ASSERT_TRUE(rs_last.has_value());
            EXPECT_EQ(ctx.usage().count("matmul_reduce_scatter", rs_last->path), 3);
            const auto rs = ctx.dispatcher().decision(
                fmt::format("matmul_reduce_scatter|512x768x512|bf16->bf16|B row|ws{}|", ws) +
                ctx.backend().hardware());
            ASSERT_TRUE(rs.has_value());
            EXPECT_EQ(rs->path.path, rs_last->path);
            if (round == 0) {
              EXPECT_GT(rs->native_us, 0);
              // (One rank has no peers' rows to push: one route.)
              EXPECT_EQ(rs->native_push_us > 0, ws > 1);
            } else {
              EXPECT_TRUE(rs->from_disk);
            }
          },
          options);
      EXPECT_RANKS_OK(statuses) << "ws " << ws << ", round " << round;
    }
    std::filesystem::remove_all(dir_template);
  }
}

TEST(FusedOpsGpu, CaptureRefusesToGrowTheWorkspace) {
  SKIP_UNLESS_GPUS(2);
  auto statuses = run_ranks(
      2,
      [&](OpContext& ctx) {
        DeviceTensor a = upload_seeded(ctx, {64, 64}, DType::kBF16, seed_of({31}), Values::kRandom);
        DeviceTensor b = upload_seeded(ctx, {64, 64}, DType::kBF16, seed_of({32}), Values::kRandom);
        OwnedTensor out = device_empty(ctx, {128, 64}, DType::kBF16);
        const Tensor bs[] = {*b};
        const Tensor outs[] = {out.tensor};
        cuda::Graph graph;
        graph.begin_capture(ctx.stream());
        EXPECT_THAT(error_of([&] { all_gather_matmul(ctx, *a, bs, outs); }),
                    ::testing::HasSubstr("captured into a CUDA graph"));
      },
      gpu_options());
  EXPECT_RANKS_OK(statuses);
}

// A strided A_shard (a transposed view) on the native path: the GEMM cannot read it in place, so
// it is gathered into the own slot before the GEMM; every copy beside the GEMM stays a
// copy-engine copy (a copy kernel there would wait for an SM the GEMM never frees).
TEST(FusedOpsGpu, NativeAllGatherTakesAStridedShard) {
  SKIP_UNLESS_GPUS(2);
  auto statuses = run_ranks(
      2,
      [&](OpContext& ctx) {
        const int ws = ctx.world_size();
        const int64_t rows = 256, k = 64, n = 96;
        std::vector<std::vector<float>> shards;
        for (int r = 0; r < ws; ++r) {
          // Rank r's storage is [k, rows]; its shard is the transposed view [rows, k].
          const auto stored = values_of({k, rows}, DType::kBF16,
                                        seed_of({9, static_cast<uint64_t>(r)}), Values::kRandom);
          std::vector<float> shard(rows * k);
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < k; ++j)
              shard[i * k + j] = stored[j * rows + i];
          shards.push_back(shard);
        }
        std::vector<double> expected(ws * rows * n, 0.0);
        host_gemm_add(gather_host(shards, {rows, k}, 0),
                      values_of({k, n}, DType::kBF16, seed_of({10}), Values::kRandom), expected,
                      ws * rows, k, n);
        DeviceTensor stored =
            upload_seeded(ctx, {k, rows}, DType::kBF16,
                          seed_of({9, static_cast<uint64_t>(ctx.rank())}), Values::kRandom);
        DeviceTensor b = upload_seeded(ctx, {k, n}, DType::kBF16, seed_of({10}), Values::kRandom);
        OwnedTensor out = device_empty(ctx, {ws * rows, n}, DType::kBF16);
        OwnedTensor a_out = device_empty(ctx, {ws * rows, k}, DType::kBF16);
        ctx.backend().fill(out, std::nanf(""), ctx.stream());
        const Tensor bs[] = {*b};
        const Tensor outs[] = {out.tensor};
        all_gather_matmul(ctx, (*stored).t(), bs, outs, a_out, {.path = PathChoice::kNative});
        EXPECT_EQ(ctx.usage().last("all_gather_matmul")->path, Path::kNative);
        EXPECT_LT(rel_error(download(ctx, out), expected), 1e-2);
        EXPECT_EQ(to_vector(download(ctx, a_out)), gather_host(shards, {rows, k}, 0));
      },
      gpu_options(Millis(20'000)));
  EXPECT_RANKS_OK(statuses);
}

// ---- tensor-parallel layers back to back --------------------------------------------------------

// A column-parallel layer (all_gather_matmul) after a row-parallel one (matmul_reduce_scatter),
// several times over with no synchronization in between, on every path pair: each op's symmetric
// buffers must be free for the next op of any kind (the native all-gather pushes into its peers'
// buffers the moment it starts, while a peer may still be in the final reduction of the
// reduce-scatter before it).
TEST(FusedOpsGpu, LayersBackToBackOnEveryPath) {
  SKIP_UNLESS_GPUS(2);
  // Both settings of ContextOptions::gemm_streams (the split paths' chunk GEMMs on one stream or
  // alternating between two).
  for (const int gemm_streams : {1, 2}) {
    SCOPED_TRACE(fmt::format("gemm_streams {}", gemm_streams));
    HarnessOptions options = gpu_options();
    options.context.gemm_streams = gemm_streams;
    auto statuses = run_ranks(
        2,
        [&](OpContext& ctx) {
          const int ws = ctx.world_size();
          const uint64_t me = static_cast<uint64_t>(ctx.rank());
          const Dims shard{256, 256}, a2_shape{512, 384};
          const int64_t n1 = 512, k2 = 384, n2 = 256;
          std::vector<std::vector<float>> shards;
          std::vector<double> total(512 * n2, 0.0);
          for (int r = 0; r < ws; ++r) {
            const uint64_t u = static_cast<uint64_t>(r);
            shards.push_back(values_of(shard, DType::kBF16, seed_of({5, u}), Values::kRandom));
            host_gemm_add(values_of(a2_shape, DType::kBF16, seed_of({7, u}), Values::kRandom),
                          values_of({k2, n2}, DType::kBF16, seed_of({8, u}), Values::kRandom),
                          total, 512, k2, n2);
          }
          std::vector<double> expected_ag(512 * n1, 0.0);
          host_gemm_add(gather_host(shards, shard, 0),
                        values_of({256, n1}, DType::kBF16, seed_of({6}), Values::kRandom),
                        expected_ag, 512, 256, n1);
          const auto expected_rs = chunk_host(total, {512, n2}, 0, ws, ctx.rank());

          DeviceTensor a1 =
              upload_seeded(ctx, shard, DType::kBF16, seed_of({5, me}), Values::kRandom);
          DeviceTensor b1 =
              upload_seeded(ctx, {256, n1}, DType::kBF16, seed_of({6}), Values::kRandom);
          DeviceTensor a2 =
              upload_seeded(ctx, a2_shape, DType::kBF16, seed_of({7, me}), Values::kRandom);
          DeviceTensor b2 =
              upload_seeded(ctx, {k2, n2}, DType::kBF16, seed_of({8, me}), Values::kRandom);
          const Tensor b1s[] = {*b1};
          const PathChoice paths[] = {PathChoice::kNative, PathChoice::kSplit};
          std::vector<OwnedTensor> ag_outs, rs_outs;
          for (int i = 0; i < 8; ++i) {
            ag_outs.push_back(device_empty(ctx, {512, n1}, DType::kBF16));
            rs_outs.push_back(device_empty(ctx, {256, n2}, DType::kBF16));
            const Tensor outs[] = {ag_outs.back().tensor};
            all_gather_matmul(ctx, *a1, b1s, outs, Tensor(), {.path = paths[i % 2]});
            matmul_reduce_scatter(ctx, *a2, *b2, rs_outs.back(), {.path = paths[(i / 2) % 2]});
          }
          for (int i = 0; i < 8; ++i) {
            SCOPED_TRACE(fmt::format("layer pair {}", i));
            EXPECT_LT(rel_error(download(ctx, ag_outs[i]), expected_ag), 1e-2);
            EXPECT_LT(rel_error(download(ctx, rs_outs[i]), expected_rs), 1e-2);
          }
        },
        options);
    EXPECT_RANKS_OK(statuses);
  }
}

// all_gather_matmul's push buffers and flags across ops (see all_gather_matmul.cpp): eager ops of
// either path take two buffers by turns with op-numbered flags and no barrier, ops captured into a
// CUDA graph a third with 0/1 flags and a closing barrier. A new shard every step, written into
// the same A_shard right before the op, both paths, eager steps and graph replays mixed, no
// synchronization in between: a push into a buffer a peer still reads, a flag taken for a later
// op's, or a stale chunk shows up as a wrong result of some step. N / F: eager native / split;
// G / H: replay of the captured native / split op.
TEST(FusedOpsGpu, AllGatherBuffersAcrossEagerOpsAndReplaysOfBothPaths) {
  SKIP_UNLESS_GPUS(2);
  for (const int ws : {2, 4}) {
    for (const size_t piece_bytes : {size_t{0}, size_t{1}}) {
      SCOPED_TRACE(fmt::format("world size {}, push_piece_bytes {}", ws, piece_bytes));
      if (gpu_rank_slots() < ws) continue;
      HarnessOptions options = gpu_options();
      options.context.push_piece_bytes = piece_bytes;
      auto statuses = run_ranks(
          ws,
          [&](OpContext& ctx) {
            const int64_t rows = 256, k = 128, n = 256;
            const std::string steps = "NNGFHNFGHFFNG";
            const int count = static_cast<int>(steps.size());
            const uint64_t me = static_cast<uint64_t>(ctx.rank());
            DeviceTensor b =
                upload_seeded(ctx, {k, n}, DType::kBF16, seed_of({61}), Values::kRandom);
            std::vector<DeviceTensor> inputs;
            std::vector<OwnedTensor> outs;
            for (int i = 0; i < count; ++i) {
              inputs.push_back(upload_seeded(ctx, {rows, k}, DType::kBF16,
                                             seed_of({62, static_cast<uint64_t>(i), me}),
                                             Values::kRandom));
              outs.push_back(device_empty(ctx, {ws * rows, n}, DType::kBF16));
            }
            OwnedTensor a = device_empty(ctx, {rows, k}, DType::kBF16);
            OwnedTensor native_out = device_empty(ctx, {ws * rows, n}, DType::kBF16);
            OwnedTensor split_out = device_empty(ctx, {ws * rows, n}, DType::kBF16);
            const Tensor bs[] = {*b};
            const Tensor native_outs[] = {native_out.tensor};
            const Tensor split_outs[] = {split_out.tensor};
            const AllGatherMatmulOptions native{.path = PathChoice::kNative};
            const AllGatherMatmulOptions split{.path = PathChoice::kSplit};
            ctx.backend().copy(a, *inputs[0], ctx.stream());
            // Both paths once before the capture (the workspace, the GEMMs' stream state).
            all_gather_matmul(ctx, a, bs, native_outs, Tensor(), native);
            all_gather_matmul(ctx, a, bs, split_outs, Tensor(), split);
            ctx.backend().synchronize();
            cuda::Graph native_graph, split_graph;
            native_graph.begin_capture(ctx.stream());
            all_gather_matmul(ctx, a, bs, native_outs, Tensor(), native);
            native_graph.end_capture();
            split_graph.begin_capture(ctx.stream());
            all_gather_matmul(ctx, a, bs, split_outs, Tensor(), split);
            split_graph.end_capture();
            for (int i = 0; i < count; ++i) {
              ctx.backend().copy(a, *inputs[i], ctx.stream());
              const Tensor step_outs[] = {outs[i].tensor};
              switch (steps[i]) {
                case 'N':
                  all_gather_matmul(ctx, a, bs, step_outs, Tensor(), native);
                  break;
                case 'F':
                  all_gather_matmul(ctx, a, bs, step_outs, Tensor(), split);
                  break;
                case 'G':
                  native_graph.replay(ctx.stream());
                  ctx.backend().copy(outs[i], native_out, ctx.stream());
                  break;
                default:
                  split_graph.replay(ctx.stream());
                  ctx.backend().copy(outs[i], split_out, ctx.stream());
              }
            }
            ctx.backend().synchronize();
            EXPECT_EQ(ctx.usage().count("all_gather_matmul", Path::kNative),
                      2 + static_cast<int>(std::count(steps.begin(), steps.end(), 'N')));
            EXPECT_EQ(ctx.usage().count("all_gather_matmul", Path::kSplit),
                      2 + static_cast<int>(std::count(steps.begin(), steps.end(), 'F')));
            for (int i = 0; i < count; ++i) {
              SCOPED_TRACE(fmt::format("step {} ({})", i, steps[i]));
              std::vector<std::vector<float>> shards;
              for (int q = 0; q < ws; ++q) {
                shards.push_back(
                    values_of({rows, k}, DType::kBF16,
                              seed_of({62, static_cast<uint64_t>(i), static_cast<uint64_t>(q)}),
                              Values::kRandom));
              }
              std::vector<double> expected(ws * rows * n, 0.0);
              host_gemm_add(gather_host(shards, {rows, k}, 0), to_vector(b.host), expected,
                            ws * rows, k, n);
              EXPECT_LT(rel_error(download(ctx, outs[i]), expected), 1e-2);
            }
          },
          options);
      EXPECT_RANKS_OK(statuses);
    }
  }
}

// The same for matmul_reduce_scatter: eager ops take two buffers by turns (op-numbered landed
// flags, no barrier: one flag per push on the split path, per piece on the native one); captured
// ops use a third behind an opening barrier. F: eager split, N: eager native, G: replay of a
// captured split op, H: of a captured native op. A new A every step, no synchronization in
// between.
TEST(FusedOpsGpu, ReduceScatterBuffersAcrossEagerOpsNativeOpsAndReplays) {
  SKIP_UNLESS_GPUS(2);
  for (const int ws : {2, 4}) {
    SCOPED_TRACE(fmt::format("world size {}", ws));
    if (gpu_rank_slots() < ws) continue;
    auto statuses = run_ranks(
        ws,
        [&](OpContext& ctx) {
          const int64_t rows = 128, k = 128, n = 256, m = rows * ws;
          const std::string steps = "FFNFGFNGHGFHNHF";
          const int count = static_cast<int>(steps.size());
          const uint64_t me = static_cast<uint64_t>(ctx.rank());
          DeviceTensor b =
              upload_seeded(ctx, {k, n}, DType::kBF16, seed_of({71, me}), Values::kRandom);
          std::vector<DeviceTensor> inputs;
          std::vector<OwnedTensor> outs;
          for (int i = 0; i < count; ++i) {
            inputs.push_back(upload_seeded(ctx, {m, k}, DType::kBF16,
                                           seed_of({72, static_cast<uint64_t>(i), me}),
                                           Values::kRandom));
            outs.push_back(device_empty(ctx, {rows, n}, DType::kBF16));
          }
          OwnedTensor a = device_empty(ctx, {m, k}, DType::kBF16);
          OwnedTensor graph_out = device_empty(ctx, {rows, n}, DType::kBF16);
          const MatmulReduceScatterOptions split{.path = PathChoice::kSplit};
          const MatmulReduceScatterOptions native{.path = PathChoice::kNative};
          ctx.backend().copy(a, *inputs[0], ctx.stream());
          matmul_reduce_scatter(ctx, a, *b, graph_out, split);  // sizes the workspace
          matmul_reduce_scatter(ctx, a, *b, graph_out, native);
          ctx.backend().synchronize();
          cuda::Graph graph, native_graph;
          graph.begin_capture(ctx.stream());
          matmul_reduce_scatter(ctx, a, *b, graph_out, split);
          graph.end_capture();
          native_graph.begin_capture(ctx.stream());
          matmul_reduce_scatter(ctx, a, *b, graph_out, native);
          native_graph.end_capture();
          for (int i = 0; i < count; ++i) {
            ctx.backend().copy(a, *inputs[i], ctx.stream());
            if (steps[i] == 'G' || steps[i] == 'H') {
              (steps[i] == 'G' ? graph : native_graph).replay(ctx.stream());
              ctx.backend().copy(outs[i], graph_out, ctx.stream());
            } else {
              matmul_reduce_scatter(
                  ctx, a, *b, outs[i],
                  {.path = steps[i] == 'N' ? PathChoice::kNative : PathChoice::kSplit});
            }
          }
          ctx.backend().synchronize();
          EXPECT_EQ(ctx.usage().count("matmul_reduce_scatter", Path::kNative),
                    2 + static_cast<int>(std::count(steps.begin(), steps.end(), 'N')));
          for (int i = 0; i < count; ++i) {
            SCOPED_TRACE(fmt::format("step {} ({})", i, steps[i]));
            std::vector<double> total(m * n, 0.0);
            for (int q = 0; q < ws; ++q) {
              const uint64_t u = static_cast<uint64_t>(q);
              host_gemm_add(values_of({m, k}, DType::kBF16,
                                      seed_of({72, static_cast<uint64_t>(i), u}), Values::kRandom),
                            values_of({k, n}, DType::kBF16, seed_of({71, u}), Values::kRandom),
                            total, m, k, n);
            }
            EXPECT_LT(
                rel_error(download(ctx, outs[i]), chunk_host(total, {m, n}, 0, ws, ctx.rank())),
                1e-2);
          }
        },
        gpu_options());
    EXPECT_RANKS_OK(statuses);
  }
}

// The native matmul_reduce_scatter with its pieces on 1, 2 and 3 push streams
// (ContextOptions::push_streams; their flags on the flag streams beside them): chunks of
// 1024 x 8192 bf16 (16 MiB) go in 4 pieces each. Four ops with four different As, two eager and
// two replayed from one CUDA graph (output poisoned before each replay), each against the split
// path's result for the same A: a flag that came before its piece's data would leave another
// op's partial in the sum. The bits are the same on every number of streams (the pieces' sums do
// not depend on which stream landed them). "Streams" 0: the eager ops push inline
// (ContextOptions::push_inline_min_k 0: 2 pieces a chunk on one copy stream, the flags and the
// next counter wait in one batch); the others keep the schedule beside. "Streams" -1: the GEMM
// pushes itself (ContextOptions::kernel_push: its TMA stores into the peers' slots, and the flag
// raised by the CTA that completes a piece), eager and replayed alike.
TEST(FusedOpsGpu, NativeReduceScatterPushesOnSeveralStreams) {
  SKIP_UNLESS_GPUS(2);
  constexpr int kOps = 4;
  const std::filesystem::path dir = ::testing::TempDir();
  const int tag = static_cast<int>(::getpid());
  auto file_of = [&](int ws, int streams, int rank, int op) {
    return dir /
           fmt::format("push_streams_{}_ws{}_s{}_rank{}_op{}.bin", tag, ws, streams, rank, op);
  };
  for (const int ws : {2, 4}) {
    if (gpu_rank_slots() < ws) continue;
    for (const int streams : {1, 2, 3, 0, -1}) {
      SCOPED_TRACE(fmt::format("world size {}, push_streams {}", ws, streams));
      HarnessOptions options = gpu_options();
      options.context.kernel_push = streams == -1 ? KernelPush::kOn : KernelPush::kOff;
      options.context.push_streams = std::max(streams, 1);
      options.context.push_inline_min_k = streams == 0 ? 0 : std::numeric_limits<int64_t>::max();
      auto statuses = run_ranks(
          ws,
          [&](OpContext& ctx) {
            const int64_t rows = 1024, k = 64, n = 8192, m = rows * ws;
            ASSERT_EQ(detail::native_rs_pieces(n, rows * n * 2).count, 4);
            const uint64_t me = static_cast<uint64_t>(ctx.rank());
            DeviceTensor b =
                upload_seeded(ctx, {k, n}, DType::kBF16, seed_of({82, me}), Values::kRandom);
            std::vector<DeviceTensor> as;
            std::vector<OwnedTensor> split, native;
            for (int i = 0; i < kOps; ++i) {
              as.push_back(upload_seeded(ctx, {m, k}, DType::kBF16,
                                         seed_of({81, static_cast<uint64_t>(i), me}),
                                         Values::kRandom));
              split.push_back(device_empty(ctx, {rows, n}, DType::kBF16));
              native.push_back(device_empty(ctx, {rows, n}, DType::kBF16));
            }
            OwnedTensor a_graph = device_empty(ctx, {m, k}, DType::kBF16);
            OwnedTensor replayed = device_empty(ctx, {rows, n}, DType::kBF16);
            const MatmulReduceScatterOptions native_path{.path = PathChoice::kNative};
            for (int i = 0; i < kOps; ++i)
              matmul_reduce_scatter(ctx, *as[i], *b, split[i], {.path = PathChoice::kSplit});
            matmul_reduce_scatter(ctx, *as[0], *b, native[0], native_path);
            matmul_reduce_scatter(ctx, *as[1], *b, native[1], native_path);
            ctx.backend().copy(a_graph, *as[2], ctx.stream());
            ctx.backend().synchronize();
            cuda::Graph graph;
            graph.begin_capture(ctx.stream());
            matmul_reduce_scatter(ctx, a_graph, *b, replayed, native_path);
            graph.end_capture();
            for (int i = 2; i < kOps; ++i) {
              ctx.backend().copy(a_graph, *as[i], ctx.stream());
              ctx.backend().fill(replayed, std::nanf(""), ctx.stream());
              graph.replay(ctx.stream());
              ctx.backend().copy(native[i], replayed, ctx.stream());
            }
            ctx.backend().synchronize();
            EXPECT_EQ(ctx.usage().count("matmul_reduce_scatter", Path::kNative), 3);
            for (int i = 0; i < kOps; ++i) {
              SCOPED_TRACE(fmt::format("op {} ({})", i, i < 2 ? "eager" : "replayed"));
              const OwnedTensor got = download(ctx, native[i]);
              const std::vector<float> reference = to_vector(download(ctx, split[i]));
              EXPECT_LT(rel_error(got, std::vector<double>(reference.begin(), reference.end())),
                        1e-2);
              std::ofstream file(file_of(ws, streams, ctx.rank(), i), std::ios::binary);
              file.write(static_cast<const char*>(got->data()),
                         static_cast<std::streamsize>(got->nbytes()));
            }
          },
          options);
      EXPECT_RANKS_OK(statuses);
    }
    for (int r = 0; r < ws; ++r) {
      for (int i = 0; i < kOps; ++i) {
        auto bytes_of = [&](int streams) {
          std::ifstream file(file_of(ws, streams, r, i), std::ios::binary);
          return std::string(std::istreambuf_iterator<char>(file), {});
        };
        const std::string one = bytes_of(1);
        EXPECT_EQ(one.size(), size_t{1024} * 8192 * 2) << "rank " << r << ", op " << i;
        EXPECT_TRUE(bytes_of(2) == one) << "rank " << r << ", op " << i << ": 2 streams differ";
        EXPECT_TRUE(bytes_of(3) == one) << "rank " << r << ", op " << i << ": 3 streams differ";
        EXPECT_TRUE(bytes_of(0) == one) << "rank " << r << ", op " << i << ": inline differs";
        EXPECT_TRUE(bytes_of(-1) == one)
            << "rank " << r << ", op " << i << ": the GEMM's own pushes differ";
        for (const int streams : {1, 2, 3, 0, -1})
          std::filesystem::remove(file_of(ws, streams, r, i));
      }
    }
  }
}

// The native matmul_reduce_scatter gives the same bits every time, whatever runs between its
// calls: the split path (the same buffers by turns) and the unfused reduce-scatter (the
// context's communicator), in the order the bench validates them.
TEST(FusedOpsGpu, NativeReduceScatterRepeatsAmongOtherOps) {
  SKIP_UNLESS_GPUS(2);
  for (const int ws : {2, 4}) {
    if (gpu_rank_slots() < ws) continue;
    // R: the unfused path in f32, F: the split path, C: GEMM + the communicator's
    // reduce-scatter, N: the native path (the bench's validation order is RFNCNN).
    for (const std::string steps : {"FNCNN", "RFNCNN"}) {
      SCOPED_TRACE(fmt::format("world size {}, steps {}", ws, steps));
      auto statuses = run_ranks(
          ws,
          [&](OpContext& ctx) {
            const int64_t m = 512, k = 256, n = 384;
            const uint64_t me = static_cast<uint64_t>(ctx.rank());
            DeviceTensor a =
                upload_seeded(ctx, {m, k}, DType::kBF16, seed_of({91, me}), Values::kRandom);
            DeviceTensor b =
                upload_seeded(ctx, {k, n}, DType::kBF16, seed_of({92, me}), Values::kRandom);
            OwnedTensor product = device_empty(ctx, {m, n}, DType::kBF16);
            OwnedTensor reduced = device_empty(ctx, {m / ctx.world_size(), n}, DType::kBF16);
            OwnedTensor a32 = device_empty(ctx, {m, k}, DType::kF32);
            OwnedTensor b32 = device_empty(ctx, {k, n}, DType::kF32);
            OwnedTensor reference = device_empty(ctx, {m / ctx.world_size(), n}, DType::kF32);
            ctx.backend().copy(a32, *a, ctx.stream());
            ctx.backend().copy(b32, *b, ctx.stream());
            std::vector<OwnedTensor> natives;
            for (const char step : steps) {
              OwnedTensor out = device_empty(ctx, {m / ctx.world_size(), n}, DType::kBF16);
              if (step == 'R') {
                matmul_reduce_scatter(ctx, a32, b32, reference, {.path = PathChoice::kFallback});
                continue;
              }
              if (step == 'C') {
                ctx.backend().gemm({.a = *a, .b = *b, .d = product}, ctx.stream());
                reduce_scatter(ctx, product, reduced, ReduceOp::kSum);
                continue;
              }
              matmul_reduce_scatter(
                  ctx, *a, *b, out,
                  {.path = step == 'N' ? PathChoice::kNative : PathChoice::kSplit});
              if (step == 'N') natives.push_back(std::move(out));
            }
            const OwnedTensor first = download(ctx, natives[0]);
            for (size_t i = 1; i < natives.size(); ++i)
              EXPECT_TRUE(same_bits(download(ctx, natives[i]), first))
                  << "native call " << i << " differs from the first";
          },
          gpu_options());
      EXPECT_RANKS_OK(statuses);
    }
  }
}

// Random sequences of both ops on every path, shapes changing from op to op (so the push
// pieces, their streams and the workspace's size change too; a larger op grows the symmetric
// workspace mid-sequence), fresh inputs for every op and no synchronization in between; then every
// result against the same op on the unfused path. A push into a buffer a peer still reads, a flag
// taken for another op's, or a stale chunk or part would show up as a wrong result. The same
// sequence on every rank (one seed).
TEST(FusedOpsGpu, RandomSequencesOfOpsMatchTheUnfusedPath) {
  SKIP_UNLESS_GPUS(2);
  for (const int ws : {2, 4}) {
    if (gpu_rank_slots() < ws) continue;
    for (const uint64_t seed : {1u, 2u, 3u}) {
      SCOPED_TRACE(fmt::format("world size {}, seed {}", ws, seed));
      auto statuses = run_ranks(
          ws,
          [&](OpContext& ctx) {
            struct Step {
              bool ag;
              PathChoice path;
              std::optional<size_t> piece_bytes;
              DeviceTensor a, b;
              OwnedTensor out;
            };
            const uint64_t me = static_cast<uint64_t>(ctx.rank());
            std::mt19937_64 rng(seed);
            auto pick = [&](std::initializer_list<int64_t> v) {
              return *(v.begin() + rng() % v.size());
            };
            // auto measures its candidates (with barriers) in the middle of the sequence.
            const PathChoice paths[] = {PathChoice::kNative, PathChoice::kNative,
                                        PathChoice::kSplit, PathChoice::kFallback,
                                        PathChoice::kAuto};
            std::vector<Step> steps;
            for (int i = 0; i < 20; ++i) {
              Step s;
              s.ag = rng() % 2 == 0;
              s.path = paths[rng() % std::size(paths)];
              const int64_t rows = pick({128, 256, 384}), k = pick({64, 192});
              // One reduce-scatter in four in chunks of 4 column pieces (1024 x 8192).
              const bool wide = !s.ag && rng() % 4 == 0;
              const int64_t n = wide ? 8192 : pick({128, 256, 640});
              const uint64_t i64 = static_cast<uint64_t>(i);
              if (s.ag) {
                if (rng() % 2 == 0) s.piece_bytes = 1;  // as many pieces as there may be
                s.a = upload_seeded(ctx, {rows, k}, DType::kBF16, seed_of({101, seed, i64, me}),
                                    Values::kRandom);
                s.b = upload_seeded(ctx, {k, n}, DType::kBF16, seed_of({102, seed, i64}),
                                    Values::kRandom);
                s.out = device_empty(ctx, {rows * ctx.world_size(), n}, DType::kBF16);
                const Tensor bs[] = {*s.b};
                const Tensor outs[] = {s.out.tensor};
                all_gather_matmul(ctx, *s.a, bs, outs, Tensor(),
                                  {.path = s.path, .push_piece_bytes = s.piece_bytes});
              } else {
                const int64_t own = wide ? 1024 : rows;
                s.a = upload_seeded(ctx, {own * ctx.world_size(), k}, DType::kBF16,
                                    seed_of({103, seed, i64, me}), Values::kRandom);
                s.b = upload_seeded(ctx, {k, n}, DType::kBF16, seed_of({104, seed, i64, me}),
                                    Values::kRandom);
                s.out = device_empty(ctx, {own, n}, DType::kBF16);
                matmul_reduce_scatter(ctx, *s.a, *s.b, s.out, {.path = s.path});
              }
              steps.push_back(std::move(s));
            }
            for (size_t i = 0; i < steps.size(); ++i) {
              const Step& s = steps[i];
              SCOPED_TRACE(fmt::format("op {}: {} on path {}", i,
                                       s.ag ? "all_gather_matmul" : "matmul_reduce_scatter",
                                       path_choice_name(s.path)));
              OwnedTensor expected = device_empty(ctx, s.out.tensor.shape(), DType::kBF16);
              if (s.ag) {
                const Tensor bs[] = {*s.b};
                const Tensor outs[] = {expected.tensor};
                all_gather_matmul(ctx, *s.a, bs, outs, Tensor(), {.path = PathChoice::kFallback});
              } else {
                matmul_reduce_scatter(ctx, *s.a, *s.b, expected, {.path = PathChoice::kFallback});
              }
              const std::vector<float> want = to_vector(download(ctx, expected));
              EXPECT_LT(
                  rel_error(download(ctx, s.out), std::vector<double>(want.begin(), want.end())),
                  1e-2);
            }
          },
          gpu_options());
      EXPECT_RANKS_OK(statuses);
    }
  }
}

// An op that threw midway leaves a flag stream it used unjoined (OpContext::forget_flag_streams):
// the next op, captured into a CUDA graph, must not join that stream into the capture, which
// it is no part of. Simulated by queueing on flag stream 1 directly, then capturing a native
// matmul_reduce_scatter that uses flag stream 0 only (ws 2: one peer chunk, small enough to go
// in one piece).
TEST(FusedOpsGpu, CaptureAfterAFlagStreamLeftUnjoined) {
  SKIP_UNLESS_GPUS(2);
  HarnessOptions options = gpu_options();
  options.context.push_streams = 2;
  options.context.kernel_push = KernelPush::kOff;
  auto statuses = run_ranks(
      2,
      [&](OpContext& ctx) {
        const int64_t rows = 128, k = 64, n = 256, m = 2 * rows;
        ASSERT_EQ(detail::native_rs_pieces(n, rows * n * 2).count, 1);
        const uint64_t me = static_cast<uint64_t>(ctx.rank());
        DeviceTensor a =
            upload_seeded(ctx, {m, k}, DType::kBF16, seed_of({91, me}), Values::kRandom);
        DeviceTensor b =
            upload_seeded(ctx, {k, n}, DType::kBF16, seed_of({92, me}), Values::kRandom);
        OwnedTensor eager = device_empty(ctx, {rows, n}, DType::kBF16);
        OwnedTensor replayed = device_empty(ctx, {rows, n}, DType::kBF16);
        const MatmulReduceScatterOptions native_path{.path = PathChoice::kNative};
        matmul_reduce_scatter(ctx, *a, *b, eager, native_path);
        ctx.backend().synchronize();
        ctx.flags_behind(1);  // as an op that threw would leave it
        cuda::Graph graph;
        graph.begin_capture(ctx.stream());
        matmul_reduce_scatter(ctx, *a, *b, replayed, native_path);
        graph.end_capture();
        ctx.backend().fill(replayed, std::nanf(""), ctx.stream());
        graph.replay(ctx.stream());
        ctx.backend().synchronize();
        EXPECT_TRUE(same_bits(download(ctx, replayed), download(ctx, eager)));
      },
      options);
  EXPECT_RANKS_OK(statuses);
}

// ---- failures -------------------------------------------------------------------------------

// Both ranks run one all_gather_matmul on `path` (the workspace exists), then rank 1 never joins
// the second: rank 0 must fail with a TimeoutError whose message holds every one of `names`.
// The group timeout of a test whose wait is meant to time out: 2 s, or a tenth of ASYNCTP_TIMEOUT
// where the run sets it. A sanitizer run sets it, and slows the rank set-up before that wait
// (store exchanges bounded by the same group timeout) past 2 s.
Millis expected_timeout() {
  return std::getenv("ASYNCTP_TIMEOUT") != nullptr ? std::max(Millis(2'000), default_timeout() / 10)
                                                   : Millis(2'000);
}

void expect_missing_rank_times_out(PathChoice path, int64_t shard_rows,
                                   std::initializer_list<const char*> names) {
  auto statuses = run_ranks(
      2,
      [&](OpContext& ctx) {
        DeviceTensor a =
            upload_seeded(ctx, {shard_rows, 64}, DType::kBF16, seed_of({41}), Values::kRandom);
        DeviceTensor b = upload_seeded(ctx, {64, 64}, DType::kBF16, seed_of({42}), Values::kRandom);
        OwnedTensor out = device_empty(ctx, {2 * shard_rows, 64}, DType::kBF16);
        const Tensor bs[] = {*b};
        const Tensor outs[] = {out.tensor};
        const AllGatherMatmulOptions options{.path = path};
        all_gather_matmul(ctx, *a, bs, outs, Tensor(), options);
        ctx.backend().synchronize();
        ASSERT_EQ(ctx.usage().last("all_gather_matmul")->path,
                  path == PathChoice::kNative ? Path::kNative : Path::kSplit);
        ctx.group().barrier("joined once");
        if (ctx.rank() == 1) return;  // rank 1 never joins the second op
        try {
          all_gather_matmul(ctx, *a, bs, outs, Tensor(), options);
          ctx.backend().synchronize();
          ADD_FAILURE() << "rank 0 did not time out";
        } catch (const TimeoutError& e) {
          for (const char* name : names)
            EXPECT_THAT(e.what(), ::testing::HasSubstr(name));
        }
      },
      gpu_options(expected_timeout()));
  EXPECT_RANKS_OK(statuses);
}

// The split path's first wait is for the peer's shard, before that chunk's GEMM: the error names
// the peer and the channel (the eager ready flags).
TEST(FusedOpsGpu, RankThatNeverJoinsMakesTheOthersTimeOut) {
  SKIP_UNLESS_GPUS(2);
  expect_missing_rank_times_out(PathChoice::kSplit, 64, {"rank 0", "shard of peer 1", "channel 8"});
}

// The native all_gather_matmul's GEMM waits for the peer's pushed chunk: it names that chunk.
TEST(FusedOpsGpu, NativeAllGatherNamesTheChunkThatNeverLands) {
  SKIP_UNLESS_GPUS(2);
  expect_missing_rank_times_out(PathChoice::kNative, 128, {"rank 0", "chunk 1"});
}

// The device barrier: through the symmetric workspace, and through the communicator (NCCL with
// a GPU per rank) where the workspace limit leaves no symmetric memory. Captured into a CUDA
// graph it replays; a first call during capture, which would have to allocate, is refused.
TEST(FusedOpsGpu, BarrierHoldsEveryStreamUntilTheLastRankArrives) {
  SKIP_UNLESS_GPUS(2);
  for (const size_t limit : {ContextOptions::default_max_workspace_bytes(), size_t{0}}) {
    // Ranks sharing a GPU have no NCCL, and the store's communicator takes host memory only.
    if (limit == 0 && cuda_ranks_per_gpu() > 1) continue;
    SCOPED_TRACE(fmt::format("workspace limit {}", limit));
    HarnessOptions options = gpu_options();
    options.context.max_workspace_bytes = limit;
    auto statuses = run_ranks(
        2,
        [&](OpContext& ctx) {
          {
            cuda::Graph refused;
            refused.begin_capture(ctx.stream());
            EXPECT_THAT(error_of([&] { barrier(ctx); }),
                        ::testing::HasSubstr("call it once before capturing it"));
          }
          barrier(ctx);  // (the first one makes the workspace or the token, collectively)
          check_barrier_waits_for_the_last(ctx, /*host_free=*/true);
          EXPECT_EQ(ctx.workspace().capacity() > 0, limit > 0);
          cuda::Graph graph;
          graph.begin_capture(ctx.stream());
          barrier(ctx);
          graph.end_capture();
          for (int i = 0; i < 3; ++i)
            graph.replay(ctx.stream());
          ctx.stream().synchronize();
        },
        options);
    EXPECT_RANKS_OK(statuses);
  }
}

// ---- the unfused paths on CUDA (NCCL + cuBLASLt) ----------------------------------------------

// Through NCCL; where ranks share GPUs (no NCCL there), through symmetric memory.
TEST(FusedOpsGpu, FallbackThroughNcclMatchesReference) {
  SKIP_UNLESS_GPUS(2);
  auto statuses = run_ranks(
      2,
      [&](OpContext& ctx) {
        EXPECT_EQ(ctx.communicator().name(), cuda_ranks_per_gpu() == 1 ? "nccl" : "symm");
        const int ws = ctx.world_size();
        const int64_t ms = 64, k = 96, n = 80;
        const uint64_t r = static_cast<uint64_t>(ctx.rank());
        DeviceTensor a =
            upload_seeded(ctx, {ms, k}, DType::kBF16, seed_of({51, r}), Values::kRandom);
        DeviceTensor b = upload_seeded(ctx, {k, n}, DType::kBF16, seed_of({52}), Values::kRandom);
        OwnedTensor out = device_empty(ctx, {ms * ws, n}, DType::kBF16);
        const Tensor bs[] = {*b};
        const Tensor outs[] = {out.tensor};
        all_gather_matmul(ctx, *a, bs, outs, {}, {.path = PathChoice::kFallback});
        EXPECT_EQ(ctx.usage().last("all_gather_matmul")->path, Path::kFallback);
        std::vector<std::vector<float>> shards;
        for (int q = 0; q < ws; ++q)
          shards.push_back(values_of({ms, k}, DType::kBF16, seed_of({51, static_cast<uint64_t>(q)}),
                                     Values::kRandom));
        std::vector<double> expected(ms * ws * n, 0.0);
        host_gemm_add(gather_host(shards, {ms, k}, 0), to_vector(b.host), expected, ms * ws, k, n);
        EXPECT_LT(rel_error(download(ctx, out), expected), 1e-2);
      },
      gpu_options());
  EXPECT_RANKS_OK(statuses);
}

}  // namespace
}  // namespace asynctp::testing
