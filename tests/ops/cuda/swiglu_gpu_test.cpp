// all_gather_matmul_swiglu on real GPUs (label gpu): every path (native: the GEMM's SwiGLU
// epilogue; split and fallback: f32 products then the SwiGLU kernel) against an f64 host
// reference, on 1, 2 and 4 GPUs, bf16 and f16, row and contraction-dim gathers, N on and off the
// 128-column tile grid, a column-major B, the products returned (f32 or 16-bit). Skips, saying why,
// without enough GPUs.
//
//   A_shard [s, k] -AG(g)-> A;  P = A @ B_gate_up [K, 2N];  out = silu(P[:, :N]) * P[:, N:]
#include <gtest/gtest.h>

#include <cmath>

#include "ops/cuda/gpu_testing.h"
#include "ops/fused_matmul.h"
#include "support/multiprocess.h"

namespace asynctp::testing {
namespace {

HarnessOptions gpu_options() {
  HarnessOptions o;
  o.context.backend = "cuda";
  o.group_timeout = std::max(Millis(30'000), default_timeout());
  o.run_timeout = std::max(Millis(180'000), 2 * o.group_timeout);
  return o;
}

struct SwigluGpuCase {
  int ws;
  int64_t s, k;  // A_shard [s, k]
  int gather_dim;
  int64_t n;  // out's columns
  DType dtype;
  bool k_major_b;
  bool return_pre;
  DType pre_dtype = DType::kF32;  // 16-bit: the native path stages it for TMA stores, as C
};

std::string case_name(const ::testing::TestParamInfo<SwigluGpuCase>& info) {
  const SwigluGpuCase& c = info.param;
  return fmt::format("ws{}_{}x{}g{}_n{}_{}{}{}", c.ws, c.s, c.k, c.gather_dim, c.n,
                     dtype_name(c.dtype), c.k_major_b ? "_colB" : "",
                     c.return_pre ? fmt::format("_pre{}", dtype_name(c.pre_dtype)) : "");
}

class SwigluGpu : public ::testing::TestWithParam<SwigluGpuCase> {};

TEST_P(SwigluGpu, EveryPathMatchesTheHostReference) {
  const SwigluGpuCase c = GetParam();
  SKIP_UNLESS_GPUS(c.ws);
  auto statuses = run_ranks(
      c.ws,
      [&](OpContext& ctx) {
        const int ws = ctx.world_size();
        const bool k_gather = c.gather_dim == 1;
        const int64_t rows = k_gather ? c.s : ws * c.s;
        const int64_t k = k_gather ? ws * c.k : c.k;
        // The gathered A on the host: shard r's rows (row gather) or columns (k gather).
        std::vector<float> a_full(rows * k);
        for (int r = 0; r < ws; ++r) {
          OwnedTensor shard = empty_host({c.s, c.k}, c.dtype);
          fill_seeded(shard, seed_of({1, static_cast<uint64_t>(r)}), Values::kRandom);
          for (int64_t i = 0; i < c.s; ++i) {
            for (int64_t j = 0; j < c.k; ++j) {
              const float v = get(shard, i * c.k + j);
              if (k_gather) {
                a_full[i * k + r * c.k + j] = v;
              } else {
                a_full[(r * c.s + i) * k + j] = v;
              }
            }
          }
        }
        DeviceTensor a =
            upload_seeded(ctx, {c.s, c.k}, c.dtype, seed_of({1, static_cast<uint64_t>(ctx.rank())}),
                          Values::kRandom);
        // B_gate_up [k, 2n]: row-major, or the column-major view of a [2n, k] upload.
        DeviceTensor b_store =
            c.k_major_b ? upload_seeded(ctx, {2 * c.n, k}, c.dtype, seed_of({2}), Values::kRandom)
                        : upload_seeded(ctx, {k, 2 * c.n}, c.dtype, seed_of({2}), Values::kRandom);
        const Tensor b = c.k_major_b ? b_store.device.tensor.t() : b_store.device.tensor;
        std::vector<float> b_host(k * 2 * c.n);
        for (int64_t i = 0; i < k; ++i) {
          for (int64_t j = 0; j < 2 * c.n; ++j) {
            b_host[i * 2 * c.n + j] =
                c.k_major_b ? get(b_store.host, j * k + i) : get(b_store.host, i * 2 * c.n + j);
          }
        }
        std::vector<double> products(rows * 2 * c.n, 0.0);
        host_gemm_add(a_full, b_host, products, rows, k, 2 * c.n);
        std::vector<double> expected(rows * c.n);
        for (int64_t i = 0; i < rows; ++i) {
          for (int64_t j = 0; j < c.n; ++j) {
            const double g = products[i * 2 * c.n + j];
            const double u = products[i * 2 * c.n + c.n + j];
            expected[i * c.n + j] = g / (1.0 + std::exp(-g)) * u;
          }
        }

        OwnedTensor out = device_empty(ctx, {rows, c.n}, c.dtype);
        OwnedTensor pre =
            c.return_pre ? device_empty(ctx, {rows, 2 * c.n}, c.pre_dtype) : OwnedTensor{};
        std::vector<PathChoice> paths{PathChoice::kSplit, PathChoice::kFallback};
        if (!k_gather) paths.push_back(PathChoice::kNative);
        for (PathChoice path : paths) {
          SCOPED_TRACE(fmt::format("path {}", path_choice_name(path)));
          // NaN first: a path that leaves elements unwritten must not pass on an earlier one's.
          ctx.backend().fill(out, std::nanf(""), ctx.stream());
          if (c.return_pre) ctx.backend().fill(pre, std::nanf(""), ctx.stream());
          all_gather_matmul_swiglu(ctx, *a, b, out, c.return_pre ? pre.tensor : Tensor(), {},
                                   {.gather_dim = c.gather_dim, .path = path});
          const Path took = ctx.usage().last("all_gather_matmul_swiglu")->path;
          EXPECT_EQ(path_name(took), path_choice_name(path));
          EXPECT_LT(rel_error(download(ctx, out), expected), 1e-2) << "out";
          if (c.return_pre) {
            // f32: the products as accumulated; 16-bit: each rounded once.
            const double tolerance = c.pre_dtype == DType::kF32 ? 1e-4 : 1e-2;
            EXPECT_LT(rel_error(download(ctx, pre), products), tolerance) << "pre_out";
          }
        }
      },
      gpu_options());
  EXPECT_RANKS_OK(statuses);
}

std::vector<SwigluGpuCase> cases() {
  std::vector<SwigluGpuCase> out;
  for (int ws : {1, 2, 4}) {
    for (DType dt : {DType::kBF16, DType::kF16}) {
      out.push_back({ws, 256, 128, 0, 256, dt, false, false});     // whole 128 x 128 tiles
      out.push_back({ws, 300, 136, 0, 200, dt, true, true});       // off both tile grids
      out.push_back({ws, 96, 64, 1, 72, dt, false, true});         // contraction-dim gather
      out.push_back({ws, 300, 136, 0, 200, dt, false, true, dt});  // 16-bit pre, N off the grid
    }
  }
  // A layer's shape, scaled down: T = 1024 tokens a rank, H = 1024, F = 1408 a rank.
  out.push_back({2, 1024, 1024, 0, 1408, DType::kBF16, true, true});
  out.push_back({2, 1024, 1024, 0, 1408, DType::kBF16, true, true, DType::kBF16});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cases, SwigluGpu, ::testing::ValuesIn(cases()), case_name);

}  // namespace
}  // namespace asynctp::testing
