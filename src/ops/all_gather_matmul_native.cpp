// all_gather_matmul's native path: one async-input GEMM over the gathered A, whose tiles wait for
// the chunks' ready flags (the protocol and the pushes: all_gather_matmul.cpp).
#include "ops/all_gather_matmul_paths.h"

namespace asynctp::detail::agmm {

// The native schedule on rank r of ws (row gather with no batch dims before g; bf16/f16, or
// float8 with fast accumulation, whose row-wise scales travel with the first piece):
//
//   compute: [own edge rows -> S_r[r], ready_r[r] = e] | native GEMM: own chunk from A_shard,
//            then chunks r+1, r+2, ... as they land (each row of A also stored into a returned
//            A, by the tiles of the first column) | join | (captured into a CUDA graph:
//            barrier, which also sets ready back to 0)
//   copy:    A_shard -> S_{r-1}[r] | A_shard -> S_{r-2}[r] | ...
//   flags:        ready_{r-1}[r] = e (behind its push) | ready_{r-2}[r] = e | ...
//            (the last flag on the copy stream itself, where no copy of a returned A follows:
//            only where the GEMM cannot store it, e.g. a misaligned output)
//
//   ws 4, step i = the i-th push of every rank (arrows: who writes whose slot):
//     step 1: 1->0, 2->1, 3->2, 0->3   each rank gets the chunk its GEMM takes after its own
//     step 2: 2->0, 3->1, 0->2, 1->3   ... then the next one
//     step 3: 3->0, 0->1, 1->2, 2->3
//
// The pushes and the protocol are the split path's (see the file comment); the one GEMM reads
// the slots in place, starts at once on the own chunk, read from A_shard, and waits (with the
// group's timeout) for each other chunk's flag before it loads that chunk's tiles, in the
// kernel. Big shards may go in up to 4 pieces of at least push_piece_bytes (whole 128-row tiles;
// off by default), each flagged: a tile of the next chunk waits for its piece only. Where a tile
// straddles the own chunk's edges (chunk rows off the GEMM's tile grid) the own shard's edge
// rows are also copied into the own slot, with its flags, on the compute stream before the GEMM;
// where A_shard cannot be read in place (strided, misaligned) all of it is copied there first,
// on the compute stream, and pushed from there.
//
// Pushing, not pulling: a pull needs the own shard published and an opening barrier first, and a
// barrier kernel beside the GEMM gets no SM (see docs/DECISIONS.md D1, D2).

std::optional<NativePlan> native_plan(const AgMmCall& c, std::string* why) {
  if (c.scaled) {
    for (size_t j = 0; j < c.bs.size(); ++j) {
      if (!c.fast(j)) {
        *why = c.bs.size() > 1 ? fmt::format("B {}: {}", j, kNativeFloat8NeedsFastAccum)
                               : std::string(kNativeFloat8NeedsFastAccum);
        return std::nullopt;
      }
    }
    if (c.rowwise() && !c.a_scale.is_contiguous()) {
      *why = fmt::format("a strided row-wise A_scale {} (the GEMM reads the own rows' in place)",
                         c.a_scale.describe());
      return std::nullopt;
    }
  }
  if (c.k_gather()) {
    *why = "the gather is on the contraction dim";
    return std::nullopt;
  }
  for (int d = 0; d < c.g; ++d) {
    if (c.a_shard.size(d) != 1) {
      *why = fmt::format(
          "gather dim {} has batch dims before it (A_shard {}): the chunks are not row ranges", c.g,
          c.a_shard.describe());
      return std::nullopt;
    }
  }
  NativePlan plan;
  plan.k = c.a_shard.size(-1);
  plan.rows = plan.k == 0 ? 0 : c.a_shard.numel() / plan.k;
  if (plan.rows == 0) {
    *why = "an empty shard";
    return std::nullopt;
  }
  return plan;
}

ChunkedGemmArgs native_args(OpContext& ctx, const NativePlan& plan, const AgMmCall& c,
                            const Tensor& a, const Tensor& b, const Tensor& out, const Tensor& pre,
                            const Tensor& a_scale, const Tensor& b_scale) {
  const int ws = ctx.world_size();
  ChunkedGemmArgs args;
  args.a = a;
  args.b = b;
  args.a_scale = a_scale;
  args.b_scale = b_scale;
  args.d = out.view({ws * plan.rows, out.size(-1)});
  args.swiglu = c.swiglu;
  if (pre.defined()) args.pre_out = pre.view({ws * plan.rows, pre.size(-1)});
  args.chunk_rows = plan.rows;
  args.first_chunk = ctx.rank();
  args.timeout = ctx.group().timeout();
  args.rank = ctx.rank();
  return args;
}

Tensor native_a_scale(const AgMmCall& c, const Tensor& gathered_scales) {
  if (!c.scaled) return Tensor();
  return c.rowwise() ? gathered_scales : c.a_scale;
}

void run_native(OpContext& ctx, const AgMmCall& c, const NativePlan& plan) {
  Backend& be = ctx.backend();
  Stream& compute = ctx.stream();
  Stream& copy = ctx.copy_stream();
  const int ws = ctx.world_size();
  const int rank = ctx.rank();
  const DType dtype = c.a_shard.dtype();
  const size_t shard_bytes = c.a_shard.nbytes();
  // float8 with row-wise scales: each rank's scales ([rows] f32) go with its shard, into the scale
  // slots, which hold the gathered scales [ws * rows] in rank order; pushed before the shard's
  // first piece, so every flag of the shard stands for its scales too.
  const bool rowwise = c.rowwise();
  const PushBuffer buf(ctx, shard_bytes, rowwise ? c.a_scale.nbytes() : 0);
  const Tensor own_scale = rowwise ? c.a_scale.view({plan.rows}) : Tensor();
  auto scale_slot = [&](int owner, int p) { return buf.scale_slot(owner, p, {plan.rows}); };
  const uint32_t number = buf.number;
  auto slot = [&](int owner, int p) { return buf.slot(owner, p, {plan.rows, plan.k}, dtype); };
  // Piece q of chunk s is flagged by [channel + q][s] of the owner's pad.
  const detail::PushPieces pieces = detail::push_pieces(plan.rows, shard_bytes, c.push_piece_bytes);
  auto ready_of = [&](int owner) { return buf.ready(owner); };
  uint32_t* ready = ready_of(rank);
  const Tensor gathered = buf.slot(rank, 0, {ws * plan.rows, plan.k}, dtype);
  auto piece_of = [&](const Tensor& chunk, int q) {
    const int64_t begin = q * pieces.rows;
    return chunk.narrow(0, begin, std::min(pieces.rows, plan.rows - begin));
  };
  // The flag of piece q of this rank's chunk on `owner`.
  auto flag_of = [&](int owner, int q) { return ready_of(owner) + q * ws + rank; };
  // Piece q of this rank's chunk into `owner`'s slot, on the copy stream (the first one behind
  // the chunk's row-wise scales).
  auto copy_piece = [&](int owner, const Tensor& from, int q) {
    if (rowwise && q == 0) be.copy(scale_slot(owner, rank), own_scale, copy);
    be.copy(piece_of(slot(owner, rank), q), piece_of(from, q), copy);
  };
  // Its flag, beside the copy stream (which goes on at once), behind everything on it so far.
  // The last flag goes on the copy stream itself, straight behind its copy, where nothing
  // follows it there in this op (no returned A): a flag on the copy stream holds only that
  // stream's next copy (see OpContext::flags_behind), and there is none; it saves the flag
  // stream's event edge and its join, four host calls of an eager op (all of them at ws 2 with
  // one piece).
  int flags_left = (ws - 1) * pieces.count;
  // Whether a returned A is copied after the GEMM (set below; false where the GEMM writes it).
  bool copies_a_out = c.a_out.defined();
  auto flag_piece = [&](int owner, int q) {
    const bool last = --flags_left == 0 && !copies_a_out;
    be.write_flag(flag_of(owner, q), number, last ? copy : ctx.flags_behind(0));
  };
  // Copies pieces [first_piece, end_piece) of this rank's chunk into `owner`'s slot, each
  // followed by its flag.
  auto land = [&](int owner, const Tensor& from, int first_piece, int end_piece) {
    for (int q = first_piece; q < end_piece; ++q) {
      copy_piece(owner, from, q);
      flag_piece(owner, q);
    }
  };

  // The own chunk is read in place where the GEMM can address A_shard (contiguous, aligned:
  // the same for every B).
  std::vector<ChunkedGemmArgs> gemms;
  const Tensor a_scale =
      native_a_scale(c, rowwise ? buf.scale_slot(rank, 0, {ws * plan.rows}) : Tensor());
  for (size_t j = 0; j < c.bs.size(); ++j) {
    gemms.push_back(
        native_args(ctx, plan, c, gathered, c.bs[j], c.outs[j], c.pre_out, a_scale, c.b_scale(j)));
    gemms.back().ready = ready;
    gemms.back().ready_value = number;
    gemms.back().ready_rows = pieces.rows;
    gemms.back().ready_stride = ws;
  }
  ChunkedGemmArgs probe = gemms[0];
  probe.own_a = c.a_shard.is_contiguous() ? c.a_shard.view({plan.rows, plan.k}) : Tensor();
  probe.own_a_scale = own_scale;
  probe.own_chunk = rank;
  const bool in_place = probe.own_a.defined() && be.native_gemm_unsupported(probe).empty();
  if (in_place) {
    for (ChunkedGemmArgs& args : gemms) {
      args.own_a = probe.own_a;
      args.own_a_scale = own_scale;
      args.own_chunk = rank;
    }
  }
  const Backend::OwnEdgeRows edges =
      in_place ? be.native_gemm_own_edge_rows(gemms[0]) : Backend::OwnEdgeRows{};
  // A returned A: the first GEMM stores the rows it loads (the own chunk's from A_shard, the
  // others' from the slots once landed) beside its main loop, where it can address the output;
  // otherwise it is copied after the GEMM (below; see docs/DECISIONS.md D29).
  if (c.a_out.defined()) {
    gemms[0].a_out = c.a_out.view({ws * plan.rows, plan.k});
    copies_a_out = false;
  }
  // Every GEMM's arguments (the real B and out of each) are checked before anything is enqueued:
  // an op that throws after its first push would leave the ranks' op counts apart.
  for (size_t j = 0; j < gemms.size(); ++j) {
    std::string why = be.native_gemm_unsupported(gemms[j]);
    if (!why.empty() && j == 0 && gemms[0].a_out.defined()) {
      gemms[0].a_out = Tensor();  // the GEMM cannot store it (TMA): copied after the GEMM
      copies_a_out = true;
      why = be.native_gemm_unsupported(gemms[0]);
    }
    ASYNCTP_CHECK(why.empty(), "{}: the native GEMM cannot run these operands: {}", c.op, why);
  }

  // The copy stream pushes only contiguous matrices to peers (a copy engine's copies, beside a GEMM
  // that holds every SM and waits for them: a copy kernel there would get no SM until CTAs exit;
  // a copy within one GPU is such a kernel, even a contiguous one: see docs/DECISIONS.md D3).
  // A shard the GEMM cannot read in place is first gathered into the own slot on the compute
  // stream, before the GEMM (a strided copy may take a kernel), and pushed from there.
  ctx.mark("start", compute);
  if (!in_place) {
    be.copy(slot(rank, rank).view(c.a_shard.shape()), c.a_shard, compute);
    if (rowwise) be.copy(scale_slot(rank, rank), own_scale, compute);
    for (int q = 0; q < pieces.count; ++q)
      be.write_flag(flag_of(rank, q), number, compute);
  }
  const Tensor source = in_place ? c.a_shard.view({plan.rows, plan.k}) : slot(rank, rank);
  // The copy stream starts behind the caller's writes of A_shard and the previous op's GEMM (and
  // barrier, if it was captured): see the protocol above.
  Event& start = ctx.event(0);
  start.record(compute);
  start.block(copy);
  // Read in place but off the tile grid: the tiles over the own chunk's edges read its first
  // head and last tail rows from the own slot. Those rows only, on the compute stream before the
  // GEMM: a copy within one GPU is a kernel (even a contiguous one; see docs/DECISIONS.md D3),
  // which on the copy stream would wait beside the GEMM for an SM until CTAs exit, and the edge
  // tiles with it. After the copy stream's start: the pushes read A_shard, not the own slot, and
  // need not wait for this copy.
  if (edges.any()) {
    const Tensor own = slot(rank, rank);
    if (edges.head > 0)
      be.copy(own.narrow(0, 0, edges.head), source.narrow(0, 0, edges.head), compute);
    if (edges.tail > 0) {
      const int64_t begin = plan.rows - edges.tail;
      be.copy(own.narrow(0, begin, edges.tail), source.narrow(0, begin, edges.tail), compute);
    }
    for (int q = 0; q < pieces.count; ++q)
      be.write_flag(flag_of(rank, q), number, compute);
  }
  // Pushes to r-1 first: rank q's GEMM wants chunk q+1 right after its own, and so on, so the
  // chunk that q+i pushes to q lands at step i, the step q's GEMM reaches it.
  auto push = [&](int i, int first_piece, int end_piece) {
    const int p = (rank - i + ws) % ws;
    land(p, source, first_piece, end_piece);
    if (ctx.tracing() && end_piece == pieces.count) {
      ctx.mark(fmt::format("pushed to {}", p), ctx.flags_behind(0));
    }
  };
  // Host order. Unless replayed from a graph, each call's host time delays what is enqueued after
  // it, and on an idle GPU the device waits for it (see docs/DECISIONS.md D9):
  //
  //   ws 2:   GEMM 0 | copy piece 0 | flag 0 | GEMMs of the other Bs | the other pieces
  //   ws > 2: copy piece 0 | GEMM 0 | flag 0 | GEMMs of the other Bs | the other pieces, then
  //           the pushes to r-2, r-3, ...
  //
  // With more than two ranks each copy stream carries a chain of pushes (to r-1, then r-2, ...)
  // and each chunk lands as late as the first push started, the last one bounding the GEMM; so
  // the first copy goes before the launch (its flag after: the copy takes longer than the launch
  // anyway). With two there is one push, and it lands long before the GEMM is through its own
  // chunk: the GEMM goes first (see docs/DECISIONS.md D9). The other Bs' GEMMs run after the
  // first on the compute stream, so their launches wait until the first piece is on its way.
  const bool gemm_first = ws == 2;
  const int first_peer = (rank - 1 + ws) % ws;
  if (ws > 1 && !gemm_first) copy_piece(first_peer, source, 0);
  ctx.mark("launch", compute);
  for (size_t j = 0; j < gemms.size(); ++j) {
    be.native_gemm(gemms[j], compute);
    if (j > 0 || ws == 1) continue;
    if (gemm_first) copy_piece(first_peer, source, 0);
    flag_piece(first_peer, 0);  // nothing went on the copy stream since that copy
  }
  ctx.mark("gemm", compute);
  if (ws > 1) push(1, 1, pieces.count);  // (marks "pushed to" with one piece too)
  for (int i = 2; i < ws; ++i)
    push(i, 0, pieces.count);
  // A returned A that the GEMM could not store: the own rows from the source (read in place, the
  // own slot holds at most their edge rows), on the copy stream behind the pushes (a copy within
  // the GPU: a kernel, which starts as the GEMM's CTAs finish); the others from the slots, on the
  // compute stream, where every chunk has landed once the GEMMs are through (they waited for
  // each flag).
  ctx.host_profile().stamp("pushes");
  Tensor a_out;
  if (copies_a_out) {
    a_out = c.a_out.view({ws * plan.rows, plan.k});
    be.copy(a_out.narrow(0, rank * plan.rows, plan.rows), source, copy);
  }
  Event& pushed = ctx.event(ws + 1);
  pushed.record(copy);
  if (a_out.defined()) {
    const int64_t r = plan.rows;
    if (rank > 0) be.copy(a_out.narrow(0, 0, rank * r), gathered.narrow(0, 0, rank * r), compute);
    if (rank + 1 < ws) {
      const int64_t rest = (ws - rank - 1) * r;
      be.copy(a_out.narrow(0, (rank + 1) * r, rest), gathered.narrow(0, (rank + 1) * r, rest),
              compute);
    }
  }
  // The pushes read A_shard: the caller may write it again once the op is through.
  pushed.block(compute);
  // The flag stream, where used, holds flag writes only, each waited for by its owner's GEMM.
  // Joined so that the next op's flags land after these where that op raises one on another
  // stream (a returned A in one op and not the other, or another piece count: the last flag goes
  // on the copy stream or not), which would otherwise step it back to this op's number; and a
  // CUDA graph must join every stream it forked.
  ctx.join_flag_streams(compute);
  ctx.mark("joined", compute);
  if (buf.captured) {
    // Past this barrier no rank reads any buffer of this op, and every flag is back to 0 (reset
    // in the barrier's kernel, not by separate stream writes: see docs/DECISIONS.md D20).
    buf.sm.reset_and_barrier(ready, ws * pieces.count, kBarrierChannel, compute);
  }
  ctx.mark("end", compute);
}

}  // namespace asynctp::detail::agmm
