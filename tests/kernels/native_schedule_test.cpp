// The native GEMM's schedule (kernels/native/schedule.h) on CPU: the functions the kernel and its
// host side call, run here as the kernel runs them (tile by tile, unit by unit), against the
// invariants the ops rely on. Property tests over seeded random shapes, and small cases checked
// by hand.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/native/schedule.h"

namespace asynctp::kernels {
namespace {

// Params of a shape (nothing is launched: only the schedule is asked).
NativeGemmParams shape(int64_t m, int64_t n, int64_t k = 1024) {
  NativeGemmParams p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.c_dtype = DType::kBF16;
  // 16-byte aligned and a TMA-able row stride: clusters of two are possible.
  p.c = reinterpret_cast<void*>(uintptr_t{1} << 20);
  p.ldc = (n + 7) / 8 * 8;
  return p;
}

uint32_t g_flag = 0;        // a flag array the schedule only compares with null
char g_workspace[16] = {};  // a tail-split workspace the schedule only points into

struct Rng {
  std::mt19937 gen;
  explicit Rng(uint32_t seed) : gen(seed) {}
  int operator()(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); }
};

// A random problem of up to m_tiles x n_tiles tiles and 80 k-blocks, each edge off its grid.
NativeGemmParams random_shape(Rng& pick, int m_tiles, int n_tiles) {
  const int64_t m = 128 * pick(1, m_tiles) - pick(0, 127);
  const int64_t n = 256 * pick(1, n_tiles) - pick(0, 255);
  return shape(m, n, 64 * pick(1, 80) - pick(0, 63));
}

// Random params for the walk: chunks on or off the tile grid, a pivot chunk, pieces of ready
// flags (AG+MM), done counters by rows and columns (MM+RS, chunks on the grid), the reduced own
// chunk, clusters of two.
NativeGemmParams random_walk_params(Rng& pick) {
  NativeGemmParams p = shape(0, 256 * pick(1, 12) - (pick(0, 1) == 0 ? 8 * pick(0, 31) : 0));
  const int mode = pick(0, 3);  // 0 nothing waited for, 1 ready pieces, 2 done, 3 done + sum
  const bool on_grid = mode >= 2 || pick(0, 1) == 0;
  const int64_t chunk_tiles = pick(1, 12);
  p.chunk_rows = on_grid ? 128 * chunk_tiles : pick(1, 1600);
  const int64_t chunks = pick(1, 8);
  p.m = chunks * p.chunk_rows - (on_grid && pick(0, 2) == 0 ? 128 * pick(0, chunk_tiles - 1) : 0);
  if (!on_grid && pick(0, 2) == 0) p.m -= pick(0, static_cast<int>(p.chunk_rows) - 1);
  p.first_chunk = pick(0, static_cast<int>(num_chunks(p)) - 1);
  p.cluster = pick(0, 3) == 0 ? 2 : 1;
  if (mode == 1) {
    p.ready = &g_flag;
    p.ready_stride = num_chunks(p);
    if (pick(0, 1) == 0) p.ready_rows = pick(1, static_cast<int>(p.chunk_rows));
  }
  if (mode >= 2) {
    p.done = &g_flag;
    std::vector<int64_t> divisors;
    for (int64_t d = 1; d <= chunk_tiles; ++d)
      if (chunk_tiles % d == 0) divisors.push_back(d);
    if (pick(0, 1) == 0) p.done_rows = 128 * divisors[pick(0, int(divisors.size()) - 1)];
    if (pick(0, 1) == 0) p.done_cols = 256 * pick(1, 4);
  }
  if (mode == 3 && p.m % p.chunk_rows == 0) {
    p.sum_chunk = (p.first_chunk + static_cast<int>(num_chunks(p)) - 1) % num_chunks(p);
    p.sum_count = static_cast<int>(num_chunks(p));
    p.sum_self = p.sum_chunk;
  }
  // The SwiGLU epilogue (AG+MM: no done counters, no sum): tiles of kBN / 2 output columns.
  if (mode <= 1 && pick(0, 3) == 0) p.swiglu = true;
  return p;
}

std::string describe(const NativeGemmParams& p) {
  return fmt::format(
      "m {} n {} chunk_rows {} first {} ready {} ready_rows {} done {} done_rows {} done_cols {} "
      "sum_chunk {} cluster {} swiglu {}",
      p.m, p.n, p.chunk_rows, p.first_chunk, p.ready != nullptr, p.ready_rows, p.done != nullptr,
      p.done_rows, p.done_cols, p.sum_chunk, p.cluster, p.swiglu);
}

// The walk as the kernel sees it: resolved params, (cluster) tile height, group height.
struct KernelView {
  NativeGemmParams r;
  NativeGemmPlan plan;
  Walk walk;
  int cluster;
};
KernelView kernel_view(const NativeGemmParams& p, int ctas = 132, int sms = 132) {
  KernelView v;
  v.r = resolved(p);
  v.plan = plan_of(v.r, ctas, sms);
  v.cluster = uses_cluster(p) ? 2 : 1;
  v.walk = walk_of(v.r, kBM * v.cluster, v.plan.group_m);
  return v;
}

// Runs check(params, their kernel view) over `trials` random walk params drawn from `seed`.
template <typename Check>
void for_random_walks(uint32_t seed, int trials, Check check) {
  Rng pick(seed);
  for (int trial = 0; trial < trials; ++trial) {
    const NativeGemmParams p = random_walk_params(pick);
    SCOPED_TRACE(describe(p));
    check(p, kernel_view(p));
  }
}

TEST(NativeSchedule, ResolvedIsIdempotent) {
  Rng pick(1);
  for (int trial = 0; trial < 500; ++trial) {
    const NativeGemmParams p = random_walk_params(pick);
    const NativeGemmParams r = resolved(p);
    const NativeGemmParams rr = resolved(r);
    EXPECT_EQ(std::make_tuple(r.chunk_rows, r.ready_rows, r.done_rows, r.done_cols, r.sum_rows,
                              r.sum_cols, r.own_chunk, r.b_mn_lbo, r.b_mn_sbo),
              std::make_tuple(rr.chunk_rows, rr.ready_rows, rr.done_rows, rr.done_cols, rr.sum_rows,
                              rr.sum_cols, rr.own_chunk, rr.b_mn_lbo, rr.b_mn_sbo))
        << describe(p);
    EXPECT_EQ(group_m_of(r, tile_height(r)), group_m_of(p, tile_height(p))) << describe(p);
    EXPECT_EQ(done_order(r), done_order(p)) << describe(p);
  }
}

// Every tile of the grid is visited exactly once, on the (cluster) tile grid: kBN output
// columns a tile, kBN / 2 with the SwiGLU epilogue (whose tiles take the gate's and the up
// projection's kBN / 2 columns each), on single CTAs.
TEST(NativeSchedule, WalkVisitsEveryTileOnce) {
  int swiglu_walks = 0;
  for_random_walks(2, 3000, [&](const NativeGemmParams& p, const KernelView& v) {
    const Walk& w = v.walk;
    ASSERT_EQ(w.num_tiles, num_tiles(p, tile_height(p)));
    ASSERT_EQ(w.width, p.swiglu ? kBN / 2 : kBN);
    ASSERT_EQ(w.tiles_n, (p.n + w.width - 1) / w.width);
    if (p.swiglu) {
      ++swiglu_walks;
      ASSERT_EQ(v.cluster, 1);
      ASSERT_EQ(b_cols(p), 2 * p.n);
    }
    ASSERT_GE(w.group_m, 1);
    ASSERT_LE(w.group_m, kGroupM);
    std::set<std::pair<int, int>> seen;
    for (int t = 0; t < w.num_tiles; ++t) {
      const Tile tile = w.tile(t);
      ASSERT_EQ(tile.m0 % w.height, 0);
      ASSERT_EQ(tile.n0 % w.width, 0);
      ASSERT_LT(tile.m0, p.m);
      ASSERT_LT(tile.n0, p.n);
      ASSERT_TRUE(seen.insert({tile.m0, tile.n0}).second) << "tile " << t << " visited twice";
    }
    EXPECT_EQ(static_cast<int>(seen.size()), w.tiles_m * w.tiles_n);
  });
  EXPECT_GT(swiglu_walks, 100);
}

// The walk starts at the first tile of the pivot chunk (wholly inside it where the chunk holds
// one) and reaches the chunks in the order their owners push them: first_chunk, first_chunk +
// 1, ... wrapping around (the chunk of each tile's first row, first seen in that order). The
// reduced own chunk of the native MM+RS comes after every other tile.
TEST(NativeSchedule, WalkStartsAtThePivotAndFollowsThePushOrder) {
  for_random_walks(3, 3000, [](const NativeGemmParams& p, const KernelView& v) {
    const Walk& w = v.walk;
    const int64_t rows = v.r.chunk_rows, first_row = p.first_chunk * rows;
    const int64_t chunks = num_chunks(p);
    // The first (cluster) tile that starts inside or after the pivot chunk's first row; past
    // the last tile (a last chunk that holds no tile start), the walk wraps to m-tile 0.
    const Tile start = w.tile(0);
    const int64_t pivot = (first_row + w.height - 1) / w.height;
    EXPECT_EQ(start.m0, pivot % w.tiles_m * w.height);
    EXPECT_EQ(start.n0, 0);
    if (start.m0 >= first_row && start.m0 + w.height <= std::min(p.m, first_row + rows)) {
      EXPECT_EQ(start.m0 / rows, p.first_chunk) << "the first tile is not in the pivot chunk";
    }
    int64_t last_key = -1;
    std::vector<bool> seen(static_cast<size_t>(chunks), false);
    int last_other = -1, first_sum = w.num_tiles;
    for (int t = 0; t < w.num_tiles; ++t) {
      const Tile tile = w.tile(t);
      const int64_t c = tile.m0 / rows;
      const int64_t key = (c - p.first_chunk + chunks) % chunks;
      if (!seen[static_cast<size_t>(key)]) {
        EXPECT_GT(key, last_key) << "chunk " << c << " first reached at tile " << t;
        seen[static_cast<size_t>(key)] = true;
        last_key = key;
      }
      // A pair's CTAs reduce together or not at all (their rings go in step).
      const bool sums = in_sum_chunk(v.r, tile.m0);
      if (v.cluster == 2 && tile.m0 + kBM < p.m) {
        EXPECT_EQ(in_sum_chunk(v.r, tile.m0 + kBM), sums) << "a pair's CTAs differ, tile " << t;
      }
      if (sums) {
        first_sum = std::min(first_sum, t);
      } else {
        last_other = t;
      }
    }
    if (p.sum_chunk >= 0) {
      EXPECT_LT(last_other, first_sum) << "the own chunk is not last";
    }
  });
}

// Small walks checked by hand.
TEST(NativeSchedule, WalkByHand) {
  // 4 chunks of one m-tile, two n-tiles, from chunk 2: one group of 16 (nothing waits), the m
  // index fastest.
  NativeGemmParams p = shape(512, 512);
  p.chunk_rows = 128;
  p.first_chunk = 2;
  auto walk = [&] {
    const KernelView v = kernel_view(p);
    std::vector<std::pair<int, int>> tiles;
    for (int t = 0; t < v.walk.num_tiles; ++t)
      tiles.push_back({v.walk.tile(t).m0, v.walk.tile(t).n0});
    return tiles;
  };
  using Tiles = std::vector<std::pair<int, int>>;
  EXPECT_EQ(
      walk(),
      (Tiles{{256, 0}, {384, 0}, {0, 0}, {128, 0}, {256, 256}, {384, 256}, {0, 256}, {128, 256}}));
  // Counted by chunk: groups of one m-tile, each chunk's row finished before the next.
  p.done = &g_flag;
  EXPECT_EQ(
      walk(),
      (Tiles{{256, 0}, {256, 256}, {384, 0}, {384, 256}, {0, 0}, {0, 256}, {128, 0}, {128, 256}}));
  EXPECT_EQ(done_order(p), (std::vector<int>{2, 3, 0, 1}));
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(done_count(p, i), 4u);  // 2 halves x 2 n-tiles
  // The SwiGLU epilogue over N = 200 output columns (B: 400): tiles of 128 output columns, so
  // two n-tiles, the second over columns 128..199 (its B tile: gate 128..255, up 328..455).
  p = shape(512, 200);
  p.chunk_rows = 128;
  p.first_chunk = 2;
  p.swiglu = true;
  p.cluster = 2;  // ignored: single CTAs
  EXPECT_EQ(
      walk(),
      (Tiles{{256, 0}, {384, 0}, {0, 0}, {128, 0}, {256, 128}, {384, 128}, {0, 128}, {128, 128}}));
  EXPECT_EQ(num_tiles(p, tile_height(p)), 8);
  // Chunks of 200 rows off the grid, from chunk 1 (rows 200..399): the walk starts at the first
  // m-tile wholly inside it (rows 256..383); the tile over row 200 (rows 128..255) comes last.
  p = shape(800, 256);
  p.chunk_rows = 200;
  p.first_chunk = 1;
  EXPECT_EQ(walk(), (Tiles{{256, 0}, {384, 0}, {512, 0}, {640, 0}, {768, 0}, {0, 0}, {128, 0}}));
}

// The done order lists every counter once, in the order of each counter's last tile in the walk
// (run forwards here, as the kernel publishes); every counter reaches its count from the halves
// the kernel publishes (done_index), and the counts add up to every published half.
TEST(NativeSchedule, DoneOrderAndCountsFollowTheWalk) {
  for_random_walks(4, 4000, [](const NativeGemmParams& p, const KernelView& v) {
    if (p.done == nullptr) return;
    const int counters = num_done_counters(p);
    std::vector<uint32_t> counted(static_cast<size_t>(counters), 0);
    std::vector<int> last(static_cast<size_t>(counters), -1);
    int64_t halves = 0;
    for (int t = 0; t < v.walk.num_tiles; ++t) {
      const Tile tile = v.walk.tile(t);
      for (int cta = 0; cta < v.cluster; ++cta) {
        const int m0 = tile.m0 + kBM * cta;
        if (in_sum_chunk(v.r, m0)) continue;  // reduced, never counted
        for (int consumer = 0; consumer < 2; ++consumer) {
          const int r0 = m0 + 64 * consumer;
          if (r0 >= p.m) continue;
          const int64_t index = done_index(v.r, v.plan, r0, tile.n0);
          ASSERT_GE(index, 0);
          ASSERT_LT(index, counters);
          ++counted[static_cast<size_t>(index)];
          last[static_cast<size_t>(index)] = t;
          ++halves;
        }
      }
    }
    int64_t total = 0;
    for (int i = 0; i < counters; ++i) {
      const bool reduced =
          p.sum_chunk >= 0 &&
          i / v.plan.done_col_pieces * v.r.done_rows / v.r.chunk_rows == p.sum_chunk;
      if (reduced) continue;
      EXPECT_EQ(counted[static_cast<size_t>(i)], done_count(p, i)) << "counter " << i;
      total += done_count(p, i);
    }
    EXPECT_EQ(total, halves);
    const std::vector<int> order = done_order(p);
    std::vector<int> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int> all(static_cast<size_t>(counters));
    std::iota(all.begin(), all.end(), 0);
    ASSERT_EQ(sorted, all) << "not every counter once";
    for (size_t i = 1; i < order.size(); ++i) {
      const int a = order[i - 1], b = order[i];
      if (last[static_cast<size_t>(a)] < 0 || last[static_cast<size_t>(b)] < 0) continue;
      EXPECT_LE(last[static_cast<size_t>(a)], last[static_cast<size_t>(b)])
          << "counter " << a << " before " << b;
    }
  });
}

// The native MM+RS's walk: groups never span two chunks, so the done counters complete chunk by
// chunk in the walk's order (rank + 1, rank + 2, ...), each chunk's column pieces in column
// order, and the own chunk (reduced, never counted) comes last: the order of the pushes. On
// single CTAs (bf16) and on pairs (float8's default) where every chunk and counted piece is whole
// 256-row tiles (pairs_can_sum), single CTAs elsewhere.
TEST(NativeSchedule, ReduceScatterFinishesThePeersChunksOneByOneAndTheOwnLast) {
  NativeGemmParams a = shape(0, 8192);
  a.done = &g_flag;
  a.done_cols = 2048;  // 4 column pieces of 8 n-tiles
  for (const bool float8 : {false, true}) {
    a.in_dtype = float8 ? DType::kF8E4M3 : DType::kBF16;
    a.b_k_major = float8;
    for (int ws : {2, 3, 4, 8}) {
      for (int64_t chunk_tiles = 1; chunk_tiles <= 40; ++chunk_tiles) {
        for (int rank = 0; rank < ws; ++rank) {
          SCOPED_TRACE(fmt::format("{}, ws {}, rank {}, chunks of {} m-tiles",
                                   float8 ? "float8" : "bf16", ws, rank, chunk_tiles));
          a.chunk_rows = 128 * chunk_tiles;
          a.m = ws * a.chunk_rows;
          a.sum_chunk = rank;
          a.first_chunk = (rank + 1) % ws;
          const bool pairs = float8 && chunk_tiles % 2 == 0;
          EXPECT_EQ(uses_cluster(a), pairs);
          const int g = group_m_of(a, tile_height(a));
          EXPECT_EQ(a.chunk_rows % (g * tile_height(a)), 0)
              << "a group of " << g << " spans two chunks";
          std::vector<int> want;
          for (int i = 1; i <= ws; ++i) {
            for (int q = 0; q < 4; ++q)
              want.push_back(4 * ((rank + i) % ws) + q);
          }
          EXPECT_EQ(done_order(a), want);
          // Counted pieces of 128 rows inside whole pair tiles: single CTAs.
          a.done_rows = 128;
          EXPECT_FALSE(uses_cluster(a));
          a.done_rows = 0;
        }
      }
    }
  }
  // 16-bit inputs take pairs when asked for, on the same condition.
  a.in_dtype = DType::kBF16;
  a.b_k_major = false;
  a.cluster = 2;
  a.chunk_rows = 512;
  a.m = 2 * a.chunk_rows;
  EXPECT_TRUE(uses_cluster(a));
  a.chunk_rows = 384;
  a.m = 2 * a.chunk_rows;
  EXPECT_FALSE(uses_cluster(a));
}

// The walk's group height: 16 m-tiles where nothing waits or counts; where rows become ready (AG)
// or are counted (MM+RS) by pieces, the largest height up to 16 that divides every piece and
// chunk; where AG pieces are off the tile grid, a piece's whole m-tiles (up to 16).
TEST(NativeSchedule, GroupsNeverSpanAPieceOrAChunk) {
  NativeGemmParams a = shape(8192, 4096);
  EXPECT_EQ(group_m_of(a, kBM), 16);
  a.done = &g_flag;
  for (int64_t chunk_tiles = 1; chunk_tiles <= 80; ++chunk_tiles) {
    for (int64_t piece_tiles : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{4}, chunk_tiles}) {
      if (piece_tiles > 0 && chunk_tiles % piece_tiles != 0) continue;
      SCOPED_TRACE(fmt::format("chunks of {} m-tiles, pieces of {}", chunk_tiles, piece_tiles));
      a.chunk_rows = 128 * chunk_tiles;
      a.m = 2 * a.chunk_rows;
      a.done_rows = 128 * piece_tiles;
      const int g = group_m_of(a, kBM);
      const int64_t piece = piece_tiles > 0 ? piece_tiles : chunk_tiles;
      EXPECT_GE(g, 1);
      EXPECT_LE(g, 16);
      EXPECT_EQ(piece % g, 0);
      EXPECT_EQ(chunk_tiles % g, 0);
    }
  }
  a.done_rows = 0;
  for (const auto& [chunk_tiles, want] : std::vector<std::pair<int64_t, int>>{
           {8, 8}, {16, 16}, {40, 10}, {48, 16}, {56, 14}, {64, 16}, {37, 1}, {13, 13}}) {
    a.chunk_rows = 128 * chunk_tiles;
    a.m = 2 * a.chunk_rows;
    EXPECT_EQ(group_m_of(a, kBM), want) << chunk_tiles << " m-tiles a chunk";
  }
  a.done = nullptr;
  a.ready = &g_flag;
  a.chunk_rows = 128 * 48;
  a.ready_rows = 128 * 12;
  EXPECT_EQ(group_m_of(a, kBM), 12);
  a.ready_rows = 0;
  for (const auto& [rows, want] : std::vector<std::pair<int64_t, int>>{
           {1000, 7}, {2000, 15}, {4000, 16}, {100, 1}, {250, 1}, {300, 2}}) {
    a.chunk_rows = rows;
    a.m = 4 * rows;
    EXPECT_EQ(group_m_of(a, kBM), want) << rows << "-row chunks";
  }
  for (const auto& [rows, piece, want] : std::vector<std::tuple<int64_t, int64_t, int>>{
           {4000, 1024, 8}, {1000, 512, 4}, {1000, 896, 7}, {300, 256, 2}}) {
    a.chunk_rows = rows;
    a.ready_rows = piece;
    a.m = 4 * rows;
    EXPECT_EQ(group_m_of(a, kBM), want) << rows << "-row chunks, pieces of " << piece;
  }
  // A reduced own chunk keeps the groups within chunks even with nothing waited for or counted.
  a.ready = nullptr;
  a.chunk_rows = 128 * 40;
  a.m = 2 * a.chunk_rows;
  a.sum_chunk = 0;
  a.first_chunk = 1;
  EXPECT_EQ(group_m_of(a, kBM), 10);
}

// The tail split never gives a tail tile more parts than the last wave's idle slots take (CTAs,
// or pairs: all tail units fit in one wave, at most one per slot), keeps every part at least
// kMinSplitKBlocks deep and within the workspace, and the units cover every (tile, k-block)
// exactly once.
TEST(NativeSchedule, TailSplitFitsTheIdleCtasAndCoversEveryKBlockOnce) {
  Rng pick(5);
  int splits = 0, pair_splits = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    NativeGemmParams p = random_shape(pick, 40, 20);
    p.split_workspace = pick(0, 5) == 0 ? nullptr : g_workspace;
    p.tail_split = pick(0, 6);
    p.cluster = pick(0, 5) == 0 ? 2 : 1;
    const int sms = pick(1, 140);
    const int ctas = pick(0, 3) == 0 ? sms + pick(1, 8) : pick(1, sms);
    SCOPED_TRACE(fmt::format("m {} n {} k {} ctas {} sms {} tail_split {} workspace {} cluster {}",
                             p.m, p.n, p.k, ctas, sms, p.tail_split, p.split_workspace != nullptr,
                             p.cluster));
    const KernelView v = kernel_view(p, ctas, sms);
    const int split = v.plan.split;
    const int tiles = v.walk.num_tiles;
    ASSERT_GE(split, 1);
    ASSERT_LE(split, kMaxSplit);
    if (p.tail_split >= 2) {
      EXPECT_LE(split, p.tail_split);
    }
    // Pairs: a slot is a cluster (both CTAs take the same unit).
    const int slots = ctas / v.cluster;
    if (p.split_workspace == nullptr || p.tail_split == 1 || ctas > sms || slots == 0) {
      EXPECT_EQ(split, 1);
    }
    if (split > 1) {
      ++splits;
      pair_splits += v.cluster == 2 ? 1 : 0;
      const int tail = tiles - v.plan.full_tiles;
      EXPECT_EQ(v.plan.full_tiles % slots, 0);
      EXPECT_EQ(tail, tiles % slots);
      EXPECT_LE(tail * split, slots) << "more parts than idle slots";
      // Every tail CTA's parts have their own flags and partials within the workspace.
      const int last_slot = split_slot(tail - 1, v.cluster, v.cluster - 1);
      EXPECT_LT(split_flag_index(last_slot, 1), 2 * sms);
      EXPECT_LE(split_partial_index(v.plan, last_slot, split - 2, 1) + 32 * 128,
                static_cast<int64_t>(sms) * (kPartialBytes / 16));
    } else {
      EXPECT_EQ(v.plan.full_tiles, tiles);
    }
    const int units = num_units(v.plan, tiles);
    std::map<std::pair<int, int>, int> covered;
    for (int u = 0; u < units; ++u) {
      const Unit w = unit_at(u, v.plan, tiles, v.walk.k_blocks);
      ASSERT_GE(w.t, 0);
      ASSERT_LT(w.t, tiles);
      if (w.part >= 0) {
        EXPECT_GE(w.kb1 - w.kb0, kMinSplitKBlocks) << "unit " << u;
        EXPECT_LT(w.part, split);
        EXPECT_EQ(w.tail, w.t - v.plan.full_tiles);
      }
      for (int kb = w.kb0; kb < w.kb1; ++kb)
        ++covered[{w.t, kb}];
    }
    ASSERT_EQ(covered.size(), static_cast<size_t>(tiles) * v.walk.k_blocks);
    for (const auto& [key, count] : covered)
      ASSERT_EQ(count, 1) << "tile " << key.first << " k-block " << key.second;
  }
  EXPECT_GT(splits, 100);  // the split is exercised, not only its absence
  EXPECT_GT(pair_splits, 10);
}

// A launch's grid: at most the slots that fit (CTAs, or pairs) and one per unit; the tail units
// all run in the grid's last round, one per slot, so that a last part never waits for a part
// that its own slot, or a slot not yet running, still has to compute.
TEST(NativeSchedule, LaunchGridRunsTheTailUnitsTogetherOnePerSlot) {
  Rng pick(7);
  int splits = 0, pair_splits = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    NativeGemmParams p = random_shape(pick, 60, 30);
    p.split_workspace = g_workspace;
    p.cluster = pick(0, 1) == 0 ? 2 : 1;
    const int sms = pick(1, 140);
    const int max_ctas = pick(1, sms);
    const int per_slot = uses_cluster(p) ? 2 : 1;
    const int fit = pick(0, 3) == 0 ? sms : pick(1, std::max(1, max_ctas / per_slot));
    SCOPED_TRACE(fmt::format("m {} n {} k {} sms {} max_ctas {} fit {} cluster {}", p.m, p.n, p.k,
                             sms, max_ctas, fit, per_slot));
    const NativeGemmParams r = resolved(p);
    const LaunchGrid g = launch_grid(r, fit, max_ctas, sms);
    const int64_t units = num_units(g.plan, num_tiles(r, tile_height(r)));
    if (max_ctas / per_slot == 0) {
      EXPECT_EQ(g.slots, 0);
      continue;
    }
    ASSERT_GE(g.slots, 1);
    EXPECT_LE(g.slots, fit);
    EXPECT_LE(g.slots * per_slot, max_ctas);
    EXPECT_LE(g.slots, units);
    if (g.plan.split > 1) {
      ++splits;
      pair_splits += per_slot == 2 ? 1 : 0;
      EXPECT_LE(units - g.plan.full_tiles, g.slots) << "more tail units than slots";
      for (int64_t u = g.plan.full_tiles; u < units; ++u)
        EXPECT_GE(u + g.slots, units) << "tail unit " << u << " is not its slot's last";
    }
  }
  EXPECT_GT(splits, 100);
  EXPECT_GT(pair_splits, 30);
}

// The own chunk's edge rows are exactly its rows that tiles read from `a` (tiles that are not
// wholly inside the chunk, by reads_own, as the producer decides): the first `head` and the last
// `tail` rows.
TEST(NativeSchedule, OwnEdgeRowsAreExactlyTheRowsEdgeTilesRead) {
  Rng pick(6);
  for (int trial = 0; trial < 3000; ++trial) {
    NativeGemmParams p = random_walk_params(pick);
    p.own_a = g_workspace;
    p.own_chunk = pick(0, static_cast<int>(num_chunks(p)) - 1);
    SCOPED_TRACE(describe(p) + fmt::format(" own_chunk {}", p.own_chunk));
    const KernelView v = kernel_view(p);
    const int64_t first = own_first_row(v.r), last = std::min(p.m, first + v.r.chunk_rows);
    std::vector<bool> from_a(static_cast<size_t>(last - first), false);
    for (int t = 0; t < v.walk.num_tiles; ++t) {
      for (int cta = 0; cta < v.cluster; ++cta) {
        const int64_t m0 = v.walk.tile(t).m0 + kBM * cta;
        if (reads_own(v.r, m0)) {
          EXPECT_GE(m0, first);
          EXPECT_LE(m0 + kBM, first + v.r.chunk_rows);
          continue;
        }
        for (int64_t r = std::max(m0, first); r < std::min({m0 + kBM, last, p.m}); ++r)
          from_a[static_cast<size_t>(r - first)] = true;
      }
    }
    const NativeGemmOwnEdges edges = own_edge_rows(p);
    ASSERT_GE(edges.head, 0);
    ASSERT_GE(edges.tail, 0);
    ASSERT_LE(edges.head + edges.tail, last - first);
    for (int64_t r = first; r < last; ++r) {
      const bool edge = r < first + edges.head || r >= last - edges.tail;
      ASSERT_EQ(from_a[static_cast<size_t>(r - first)], edge) << "row " << r;
    }
  }
  // By hand: chunks of 200 rows, the own chunk 1 (rows 200..399): the tile of rows 128..255
  // reads its first 56 rows from a, the tile of rows 384..511 its last 16.
  NativeGemmParams p = shape(800, 256);
  p.chunk_rows = 200;
  p.own_a = g_workspace;
  p.own_chunk = 1;
  EXPECT_EQ(own_edge_rows(p).head, 56);
  EXPECT_EQ(own_edge_rows(p).tail, 16);
  p.own_a = nullptr;  // no own rows: nothing read in place
  EXPECT_EQ(own_edge_rows(p).head + own_edge_rows(p).tail, 0);
}

// A tile waits for exactly the ready flags of the pieces its rows overlap, each once.
TEST(NativeSchedule, ReadyPiecesAreThoseATileOverlaps) {
  Rng pick(7);
  for (int trial = 0; trial < 3000; ++trial) {
    NativeGemmParams p = shape(0, 256);
    p.chunk_rows = pick(1, 2000);
    p.m = p.chunk_rows * pick(1, 8) - pick(0, static_cast<int>(p.chunk_rows) - 1);
    p.ready = &g_flag;
    p.ready_rows = pick(0, 1) == 0 ? 0 : pick(1, static_cast<int>(p.chunk_rows));
    p.ready_stride = num_chunks(p) + pick(0, 3);
    SCOPED_TRACE(fmt::format("m {} chunk_rows {} ready_rows {} stride {}", p.m, p.chunk_rows,
                             p.ready_rows, p.ready_stride));
    const NativeGemmParams r = resolved(p);
    for (int64_t m0 = 0; m0 < p.m; m0 += kBM) {
      std::set<int64_t> waited;
      const int64_t end_row = std::min(p.m, m0 + kBM);
      for (int64_t row = m0; row < end_row;) {  // as the producer walks them
        const ReadyPiece piece = ready_piece_at(r, row);
        ASSERT_GT(piece.end, row);
        row = piece.end;
        ASSERT_TRUE(waited.insert(ready_index(r, piece)).second) << "a flag waited twice";
      }
      std::set<int64_t> want;
      for (int64_t row = m0; row < end_row; ++row) {
        const int64_t c = row / r.chunk_rows, j = (row - c * r.chunk_rows) / r.ready_rows;
        want.insert(j * r.ready_stride + c);
      }
      ASSERT_EQ(waited, want) << "tile at row " << m0;
    }
  }
}

// The reduce-scatter epilogue's flag pieces: every tile of the own chunk maps to one piece below
// the number of pieces, and the pieces of the chunk's tiles are all of them.
TEST(NativeSchedule, SumPiecesCoverTheOwnChunk) {
  Rng pick(8);
  for (int trial = 0; trial < 500; ++trial) {
    NativeGemmParams p = shape(0, 256 * pick(1, 16) - 2 * pick(0, 100));
    p.chunk_rows = 128 * pick(1, 12);
    p.m = p.chunk_rows * pick(1, 8);
    p.sum_chunk = pick(0, static_cast<int>(num_chunks(p)) - 1);
    p.sum_cols = pick(0, 1) == 0 ? 0 : 256 * pick(1, 4);
    std::vector<int64_t> divisors;
    for (int64_t d = 128; d <= p.chunk_rows; d += 128)
      if (p.chunk_rows % d == 0) divisors.push_back(d);
    p.sum_rows = pick(0, 1) == 0 ? 0 : divisors[pick(0, int(divisors.size()) - 1)];
    const KernelView v = kernel_view(p);
    const int64_t pieces = v.r.chunk_rows / v.r.sum_rows * v.plan.sum_col_pieces;
    std::set<int64_t> seen;
    for (int64_t m0 = p.sum_chunk * v.r.chunk_rows; m0 < (p.sum_chunk + 1) * v.r.chunk_rows;
         m0 += kBM) {
      ASSERT_TRUE(in_sum_chunk(v.r, m0));
      for (int n0 = 0; n0 < p.n; n0 += kBN) {
        const int64_t q = sum_piece(v.r, v.plan, sum_row_of(v.r, m0), n0);
        ASSERT_GE(q, 0);
        ASSERT_LT(q, pieces);
        seen.insert(q);
      }
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), pieces);
  }
}

// The SwiGLU epilogue stores through the staging area (TMA) where C and pre both can go that
// way: 16-bit, 16-byte aligned bases and row strides, and N % 8 == 0 so that pre's up half starts
// 16-byte aligned; otherwise from registers. Never in clusters.
TEST(NativeSchedule, SwigluTakesTheTmaStoreWhereCAndPreAllowIt) {
  alignas(16) static uint16_t buffer[64];
  NativeGemmParams p = shape(512, 200);
  p.swiglu = true;
  p.c = buffer;
  p.ldc = 200;
  p.cluster = 2;
  EXPECT_TRUE(uses_tma_store(p));
  EXPECT_FALSE(uses_cluster(p));
  p.pre = buffer;
  p.pre_ld = 400;
  p.pre_dtype = DType::kBF16;
  EXPECT_TRUE(uses_tma_store(p));
  p.pre_dtype = DType::kF32;  // f32 pre: from registers
  EXPECT_FALSE(uses_tma_store(p));
  p.pre_dtype = DType::kF16;
  p.pre = buffer + 4;  // 8-byte aligned
  EXPECT_FALSE(uses_tma_store(p));
  p.pre = buffer;
  p.pre_ld = 404;  // a row stride off 16 bytes
  EXPECT_FALSE(uses_tma_store(p));
  p = shape(512, 204);  // N % 8 != 0: pre + N is not 16-byte aligned
  p.swiglu = true;
  p.c = buffer;
  p.ldc = 208;
  p.pre = buffer;
  p.pre_ld = 408;
  p.pre_dtype = DType::kBF16;
  EXPECT_FALSE(uses_tma_store(p));
  p.pre = nullptr;  // C alone can
  EXPECT_TRUE(uses_tma_store(p));
  p.force_register_store = true;
  EXPECT_FALSE(uses_tma_store(p));
}

}  // namespace
}  // namespace asynctp::kernels
