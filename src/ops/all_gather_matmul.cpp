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

#include "device/nvtx.h"
#include "ops/all_gather_matmul_paths.h"
#include "ops/call_memo.h"
#include "ops/collectives.h"
#include "ops/fused_matmul.h"
#include "ops/matmul_common.h"
#include "ops/operand_overlap.h"

namespace asynctp {

using detail::align_up;
using detail::gemm_view;

namespace {

using namespace detail::agmm;  // NOLINT(google-build-using-namespace)

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
  ASYNCTP_CHECK(!c.swiglu || c.bs.size() == 1, "{}: takes one B (gate | up), got {}", op,
                c.bs.size());
  ASYNCTP_CHECK(c.outs.size() == c.bs.size(), "{}: got {} Bs but {} outs", op, c.bs.size(),
                c.outs.size());
  const Dims gathered = all_gather_shape(c.a_shard, c.g, ctx.world_size());
  const int64_t k = gathered.back();
  if (!c.fast_accum.empty()) {
    ASYNCTP_CHECK(c.scaled,
                  "{}: fast_accum is for the scaled (float8) form, all_gather_scaled_matmul; got "
                  "{} values",
                  op, c.fast_accum.size());
    ASYNCTP_CHECK(c.fast_accum.size() == 1 || c.fast_accum.size() == c.bs.size(),
                  "{}: fast_accum holds {} values for {} Bs: give one per B, or one for all", op,
                  c.fast_accum.size(), c.bs.size());
  }
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
    ASYNCTP_CHECK(!c.swiglu || b.size(1) % 2 == 0,
                  "{}: {} must hold 2N columns (the gate's N, then the up projection's N), got {}",
                  op, name, b.describe());
    Dims expected = gathered;
    expected[expected.size() - 1] = c.swiglu ? b.size(1) / 2 : b.size(1);
    ASYNCTP_CHECK(out.shape() == expected, "{}: {} must have shape {}, got {}", op, out_name,
                  expected, out.describe());
    ASYNCTP_CHECK(out.is_contiguous(), "{}: {} must be contiguous, got {}", op, out_name,
                  out.describe());
  }
  if (c.pre_out.defined()) {
    detail::check_on_device(ctx, c.pre_out, op, "pre_out");
    detail::check_out_dtype(c.pre_out, op, "pre_out");
    Dims expected = gathered;
    expected[expected.size() - 1] = c.bs[0].size(1);
    ASYNCTP_CHECK(c.pre_out.shape() == expected && c.pre_out.is_contiguous(),
                  "{}: pre_out must be contiguous of shape {}, got {}", op, expected,
                  c.pre_out.describe());
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
  ctx.host_profile().stamp("scratch");
  all_gather(ctx, c.a_shard, a, c.g);
  if (c.rowwise()) all_gather(ctx, c.a_scale, scale, c.g);
  ctx.host_profile().stamp("gathered");
  for (size_t i = 0; i < c.bs.size(); ++i) {
    ctx.backend().gemm(c.product(i, gemm_view(a, 0, "A"), gemm_view(c.outs[i], 0, "out"),
                                 c.rowwise() ? scale_view(scale, true, 0) : c.a_scale),
                       ctx.stream());
  }
  ctx.host_profile().stamp("gemm");
}

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
      be.gemm(c.product(j, gemm_view(chunk_a(p), c.g, "A chunk"),
                        gemm_view(slice(c.outs[j], p), c.g, "out chunk"),
                        scale_view(chunk_scale(p), rowwise, c.g)),
              stream);
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
      // An empty output has nothing to accumulate (and no room in an accumulator of 0
      // elements): its GEMMs write nothing, so they may as well write it.
      if (c.outs[j].dtype() == DType::kF32 || c.outs[j].numel() == 0) {
        acc[j] = c.outs[j];
      } else {
        acc[j] = acc_buf.narrow(0, offset, c.outs[j].numel()).view(c.outs[j].shape());
        offset += c.outs[j].numel();
      }
    }
    for (int p = 0; p < ws; ++p) {
      wait_for(p, compute);
      for (size_t j = 0; j < c.bs.size(); ++j) {
        // (Unscaled: the scaled form cannot gather the contraction dim.)
        be.gemm({.a = gemm_view(chunk_a(p), 0, "A chunk"),
                 .b = c.bs[j].narrow(0, p * s, s),
                 .d = gemm_view(acc[j], 0, "accumulator"),
                 .accumulate = p > 0},
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

// all_gather_matmul_swiglu on the split or fallback path: the products [.., 2N] into f32 (pre_out
// itself where it is f32, else the kPreActivation scratch) by that path as all_gather_matmul
// takes them, then the SwiGLU (and pre_out, rounded) from there, on the compute stream behind the
// path's join.
void run_swiglu_unfused(OpContext& ctx, const AgMmCall& c, Path path) {
  const Tensor& out = c.outs[0];
  Dims shape = out.shape();
  shape[shape.size() - 1] = c.bs[0].size(1);
  const bool pre_in_place = c.pre_out.defined() && c.pre_out.dtype() == DType::kF32;
  const Tensor pre =
      pre_in_place ? c.pre_out : ctx.scratch(Scratch::kPreActivation, shape, DType::kF32);
  AgMmCall products = c;
  products.swiglu = false;
  products.pre_out = Tensor();
  products.outs = std::span<const Tensor>(&pre, 1);
  if (path == Path::kSplit) {
    run_split(ctx, products);
  } else {
    run_fallback(ctx, products);
  }
  Backend& be = ctx.backend();
  be.swiglu(out, pre, ctx.stream());
  if (c.pre_out.defined() && !pre_in_place) be.copy(c.pre_out, pre, ctx.stream());
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
  if (c.pre_out.defined()) variant.push_back("returns the products");
  if (detail::off_16_bytes(c.bs) || detail::off_16_bytes(c.outs) ||
      detail::off_16_bytes(c.pre_out) || detail::off_16_bytes(c.a_scale) ||
      detail::off_16_bytes(c.b_scales))
    variant.push_back("operands off 16-byte alignment");
  // Fast accumulation changes the GEMMs' times, so the paths' too.
  std::vector<size_t> fast;
  for (size_t i = 0; i < c.bs.size(); ++i)
    if (c.scaled && c.fast(i)) fast.push_back(i);
  if (fast.size() == c.bs.size()) {
    variant.push_back("fast accum");
  } else if (!fast.empty()) {
    variant.push_back(fmt::format("fast accum for Bs {}", fmt::join(fast, " ")));
  }
  return detail::problem_key(ctx, c.op, m, n, k, c.a_shard.dtype(), c.outs[0].dtype(), c.bs[0],
                             fmt::format("{}", fmt::join(variant, ", ")));
}

// The call's NVTX range text: "all_gather_matmul native: A_shard bf16[512, 8192] gather_dim 0,
// Bs [8192, 1024] [8192, 1024], ws 2" (scaled: ", row-wise scales" or ", tensor-wise scales").
std::string range_text(OpContext& ctx, const AgMmCall& c, Path path) {
  return fmt::format("{} {}: A_shard {}{} gather_dim {}, Bs {}{}, ws {}", c.op, path_name(path),
                     c.a_shard.dtype(), c.a_shard.shape(), c.g, detail::shapes_text(c.bs),
                     detail::scales_text(c.scaled, c.rowwise()), ctx.world_size());
}

void run_path(OpContext& ctx, const AgMmCall& c, Path path, const std::optional<NativePlan>& plan) {
  const nvtx::Range range(detail::path_color(path), [&] { return range_text(ctx, c, path); });
  if (c.swiglu && path != Path::kNative) {
    run_swiglu_unfused(ctx, c, path);
    return;
  }
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
  const HostProfile::Call profiled(ctx.host_profile());
  ctx.host_profile().stamp("run");
  const OpContext::StreamScope scope(ctx, options.stream);
  // Where the host's time goes before the first GPU work of the op (bench --trace).
  ctx.mark("call", ctx.stream());
  // A wait of an earlier op that timed out is reported here: no barrier of these ops would (and
  // every later bounded wait gives up at once while the error stands).
  ctx.backend().check_errors();
  ctx.forget_flag_streams();
  c.push_piece_bytes = options.push_piece_bytes.value_or(ctx.options().push_piece_bytes);
  c.fast_accum = options.fast_accum;
  // The call's metadata: a call seen before skips the checks and the choice.
  detail::CallMemos& memos = ctx.call_memos();
  memos.start(c.op);
  memos.add(options.gather_dim);
  memos.add(ctx.capturing());  // eager and captured calls may take different paths (dispatch.h)
  memos.add(options.path ? static_cast<int64_t>(*options.path) : -1);
  memos.add(static_cast<int64_t>(c.push_piece_bytes));
  memos.add(static_cast<int64_t>(c.fast_accum.size()));
  for (const bool fast : c.fast_accum)
    memos.add(fast);
  memos.add(c.a_shard);
  memos.add(c.a_scale);
  memos.add(c.bs);
  memos.add(c.b_scales);
  memos.add(c.outs);
  memos.add(c.a_out);
  memos.add(c.pre_out);
  const detail::CallMemo* memo = memos.find();
  ctx.host_profile().stamp("memo");
  if (memo == nullptr) validate(ctx, c, options.gather_dim);
  // No output over an input or another output (ops/operand_overlap.h). On every call: the memos
  // leave the data pointers out.
  detail::check_no_overlap(
      c.op,
      {{"A_shard", c.a_shard}, {"A_scale", c.a_scale}, {"Bs", c.bs}, {"B_scales", c.b_scales}},
      {{"outs", c.outs}, {"pre_out", c.pre_out}, {"A_out", c.a_out}});
  if (memo != nullptr) {
    c.g = memo->dim;
    std::optional<NativePlan> plan;
    if (memo->has_plan) plan = NativePlan{memo->plan[0], memo->plan[1]};
    ctx.usage().record(c.op, memo->decision.path, memo->decision.reason, memo->decision.warns());
    ctx.host_profile().set_path(c.op, memo->decision.path);
    run_path(ctx, c, memo->decision.path, plan);
    return;
  }
  const size_t symm_bytes =
      push_symm_bytes(ctx.world_size(), c.a_shard.nbytes(), c.rowwise() ? c.a_scale.nbytes() : 0);
  detail::CallPaths paths;
  const std::optional<NativePlan> plan = native_plan(c, &paths.native_unsupported);
  if (plan) {
    paths.native_symm_bytes = symm_bytes;
    const int64_t m = ctx.world_size() * plan->rows;
    // The caller's operands as they are (their alignment counts, and the call memos key it); the
    // gathered A and its scales, the op's own buffers, at an aligned dummy address.
    for (size_t j = 0; j < c.bs.size() && paths.native_unsupported.empty(); ++j) {
      const ChunkedGemmArgs args = native_args(
          ctx, *plan, c,
          detail::shape_only_matrix(c.a_shard.dtype(), m, plan->k, c.a_shard.device()), c.bs[j],
          c.outs[j], c.pre_out,
          native_a_scale(c, detail::shape_only_contiguous(DType::kF32, {m}, c.a_shard.device())),
          c.b_scale(j));
      paths.native_unsupported = ctx.backend().native_gemm_unsupported(args);
    }
  }
  paths.key = problem_key(ctx, c);
  paths.run = [&](Route r) { run_path(ctx, c, r.path, plan); };
  const auto decision = detail::choose_path(ctx, options.path, symm_bytes, c.op, paths);
  ctx.usage().record(c.op, decision.path, decision.reason, decision.warns());
  // (Kept before the run: the key is the memos' one buffer.)
  if (decision.settled) {
    memos.remember(
        {decision, c.g, plan.has_value(), {plan ? plan->rows : 0, plan ? plan->k : 0, 0}});
  }
  ctx.host_profile().set_path(c.op, decision.path);
  ctx.host_profile().stamp("checks");
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

void all_gather_matmul_swiglu(OpContext& ctx, const Tensor& a_shard, const Tensor& b_gate_up,
                              const Tensor& out, const Tensor& pre_out, const Tensor& a_out,
                              const AllGatherMatmulOptions& options) {
  AgMmCall c{"all_gather_matmul_swiglu",
             a_shard,
             Tensor(),
             std::span<const Tensor>(&b_gate_up, 1),
             {},
             std::span<const Tensor>(&out, 1),
             a_out,
             0,
             false};
  c.swiglu = true;
  c.pre_out = pre_out;
  run(ctx, c, options);
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

void reserve_all_gather_matmul_swiglu(OpContext& ctx, const Tensor& a_shard,
                                      const Tensor& b_gate_up, bool return_a,
                                      const AllGatherMatmulOptions& options) {
  reserve_all_gather_matmul(ctx, a_shard, std::span<const Tensor>(&b_gate_up, 1), return_a,
                            options);
  ASYNCTP_CHECK(b_gate_up.size(1) % 2 == 0,
                "reserve_all_gather_matmul_swiglu: B_gate_up must hold 2N columns, got {}",
                b_gate_up.describe());
  if (options.path == PathChoice::kNative) return;
  // The split and fallback paths' f32 products (see run_swiglu_unfused).
  const Dims gathered = all_gather_shape(a_shard, options.gather_dim, ctx.world_size());
  const int64_t rows = gathered.back() == 0 ? 0 : gathered.product() / gathered.back();
  ctx.reserve_scratch(Scratch::kPreActivation,
                      static_cast<size_t>(rows * b_gate_up.size(1)) * sizeof(float));
}

}  // namespace asynctp
