// The CPU backend's native GEMM (device/cpu_native_gemm.h) and flag operations, on one process:
// the GEMM equals the reference GEMM bit for bit whatever its pivot, counts every done counter to
// the contract's count (kernels/native/schedule.h), reduces its sum chunk as the contract says,
// and its waits and the stream waits time out naming what they waited for.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>

#include "device/backend.h"
#include "device/cpu_backend.h"
#include "support/tensor_testing.h"

namespace asynctp {
namespace {

using testing::error_of;
using testing::fill_seeded;
using testing::get;
using ::testing::HasSubstr;
using testing::same_bits;
using testing::seed_of;
using testing::Values;

class CpuNativeGemmTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be_ = make_cpu_backend();
  Stream& stream() { return be_->compute_stream(); }
  uint32_t* flags(size_t count) {
    flags_ = be_->allocate(count * sizeof(uint32_t));
    be_->zero_flags(static_cast<uint32_t*>(flags_.data()), count, stream());
    return static_cast<uint32_t*>(flags_.data());
  }
  Buffer flags_;
};

// The native GEMM of a by b into d, in chunks of 128 rows.
ChunkedGemmArgs chunked(const Tensor& a, const Tensor& b, const Tensor& d) {
  ChunkedGemmArgs args;
  args.a = a;
  args.b = b;
  args.d = d;
  args.chunk_rows = 128;
  return args;
}

// M = 384 in chunks of 128 from chunk 1, N = 600 (three n-tiles, the last partial) counted in
// pieces of 256 columns, every ready flag up.
TEST_F(CpuNativeGemmTest, MatchesTheReferenceAndCountsEveryPiece) {
  OwnedTensor a = empty_host({384, 24}, DType::kBF16), b = empty_host({24, 600}, DType::kBF16);
  fill_seeded(a, seed_of({1}), Values::kRandom);
  fill_seeded(b, seed_of({2}), Values::kRandom);
  OwnedTensor expected = empty_host({384, 600}, DType::kF32),
              d = empty_host({384, 600}, DType::kF32);
  be_->gemm({.a = a, .b = b, .d = expected}, stream());
  uint32_t* f = flags(16);
  for (int c = 0; c < 3; ++c)
    be_->write_flag(f + c, 1, stream());
  ChunkedGemmArgs args = chunked(a, b, d);
  args.first_chunk = 1;
  args.ready = f;
  args.done = f + 4;
  args.done_cols = 256;
  ASSERT_EQ(be_->native_gemm_unsupported(args), "");
  be_->native_gemm(args, stream());
  stream().synchronize();
  EXPECT_TRUE(same_bits(d, expected));
  const auto order = be_->native_gemm_done_order(args);
  ASSERT_EQ(order.size(), 9u);        // 3 chunks x 3 column pieces
  EXPECT_EQ(order.front().index, 3);  // chunk 1 first, from the pivot
  for (const auto& counter : order) {
    EXPECT_EQ(std::atomic_ref<uint32_t>(args.done[counter.index]).load(), counter.count)
        << "counter " << counter.index;
  }
}

// The copy of A: every row as the GEMM read it, the own chunk's (chunk 1) from own_a, the
// others' from a, with and without the SwiGLU epilogue (whose tiles span fewer columns); d is
// what it is without the copy. A misaligned or mis-shaped copy is refused, naming it.
TEST_F(CpuNativeGemmTest, CopiesEveryRowOfAItReads) {
  OwnedTensor a = empty_host({300, 40}, DType::kBF16), own = empty_host({128, 40}, DType::kBF16);
  OwnedTensor b = empty_host({40, 608}, DType::kBF16);
  fill_seeded(a, seed_of({11}), Values::kRandom);
  fill_seeded(own, seed_of({12}), Values::kRandom);
  fill_seeded(b, seed_of({13}), Values::kRandom);
  OwnedTensor expected_a = empty_host({300, 40}, DType::kBF16);
  be_->copy(expected_a, a, stream());
  be_->copy(expected_a->narrow(0, 128, 128), own, stream());
  for (bool swiglu : {false, true}) {
    SCOPED_TRACE(swiglu ? "SwiGLU epilogue" : "plain");
    const int64_t n = swiglu ? 304 : 608;
    OwnedTensor d = empty_host({300, n}, DType::kBF16), plain = empty_host({300, n}, DType::kBF16);
    OwnedTensor copy = empty_host({300, 40}, DType::kBF16);
    be_->fill(copy, std::nanf(""), stream());
    ChunkedGemmArgs args = chunked(a, b, plain);
    args.first_chunk = 2;
    args.own_a = own;
    args.own_chunk = 1;
    args.swiglu = swiglu;
    be_->native_gemm(args, stream());
    args.d = d;
    args.a_out = copy;
    ASSERT_EQ(be_->native_gemm_unsupported(args), "");
    be_->native_gemm(args, stream());
    stream().synchronize();
    EXPECT_TRUE(same_bits(copy, expected_a));
    EXPECT_TRUE(same_bits(d, plain));
  }
  ChunkedGemmArgs args = chunked(a, b, empty_host({300, 608}, DType::kBF16));
  OwnedTensor wide = empty_host({300, 48}, DType::kBF16);
  args.a_out = wide->narrow(1, 1, 40);  // 2 bytes off a 16-byte boundary
  EXPECT_THAT(be_->native_gemm_unsupported(args), HasSubstr("the copy of A is not 16-byte"));
  args.a_out = wide;
  EXPECT_THAT(be_->native_gemm_unsupported(args), HasSubstr("a_out"));
}

// The reduce-scatter epilogue: chunk 1 of 2 (128 rows each) is this rank's; its tiles add the
// other part in f32 to the product, x 1/2 (avg), and store into sum_out, not into d.
TEST_F(CpuNativeGemmTest, ReducesTheSumChunkAsTheContractSays) {
  OwnedTensor a = empty_host({256, 16}, DType::kBF16), b = empty_host({16, 40}, DType::kBF16);
  fill_seeded(a, seed_of({3}), Values::kRandom);
  fill_seeded(b, seed_of({4}), Values::kRandom);
  OwnedTensor product = empty_host({256, 40}, DType::kF32);
  be_->gemm({.a = a, .b = b, .d = product}, stream());
  OwnedTensor parts = empty_host({2, 128, 40}, DType::kBF16);
  fill_seeded(parts, seed_of({5}), Values::kRandom);
  OwnedTensor d = empty_host({256, 40}, DType::kBF16), out = empty_host({128, 40}, DType::kBF16);
  uint32_t* f = flags(4);
  be_->write_flag(f, 7, stream());  // part 0's landed flag, for op 7
  ChunkedGemmArgs args = chunked(a, b, d);
  args.first_chunk = 0;
  args.sum_chunk = 1;
  args.sum_self = 1;
  args.sum_avg = true;
  args.sum_parts = parts;
  args.sum_out = out;
  args.sum_flags = f;
  args.sum_value = 7;
  args.sum_flag_stride = 2;
  ASSERT_EQ(be_->native_gemm_unsupported(args), "");
  be_->native_gemm(args, stream());
  stream().synchronize();
  OwnedTensor expected = empty_host({128, 40}, DType::kBF16);
  for (int64_t i = 0; i < 128 * 40; ++i)
    testing::set(expected, i, (get(product, 128 * 40 + i) + get(parts, i)) * 0.5f);
  EXPECT_TRUE(same_bits(out, expected));
}

// The kernel's own pushes: chunks 0 and 2 of 3 (128 rows each, N = 520: three column pieces of
// 256) go to their push_c buffers (row stride 528), never to d; each piece's flag is raised to
// push_value and its counter set back to 0 by the count that completes it; chunk 1, this rank's,
// is reduced with the parts as without. Pushes the kernel cannot store are refused, naming why.
TEST_F(CpuNativeGemmTest, PushesTheOtherChunksItselfAndRaisesTheirFlags) {
  const int64_t rows = 128, n = 520, ld = 528;
  const int chunks = 3, own = 1, pieces = 3;
  OwnedTensor a = empty_host({chunks * rows, 16}, DType::kBF16);
  OwnedTensor b = empty_host({16, n}, DType::kBF16);
  fill_seeded(a, seed_of({21}), Values::kRandom);
  fill_seeded(b, seed_of({22}), Values::kRandom);
  OwnedTensor product = empty_host({chunks * rows, n}, DType::kF32);
  be_->gemm({.a = a, .b = b, .d = product}, stream());
  OwnedTensor parts = empty_host({chunks, rows, n}, DType::kBF16);
  fill_seeded(parts, seed_of({23}), Values::kRandom);
  OwnedTensor d = empty_host({chunks * rows, n}, DType::kBF16);
  OwnedTensor out = empty_host({rows, n}, DType::kBF16);
  OwnedTensor slots = empty_host({chunks, rows, ld}, DType::kBF16);
  be_->fill(d, std::nanf(""), stream());
  be_->fill(slots, std::nanf(""), stream());
  // landed (the parts' flags), done, pushed: [pieces][chunks] each.
  uint32_t* landed = flags(3 * pieces * chunks);
  uint32_t* done = landed + pieces * chunks;
  uint32_t* pushed = done + pieces * chunks;
  for (int q = 0; q < pieces; ++q) {
    for (int c = 0; c < chunks; ++c) {
      if (c != own) be_->write_flag(landed + q * chunks + c, 7, stream());
    }
  }
  ChunkedGemmArgs args = chunked(a, b, d);
  args.first_chunk = own + 1;
  args.done = done;
  args.done_cols = 256;
  args.sum_chunk = own;
  args.sum_self = own;
  args.sum_parts = parts;
  args.sum_out = out;
  args.sum_flags = landed;
  args.sum_value = 7;
  args.sum_cols = 256;
  args.sum_flag_stride = chunks;
  args.push_chunks = chunks;
  args.push_ld = ld;
  args.push_flag_stride = chunks;
  args.push_value = 9;
  for (int c = 0; c < chunks; ++c) {
    if (c == own) continue;
    args.push_c[c] = slots->narrow(0, c, 1).data();
    args.push_flags[c] = pushed + c;
  }
  ASSERT_EQ(be_->native_gemm_unsupported(args), "");
  be_->native_gemm(args, stream());
  stream().synchronize();
  OwnedTensor expected_out = empty_host({rows, n}, DType::kBF16);
  for (int64_t i = 0; i < rows * n; ++i) {
    float x = get(product, own * rows * n + i);
    for (int c = 0; c < chunks; ++c)
      if (c != own) x += get(parts, c * rows * n + i);
    testing::set(expected_out, i, x);
  }
  EXPECT_TRUE(same_bits(out, expected_out));
  for (int c = 0; c < chunks; ++c) {
    if (c == own) continue;
    OwnedTensor expected = empty_host({rows, n}, DType::kBF16);
    for (int64_t i = 0; i < rows * n; ++i)
      testing::set(expected, i, get(product, c * rows * n + i));
    EXPECT_TRUE(same_bits(slots->narrow(0, c, 1).view({rows, ld}).narrow(1, 0, n), expected))
        << "chunk " << c;
  }
  int64_t untouched = 0;
  for (int64_t i = 0; i < chunks * rows * ld; ++i)
    untouched += std::isnan(get(slots, i)) ? 1 : 0;
  EXPECT_EQ(untouched, rows * ld + (chunks - 1) * rows * (ld - n));
  for (int64_t i = 0; i < chunks * rows * n; ++i) {
    ASSERT_TRUE(std::isnan(get(d, i))) << "the GEMM stored into C at " << i;
  }
  for (int i = 0; i < pieces * chunks; ++i) {
    EXPECT_EQ(std::atomic_ref<uint32_t>(done[i]).load(), 0u) << "counter " << i;
    EXPECT_EQ(std::atomic_ref<uint32_t>(pushed[i]).load(), i % chunks == own ? 0u : 9u)
        << "flag of chunk " << i % chunks << ", piece " << i / chunks;
  }
  // What the pushes need, named.
  ChunkedGemmArgs bad = args;
  bad.push_ld = 524;  // not a multiple of 16 bytes
  EXPECT_THAT(be_->native_gemm_unsupported(bad), HasSubstr("push_ld = 524"));
  bad = args;
  bad.push_c[0] = static_cast<char*>(args.push_c[0]) + 2;
  EXPECT_THAT(be_->native_gemm_unsupported(bad), HasSubstr("push_c % 16 = 2"));
  bad = args;
  bad.push_chunks = 2;
  EXPECT_THAT(be_->native_gemm_unsupported(bad), HasSubstr("push_chunks = 2, chunks = 3"));
  bad = args;
  bad.done = nullptr;
  EXPECT_THAT(be_->native_gemm_unsupported(bad), HasSubstr("need done counters"));
  bad = args;
  bad.push_flag_stride = 0;  // three pieces a chunk on one flag
  EXPECT_THAT(be_->native_gemm_unsupported(bad), HasSubstr("pieces a chunk = 3"));
  bad = args;
  bad.done_cols = 0;  // counted by whole chunks, flagged by 256 columns
  EXPECT_THAT(be_->native_gemm_unsupported(bad), HasSubstr("the sum flags'"));
  bad = args;
  bad.push_chunks = -1;
  EXPECT_THAT(be_->native_gemm_unsupported(bad), HasSubstr("push_chunks is negative"));
  bad = args;
  bad.a = a->narrow(0, 0, chunks * rows - 8);  // a short last chunk
  bad.d = d->narrow(0, 0, chunks * rows - 8);
  EXPECT_THAT(be_->native_gemm_unsupported(bad), HasSubstr("m % chunk_rows == 0"));
}

TEST_F(CpuNativeGemmTest, AReadyWaitTimesOutNamingTheChunk) {
  OwnedTensor a = empty_host({256, 8}, DType::kBF16), b = empty_host({8, 8}, DType::kBF16);
  OwnedTensor d = empty_host({256, 8}, DType::kBF16);
  uint32_t* f = flags(2);
  ChunkedGemmArgs args = chunked(a, b, d);
  args.ready = f;
  args.rank = 3;
  args.timeout = Millis(30);
  be_->write_flag(f, 1, stream());  // chunk 0 landed, chunk 1 never does
  be_->native_gemm(args, stream());
  try {
    stream().synchronize();
    ADD_FAILURE() << "no TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 3: the native GEMM waited 0.03 s on cpu for chunk 1 of "
                                    "A (piece 0)"));
  }
}

TEST_F(CpuNativeGemmTest, StreamFlagWaitsCountUpAndTimeOutNamingRankPeerAndChannel) {
  uint32_t* f = flags(2);
  be_->write_flag(f, 0xFFFFFFFFu, stream());
  // Wrap-aware (CUDA's GEQ): 0xFFFFFFFF is past 0xFFFFFFF0, and 2 past 0xFFFFFFFF.
  be_->wait_flag(f, 0xFFFFFFF0u, {.timeout = Millis(30)}, stream());
  be_->write_flag(f, 2, stream());
  be_->wait_flag(f, 0xFFFFFFFFu, {.timeout = Millis(30)}, stream());
  stream().synchronize();
  be_->zero_flags(f, 2, stream());
  be_->wait_flag(f, 1, {.rank = 3, .peer = 5, .channel = 2, .timeout = Millis(30)}, stream());
  EXPECT_THAT(error_of([&] { stream().synchronize(); }),
              HasSubstr("rank 3: waited 0.03 s for flag"));
  EXPECT_EQ(error_of([&] { stream().synchronize(); }), "<no error thrown>");  // reported once
  be_->wait_flag(f + 1, 1, {.rank = 3, .peer = 5, .channel = 2, .timeout = Millis(30)}, stream());
  EXPECT_THAT(error_of([&] { stream().synchronize(); }),
              HasSubstr("of peer 5 on channel 2 to reach 1 (it holds 0"));
}

}  // namespace
}  // namespace asynctp
