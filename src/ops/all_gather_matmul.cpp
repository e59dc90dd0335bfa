// all_gather_matmul and all_gather_scaled_matmul.
//
// Both overlapped paths push: every rank copies its shard (with the copy engine, straight from
// A_shard) into slot r of every peer's symmetric buffer and then raises that peer's ready flag r
// (a stream memory write over NVLink, ordered after the copy: no SM needed while a GEMM holds
// them all). The write goes on a flag stream that waits for the copy through an event
// (OpContext::flags_behind), so the copy stream goes on to the next push at once; each op joins
// its flag streams into the compute stream before it ends (captured: before its closing
// barrier, so that no flag of it lands after the barrier's reset). It pushes to r-1 first, then
// r-2, ...: at each step every rank is written by exactly one peer and receives the chunk its GEMMs
// take next (the own chunk comes first and needs no communication; pushing to r+1 first would
// deliver the chunk each GEMM needs first last of all: see docs/DECISIONS.md D8). Nothing but the
// first GEMM stands at the start of the op (and a copy of A_shard where it is not contiguous, or of
// its edge rows off the native GEMM's tile grid): no publication copy, no opening barrier (see
// docs/DECISIONS.md D1).
//
// When may a rank push again into a peer's buffer, which the peer's GEMMs read? Two protocols:
//
// Eager (the op runs now): no barrier at all. The context's push workspace holds two buffers and
// op number e (counted on every rank alike, from 1 for a fresh allocation, over both paths) uses
// buffer e % 2; the flags (channels kEagerReadyChannel..) are set to e, never reset, and a GEMM
// waits until a flag holds e (or e+1). Rank r writes p's buffer e % 2 in op e; p last read it in op
// e-2. r's op-e pushes start behind r's compute stream, so after r's op e-1 GEMMs, which waited
// for p's op-e-1 pushes, which start behind p's op e-2 GEMMs: p is done with them. For the same
// reason a peer's flag is at most one op ahead (e+1, raised after its op-e push into the other
// buffer), and a rank never waits for anything but the chunks it multiplies: the op ends when
// its GEMMs and its own pushes do (a closing barrier would add the skew between the ranks; see
// docs/DECISIONS.md D1). A flag is up for op e when it holds e or e+1 (flag_raised): a stale flag,
// behind by any number of ops, never passes for a new one.
//
// Captured into a CUDA graph (replayed any number of times, so no op number can be baked in):
// a third buffer and flags of its own (channels kCapturedReadyChannel..) that go 0 -> 1, and a
// closing barrier: each rank enters it after its GEMMs have read every chunk and after it has set
// its flags back to 0, and a rank pushes again only in a later op, whose copy stream starts
// behind this barrier. An eager op after a replay writes a buffer the replay did not touch; a
// replay after an eager op writes the third buffer, last used by a replay, which ended with its
// barrier.
//
// The push workspace is the context's second symmetric allocation, which no other op uses: in
// the shared one a peer could still be busy with a previous op of another kind (the final
// reduction of a matmul_reduce_scatter) when this one pushes.
//
// Split schedule on rank r of ws (row gather, g < last dim), two streams:
//
//   compute: GEMM own chunk | wait flag r+1, GEMM r+1 | wait flag r+2, GEMM r+2 | ... | join
//   copy:    push to r-1 | push to r-2 | ... | push to r+1 |
//   flags:        flag (behind its push) | flag | ... | flag
//
// The waits are one-block kernels on the GEMM's stream, between GEMMs (bounded by the group's
// timeout, naming the peer and channel); the chunk GEMMs read the slots in place. A returned A
// (a_out) is copied from the slots after the GEMMs.
//
// Contraction-dim gather (g = last): chunk p is A[:, p*k:(p+1)*k] and its product with
// B[p*k:(p+1)*k, :] is a partial sum. The partial sums are accumulated in f32 in rank order
// 0..ws-1, so every rank computes the same bits (and, on the CPU backend, exactly the unfused
// GEMM's): replicas of the output never drift apart.
#include <fmt/ranges.h>

#include "ops/call_memo.h"
#include "ops/collectives.h"
#include "ops/fused_matmul.h"
#include "ops/matmul_common.h"

namespace asynctp {

using detail::align_up;
using detail::gemm;
using detail::gemm_view;

namespace {

constexpr int kBarrierChannel = 0;  // see NOTE [signal pads and channels]

struct AgMmCall {
  const char* op;
  Tensor a_shard;
  Tensor a_scale;  // undefined unless scaled
  std::span<const Tensor> bs;
  std::span<const Tensor> b_scales;
  std::span<const Tensor> outs;
  Tensor a_out;
  int g = 0;
  bool scaled = false;
  size_t push_piece_bytes = 0;  // the native path's (the call's option, else the context's)

  bool rowwise() const { return scaled && detail::is_rowwise_scale(a_scale, a_shard); }
  bool k_gather() const { return g == a_shard.dim() - 1; }
  Tensor b_scale(size_t i) const { return scaled ? b_scales[i] : Tensor(); }
};

void validate(OpContext& ctx, AgMmCall& c, int gather_dim) {
  const char* op = c.op;
  detail::check_on_device(ctx, c.a_shard, op, "A_shard");
  ASYNCTP_CHECK(c.a_shard.dim() >= 2, "{}: A_shard must have rank >= 2, got {}", op,
                c.a_shard.describe());
  ASYNCTP_CHECK(gather_dim >= -c.a_shard.dim() && gather_dim < c.a_shard.dim(),
                "{}: gather_dim {} is out of range for A_shard of rank {}", op, gather_dim,
                c.a_shard.dim());
  c.g = c.a_shard.wrap_dim(gather_dim);
  detail::check_gemm_dtype(c.a_shard, op, "A_shard", c.scaled);
  ASYNCTP_CHECK(!c.bs.empty(), "{}: Bs must hold at least one matrix", op);
  ASYNCTP_CHECK(c.outs.size() == c.bs.size(), "{}: got {} Bs but {} outs", op, c.bs.size(),
                c.outs.size());
  const Dims gathered = all_gather_shape(c.a_shard, c.g, ctx.world_size());
  const int64_t k = gathered.back();
  if (c.scaled) {
    ASYNCTP_CHECK(!c.k_gather(),
                  "{}: gathering on the contraction dim (gather_dim {}) is not "
                  "supported for scaled matmul: each shard would carry its own scale",
                  op, gather_dim);
    ASYNCTP_CHECK(c.b_scales.size() == c.bs.size(), "{}: got {} Bs but {} B_scales", op,
                  c.bs.size(), c.b_scales.size());
    detail::check_on_device(ctx, c.a_scale, op, "A_scale");
    detail::check_a_scale(c.a_scale, c.a_shard, op, "A_scale");
  }
  for (size_t i = 0; i < c.bs.size(); ++i) {
    const Tensor& b = c.bs[i];
    const std::string name = fmt::format("Bs[{}]", i);
    detail::check_on_device(ctx, b, op, name);
    ASYNCTP_CHECK(b.dim() == 2, "{}: {} must be 2-D [K, N], got {}", op, name, b.describe());
    ASYNCTP_CHECK(b.size(0) == k,
                  "{}: {} has {} rows but the gathered A's contraction dim is {} "
                  "(A_shard {}, gather_dim {})",
                  op, name, b.size(0), k, c.a_shard.describe(), c.g);
    detail::check_gemm_dtype(b, op, name, c.scaled);
    if (!c.scaled) {
      ASYNCTP_CHECK(b.dtype() == c.a_shard.dtype(), "{}: {} is {} but A_shard is {}", op, name,
                    b.dtype(), c.a_shard.dtype());
    } else {
      detail::check_on_device(ctx, c.b_scales[i], op, fmt::format("B_scales[{}]", i));
      detail::check_b_scale(c.b_scales[i], b.size(1), op, fmt::format("B_scales[{}]", i));
    }
    const Tensor& out = c.outs[i];
    const std::string out_name = fmt::format("outs[{}]", i);
    detail::check_on_device(ctx, out, op, out_name);
    detail::check_out_dtype(out, op, out_name);
    Dims expected = gathered;
    expected[expected.size() - 1] = b.size(1);
    ASYNCTP_CHECK(out.shape() == expected, "{}: {} must have shape {}, got {}", op, out_name,
                  expected, out.describe());
    ASYNCTP_CHECK(out.is_contiguous(), "{}: {} must be contiguous, got {}", op, out_name,
                  out.describe());
  }
  if (c.a_out.defined()) {
    detail::check_on_device(ctx, c.a_out, op, "A_out");
    ASYNCTP_CHECK(c.a_out.shape() == gathered && c.a_out.dtype() == c.a_shard.dtype() &&
                      c.a_out.is_contiguous(),
                  "{}: A_out must be a contiguous {}{}, got {}", op, c.a_shard.dtype(), gathered,
                  c.a_out.describe());
  }
}

// A row-wise scale's view matching a GEMM operand view of `split`.
Tensor scale_view(const Tensor& scale, bool rowwise, int split) {
  return rowwise ? gemm_view(scale, split, "A_scale") : scale;
}

// The shape of the gathered row-wise scale.
Dims gathered_scale_shape(const Dims& gathered) {
  Dims shape = gathered;
  shape[shape.size() - 1] = 1;
  return shape;
}

// The split path's f32 accumulator for a contraction-dim gather: one [rows, N_j] block for each
// output that is not f32 itself.
int64_t accumulator_elems(std::span<const Tensor> outs) {
  int64_t elems = 0;
  for (const Tensor& out : outs)
    if (out.dtype() != DType::kF32) elems += out.numel();
  return elems;
}

void run_fallback(OpContext& ctx, const AgMmCall& c) {
  const Dims gathered = all_gather_shape(c.a_shard, c.g, ctx.world_size());
  const Tensor a =
      c.a_out.defined() ? c.a_out : ctx.scratch(Scratch::kGatheredA, gathered, c.a_shard.dtype());
  Tensor scale;
  if (c.rowwise())
    scale = ctx.scratch(Scratch::kGatheredScale, gathered_scale_shape(gathered), DType::kF32);
  all_gather(ctx, c.a_shard, a, c.g);
  if (c.rowwise()) all_gather(ctx, c.a_scale, scale, c.g);
  for (size_t i = 0; i < c.bs.size(); ++i) {
    gemm(ctx, gemm_view(a, 0, "A"), c.bs[i], gemm_view(c.outs[i], 0, "out"), false,
         c.rowwise() ? scale_view(scale, true, 0) : c.a_scale, c.b_scale(i), ctx.stream());
  }
}

// ---- The push buffers (see the file comment) ----------------------------------------------------

constexpr int kCapturedReadyChannel = 1;  // to 1 + kMaxPushPieces - 1: see NOTE [signal pads and
constexpr int kEagerReadyChannel = 8;     // to 8 + kMaxPushPieces - 1:  channels]
static_assert(kCapturedReadyChannel + detail::kMaxPushPieces <= kEagerReadyChannel &&
              kEagerReadyChannel + detail::kMaxPushPieces <= kNumChannels);

// One buffer of the push workspace: [ws shard slots | ws scale slots] (row-wise scales), each
// part 256-byte aligned.
size_t push_buffer_bytes(int ws, size_t shard_bytes, size_t scale_bytes) {
  return align_up(ws * shard_bytes, 256) + align_up(ws * scale_bytes, 256);
}

// The push workspace both overlapped paths need per rank (kOpBuffers buffers).
size_t push_symm_bytes(int ws, size_t shard_bytes, size_t scale_bytes) {
  return detail::op_buffers_bytes(push_buffer_bytes(ws, shard_bytes, scale_bytes));
}

// This op's buffer of the push workspace (detail::OpBuffer) and its ready flags.
struct PushBuffer : detail::OpBuffer {
  PushBuffer(OpContext& ctx, size_t shard_bytes, size_t scale_bytes)
      : OpBuffer(ctx, ctx.push_workspace(),
                 push_buffer_bytes(ctx.world_size(), shard_bytes, scale_bytes)),
        ws(ctx.world_size()),
        shard_bytes(shard_bytes),
        scale_bytes(scale_bytes),
        channel(captured ? kCapturedReadyChannel : kEagerReadyChannel) {}

  // Slot p (rank p's shard) of `owner`'s buffer, viewed as `shape`.
  Tensor slot(int owner, int p, const Dims& shape, DType dtype) const {
    return sm.buffer(owner, shape, dtype, offset + p * shard_bytes);
  }
  // Rank p's row-wise scale in `owner`'s buffer.
  Tensor scale_slot(int owner, int p, const Dims& shape) const {
    return sm.buffer(owner, shape, DType::kF32,
                     offset + align_up(ws * shard_bytes, 256) + p * scale_bytes);
  }
  // `owner`'s flags: piece q of chunk p is flag q * ws + p.
  uint32_t* ready(int owner) const { return sm.signal_pad_ptr(owner) + channel * ws; }

  int ws;
  size_t shard_bytes, scale_bytes;
  int channel;
};

void run_split(OpContext& ctx, const AgMmCall& c) {
  Backend& be = ctx.backend();
  Stream& compute = ctx.stream();
  Stream& copy = ctx.copy_stream();
  const int ws = ctx.world_size();
  const int rank = ctx.rank();
  const int64_t s = c.a_shard.size(c.g);
  const bool rowwise = c.rowwise();
  const PushBuffer buf(ctx, c.a_shard.nbytes(), rowwise ? c.a_scale.nbytes() : 0);
  auto shard_slot = [&](int owner, int p) {
    return buf.slot(owner, p, c.a_shard.shape(), c.a_shard.dtype());
  };
  auto scale_slot = [&](int owner, int p) { return buf.scale_slot(owner, p, c.a_scale.shape()); };
  auto slice = [&](const Tensor& t, int p) { return t.narrow(c.g, p * s, s); };
  uint32_t* ready = buf.ready(rank);

  // The own shard is multiplied and pushed in place where it is contiguous (its row-wise scale
  // too); else it is copied into the own slot first, on the compute stream, and taken from there.
  const bool in_place = c.a_shard.is_contiguous() && (!rowwise || c.a_scale.is_contiguous());
  ctx.mark("start", compute);
  if (!in_place) {
    be.copy(shard_slot(rank, rank), c.a_shard, compute);
    if (rowwise) be.copy(scale_slot(rank, rank), c.a_scale, compute);
  }
  const Tensor own_a = in_place ? c.a_shard : shard_slot(rank, rank);
  const Tensor own_scale = rowwise && !in_place ? scale_slot(rank, rank) : c.a_scale;
  auto chunk_a = [&](int p) { return p == rank ? own_a : shard_slot(rank, p); };
  auto chunk_scale = [&](int p) {
    if (!rowwise) return c.a_scale;
    return p == rank ? own_scale : scale_slot(rank, p);
  };

  // The copy stream (and the second GEMM stream) start behind the caller's writes of A_shard
  // and this rank's previous op (see the protocol).
  Event& start = ctx.event(0);
  start.record(compute);
  start.block(copy);
  Stream& aux = ctx.gemm_stream(1);
  if (&aux != &compute) start.block(aux);
  auto push = [&](int i) {
    const int p = (rank - i + ws) % ws;
    be.copy(shard_slot(p, rank), own_a, copy);
    if (rowwise) be.copy(scale_slot(p, rank), own_scale, copy);
    Stream& flags = ctx.flags_behind(0);  // behind the copy stream, which goes on at once
    be.write_flag(buf.ready(p) + rank, buf.number, flags);
    if (ctx.tracing()) ctx.mark(fmt::format("pushed to {}", p), flags);
  };
  // Waits (on `stream`, bounded) until chunk p has landed.
  auto wait_for = [&](int p, Stream& stream) {
    if (p == rank) return;
    Backend::FlagWait wait;
    wait.flags = ready;
    wait.value = buf.number;
    wait.first = p;
    wait.count = p + 1;
    wait.timeout = ctx.group().timeout();
    wait.rank = rank;
    wait.channel = buf.channel;
    wait.of = Backend::FlagWait::Of::kShard;
    be.wait_flags(wait, stream);
  };
  auto multiply_rows = [&](int p, Stream& stream) {
    for (size_t j = 0; j < c.bs.size(); ++j) {
      gemm(ctx, gemm_view(chunk_a(p), c.g, "A chunk"), c.bs[j],
           gemm_view(slice(c.outs[j], p), c.g, "out chunk"), false,
           scale_view(chunk_scale(p), rowwise, c.g), c.b_scale(j), stream);
    }
  };
  // The first push is enqueued before the first GEMM: enqueueing a GEMM takes longer than a copy,
  // and r-1 needs this chunk right after its own.
  if (ws > 1) push(1);

  if (!c.k_gather()) {
    // Each chunk as it lands, in push order, alternating between the GEMM streams (with two) so
    // that one chunk's tail overlaps the next one's start.
    for (int i = 0; i < ws; ++i) {
      const int p = (rank + i) % ws;
      Stream& stream = ctx.gemm_stream(i);
      wait_for(p, stream);
      multiply_rows(p, stream);
      if (ctx.tracing()) ctx.mark(fmt::format("gemm {}", p), stream);
      if (i == 0) {
        for (int j = 2; j < ws; ++j)
          push(j);
      }
    }
  } else {
    for (int j = 2; j < ws; ++j)
      push(j);
    // Partial sums over K slices, accumulated in f32 in rank order (see the file comment).
    std::vector<Tensor> acc(c.bs.size());
    const int64_t acc_elems = accumulator_elems(c.outs);
    const Tensor acc_buf =
        acc_elems > 0 ? ctx.scratch(Scratch::kAccumulator, {acc_elems}, DType::kF32) : Tensor();
    int64_t offset = 0;
    for (size_t j = 0; j < c.bs.size(); ++j) {
      if (c.outs[j].dtype() == DType::kF32) {
        acc[j] = c.outs[j];
      } else {
        acc[j] = acc_buf.narrow(0, offset, c.outs[j].numel()).view(c.outs[j].shape());
        offset += c.outs[j].numel();
      }
    }
    for (int p = 0; p < ws; ++p) {
      wait_for(p, compute);
      for (size_t j = 0; j < c.bs.size(); ++j) {
        gemm(ctx, gemm_view(chunk_a(p), 0, "A chunk"), c.bs[j].narrow(0, p * s, s),
             gemm_view(acc[j], 0, "accumulator"), /*accumulate=*/p > 0, Tensor(), Tensor(),
             compute);
      }
    }
    for (size_t j = 0; j < c.bs.size(); ++j) {
      if (acc[j].data() != c.outs[j].data()) be.copy(c.outs[j], acc[j], compute);
    }
  }
  // The second GEMM stream joins back (forked at the start whatever the branch: a CUDA graph
  // may not end with a fork left open).
  if (&aux != &compute) {
    Event& aux_done = ctx.event(ws + 2);
    aux_done.record(aux);
    aux_done.block(compute);
  }
  // Every chunk has landed once the GEMMs are through (they waited for each flag).
  if (c.a_out.defined()) {
    for (int p = 0; p < ws; ++p)
      be.copy(slice(c.a_out, p), p == rank ? c.a_shard : shard_slot(rank, p), compute);
  }
  // The pushes read A_shard: the caller may write it again once the op is through.
  Event& pushed = ctx.event(ws + 1);
  pushed.record(copy);
  pushed.block(compute);
  ctx.join_flag_streams(compute);
  ctx.mark("joined", compute);
  if (buf.captured) {
    // Past this barrier no rank reads any buffer of this op, and every flag is back to 0.
    buf.sm.reset_and_barrier(ready, ws, kBarrierChannel, compute);
  }
  ctx.mark("end", compute);
}

// The native schedule on rank r of ws (row gather with no batch dims before g, bf16/f16):
//
//   compute: [own edge rows -> S_r[r], ready_r[r] = e] | native GEMM: own chunk from A_shard,
//            then chunks r+1, r+2, ... as they land | join | (captured into a CUDA graph:
//            barrier, which also sets ready back to 0)
//   copy:    A_shard -> S_{r-1}[r] | A_shard -> S_{r-2}[r] | ...
//   flags:        ready_{r-1}[r] = e (behind its push) | ready_{r-2}[r] = e | ...
//            (the last flag on the copy stream itself, where no copy of a returned A follows)
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
struct NativePlan {
  int64_t rows = 0;  // rows of the shard as a matrix
  int64_t k = 0;
};

std::optional<NativePlan> native_plan(const AgMmCall& c, std::string* why) {
  if (c.scaled) {
    *why = "float8 operands (the native GEMM takes bf16 or f16)";
    return std::nullopt;
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

ChunkedGemmArgs native_args(OpContext& ctx, const NativePlan& plan, const Tensor& a,
                            const Tensor& b, const Tensor& out) {
  const int ws = ctx.world_size();
  ChunkedGemmArgs args;
  args.a = a;
  args.b = b;
  args.d = out.view({ws * plan.rows, b.size(1)});
  args.chunk_rows = plan.rows;
  args.first_chunk = ctx.rank();
  args.timeout = ctx.group().timeout();
  args.rank = ctx.rank();
  return args;
}

void run_native(OpContext& ctx, const AgMmCall& c, const NativePlan& plan) {
  Backend& be = ctx.backend();
  Stream& compute = ctx.stream();
  Stream& copy = ctx.copy_stream();
  const int ws = ctx.world_size();
  const int rank = ctx.rank();
  const DType dtype = c.a_shard.dtype();
  const size_t shard_bytes = c.a_shard.nbytes();
  const PushBuffer buf(ctx, shard_bytes, 0);
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
  // Piece q of this rank's chunk into `owner`'s slot, on the copy stream.
  auto copy_piece = [&](int owner, const Tensor& from, int q) {
    be.copy(piece_of(slot(owner, rank), q), piece_of(from, q), copy);
  };
  // Its flag, beside the copy stream (which goes on at once), behind everything on it so far.
  // The last flag goes on the copy stream itself, straight behind its copy, where nothing
  // follows it there in this op (no returned A): a flag on the copy stream holds only that
  // stream's next copy (see OpContext::flags_behind), and there is none; it saves the flag
  // stream's event edge and its join, four host calls of an eager op (all of them at ws 2 with
  // one piece).
  int flags_left = (ws - 1) * pieces.count;
  auto flag_piece = [&](int owner, int q) {
    const bool last = --flags_left == 0 && !c.a_out.defined();
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
  for (size_t j = 0; j < c.bs.size(); ++j) {
    gemms.push_back(native_args(ctx, plan, gathered, c.bs[j], c.outs[j]));
    gemms.back().ready = ready;
    gemms.back().ready_value = number;
    gemms.back().ready_rows = pieces.rows;
    gemms.back().ready_stride = ws;
  }
  ChunkedGemmArgs probe = gemms[0];
  probe.own_a = c.a_shard.is_contiguous() ? c.a_shard.view({plan.rows, plan.k}) : Tensor();
  probe.own_chunk = rank;
  const bool in_place = probe.own_a.defined() && be.native_gemm_unsupported(probe).empty();
  if (in_place) {
    for (ChunkedGemmArgs& args : gemms) {
      args.own_a = probe.own_a;
      args.own_chunk = rank;
    }
  }
  const Backend::OwnEdgeRows edges =
      in_place ? be.native_gemm_own_edge_rows(gemms[0]) : Backend::OwnEdgeRows{};
  // Every GEMM's arguments (the real B and out of each) are checked before anything is enqueued:
  // an op that throws after its first push would leave the ranks' op counts apart.
  for (const ChunkedGemmArgs& args : gemms) {
    const std::string why = be.native_gemm_unsupported(args);
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
  // A returned A: the own rows from the source (read in place, the own slot holds at most their
  // edge rows), on the copy stream behind the pushes (a copy within the GPU: a kernel, which
  // starts as the GEMM's CTAs finish); the others from the slots, on the compute stream, where
  // every chunk has landed once the GEMMs are through (they waited for each flag).
  Tensor a_out;
  if (c.a_out.defined()) {
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
  ctx.join_flag_streams(compute);
  ctx.mark("joined", compute);
  if (buf.captured) {
    // Past this barrier no rank reads any buffer of this op, and every flag is back to 0 (reset
    // in the barrier's kernel, not by separate stream writes: see docs/DECISIONS.md D20).
    buf.sm.reset_and_barrier(ready, ws * pieces.count, kBarrierChannel, compute);
  }
  ctx.mark("end", compute);
}

// The dispatcher's key of a call: the gathered product [ws x shard rows, K] @ [K, sum of the Bs'
// columns], and what else sets the paths' times.
std::string problem_key(OpContext& ctx, const AgMmCall& c) {
  const int64_t k = c.bs[0].size(0);
  const int64_t m = k == 0 ? 0 : ctx.world_size() * c.a_shard.numel() / k;
  int64_t n = 0;
  for (const Tensor& b : c.bs)
    n += b.size(1);
  std::vector<std::string> variant;
  if (c.g != 0) variant.push_back(fmt::format("gather dim {} of {}", c.g, c.a_shard.dim()));
  if (c.bs.size() > 1) variant.push_back(fmt::format("{} Bs", c.bs.size()));
  if (c.a_out.defined()) variant.push_back("returns A");
  if (c.rowwise()) variant.push_back("row-wise A scale");
  return detail::problem_key(ctx, c.op, m, n, k, c.a_shard.dtype(), c.outs[0].dtype(), c.bs[0],
                             fmt::format("{}", fmt::join(variant, ", ")));
}

void run_path(OpContext& ctx, const AgMmCall& c, Path path, const std::optional<NativePlan>& plan) {
  switch (path) {
    case Path::kNative:
      run_native(ctx, c, *plan);
      break;
    case Path::kSplit:
      run_split(ctx, c);
      break;
    case Path::kFallback:
      run_fallback(ctx, c);
      break;
  }
}

void run(OpContext& ctx, AgMmCall c, const AllGatherMatmulOptions& options) {
  const OpContext::StreamScope scope(ctx, options.stream);
  // Where the host's time goes before the first GPU work of the op (bench --trace).
  ctx.mark("call", ctx.stream());
  // A wait of an earlier op that timed out is reported here: no barrier of these ops would (and
  // every later bounded wait gives up at once while the error stands).
  ctx.backend().check_errors();
  ctx.forget_flag_streams();
  c.push_piece_bytes = options.push_piece_bytes.value_or(ctx.options().push_piece_bytes);
  // The call's metadata: a call seen before skips the checks and the choice.
  detail::CallMemos& memos = ctx.call_memos();
  memos.start(c.op);
  memos.add(options.gather_dim);
  memos.add(options.path ? static_cast<int64_t>(*options.path) : -1);
  memos.add(static_cast<int64_t>(c.push_piece_bytes));
  memos.add(c.a_shard);
  memos.add(c.a_scale);
  memos.add(c.bs);
  memos.add(c.b_scales);
  memos.add(c.outs);
  memos.add(c.a_out);
  if (const detail::CallMemo* memo = memos.find()) {
    c.g = memo->dim;
    std::optional<NativePlan> plan;
    if (memo->has_plan) plan = NativePlan{memo->plan[0], memo->plan[1]};
    ctx.usage().record(c.op, memo->decision.path, memo->decision.reason, memo->decision.warns());
    run_path(ctx, c, memo->decision.path, plan);
    return;
  }
  validate(ctx, c, options.gather_dim);
  const size_t symm_bytes =
      push_symm_bytes(ctx.world_size(), c.a_shard.nbytes(), c.rowwise() ? c.a_scale.nbytes() : 0);
  detail::CallPaths paths;
  const std::optional<NativePlan> plan = native_plan(c, &paths.native_unsupported);
  if (plan) {
    paths.native_symm_bytes = symm_bytes;
    const int64_t m = ctx.world_size() * plan->rows;
    for (size_t j = 0; j < c.bs.size() && paths.native_unsupported.empty(); ++j) {
      const ChunkedGemmArgs args = native_args(
          ctx, *plan, detail::shape_only_matrix(c.a_shard.dtype(), m, plan->k, c.a_shard.device()),
          detail::shape_only(c.bs[j]), detail::shape_only(c.outs[j]));
      paths.native_unsupported = ctx.backend().native_gemm_unsupported(args);
    }
  }
  paths.key = problem_key(ctx, c);
  paths.run = [&](Path p) { run_path(ctx, c, p, plan); };
  const auto decision = detail::choose_path(ctx, options.path, symm_bytes, c.op, paths);
  ctx.usage().record(c.op, decision.path, decision.reason, decision.warns());
  // (Kept before the run: the key is the memos' one buffer.)
  if (decision.settled) {
    memos.remember(
        {decision, c.g, plan.has_value(), {plan ? plan->rows : 0, plan ? plan->k : 0, 0}});
  }
  run_path(ctx, c, decision.path, plan);
}

}  // namespace

Dims all_gather_shape(const Tensor& a_shard, int gather_dim, int world_size) {
  Dims shape = a_shard.shape();
  shape[a_shard.wrap_dim(gather_dim)] *= world_size;
  return shape;
}

Dims all_gather_matmul_out_shape(const Tensor& a_shard, const Tensor& b, int gather_dim,
                                 int world_size) {
  Dims shape = all_gather_shape(a_shard, gather_dim, world_size);
  shape[shape.size() - 1] = b.size(-1);
  return shape;
}

void all_gather_matmul(OpContext& ctx, const Tensor& a_shard, std::span<const Tensor> bs,
                       std::span<const Tensor> outs, const Tensor& a_out,
                       const AllGatherMatmulOptions& options) {
  run(ctx, AgMmCall{"all_gather_matmul", a_shard, Tensor(), bs, {}, outs, a_out, 0, false},
      options);
}

void all_gather_matmul(OpContext& ctx, const Tensor& a_shard, const Tensor& b, const Tensor& out,
                       const Tensor& a_out, const AllGatherMatmulOptions& options) {
  all_gather_matmul(ctx, a_shard, std::span<const Tensor>(&b, 1), std::span<const Tensor>(&out, 1),
                    a_out, options);
}

void all_gather_scaled_matmul(OpContext& ctx, const Tensor& a_shard, const Tensor& a_scale,
                              const Tensor& b, const Tensor& b_scale, const Tensor& out,
                              const Tensor& a_out, const AllGatherMatmulOptions& options) {
  all_gather_scaled_matmul(ctx, a_shard, a_scale, std::span<const Tensor>(&b, 1),
                           std::span<const Tensor>(&b_scale, 1), std::span<const Tensor>(&out, 1),
                           a_out, options);
}

void all_gather_scaled_matmul(OpContext& ctx, const Tensor& a_shard, const Tensor& a_scale,
                              std::span<const Tensor> bs, std::span<const Tensor> b_scales,
                              std::span<const Tensor> outs, const Tensor& a_out,
                              const AllGatherMatmulOptions& options) {
  run(ctx,
      AgMmCall{"all_gather_scaled_matmul", a_shard, a_scale, bs, b_scales, outs, a_out, 0, true},
      options);
}

void reserve_all_gather_matmul(OpContext& ctx, const Tensor& a_shard, std::span<const Tensor> bs,
                               bool return_a, const AllGatherMatmulOptions& options) {
  const char* op = "reserve_all_gather_matmul";
  const OpContext::StreamScope scope(ctx, options.stream);
  ASYNCTP_CHECK(a_shard.defined() && a_shard.dim() >= 2, "{}: A_shard must have rank >= 2, got {}",
                op, a_shard.describe());
  ASYNCTP_CHECK(options.gather_dim >= -a_shard.dim() && options.gather_dim < a_shard.dim(),
                "{}: gather_dim {} is out of range for A_shard of rank {}", op, options.gather_dim,
                a_shard.dim());
  ASYNCTP_CHECK(!bs.empty(), "{}: Bs must hold at least one matrix", op);
  const int ws = ctx.world_size();
  const int g = a_shard.wrap_dim(options.gather_dim);
  const Dims gathered = all_gather_shape(a_shard, g, ws);
  std::vector<Tensor> outs;  // descriptors of the outputs, in a 2-byte dtype (see below)
  for (size_t i = 0; i < bs.size(); ++i) {
    ASYNCTP_CHECK(bs[i].defined() && bs[i].dim() == 2 && bs[i].size(0) == gathered.back(),
                  "{}: Bs[{}] must be 2-D [{}, N], got {}", op, i, gathered.back(),
                  bs[i].describe());
    Dims out_shape = gathered;
    out_shape[out_shape.size() - 1] = bs[i].size(1);
    // Not f32: the split path's accumulator is then needed, the larger reservation.
    outs.push_back(detail::shape_only_contiguous(DType::kBF16, out_shape, a_shard.device()));
  }
  // A float8 A_shard may come with a row-wise scale (f32, A_shard's shape with the last dim 1),
  // which travels beside it: reserve for that.
  const bool scaled = is_float8(a_shard.dtype());
  const Dims scale_shape = gathered_scale_shape(a_shard.shape());
  const size_t scale_bytes =
      scaled ? static_cast<size_t>(scale_shape.product()) * sizeof(float) : 0;
  const size_t symm_bytes = push_symm_bytes(ws, a_shard.nbytes(), scale_bytes);
  const detail::PossiblePaths paths = detail::possible_paths(ctx, options.path, symm_bytes);
  if (paths.overlapped) {
    ctx.push_workspace().get(symm_bytes, ctx.stream());
    if (g == a_shard.dim() - 1)
      ctx.reserve_scratch(Scratch::kAccumulator, accumulator_elems(outs) * sizeof(float));
  }
  if (paths.fallback) {
    if (!return_a) {
      ctx.reserve_scratch(Scratch::kGatheredA,
                          static_cast<size_t>(gathered.product()) * element_size(a_shard.dtype()));
    }
    reserve_all_gather(ctx, a_shard, /*out_contiguous=*/true, g);
    if (scaled) {
      ctx.reserve_scratch(Scratch::kGatheredScale,
                          gathered_scale_shape(gathered).product() * sizeof(float));
      reserve_all_gather(ctx,
                         detail::shape_only_contiguous(DType::kF32, scale_shape, a_shard.device()),
                         /*out_contiguous=*/true, g);
    }
  }
}

}  // namespace asynctp
