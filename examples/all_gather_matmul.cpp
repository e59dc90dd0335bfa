// One all_gather_matmul on the CPU backend, checked against its unfused reference (the
// all-gather, then a plain matmul). Run it with `asynctp launch -n 2 -- ./all_gather_matmul`.
#include <asynctp/asynctp.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  using namespace asynctp;
  auto group = Group::from_env();
  auto ctx = Context::create(group, ContextOptions{});  // the CPU backend
  const int ws = ctx->world_size();
  const int64_t s = 4, k = 8, n = 6;  // A_shard [s, k], B [k, n] -> out [ws * s, n]

  std::vector<float> a(s * k), b(k * n), out(ws * s * n), gathered(ws * s * k);
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = static_cast<float>((ctx->rank() * 7 + i) % 5) - 2.0f;
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = static_cast<float>(i % 3) - 1.0f;
  const Tensor a_t(a.data(), DType::kF32, {s, k}), b_t(b.data(), DType::kF32, {k, n});
  const Tensor out_t(out.data(), DType::kF32, {ws * s, n});
  all_gather_matmul(*ctx, a_t, b_t, out_t);

  all_gather(*ctx, a_t, Tensor(gathered.data(), DType::kF32, {ws * s, k}));
  ctx->synchronize();  // the ops return once enqueued
  for (int64_t i = 0; i < ws * s; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float want = 0.0f;
      for (int64_t l = 0; l < k; ++l)
        want += gathered[i * k + l] * b[l * n + j];
      if (std::abs(out[i * n + j] - want) > 1e-5f) {
        std::printf("rank %d: out[%ld, %ld] = %g, want %g\n", ctx->rank(), i, j, out[i * n + j],
                    want);
        return 1;
      }
    }
  std::printf("rank %d of %d: OK\n", ctx->rank(), ws);
  return 0;
}
