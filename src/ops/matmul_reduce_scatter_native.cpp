// matmul_reduce_scatter's native path: one GEMM that counts its finished pieces, pushes beside
// it, and the own chunk's reduction in its epilogue (the protocol: matmul_reduce_scatter.cpp).
#include "ops/matmul_reduce_scatter_paths.h"

#include "core/log.h"

namespace asynctp::detail::mmrs {

// The native schedule on rank r of ws (one bf16/f16 product, scatter on a dim with no batch dims
// before it, so that every owner's chunk is a row range of P = A @ B as a matrix; a contiguous
// output):
//
//   compute: (captured: reset landed, barrier) | native GEMM: chunks r+1, r+2, ..., r-1 -> P,
//            each piece counted in done as its tiles are stored; then the own chunk r, whose
//            tiles wait for the peers' pieces, add them to their products and store the
//            reduced rows straight into out | join
//   push 0:            | wait done[r+1][0], push piece 0 of P[r+1] -> slot r of rank r+1,
//                        landed_{r+1}[0][r] = e, done[r+1][0] = 0 | piece 2 ... | chunk r+2 ...
//   push 1:            | wait done[r+1][1], push piece 1 ...      | piece 3 ...
//   (ContextOptions::push_streams of them, taking the pieces by turns; two by default; each
//   piece's flag and reset go on a flag stream beside its push stream, OpContext::flags_behind,
//   so that the push stream's next copy does not wait for them; a stream's last piece, which
//   no copy follows, has them on the push stream itself)
//
// Where the GEMM pushes itself (ContextOptions::kernel_push 1, or measured faster under auto), the
// op is one launch:
//
//   compute: (captured: reset landed, barrier) | native GEMM: chunks r+1, ..., r-1, each tile
//            TMA-stored straight into its slot on the chunk's owner (over NVLink); the CTA whose
//            count completes a piece raises landed_d[q][r] = e there (release, system scope) and
//            sets the piece's counter back to 0; then the own chunk r, reduced as below
//
// with the same pieces, flags and buffers as the copy streams' schedules that follow, so that
// the owner's side is the same whoever pushed (ranks may even differ), and the peers' rows never
// pass through this GPU's memory (the copy streams read them back from here first). It loses on
// large products: every peer chunk's bytes then cross the link while its tiles are computed (at
// ws 2, the first half of the GEMM), the copy streams' over the whole GEMM (docs/DECISIONS.md
// D32); it wins on small ones, and on the host.
//
// Otherwise copy streams push, as drawn above, the schedule "beside": up to kMaxPushPieces
// pieces a chunk, so that each piece's copy
// follows the one before at once, in CUDA graphs (where host calls cost nothing) and in eager
// calls whose K is below ContextOptions::push_inline_min_k. Every other eager call (all of them
// by default) pushes "inline", in about a third of the host calls (docs/DECISIONS.md D27):
//
//   push 0:            | wait done[r+1][0], push piece 0, landed + reset + wait done[r+1][1]
//                        (one call), push piece 1, landed + reset + wait done[r+2][0], ...
//
// at most kInlinePushPieces pieces a chunk, on one copy stream. Its flags hold the next copy
// for a few us (D4), which waits for its count longer anyway where the GEMM outlasts the push;
// and with two pieces, piece q of chunk r lands on r by the time r's GEMM reaches its columns
// (it is stored on r+1 half a chunk's GEMM earlier, and pushing it takes less than that).
//
// The GEMM counts the stored tiles of each piece (up to kMaxPushPieces per chunk, at least
// kRsPieceBytes on average, column ranges of whole 256-column tiles: the GEMM's walk takes up
// to 16 m-tiles of the chunk's rows per group and its columns in order, so the pieces finish one
// after the other); each piece's push stream waits for its count (a stream memory wait: no SM
// needed while the GEMM holds them all) and pushes it while the GEMM goes on.
// Every rank walks the chunks from its own r+1 on, so chunk r comes last on r and earlier on
// every peer (on r-1 first, on r+1 second to last): its pieces have landed on r by the time r's
// GEMM reaches its own chunk, and nothing is left once the GEMM ends (no reduction kernel, no
// closing barrier). The sum in each own tile: the f32 product first, then the peers'
// partials in rank order, rounded once (deterministic; not the split path's bits, whose own
// partial is rounded before the reduction).
//
// The protocol is the split path's (file comment) with landed flags per piece: eager op e uses
// buffer e % 2 and raises [kEagerNativeLandedChannel + q][r] to e; captured, buffer 2, 0/1 flags
// on kNativeLandedChannel + q and an opening barrier that resets them. Rank r pushes into p's
// buffer e % 2 in op e behind its own op e-1 GEMM, whose own tiles waited for p's op e-1 pushes,
// which followed p's op e-1 GEMM's counts, so p's op e-2 GEMM (the last reader of that buffer)
// had ended.

std::optional<NativeRsPlan> native_rs_plan(const MmRsCall& c, std::string* why) {
  if (c.scaled && !c.fast_accum) {
    *why = kNativeFloat8NeedsFastAccum;
    return std::nullopt;
  }
  if (c.as.size() != 1) {
    *why = "several products (the native GEMM computes one)";
    return std::nullopt;
  }
  if (c.last_dim()) {
    *why = "the scatter is on the last dim";
    return std::nullopt;
  }
  for (int d = 0; d < c.g; ++d) {
    if (c.a().size(d) != 1) {
      *why = fmt::format(
          "scatter dim {} has batch dims before it (A {}): the chunks are not row ranges", c.g,
          c.a().describe());
      return std::nullopt;
    }
  }
  NativeRsPlan plan;
  plan.k = c.a().size(-1);
  plan.n = c.n();
  plan.m = plan.k == 0 ? 0 : c.a().numel() / plan.k;
  if (plan.m == 0 || plan.n == 0) {
    *why = "an empty product";
    return std::nullopt;
  }
  if (!c.out.is_contiguous()) {
    *why = fmt::format("a strided output {} (the GEMM stores the reduced rows into it)",
                       c.out.describe());
    return std::nullopt;
  }
  return plan;
}

// The kernel's own pushes (kernel_push_allowed): chunk d's tiles go to slot_of(d) on owner d
// ([chunk rows, n]: slot `rank` there), and piece q's flag is flags_of(d)[q * ws], raised to
// `value`.
template <typename SlotOf, typename FlagsOf>
void set_kernel_pushes(ChunkedGemmArgs& args, int64_t n, int rank, int ws, const SlotOf& slot_of,
                       const FlagsOf& flags_of, uint32_t value) {
  args.push_chunks = ws;
  args.push_ld = n;
  args.push_flag_stride = ws;
  args.push_value = value;
  for (int d = 0; d < ws; ++d) {
    if (d == rank) continue;
    args.push_c[d] = slot_of(d);
    args.push_flags[d] = flags_of(d);
  }
}

// The native GEMM of the call's product: a2 [m, k] @ b into p2 [m, n], scaled (float8) by
// a_scale (contiguous where row-wise) and b_scale.
ChunkedGemmArgs native_rs_args(OpContext& ctx, const MmRsCall& c, const Tensor& a2, const Tensor& b,
                               const Tensor& p2, const Tensor& a_scale, const Tensor& b_scale) {
  ChunkedGemmArgs args;
  args.a = a2;
  args.b = b;
  args.d = p2;
  if (c.scaled) {
    args.a_scale = c.rowwise() ? a_scale.view({a2.size(0)}) : a_scale;
    args.b_scale = b_scale;
  }
  args.chunk_rows = a2.size(0) / ctx.world_size();
  args.first_chunk = (ctx.rank() + 1) % ctx.world_size();
  args.timeout = ctx.group().timeout();
  args.rank = ctx.rank();
  return args;
}

void run_native(OpContext& ctx, const MmRsCall& c, const Tensor& a, const Tensor& a_scale,
                const NativeRsPlan& plan, bool kernel_push,
                const MatmulReduceScatterOptions& options) {
  Backend& be = ctx.backend();
  Stream& compute = ctx.stream();
  const int ws = ctx.world_size();
  const int rank = ctx.rank();
  const int64_t rows = plan.m / ws;
  // The protocol (see above): eager, buffer e % 2 of the split path's op count, no opening
  // barrier; captured, buffer 2 behind one.
  const Slots slots(ctx, c.out);
  SymmetricMemory& sm = slots.sm;
  const bool captured = slots.captured;
  const int channel = captured ? kNativeLandedChannel : kEagerNativeLandedChannel;
  // The push schedule (file comment): inline where the chunk's GEMM outlasts its push and the
  // host's calls count (eager); else beside.
  const bool inline_pushes = !captured && plan.k >= ctx.options().push_inline_min_k;
  const detail::RsPieces pieces = detail::native_rs_pieces(
      plan.n, slots.bytes, inline_pushes ? kInlinePushPieces : kMaxPushPieces);
  auto landed_of = [&](int owner) { return sm.signal_pad_ptr(owner) + channel * ws; };
  auto piece_of = [&](const Tensor& m, int q) {
    if (pieces.count == 1) return m;
    return m.narrow(1, q * pieces.cols, std::min(pieces.cols, plan.n - q * pieces.cols));
  };
  // The GEMM's C: the peers' products stored here for the copy streams; with the kernel's own
  // pushes nothing is stored into C (its rows go to the peers, the own chunk to out), so none is
  // allocated (a shape at an address nothing maps).
  const Tensor product =
      kernel_push ? detail::shape_only_matrix(c.out.dtype(), plan.m, plan.n, c.out.device())
                  : ctx.scratch(Scratch::kPartial, {plan.m, plan.n}, c.out.dtype());
  uint32_t* done = ctx.flags(native_done_flags(ws, pieces));

  ctx.mark("start", compute);
  if (captured) {
    // Past this barrier every owner has finished reading its slots in every earlier op, and its
    // landed flags are back to 0.
    sm.reset_and_barrier(landed_of(rank), pieces.count * ws, kBarrierChannel, compute);
    ctx.mark("opened", compute);
  }
  ChunkedGemmArgs args =
      native_rs_args(ctx, c, a.view({plan.m, plan.k}), c.bs[0], product, a_scale, c.b_scale);
  detail::set_native_rs_reduction(args, rank, ws, pieces,
                                  sm.buffer(rank, {ws, rows, plan.n}, c.out.dtype(), slots.offset),
                                  c.out.view({rows, plan.n}), done, landed_of(rank), slots.number,
                                  channel, options.reduce_op == ReduceOp::kAvg);
  if (kernel_push) {
    // The GEMM pushes (file comment): each peer chunk's tiles into its slot on that peer, each
    // piece's flag raised there by the CTA that completes its count, which it also sets back to 0.
    set_kernel_pushes(
        args, plan.n, rank, ws, [&](int d) { return slots.at(d, rank).data(); },
        [&](int d) { return landed_of(d) + rank; }, slots.number);
    be.native_gemm(args, compute);
    ctx.mark("gemm", compute);
    ctx.mark("end", compute);
    return;
  }
  // The pieces to push, in the order the GEMM finishes them (native_gemm_done_order: chunk by
  // chunk, rank + 1, rank + 2, ..., each by columns); the own chunk is reduced in the GEMM's
  // epilogue, never counted. Piece t goes on push stream t (mod the push streams): each piece
  // waits only for its own counter and raises only its own flag, so no piece waits for another's
  // copy. Only the push streams that get a piece are forked and joined.
  std::vector<Backend::DoneCounter> to_push;
  for (const Backend::DoneCounter& counter : be.native_gemm_done_order(args))
    if (counter.index / pieces.count != rank) to_push.push_back(counter);
  const int streams =
      inline_pushes
          ? 1
          : static_cast<int>(std::min<size_t>(ctx.options().push_streams, to_push.size()));
  // The push streams start behind the op's stream, where the first op zeroes its fresh done
  // counters (ctx.flags) and, through the previous op's join, a counter reset on a flag stream
  // lands: a push's wait would otherwise pass on garbage or on the previous op's count.
  Event& start = ctx.event(0);
  start.record(compute);
  for (int i = 0; i < streams; ++i)
    start.block(ctx.push_stream(i));
  ctx.host_profile().stamp("forked");
  be.native_gemm(args, compute);
  ctx.mark("gemm", compute);
  // The push streams' waits for the counters (stream memory waits, no SM needed) are bounded by
  // the GEMM: its tiles of other chunks wait for nothing, so every count is reached.
  auto site_of = [&](const Backend::DoneCounter& counter) {
    return Backend::FlagSite{.rank = rank,
                             .peer = counter.index / pieces.count,
                             .channel = counter.index % pieces.count,
                             .timeout = ctx.group().timeout()};
  };
  // A piece's landed flag on its owner, then its counter, counted in full, back to 0 for the next
  // op: here beside the GEMM (stream writes after the GEMM would add up; see docs/DECISIONS.md
  // D4), and both in one enqueueing.
  auto flag_writes = [&](const Backend::DoneCounter& counter) {
    const int d = counter.index / pieces.count;
    const int q = counter.index % pieces.count;
    return std::array<Backend::FlagWrite, 2>{
        {{landed_of(d) + q * ws + rank, slots.number}, {done + counter.index, 0}}};
  };
  auto push_piece = [&](const Backend::DoneCounter& counter, Stream& push) {
    const int d = counter.index / pieces.count;
    const int q = counter.index % pieces.count;
    be.copy(piece_of(slots.at(d, rank).view({rows, plan.n}), q),
            piece_of(product.narrow(0, d * rows, rows), q), push);
  };
  auto mark_pushed = [&](const Backend::DoneCounter& counter, Stream& stream) {
    ctx.mark(fmt::format("pushed piece {} to {}", counter.index % pieces.count,
                         counter.index / pieces.count),
             stream);
  };
  if (inline_pushes) {
    // One copy stream: wait, copy, then the flags and the next piece's wait in one call (two,
    // and the mark between them, when tracing).
    Stream& push = ctx.push_stream(0);
    if (!to_push.empty()) {
      be.wait_flag(done + to_push[0].index, to_push[0].count, site_of(to_push[0]), push);
      ctx.host_profile().stamp("push waits");
    }
    for (size_t t = 0; t < to_push.size(); ++t) {
      push_piece(to_push[t], push);
      ctx.host_profile().stamp("push copies");
      const auto writes = flag_writes(to_push[t]);
      const Backend::DoneCounter* next = t + 1 < to_push.size() ? &to_push[t + 1] : nullptr;
      if (next != nullptr && !ctx.tracing()) {
        be.write_flags_then_wait(writes, done + next->index, next->count, site_of(*next), push);
      } else {
        be.write_flags(writes, push);
        if (ctx.tracing()) mark_pushed(to_push[t], push);
        if (next != nullptr) be.wait_flag(done + next->index, next->count, site_of(*next), push);
      }
      ctx.host_profile().stamp("push flags");
    }
  }
  for (size_t t = 0; !inline_pushes && t < to_push.size(); ++t) {
    const Backend::DoneCounter& counter = to_push[t];
    Stream& push = ctx.push_stream(static_cast<int>(t));
    be.wait_flag(done + counter.index, counter.count, site_of(counter), push);
    ctx.host_profile().stamp("push waits");
    push_piece(counter, push);
    ctx.host_profile().stamp("push copies");
    // The flag and the reset beside the push stream, which goes on to its next piece at once;
    // after a stream's last piece, on the push stream itself (nothing follows there that they
    // could hold up), which saves the flag stream's event edge and its join.
    const bool last_on_stream = t + streams >= to_push.size();
    Stream& flags = last_on_stream ? push : ctx.flags_behind(static_cast<int>(t));
    be.write_flags(flag_writes(counter), flags);
    ctx.host_profile().stamp("push flags");
    if (ctx.tracing()) mark_pushed(counter, flags);
  }
  ctx.host_profile().stamp("pushes");
  // The next op's GEMM overwrites the product the pushes read and counts in the counters they
  // (and the flag streams) reset.
  for (int i = 0; i < streams; ++i) {
    Event& pushed = ctx.event(ws + i);
    pushed.record(ctx.push_stream(i));
    pushed.block(compute);
  }
  ctx.join_flag_streams(compute);
  ctx.mark("end", compute);
}

// The native path's plan where it can run the call (a0: As[0], contiguous), else nullopt and why.
std::optional<NativeRsPlan> native_rs_check(OpContext& ctx, const MmRsCall& c, const Tensor& a0,
                                            ReduceOp reduce_op, bool kernel_push,
                                            std::string* why) {
  std::optional<NativeRsPlan> plan = native_rs_plan(c, why);
  if (!plan) return plan;
  const int ws = ctx.world_size();
  if (plan->m % ws != 0) {
    *why = fmt::format("the product's {} rows do not split evenly over {} ranks", plan->m, ws);
    return std::nullopt;
  }
  // The run's operands as they are (their alignment counts, and the call memos key it); the op's
  // own buffers (the product, the slots, the flags, a strided row-wise A scale's contiguous copy)
  // at an aligned dummy address, as the symmetric slots are aligned.
  const Tensor a_scale =
      c.rowwise() && !c.a_scale.is_contiguous()
          ? detail::shape_only_contiguous(DType::kF32, c.a_scale.shape(), c.a_scale.device())
          : c.a_scale;
  ChunkedGemmArgs args =
      native_rs_args(ctx, c, a0.view({plan->m, plan->k}), c.bs[0],
                     detail::shape_only_matrix(c.out.dtype(), plan->m, plan->n, c.out.device()),
                     a_scale, c.b_scale);
  const int64_t rows = plan->m / ws;
  auto* flags = reinterpret_cast<uint32_t*>(uintptr_t{1} << 20);
  const Tensor parts = detail::shape_only_matrix(c.out.dtype(), ws * rows, plan->n, c.out.device());
  detail::set_native_rs_reduction(args, ctx.rank(), ws,
                                  detail::native_rs_pieces(plan->n, chunk_bytes(c.out)),
                                  parts.view({ws, rows, plan->n}), c.out.view({rows, plan->n}),
                                  flags, flags, 1, 0, reduce_op == ReduceOp::kAvg);
  if (kernel_push) {
    // The slots (aligned symmetric buffers) at the parts' aligned dummy address.
    set_kernel_pushes(
        args, plan->n, ctx.rank(), ws, [&](int) { return parts.data(); },
        [&](int) { return flags; }, 1);
  }
  *why = ctx.backend().native_gemm_unsupported(args);
  if (!why->empty()) return std::nullopt;
  return plan;
}

NativeRsRoutes native_rs_routes(OpContext& ctx, const MmRsCall& c, const Tensor& a0,
                                ReduceOp reduce_op, std::string* why) {
  std::optional<NativeRsPlan> pushed;
  if (kernel_push_allowed(ctx, c.n())) {
    std::string push_why;
    pushed = native_rs_check(ctx, c, a0, reduce_op, true, &push_why);
    if (!pushed) ASYNCTP_LOG_DEBUG("{}: the native GEMM cannot push itself: {}", c.op, push_why);
  }
  NativeRsRoutes routes;
  routes.kernel_pushes = pushed.has_value();
  if (ctx.options().kernel_push != KernelPush::kOn || !pushed)
    routes.plan = native_rs_check(ctx, c, a0, reduce_op, false, why);
  routes.copies = routes.plan.has_value();
  if (!routes.plan) routes.plan = pushed;
  if (routes.plan) why->clear();
  return routes;
}

}  // namespace asynctp::detail::mmrs
