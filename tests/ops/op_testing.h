// Shared pieces of the fused-op tests: world-size parameters, seeded per-rank inputs in several
// layouts, and the unfused references each rank computes locally on the CPU backend from every
// rank's inputs (all-gather is a concatenation; GEMM is Backend::gemm over the whole matrix;
// reduce-scatter is Backend::reduce over ranks in rank order, as the design fixes it). Each
// reference synchronizes the backend's compute stream before it returns: its temporaries, and
// often its inputs, go with the call.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ops/collectives.h"
#include "ops/fused_matmul.h"
#include "support/multiprocess.h"
#include "support/tensor_testing.h"

namespace asynctp::testing {

inline constexpr int kWorldSizes[] = {1, 2, 3, 4, 8};

// The barrier (ops/collectives.h) with the last rank coming kLate after the others: every other
// rank's stream is held until then. `host_free`: the others' barrier() calls also return at once
// (the wait is the stream's, not the host's).
inline void check_barrier_waits_for_the_last(OpContext& ctx, bool host_free) {
  constexpr auto kLate = std::chrono::milliseconds(300);
  const bool last = ctx.rank() == ctx.world_size() - 1;
  ctx.group().barrier("barrier test");  // the hosts in step: then the last one comes late
  if (last) std::this_thread::sleep_for(kLate);
  const auto t0 = std::chrono::steady_clock::now();
  barrier(ctx);
  const auto called = std::chrono::steady_clock::now() - t0;
  ctx.stream().synchronize();
  const auto passed = std::chrono::steady_clock::now() - t0;
  if (last) return;
  EXPECT_GE(passed, kLate / 2) << "rank " << ctx.rank()
                               << "'s stream passed the barrier before the last rank reached it";
  if (host_free) {
    EXPECT_LT(called, kLate / 2) << "rank " << ctx.rank() << "'s host waited";
  }
}

// What outputs start with (filled), so that elements an op leaves unwritten show.
inline constexpr float kSentinel = -12345.0f;

inline std::string world_size_name(const ::testing::TestParamInfo<int>& info) {
  return fmt::format("ws{}", info.param);
}

// How a test input is laid out in memory.
enum class Layout : uint8_t {
  kContiguous,
  kTransposed,  // the last two dims stored the other way round (column-major matrices)
  kPadded,      // rows padded by a few elements: unit inner stride, not contiguous
};

inline std::string_view layout_name(Layout layout) {
  switch (layout) {
    case Layout::kContiguous:
      return "contiguous";
    case Layout::kTransposed:
      return "transposed";
    case Layout::kPadded:
      return "padded";
  }
  return "?";
}

inline OwnedTensor empty_with_layout(Dims shape, DType dtype, Layout layout) {
  switch (layout) {
    case Layout::kContiguous:
      return empty_host(shape, dtype);
    case Layout::kTransposed:
      return empty_transposed(shape, dtype);
    case Layout::kPadded:
      return empty_padded(shape, dtype, 3);
  }
  ASYNCTP_FAIL("unknown layout");
}

// A tensor filled from seed_of(parts): the same contents on whichever rank builds it.
inline OwnedTensor seeded(Dims shape, DType dtype, std::initializer_list<uint64_t> parts,
                          Values kind = Values::kRandom, Layout layout = Layout::kContiguous) {
  OwnedTensor t = empty_with_layout(shape, dtype, layout);
  fill_seeded(t, seed_of(parts), kind);
  return t;
}

inline Dims with_dim(Dims shape, int dim, int64_t size) {
  shape[dim < 0 ? dim + shape.size() : dim] = size;
  return shape;
}

// A contiguous tensor with every element `value` (outputs start with a sentinel, so that
// unwritten elements show).
inline OwnedTensor filled(Dims shape, DType dtype, float value) {
  OwnedTensor t = empty_host(shape, dtype);
  fill_value(t, value);
  return t;
}

// A contiguous copy of t.
inline OwnedTensor contiguous_copy(Backend& backend, const Tensor& t) {
  OwnedTensor out = empty_host(t.shape(), t.dtype());
  backend.copy(out, t, backend.compute_stream());
  backend.compute_stream().synchronize();
  return out;
}

// Concatenation of parts along dim (what all_gather produces).
inline OwnedTensor concat(Backend& backend, const std::vector<OwnedTensor>& parts, int dim) {
  const Tensor& first = parts.front();
  dim = first.wrap_dim(dim);
  const int64_t s = first.size(dim);
  OwnedTensor out = empty_host(with_dim(first.shape(), dim, s * parts.size()), first.dtype());
  for (size_t r = 0; r < parts.size(); ++r) {
    backend.copy(out->narrow(dim, r * s, s), parts[r], backend.compute_stream());
  }
  backend.compute_stream().synchronize();
  return out;
}

// t [.., n] viewed as the matrix [rows, n] (also when some size is 0).
inline Tensor as_matrix(const Tensor& t) {
  int64_t rows = 1;
  for (int d = 0; d + 1 < t.dim(); ++d)
    rows *= t.size(d);
  return t.view({rows, t.size(-1)});
}

// out = a @ b (scaled for float8) over the whole of a's leading dims, into out's dtype: one GEMM
// on the 2-D views [M, K] x [K, N] -> [M, N]. With accumulate, adds to out (f32 partial sums).
inline void reference_gemm(Backend& backend, const Tensor& a, const Tensor& b, const Tensor& out,
                           const Tensor& a_scale = {}, const Tensor& b_scale = {},
                           bool accumulate = false) {
  OwnedTensor a_copy = contiguous_copy(backend, a);
  GemmArgs args;
  args.a = as_matrix(a_copy);
  args.b = b;
  args.d = as_matrix(out);
  args.accumulate = accumulate;
  OwnedTensor scale_copy;
  if (a_scale.defined()) {
    scale_copy = contiguous_copy(backend, a_scale);
    // One element: tensor-wise; else row-wise, a's leading dims flattened like a's.
    args.a_scale = a_scale.numel() == 1 ? scale_copy.tensor : as_matrix(scale_copy);
  }
  args.b_scale = b_scale;
  backend.gemm(args, backend.compute_stream());
  backend.compute_stream().synchronize();
}

// Chunk `index` of t along dim when split into `chunks` equal parts.
inline Tensor chunk_of(const Tensor& t, int dim, int chunks, int index) {
  const int64_t size = t.size(dim) / chunks;
  return t.narrow(dim, index * size, size);
}

// The reduce-scatter reference: out = op over ranks (in rank order, f32, rounded once) of chunk
// `rank` along dim of products[r].
inline void reference_reduce_scatter(Backend& backend, const Tensor& out,
                                     const std::vector<OwnedTensor>& products, int dim, int rank,
                                     ReduceOp op) {
  std::vector<Tensor> parts;
  for (const auto& p : products)
    parts.push_back(chunk_of(p, dim, products.size(), rank));
  backend.reduce(out, parts, op, backend.compute_stream());
  backend.compute_stream().synchronize();
}

// The path a forced choice runs (auto names none).
inline Path path_of(PathChoice choice) {
  switch (choice) {
    case PathChoice::kNative:
      return Path::kNative;
    case PathChoice::kFallback:
      return Path::kFallback;
    case PathChoice::kSplit:
      return Path::kSplit;
    case PathChoice::kAuto:
      break;
  }
  ASYNCTP_FAIL("auto names no path");
}

inline void expect_path(OpContext& ctx, std::string_view op, Path path,
                        std::string_view reason_part = "") {
  const auto last = ctx.usage().last(op);
  ASSERT_TRUE(last.has_value()) << op << " recorded no call";
  EXPECT_EQ(last->path, path) << op << " took " << path_name(last->path) << ": " << last->reason;
  if (path == Path::kSplit) {
    EXPECT_EQ(last->reason, "");
  }
  if (!reason_part.empty()) {
    EXPECT_THAT(last->reason, ::testing::HasSubstr(std::string(reason_part)));
  }
}

}  // namespace asynctp::testing
