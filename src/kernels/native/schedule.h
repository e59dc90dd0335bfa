// The native GEMM's schedule as pure functions of its parameters (kernels/native/params.h),
// called by the kernel, by its host launcher and by the CPU tests: the walk of the tiles from
// the per-rank pivot, the group height, the tail split, the done counters (their order and
// counts), the own chunk's edge rows, and the indexing of pieces and flags.
//
// Tile 128 x 256 (each of the two consumers owns 64 rows), k-block 64 (float8: 128). A cluster of
// two CTAs takes 256-row tiles (each CTA its 128 rows): `height` is a (cluster) tile's rows.
//
// The walk (tile_at): tiles are numbered so that all tiles of the m-tile group starting at
// `first_chunk`'s first whole m-tile come first, then the following rows, wrapping around (a
// tile over the chunk's first row, off the tile grid, comes last); within a group of group_m
// m-tiles the m index runs fastest (B panels stay in L2). CTA i takes units i, i + grid, ...:
// all SMs work on the chunk that landed first while the copy engine brings the next ones.
//
//   m-tiles, pivot p, groups of g:   p .. p+g-1 | p+g .. p+2g-1 | ... | .. tiles_m-1, 0 .. p-1
//   within a group (h m-tiles):      (m0, n0) (m1, n0) .. (m_h-1, n0) (m0, n1) ..
//
// group_m is kGroupM (16), or where rows wait for flags, are counted in done or are reduced
// (sum_chunk) the largest height up to 16 that divides every piece and chunk (on the tile grid):
// a group then never spans two pieces or chunks, so the tiles of the first wave that are not the
// own chunk's wait for the piece that lands first, not for the whole next chunk (or the one
// after), counted pieces finish in walk order, and the native MM+RS's own chunk comes last.
// Pieces off the tile grid (AG+MM chunks of any rows): a piece's whole m-tiles, up to 16, so that
// a group spans few pieces.
//
// Why 16: a wave of 132 CTAs spans about 16 m-tiles x 8 n-tiles, and per k-block its tiles then
// read 16 of A's 16 KiB blocks and 8 of B's 32 KiB ones: the fewest bytes for 132 tiles (height
// 32 reads 32 x 16 + 4 x 32 KiB, height 8 about 8 x 16 + 17 x 32); see docs/DECISIONS.md D10.
//
// Tail split: with T tiles on G slots (CTAs, or pairs), the last wave holds T mod G tiles; where
// that is at most half of G, each of its tiles is cut into s <= 4 K-ranges (s = G / tail, at
// least 4 k-blocks each), one per otherwise idle slot. Work units in loop order, for slot i:
// units i, i+G, ...
//
//   units [0, T - tail):        whole tiles, as without the split
//   units [T - tail, T + (s-1) tail): part p = v / tail of tail tile v mod tail
//
//   parts 0 .. s-2: main loop over their K-range | f32 accumulators -> workspace | count++
//   part s-1:       main loop over its K-range   | wait count = s-1 | += parts 0 .. s-2 in order
//                   | epilogue (store, done counter) | count = 0 for the next launch
//
// All tail units fit in one wave, at most one per CTA, so a last part never waits for a CTA
// that is not running; the sum order is fixed, so the result is the same on every run. With
// pairs, G counts the clusters resident at once and each unit is a 256-row tile: both CTAs of a
// pair take the same K-range, each keeping its own 128 rows' part (split_slot).
// Not stream-K, nor several rounds of parts: with every CTA at its own k offset, A and B are no
// longer shared in L2 by the CTAs running together (see docs/DECISIONS.md D13).
//
// The per-tile functions (tile_at, unit_at, ready_piece_at, reads_own, done_index, ...) take the
// params resolved (resolved()): the kernel calls them as they are; the others resolve first.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kernels/native/params.h"

namespace asynctp::kernels {

inline constexpr int kBM = 128;
inline constexpr int kBN = 256;
// A k-block is 128 bytes of each row of A and B: kBK 16-bit elements, or 2 kBK float8 ones
// (k_block_of).
inline constexpr int kBK = 64;
inline constexpr int kGroupM = 16;
inline constexpr int kMaxSplit = 4;
inline constexpr int kMinSplitKBlocks = 4;  // k-blocks per part at least (the pipeline must fill)
// One tile's f32 accumulators in the tail split's workspace: 2 consumers x 32 float4 x 128.
inline constexpr size_t kPartialBytes = 2 * 32 * 128 * 16;

// ---- Defaults and pieces ----

// Whether the inputs are float8 (e4m3): one byte each, the wgmma k32 shape, scales in the
// epilogue.
ASYNCTP_HOST_DEVICE bool float8_inputs(const NativeGemmParams& p) {
  return p.in_dtype == DType::kF8E4M3;
}
// The elements of A and B in one k-block (128 bytes of a row).
ASYNCTP_HOST_DEVICE int k_block_of(const NativeGemmParams& p) {
  return float8_inputs(p) ? 2 * kBK : kBK;
}
ASYNCTP_HOST_DEVICE int64_t k_blocks_of(const NativeGemmParams& p) {
  return (p.k + k_block_of(p) - 1) / k_block_of(p);
}

ASYNCTP_HOST_DEVICE int64_t chunk_rows_of(const NativeGemmParams& p) {
  return p.chunk_rows > 0 ? p.chunk_rows : p.m;
}
ASYNCTP_HOST_DEVICE int64_t ready_rows_of(const NativeGemmParams& p) {
  return p.ready_rows > 0 ? p.ready_rows : chunk_rows_of(p);
}
ASYNCTP_HOST_DEVICE int64_t done_rows_of(const NativeGemmParams& p) {
  return p.done_rows > 0 ? p.done_rows : chunk_rows_of(p);
}
ASYNCTP_HOST_DEVICE int64_t sum_rows_of(const NativeGemmParams& p) {
  return p.sum_rows > 0 ? p.sum_rows : chunk_rows_of(p);
}
ASYNCTP_HOST_DEVICE int64_t num_chunks(const NativeGemmParams& p) {
  return (p.m + chunk_rows_of(p) - 1) / chunk_rows_of(p);
}

// Columns per piece of the done counters or the sum flags (0, or more than n: all of n), and
// the pieces per row range. A column piece is a multiple of kBN wide, so a tile lies in one.
ASYNCTP_HOST_DEVICE int64_t piece_cols(const NativeGemmParams& p, int64_t cols) {
  const int64_t all = (p.n + kBN - 1) / kBN * kBN;
  return cols > 0 && cols < all ? cols : all;
}
ASYNCTP_HOST_DEVICE int col_pieces(const NativeGemmParams& p, int64_t cols) {
  return static_cast<int>((p.n + piece_cols(p, cols) - 1) / piece_cols(p, cols));
}

// Whether TMA can store 16-bit rows at `base` with row stride `ld` elements: a 16-byte aligned
// base and row stride.
ASYNCTP_HOST_DEVICE bool tma_storable(const void* base, int64_t ld, DType dtype) {
  return dtype != DType::kF32 && reinterpret_cast<uintptr_t>(base) % 16 == 0 && ld % 8 == 0;
}
// The TMA store needs a 16-bit C that TMA can store; clusters of two (B multicast) only come with
// it, and for 16-bit inputs only when asked for: they are no faster than single CTAs there (see
// docs/DECISIONS.md D17).
// The SwiGLU epilogue's pre, if any, goes the same way as C: through the staging area, as two
// [M, N] halves (the gate's at pre, the up projection's at pre + N: N % 8 == 0 keeps the second
// half's base 16-byte aligned), so it must be TMA-storable too.
ASYNCTP_HOST_DEVICE bool uses_tma_store(const NativeGemmParams& p) {
  if (p.force_register_store || !tma_storable(p.c, p.ldc, p.c_dtype)) return false;
  return !p.swiglu || p.pre == nullptr ||
         (tma_storable(p.pre, p.pre_ld, p.pre_dtype) && p.n % 8 == 0);
}
// The SwiGLU epilogue runs on single CTAs: its tile's B is two boxes, which the multicast does
// not split. The reduce-scatter epilogue runs on pairs where both CTAs of every pair reduce or
// neither does (pairs_can_sum).
//
// The default (cluster 0): single CTAs for 16-bit inputs, pairs for float8. A float8 k-block
// feeds twice the MMAs of a 16-bit one from the same 48 KiB of A and B, so single CTAs ask L2
// for twice the bytes per second, more than it gives; sharing B cuts that by a third (see
// docs/DECISIONS.md D31).
ASYNCTP_HOST_DEVICE int cluster_of(const NativeGemmParams& p) {
  if (p.cluster != 0) return p.cluster;
  return float8_inputs(p) ? 2 : 1;
}
// The reduce-scatter epilogue on a pair: its sum stages are per CTA (each CTA loads the parts of
// its own 128 rows), while the two CTAs' rings go in step (a stage is refilled once both CTAs
// released it), so both CTAs of every pair must take the same stages: the sum chunk is whole
// 256-row tiles. The own chunk must also stay last in the walk (group_m_of): its groups divide
// every chunk and piece only where the counted and waited pieces are whole 256-row tiles too.
ASYNCTP_HOST_DEVICE bool pairs_can_sum(const NativeGemmParams& p) {
  constexpr int64_t kPairRows = 2 * kBM;
  return chunk_rows_of(p) % kPairRows == 0 &&
         (p.done == nullptr || done_rows_of(p) % kPairRows == 0) &&
         (p.ready == nullptr || ready_rows_of(p) % kPairRows == 0);
}
ASYNCTP_HOST_DEVICE bool uses_cluster(const NativeGemmParams& p) {
  return cluster_of(p) == 2 && uses_tma_store(p) && !p.swiglu &&
         (p.sum_chunk < 0 || pairs_can_sum(p));
}
// The CTAs that take one (cluster) tile: 1, or 2 for a pair.
ASYNCTP_HOST_DEVICE int ctas_per_tile(const NativeGemmParams& p) {
  return uses_cluster(p) ? 2 : 1;
}
// A (cluster) tile's rows.
ASYNCTP_HOST_DEVICE int64_t tile_height(const NativeGemmParams& p) {
  return int64_t{kBM} * ctas_per_tile(p);
}
// B's columns: n, or 2n with the SwiGLU epilogue (the gate's, then the up projection's).
ASYNCTP_HOST_DEVICE int64_t b_cols(const NativeGemmParams& p) {
  return p.swiglu ? 2 * p.n : p.n;
}
// A tile's output columns: kBN, or kBN / 2 with the SwiGLU epilogue, whose tile loads the gate's
// and the up projection's kBN / 2 columns of B as the two halves of one kBN-wide B tile.
ASYNCTP_HOST_DEVICE int tile_width(const NativeGemmParams& p) {
  return p.swiglu ? kBN / 2 : kBN;
}
// The column of B under column c (0 <= c < kBN) of the B tile of the tile at output column n0:
// n0 + c, or with the SwiGLU epilogue the gate's columns n0.. in the tile's first half and the up
// projection's n + n0.. in its second (so that the accumulator of output column n0 + c, c <
// kBN / 2, holds the gate and the one kBN / 2 further on the up projection).
ASYNCTP_HOST_DEVICE int64_t b_col_of(const NativeGemmParams& p, int n0, int c) {
  if (!p.swiglu) return n0 + c;
  return c < kBN / 2 ? n0 + c : p.n + n0 + (c - kBN / 2);
}
ASYNCTP_HOST_DEVICE int64_t num_tiles(const NativeGemmParams& p, int64_t height) {
  return ((p.m + height - 1) / height) * ((p.n + tile_width(p) - 1) / tile_width(p));
}

// The params as the kernel reads them: every 0 or -1 that stands for a default replaced by its
// value (resolved(resolved(p)) == resolved(p)).
inline NativeGemmParams resolved(const NativeGemmParams& p) {
  NativeGemmParams r = p;
  r.chunk_rows = chunk_rows_of(p);
  r.ready_rows = ready_rows_of(p);
  r.done_rows = done_rows_of(p);
  r.done_cols = piece_cols(p, p.done_cols);
  r.sum_rows = sum_rows_of(p);
  r.sum_cols = piece_cols(p, p.sum_cols);
  r.b_mn_lbo = p.b_mn_lbo != 0 ? p.b_mn_lbo : 8192;
  r.b_mn_sbo = p.b_mn_sbo != 0 ? p.b_mn_sbo : 1024;
  if (p.own_a == nullptr || p.own_chunk < 0) r.own_chunk = -1;
  return r;
}

// ---- The walk ----

struct Tile {
  int m0, n0;
};

// The walk's first m-tile: the first one wholly inside first_chunk's rows. Where the chunks are
// off the tile grid, the tile over that chunk's first row also holds rows of the chunk before,
// which (AG+MM) lands last: it comes last in the walk instead of holding a CTA of the first wave
// until then (see docs/DECISIONS.md D12).
ASYNCTP_HOST_DEVICE int64_t walk_pivot(int64_t first_row, int64_t height) {
  return (first_row + height - 1) / height;
}
ASYNCTP_HOST_DEVICE int64_t walk_pivot(const NativeGemmParams& p, int64_t height) {
  return walk_pivot(p.first_chunk * chunk_rows_of(p), height);
}

// Tile t of the walk (see the file comment); tiles are `height` rows (a cluster's) and `width`
// output columns (tile_width).
ASYNCTP_HOST_DEVICE Tile tile_at(int t, int tiles_m, int tiles_n, int pivot_m, int height,
                                 int group_m, int width = kBN) {
  const int group = t / (group_m * tiles_n);
  const int first = group * group_m;
  const int rows = group_m < tiles_m - first ? group_m : tiles_m - first;
  const int local = t - group * group_m * tiles_n;
  const int mi = (first + local % rows + pivot_m) % tiles_m;
  return {mi * height, (local / rows) * width};
}

// The walk's dimensions for resolved params: (cluster) tiles of `height` rows and `width` output
// columns, groups of group_m m-tiles, k_blocks k-blocks per tile.
struct Walk {
  int height, width, tiles_m, tiles_n, num_tiles, k_blocks, pivot_m, group_m;
  ASYNCTP_HOST_DEVICE Tile tile(int t) const {
    return tile_at(t, tiles_m, tiles_n, pivot_m, height, group_m, width);
  }
};
ASYNCTP_HOST_DEVICE Walk walk_of(const NativeGemmParams& p, int height, int group_m) {
  Walk w;
  w.height = height;
  w.width = tile_width(p);
  w.tiles_m = static_cast<int>((p.m + height - 1) / height);
  w.tiles_n = static_cast<int>((p.n + w.width - 1) / w.width);
  w.num_tiles = w.tiles_m * w.tiles_n;
  w.k_blocks = static_cast<int>(k_blocks_of(p));
  w.pivot_m = static_cast<int>(walk_pivot(p.first_chunk * p.chunk_rows, height));
  w.group_m = group_m;
  return w;
}

// The largest height up to kGroupM that divides `tiles` m-tiles (1 if none above 1 does).
ASYNCTP_HOST_DEVICE int largest_group_dividing(int64_t tiles) {
  for (int64_t g = tiles < kGroupM ? tiles : kGroupM; g > 1; --g) {
    if (tiles % g == 0) return static_cast<int>(g);
  }
  return 1;
}

// The walk's group height (see the file comment): kGroupM, or where rows become ready together
// (pieces of ready_rows), are counted together (pieces of done_rows) or are reduced (sum_chunk:
// the native MM+RS) and the chunks and pieces start on the tile grid, the largest height up to
// kGroupM that divides every piece and chunk: groups are laid from the first chunk's first
// m-tile on, so a group never spans two pieces or two chunks. The native MM+RS depends on it: its
// own chunk must come last in the walk, or two ranks can each hold the tile the other waits for
// (until the timeout), and its pushes want the peers' chunks finished one after the other:
// groups that span the peers' chunks would finish them together, late, so that their pushes no
// longer overlap the GEMM (see docs/DECISIONS.md D11).
inline int group_m_of(const NativeGemmParams& p, int64_t height) {
  if (p.ready == nullptr && p.done == nullptr && p.sum_chunk < 0) return kGroupM;
  int64_t rows = chunk_rows_of(p);
  if (p.ready != nullptr) rows = std::gcd(rows, ready_rows_of(p));
  if (p.done != nullptr) rows = std::gcd(rows, done_rows_of(p));
  // Off the tile grid (AG+MM chunks of any rows; the counted and reduced ones are on it): tiles
  // straddle pieces anyway, but groups of at most a piece's whole m-tiles span few pieces, so the
  // walk follows the pieces as they land (see docs/DECISIONS.md D11).
  if (rows % height != 0) {
    if (p.ready == nullptr) return kGroupM;
    // A piece's rows (the op's push pieces are whole tiles, but a chunk's last may be shorter:
    // sized by it, the groups of 1000-row chunks in pieces of 896 and 104 would be 1 m-tile).
    const int64_t piece = std::min(ready_rows_of(p), chunk_rows_of(p));
    return static_cast<int>(std::clamp<int64_t>(piece / height, 1, kGroupM));
  }
  return largest_group_dividing(rows / height);
}

// ---- Work units and the tail split ----

// Work unit u of the persistent loop: a whole tile, or one K-range (part) of a tail tile.
struct Unit {
  int t;         // tile number in the walk
  int kb0, kb1;  // k-blocks [kb0, kb1)
  int part;      // -1: whole tile; else 0 .. split-1 (the last one finishes the tile)
  int tail;      // index of the tail tile (t - full_tiles)
};

ASYNCTP_HOST_DEVICE Unit unit_at(int u, const NativeGemmPlan& plan, int num_tiles, int k_blocks) {
  if (u < plan.full_tiles) return {u, 0, k_blocks, -1, 0};
  const int tails = num_tiles - plan.full_tiles;
  const int v = u - plan.full_tiles;
  const int tail = v % tails;
  const int part = v / tails;
  return {plan.full_tiles + tail, part * k_blocks / plan.split, (part + 1) * k_blocks / plan.split,
          part, tail};
}

// The units of `num_tiles` tiles (int in the kernel, int64_t on the host).
template <typename I>
ASYNCTP_HOST_DEVICE I num_units(const NativeGemmPlan& plan, I num_tiles) {
  return plan.full_tiles + (num_tiles - plan.full_tiles) * plan.split;
}

// The units a launch of `ctas` CTAs runs at once: one a CTA, or one a pair (both CTAs of a
// pair take the same unit, each its 128 rows).
ASYNCTP_HOST_DEVICE int unit_slots(const NativeGemmParams& p, int ctas) {
  return ctas / ctas_per_tile(p);
}

// Parts per tail tile on `ctas` CTAs (resident together: with pairs, the clusters that fit at
// once) of a device with `sms` SMs: as many as the idle slots of the last wave can take, each
// part at least kMinSplitKBlocks deep. The tail units then fit in one wave, at most one per
// slot, so the last part of a tile never waits for a slot that is not running.
inline int tail_split_of(const NativeGemmParams& p, int ctas, int sms) {
  // More CTAs than SMs could leave a part's CTA waiting for an SM that its partner holds.
  if (p.split_workspace == nullptr || p.tail_split == 1 || ctas <= 0 || ctas > sms) return 1;
  const int slots = unit_slots(p, ctas);
  if (slots <= 0) return 1;
  const int64_t tiles = num_tiles(p, tile_height(p));
  const int tail = static_cast<int>(tiles % slots);
  if (tail == 0) return 1;
  const int64_t k_blocks = k_blocks_of(p);
  int split = static_cast<int>(std::min<int64_t>(slots / tail, k_blocks / kMinSplitKBlocks));
  split = std::min(split, p.tail_split >= 2 ? std::min(p.tail_split, kMaxSplit) : kMaxSplit);
  return split >= 2 ? split : 1;
}

// The tail split's workspace: [split flags, rounded to 256 bytes][partials], for up to `sms`
// CTAs (one tail tile per CTA at most; a pair's CTAs each keep their own 128 rows' part).
inline size_t split_flag_bytes(int sms) {
  return (static_cast<size_t>(sms) * 2 * sizeof(uint32_t) + 255) / 256 * 256;
}
inline size_t split_workspace_bytes(int sms) {
  return split_flag_bytes(sms) + static_cast<size_t>(sms) * kPartialBytes;
}
// A tail tile's CTA: tail tile `tail`, CTA `cta` of its cluster of `cluster` (the CTA's 128 rows,
// whose parts are kept apart).
ASYNCTP_HOST_DEVICE int split_slot(int tail, int cluster, int cta) {
  return tail * cluster + cta;
}
// The counter of published parts of tail CTA `slot` (split_slot), consumer `consumer`.
ASYNCTP_HOST_DEVICE int split_flag_index(int slot, int consumer) {
  return 2 * slot + consumer;
}
// Where part `part` (< split - 1) of tail CTA `slot` leaves consumer `consumer`'s accumulators:
// the float4 index of thread 0's first one (thread t's i-th at + i * 128 + t).
ASYNCTP_HOST_DEVICE int64_t split_partial_index(const NativeGemmPlan& plan, int slot, int part,
                                                int consumer) {
  return ((static_cast<int64_t>(slot) * (plan.split - 1) + part) * 2 + consumer) * (32 * 128);
}

// ---- What a tile reads and waits for ----

// The ready flag of the piece holding row `row` of A, and the first row past that piece.
struct ReadyPiece {
  int64_t chunk, piece, end;
};
ASYNCTP_HOST_DEVICE ReadyPiece ready_piece_at(const NativeGemmParams& p, int64_t row) {
  const int64_t c = row / p.chunk_rows;
  const int64_t j = (row - c * p.chunk_rows) / p.ready_rows;
  const int64_t piece_end = (j + 1) * p.ready_rows;
  return {c, j, c * p.chunk_rows + (piece_end < p.chunk_rows ? piece_end : p.chunk_rows)};
}
ASYNCTP_HOST_DEVICE int64_t ready_index(const NativeGemmParams& p, const ReadyPiece& r) {
  return r.piece * p.ready_stride + r.chunk;
}

// The own chunk's first row.
ASYNCTP_HOST_DEVICE int64_t own_first_row(const NativeGemmParams& p) {
  return static_cast<int64_t>(p.own_chunk) * p.chunk_rows;
}
// Where the scaled GEMM's sa(row) is (params.h): in own_a_scale for the own chunk's rows where
// given, else in a_scale; null where A has no scale (1).
ASYNCTP_HOST_DEVICE const float* a_scale_at(const NativeGemmParams& p, int64_t row) {
  const int64_t own_first = own_first_row(p);
  if (p.own_a_scale != nullptr && p.own_chunk >= 0 && row >= own_first &&
      row < own_first + p.chunk_rows) {
    return p.own_a_scale + (row - own_first) * p.a_scale_stride;
  }
  return p.a_scale == nullptr ? nullptr : p.a_scale + row * p.a_scale_stride;
}
// Whether a CTA's 128 rows from m0 lie wholly inside the own chunk: read from own_a, no wait.
ASYNCTP_HOST_DEVICE bool reads_own(const NativeGemmParams& p, int64_t m0) {
  const int64_t own_first = own_first_row(p);
  return p.own_chunk >= 0 && m0 >= own_first && m0 + kBM <= own_first + p.chunk_rows;
}

// With own_a given, the rows of own_chunk that tiles still read from `a` (tiles that straddle
// the chunk's first or last row: chunk edges off the 128-row tile grid): the chunk's first
// `head` and last `tail` rows (both 0: none; they may cover the whole chunk). Those tiles wait
// for ready[own_chunk] (its pieces) and need those rows in `a`; no tile reads the others there.
struct NativeGemmOwnEdges {
  int64_t head = 0, tail = 0;
};
inline NativeGemmOwnEdges own_edge_rows(const NativeGemmParams& params) {
  const NativeGemmParams p = resolved(params);
  if (p.own_chunk < 0) return {};
  // As reads_own decides, for the tiles that overlap [first, last) (with clusters each CTA loads
  // its own 128 rows).
  const int64_t first = own_first_row(p);
  const int64_t last = std::min(p.m, first + p.chunk_rows);
  if (last <= first) return {};
  const int64_t head = first % kBM == 0 ? 0 : std::min(last, (first / kBM + 1) * kBM) - first;
  const int64_t m0 = (last - 1) / kBM * kBM;  // the tile holding the chunk's last row
  const int64_t tail = m0 + kBM > first + p.chunk_rows && m0 >= first + head ? last - m0 : 0;
  return {head, tail};
}

// ---- Done counters ----

// The counter of the stored 64-row half of a tile at (r0, n0): row piece r0 / done_rows, column
// piece n0 / done_cols (a tile lies in one piece: kBN divides done_cols).
ASYNCTP_HOST_DEVICE int64_t done_index(const NativeGemmParams& p, const NativeGemmPlan& plan,
                                       int64_t r0, int n0) {
  return (r0 / p.done_rows) * plan.done_col_pieces + n0 / static_cast<int>(p.done_cols);
}

// The value done[index] reaches once every tile of its rows and columns is stored: its 64-row
// halves (those inside m) times its n-tiles.
ASYNCTP_HOST_DEVICE uint32_t done_count(const NativeGemmParams& p, int64_t index) {
  const int64_t rows = done_rows_of(p), cols = piece_cols(p, p.done_cols);
  const int pieces = col_pieces(p, p.done_cols);
  const int64_t first = index / pieces * rows;
  const int64_t last = std::min(p.m, first + rows);
  const int64_t halves = (last - first + 63) / 64;
  const int64_t first_col = index % pieces * cols;
  const int64_t width = std::min(p.n, first_col + cols) - first_col;
  return static_cast<uint32_t>(halves * ((width + kBN - 1) / kBN));
}

inline int num_done_counters(const NativeGemmParams& p) {
  return static_cast<int>((p.m + done_rows_of(p) - 1) / done_rows_of(p) *
                          col_pieces(p, p.done_cols));
}

// The done counters' indices in walk order (of each, the position of its last tile in the
// walk): the order to wait for them in. CTAs run side by side and the tail split reorders the
// last wave, so counters may complete a little out of this order; nothing depends on it but the
// pace of the waits. Where the walk's groups divide every piece and chunk (single CTAs, the
// native MM+RS) it is chunk by chunk from first_chunk on, each chunk's pieces in row order, then
// column order.
inline std::vector<int> done_order(const NativeGemmParams& p) {
  // Each counter's last tile in the walk (tile_at inverted): an m-tile at walk row rel lies in
  // group rel / g, whose h m-tiles run fastest, so tile (rel, ni) is number
  // group * g * tiles_n + ni * h + rel % g; a counter's last one is in its last column.
  const int64_t height = tile_height(p);
  const int64_t g = group_m_of(p, height);
  const int64_t tiles_m = (p.m + height - 1) / height, tiles_n = (p.n + kBN - 1) / kBN;
  const int64_t pivot = walk_pivot(p, height);
  const int64_t rows = done_rows_of(p), cols = piece_cols(p, p.done_cols);
  const int pieces = col_pieces(p, p.done_cols);
  std::vector<int64_t> last(static_cast<size_t>(num_done_counters(p)), -1);
  for (int64_t r0 = 0; r0 < p.m; r0 += kBM) {  // each CTA's rows of a (cluster) tile
    const int64_t rel = (r0 / height - pivot + tiles_m) % tiles_m;
    const int64_t first = rel / g * g;
    const int64_t h = std::min(g, tiles_m - first);
    for (int q = 0; q < pieces; ++q) {
      const int64_t ni = std::min(tiles_n, ((q + 1) * cols + kBN - 1) / kBN) - 1;
      int64_t& t = last[static_cast<size_t>(r0 / rows * pieces + q)];
      t = std::max(t, first * tiles_n + ni * h + (rel - first));
    }
  }
  std::vector<int> order(last.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return last[x] < last[y]; });
  return order;
}

// ---- The reduce-scatter epilogue ----

// Whether the tile starting at row m0 belongs to the chunk whose tiles are reduced (sum_chunk:
// chunk_rows is a multiple of 128, so a tile lies in one chunk).
ASYNCTP_HOST_DEVICE bool in_sum_chunk(const NativeGemmParams& p, int64_t m0) {
  return p.sum_chunk >= 0 && m0 / p.chunk_rows == p.sum_chunk;
}
// Row r of the product as a row of the sum chunk (of the parts and of sum_out).
ASYNCTP_HOST_DEVICE int64_t sum_row_of(const NativeGemmParams& p, int64_t r) {
  return r - static_cast<int64_t>(p.sum_chunk) * p.chunk_rows;
}
// Whether unit w (its tile at row m0) ends in the reduce-scatter epilogue: a whole tile of the
// sum chunk, or the last K-range of one.
ASYNCTP_HOST_DEVICE bool sums_tile(const NativeGemmParams& p, const NativeGemmPlan& plan,
                                   const Unit& w, int64_t m0) {
  return in_sum_chunk(p, m0) && (w.part < 0 || w.part == plan.split - 1);
}
// The piece of the sum flags that holds chunk row `row`, column `col`.
ASYNCTP_HOST_DEVICE int64_t sum_piece(const NativeGemmParams& p, const NativeGemmPlan& plan,
                                      int64_t row, int col) {
  return (row / p.sum_rows) * plan.sum_col_pieces + col / static_cast<int>(p.sum_cols);
}

// ---- The launch's plan ----

// Whether the reduce-scatter epilogue stores the reduced rows through the staging area (TMA).
inline bool sum_tma_store_of(const NativeGemmParams& p) {
  return p.sum_chunk >= 0 && uses_tma_store(p) &&
         reinterpret_cast<uintptr_t>(p.sum_out) % 16 == 0 && p.sum_ldo % 8 == 0;
}

// What the launcher derives from resolved params on `ctas` CTAs of a device with `sms` SMs.
inline NativeGemmPlan plan_of(const NativeGemmParams& p, int ctas, int sms) {
  NativeGemmPlan plan;
  const int64_t height = tile_height(p);
  plan.group_m = group_m_of(p, height);
  plan.done_col_pieces = col_pieces(p, p.done_cols);
  plan.sum_col_pieces = col_pieces(p, p.sum_cols);
  plan.split = tail_split_of(p, ctas, sms);
  const int64_t tiles = num_tiles(p, height);
  plan.full_tiles = static_cast<int>(plan.split > 1 ? tiles - tiles % unit_slots(p, ctas) : tiles);
  if (plan.split > 1) {
    plan.split_flags = static_cast<uint32_t*>(p.split_workspace);
    plan.partials =
        reinterpret_cast<float*>(static_cast<uint8_t*>(p.split_workspace) + split_flag_bytes(sms));
  }
  plan.sum_tma_store = sum_tma_store_of(p);
  return plan;
}

// A launch's grid: the plan for the slots that run at once (`fit` of them fit on the device: CTAs,
// or with pairs clusters; at most max_ctas CTAs), and how many slots it launches, one per unit at
// most. Slot i runs units i, i + slots, ...: the tail units come last, at most one per slot.
struct LaunchGrid {
  NativeGemmPlan plan;
  int slots = 0;
};
inline LaunchGrid launch_grid(const NativeGemmParams& p, int fit, int max_ctas, int sms) {
  const int resident = std::min(fit, unit_slots(p, max_ctas));
  LaunchGrid g;
  g.plan = plan_of(p, resident * ctas_per_tile(p), sms);
  g.slots = static_cast<int>(
      std::min<int64_t>(resident, num_units(g.plan, num_tiles(p, tile_height(p)))));
  return g;
}

}  // namespace asynctp::kernels
