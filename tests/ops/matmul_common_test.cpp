// The native all_gather_matmul's push pieces (detail::push_pieces) and their setting; the native
// matmul_reduce_scatter's pieces (detail::native_rs_pieces).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/error.h"
#include "ops/context.h"
#include "ops/matmul_common.h"
#include "support/env_testing.h"
#include "support/multiprocess.h"

namespace asynctp {
namespace {

using detail::kMaxPushPieces;
using detail::push_pieces;
constexpr size_t kMiB = size_t{1} << 20;

// Pieces cover the shard exactly: count - 1 pieces of `rows` rows and a last one of 1 to rows.
void expect_covers(const detail::PushPieces& p, int64_t rows) {
  ASSERT_GE(p.count, 1);
  ASSERT_LE(p.count, kMaxPushPieces);
  ASSERT_GT(p.rows, 0);
  const int64_t last = rows - (p.count - 1) * p.rows;
  EXPECT_GE(last, 1) << p.count << " pieces of " << p.rows << " rows for " << rows;
  EXPECT_LE(last, p.rows);
}

TEST(PushPieces, OnePieceWhenOffSmallOrShort) {
  for (const auto& [rows, bytes, piece] :
       std::vector<std::tuple<int64_t, size_t, size_t>>{{1024, 64 * kMiB, 0},       // off
                                                        {512, 8 * kMiB, 8 * kMiB},  // small
                                                        {1024, 15 * kMiB, 8 * kMiB},
                                                        {128, 64 * kMiB, 1},  // one tile
                                                        {100, 64 * kMiB, 1}}) {
    const auto p = push_pieces(rows, bytes, piece);
    EXPECT_EQ(p.count, 1) << rows << " rows, " << bytes << " bytes, pieces of " << piece;
    EXPECT_EQ(p.rows, rows);
  }
}

// The anchor shards at ws 4 with pieces of 8 MiB: seed-4096 (1024 x 8192 bf16, 16 MiB)
// in 2, l3-70b-qkv (2048 x 8192, 32 MiB) in 4, and no more than 4 however big.
TEST(PushPieces, WholeTilesOfAtLeastThePieceSize) {
  EXPECT_EQ(push_pieces(1024, 16 * kMiB, 8 * kMiB).count, 2);
  EXPECT_EQ(push_pieces(1024, 16 * kMiB, 8 * kMiB).rows, 512);
  EXPECT_EQ(push_pieces(2048, 32 * kMiB, 8 * kMiB).count, 4);
  EXPECT_EQ(push_pieces(2048, 32 * kMiB, 8 * kMiB).rows, 512);
  EXPECT_EQ(push_pieces(8192, 1024 * kMiB, 8 * kMiB).count, kMaxPushPieces);
  for (int64_t rows : {129, 200, 300, 512, 1000, 1024, 2047, 4096, 5000}) {
    for (size_t bytes : {size_t{1}, 3 * kMiB, 17 * kMiB, 100 * kMiB}) {
      for (size_t piece : {size_t{1}, kMiB, 8 * kMiB}) {
        const auto p = push_pieces(rows, bytes, piece);
        SCOPED_TRACE(::testing::Message() << rows << " rows, " << bytes << " B, pieces " << piece);
        expect_covers(p, rows);
        if (p.count > 1) {
          EXPECT_EQ(p.rows % 128, 0);
          EXPECT_GE(bytes / static_cast<size_t>(p.count), piece / 2)
              << "pieces much smaller than asked for";
        }
      }
    }
  }
  // 300 rows in as many pieces as allowed: 128 + 128 + 44.
  EXPECT_EQ(push_pieces(300, 300 * 272, 1).count, 3);
  EXPECT_EQ(push_pieces(300, 300 * 272, 1).rows, 128);
}

// The native matmul_reduce_scatter's pieces (detail::native_rs_pieces): column ranges of whole
// 256-column tiles covering n exactly, at least 4 MiB each, at most 4; the anchor chunks at ws 2
// (seed-like: 2048 x 8192 bf16, 32 MiB) and ws 4 (l3-8b-ffn-down: 2048 x 4096, 16 MiB) in 4.
TEST(RsPieces, ColumnRangesOfWholeTilesOfAtLeast4MiB) {
  using detail::native_rs_pieces;
  EXPECT_EQ(native_rs_pieces(8192, 32 * kMiB).count, 4);
  EXPECT_EQ(native_rs_pieces(8192, 32 * kMiB).cols, 2048);
  EXPECT_EQ(native_rs_pieces(4096, 16 * kMiB).count, 4);
  EXPECT_EQ(native_rs_pieces(4096, 16 * kMiB).cols, 1024);
  EXPECT_EQ(native_rs_pieces(8192, 8 * kMiB).count, 2);  // 4 MiB each
  EXPECT_EQ(native_rs_pieces(8192, 8 * kMiB).cols, 4096);
  EXPECT_EQ(native_rs_pieces(8192, 7 * kMiB).count, 1);  // too small to cut
  EXPECT_EQ(native_rs_pieces(8192, 7 * kMiB).cols, 0);
  EXPECT_EQ(native_rs_pieces(256, 1024 * kMiB).count, 1);  // one tile wide
  for (int64_t n : {2, 255, 256, 257, 520, 1000, 4096, 5000, 28672}) {
    for (size_t bytes : {size_t{1}, 5 * kMiB, 17 * kMiB, 1024 * kMiB}) {
      SCOPED_TRACE(::testing::Message() << n << " columns, " << bytes << " B");
      const auto p = native_rs_pieces(n, bytes);
      ASSERT_GE(p.count, 1);
      ASSERT_LE(p.count, kMaxPushPieces);
      if (p.count == 1) {
        EXPECT_EQ(p.cols, 0);
        continue;
      }
      EXPECT_EQ(p.cols % 256, 0);
      const int64_t last = n - (p.count - 1) * p.cols;
      EXPECT_GE(last, 1);
      EXPECT_LE(last, p.cols);
      EXPECT_GE(bytes / static_cast<size_t>(p.count), detail::kRsPieceBytes);
    }
  }
}

// At most max_pieces where asked (the inline pushes' 2), with the same rules.
TEST(RsPieces, AtMostTheAskedForCount) {
  using detail::native_rs_pieces;
  EXPECT_EQ(native_rs_pieces(8192, 32 * kMiB, 2).count, 2);
  EXPECT_EQ(native_rs_pieces(8192, 32 * kMiB, 2).cols, 4096);
  EXPECT_EQ(native_rs_pieces(4096, 16 * kMiB, 2).count, 2);
  EXPECT_EQ(native_rs_pieces(8192, 7 * kMiB, 2).count, 1);  // too small to cut
  EXPECT_EQ(native_rs_pieces(8192, 32 * kMiB, 1).count, 1);
  EXPECT_EQ(native_rs_pieces(8192, 32 * kMiB, 9).count, kMaxPushPieces);
  EXPECT_EQ(native_rs_pieces(1000, 1024 * kMiB, 2).cols, 512);  // 512 + 488
}

TEST(PushInlineMinK, SettingComesFromTheEnvironment) {
  const asynctp::testing::ScopedUnsetEnv unset("ASYNCTP_PUSH_INLINE_MIN_K");
  EXPECT_EQ(ContextOptions::default_push_inline_min_k(), 0);
  ::setenv("ASYNCTP_PUSH_INLINE_MIN_K", "4096", 1);
  EXPECT_EQ(ContextOptions::default_push_inline_min_k(), 4096);
  for (const char* bad : {"-1", "2k", "x"}) {
    ::setenv("ASYNCTP_PUSH_INLINE_MIN_K", bad, 1);
    EXPECT_THAT([] { ContextOptions::default_push_inline_min_k(); },
                ::testing::ThrowsMessage<Error>(::testing::HasSubstr("ASYNCTP_PUSH_INLINE_MIN_K")));
  }
}

TEST(PushPieces, SettingComesFromTheEnvironment) {
  const asynctp::testing::ScopedUnsetEnv unset("ASYNCTP_PUSH_PIECE_BYTES");
  EXPECT_EQ(ContextOptions::default_push_piece_bytes(), 0u);
  ::setenv("ASYNCTP_PUSH_PIECE_BYTES", "8388608", 1);
  EXPECT_EQ(ContextOptions::default_push_piece_bytes(), 8 * kMiB);
  ::setenv("ASYNCTP_PUSH_PIECE_BYTES", "4194304", 1);
  EXPECT_EQ(ContextOptions::default_push_piece_bytes(), 4 * kMiB);
  for (const char* bad : {"-1", "4M", "x"}) {
    ::setenv("ASYNCTP_PUSH_PIECE_BYTES", bad, 1);
    EXPECT_THAT([] { ContextOptions::default_push_piece_bytes(); },
                ::testing::ThrowsMessage<Error>(::testing::HasSubstr("ASYNCTP_PUSH_PIECE_BYTES")));
  }
}

TEST(PushStreams, SettingComesFromTheEnvironmentAndIsChecked) {
  {
    // The variable is back before the contexts below read it.
    const asynctp::testing::ScopedUnsetEnv unset("ASYNCTP_PUSH_STREAMS");
    EXPECT_EQ(ContextOptions::default_push_streams(), 2);
    for (int k = 1; k <= ContextOptions::kMaxPushStreams; ++k) {
      ::setenv("ASYNCTP_PUSH_STREAMS", std::to_string(k).c_str(), 1);
      EXPECT_EQ(ContextOptions::default_push_streams(), k);
    }
    for (const char* bad : {"0", "5", "12", "-1", "x", "2 "}) {
      ::setenv("ASYNCTP_PUSH_STREAMS", bad, 1);
      EXPECT_THAT([] { ContextOptions::default_push_streams(); },
                  ::testing::ThrowsMessage<Error>(::testing::AllOf(
                      ::testing::HasSubstr("ASYNCTP_PUSH_STREAMS"), ::testing::HasSubstr(bad))));
    }
  }
  // Out of range in the options themselves: the context refuses to start, naming the value.
  const asynctp::testing::HarnessOptions harness;
  auto statuses = asynctp::testing::run_processes(
      1,
      [&](const RendezvousInfo& info) {
        auto group = Group::create(info, asynctp::testing::rank_group_options(harness, 0));
        for (const int bad : {0, ContextOptions::kMaxPushStreams + 1}) {
          ContextOptions options;
          options.push_streams = bad;
          EXPECT_THAT([&] { OpContext::create(group, options); },
                      ::testing::ThrowsMessage<Error>(::testing::HasSubstr(
                          fmt::format("ContextOptions::push_streams must be from 1 to {}, got {}",
                                      ContextOptions::kMaxPushStreams, bad))));
        }
        ContextOptions options;
        options.push_inline_min_k = -3;
        EXPECT_THAT([&] { OpContext::create(group, options); },
                    ::testing::ThrowsMessage<Error>(::testing::HasSubstr(
                        "ContextOptions::push_inline_min_k must be 0 or more, got -3")));
      },
      harness);
  EXPECT_RANKS_OK(statuses);
}

}  // namespace
}  // namespace asynctp
