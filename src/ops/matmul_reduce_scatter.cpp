// matmul_reduce_scatter and scaled_matmul_reduce_scatter.
//
// Split schedule on rank r of ws (P = A @ B, chunk d of P is what rank d keeps):
//
//   compute: (captured: reset landed, barrier) | GEMM chunk r+1 | GEMM chunk r+2 | ... | GEMM
//            chunk r -> own slot | reduce (waits for landed[s] of every peer s) | wait for copy
//   copy:                          | push r+1 | push r+2 | ... | push r-1
//   flags:                                    | landed_{r+1}[r] = e | ... (each behind its push)
//
// Rank r computes the chunks in the order their owners need them, r+1 first, so at each step
// every rank feeds a different peer; the copy engine pushes each finished chunk into slot r of
// its owner's symmetric buffer while the next GEMM runs, then raises the owner's flag
// landed[r] (a stream memory write over NVLink, after the copy). The own chunk goes last,
// straight into the own slot. The reduction waits (in its kernel, bounded by the group's timeout)
// until every peer's flag is up, then adds the ws slots in f32 in rank order 0..ws-1 and rounds
// once: deterministic, identical on every run, and on the CPU backend identical to GEMM followed
// by reduce-scatter. The copy stream carries only copy-engine work, and the flag stream beside
// it only stream memory writes, since a kernel queued there would wait for an SM until the
// running GEMM ends. A flag's write waits on the flag stream for an event recorded after its
// copy (OpContext::flags_behind): behind the copy on the copy stream it would hold the next copy
// until this one had drained. Every step of the protocols below that says "after the push" holds
// through that event; each op joins its flag streams into the compute stream before it ends (and,
// captured, before the next op's opening barrier and reset).
//
// When may a rank push again into an owner's slots, which the owner's reduction reads? As in the
// native all_gather_matmul (all_gather_matmul.cpp), two protocols:
//   - Eager: no barrier. Op number e (counted on every rank alike, from 1 for a fresh
//     allocation) pushes into buffer e % 2 and raises the landed flags (kEagerLandedChannel) to
//     e; the reduction waits until they hold e (or e+1); nobody resets them. Rank r writes p's
//     buffer e % 2 in op e; p last read it in its op e-2 reduction. r's op-e pushes follow r's op
//     e-1 reduction on its compute stream (each push waits for its chunk GEMM), which waited for
//     p's op e-1 flag, raised after p's op e-1 push, which followed p's op e-2 reduction. A flag is
//     at most one op ahead (e+1, after a push into the other buffer). (No opening barrier, which
//     would wait for the slowest rank to arrive: see docs/DECISIONS.md D1.) The native path takes
//     the same buffers by turns (same op count), with flags per piece on channels of its own; its
//     "reduction" is the own chunk's part of its GEMM (see run_native).
//   - Captured into a CUDA graph (no op number can be baked into a replay): buffer 2, 0/1 flags
//     (kLandedChannel; the native path's kNativeLandedChannel + piece) and an opening barrier,
//     past which every owner has finished reading its slots in every earlier op and has set the
//     flags back to 0; no flag of an earlier op can arrive after that reset, since every such
//     op's reduction waited for all of its flags (an empty one too: Backend::reduce_when_flagged
//     waits whatever the output's size; the native GEMM's own chunk has a tile in every piece). An
//     eager op after one of these writes a buffer they did not touch, after the barrier-protected
//     op's reduction on its own compute stream.
// Every other user of the shared workspace (the peer-bandwidth probe, the device barrier that
// aligns the ranks) writes only its own rank's region, or nothing, and no peer still pushes into
// it: an op's reduction (a native op's GEMM) waited for every push into this rank.
//
// Symmetric buffer of each rank, three times over: [slot 0 | slot 1 | ... | slot ws-1], slot s =
// rank s's partial of this rank's chunk, in the output dtype; its signal pad's flags
// [channel][s] = slot s has landed.
#include <fmt/ranges.h>

#include "device/nvtx.h"
#include "ops/call_memo.h"
#include "ops/collectives.h"
#include "ops/fused_matmul.h"
#include "ops/matmul_common.h"
#include "ops/matmul_reduce_scatter_paths.h"
#include "ops/operand_overlap.h"

namespace asynctp {

using detail::gemm_view;

namespace {

using namespace detail::mmrs;  // NOLINT(google-build-using-namespace)

Dims product_shape(const Tensor& a, int64_t n) {
  Dims shape = a.shape();
  shape[shape.size() - 1] = n;
  return shape;
}

void validate(OpContext& ctx, MmRsCall& c, int scatter_dim) {
  const char* op = c.op;
  ASYNCTP_CHECK(!c.as.empty(), "{}: needs at least one product", op);
  ASYNCTP_CHECK(c.as.size() == c.bs.size(), "{}: got {} As but {} Bs", op, c.as.size(),
                c.bs.size());
  const bool several = c.as.size() > 1;
  for (size_t i = 0; i < c.as.size(); ++i) {
    const Tensor& a = c.as[i];
    const Tensor& b = c.bs[i];
    const std::string a_name = several ? fmt::format("As[{}]", i) : "A";
    const std::string b_name = several ? fmt::format("Bs[{}]", i) : "B";
    detail::check_on_device(ctx, a, op, a_name);
    detail::check_on_device(ctx, b, op, b_name);
    ASYNCTP_CHECK(a.dim() >= 2, "{}: {} must have rank >= 2, got {}", op, a_name, a.describe());
    ASYNCTP_CHECK(b.dim() == 2, "{}: {} must be 2-D [K, N], got {}", op, b_name, b.describe());
    ASYNCTP_CHECK(b.size(0) == a.size(-1),
                  "{}: {} has {} rows but {}'s contraction dim (last) is {}", op, b_name, b.size(0),
                  a_name, a.size(-1));
    detail::check_gemm_dtype(a, op, a_name, c.scaled);
    detail::check_gemm_dtype(b, op, b_name, c.scaled);
    if (!c.scaled) {
      ASYNCTP_CHECK(a.dtype() == b.dtype(), "{}: {} is {} but {} is {}", op, a_name, a.dtype(),
                    b_name, b.dtype());
    }
    if (i > 0) {
      ASYNCTP_CHECK(product_shape(a, b.size(1)) == product_shape(c.a(), c.n()),
                    "{}: the product {} @ {} ({}) differs in shape from As[0] @ Bs[0] ({})", op,
                    a_name, b_name, product_shape(a, b.size(1)), product_shape(c.a(), c.n()));
      ASYNCTP_CHECK(a.dtype() == c.a().dtype(), "{}: {} is {} but As[0] is {}", op, a_name,
                    a.dtype(), c.a().dtype());
    }
  }
  ASYNCTP_CHECK(c.scaled || !c.fast_accum,
                "{}: fast_accum is for the scaled (float8) form, scaled_matmul_reduce_scatter", op);
  if (c.scaled) {
    detail::check_on_device(ctx, c.a_scale, op, "A_scale");
    detail::check_on_device(ctx, c.b_scale, op, "B_scale");
    detail::check_a_scale(c.a_scale, c.a(), op, "A_scale");
    detail::check_b_scale(c.b_scale, c.n(), op, "B_scale");
  }
  detail::check_on_device(ctx, c.out, op, "out");
  detail::check_out_dtype(c.out, op, "out");
  const Dims product = product_shape(c.a(), c.n());
  ASYNCTP_CHECK(scatter_dim >= -product.size() && scatter_dim < product.size(),
                "{}: scatter_dim {} is out of range for the product {} of rank {}", op, scatter_dim,
                product, product.size());
  c.g = scatter_dim < 0 ? scatter_dim + product.size() : scatter_dim;
  const int ws = ctx.world_size();
  ASYNCTP_CHECK(
      product[c.g] % ws == 0,
      "{}: scatter_dim {} of the product {} (size {}) is not divisible by the world size {}", op,
      c.g, product, product[c.g], ws);
  Dims chunk = product;
  chunk[c.g] /= ws;
  ASYNCTP_CHECK(c.out.shape() == chunk,
                "{}: out must have shape {} (the product {} scattered on dim "
                "{} over {} ranks), got {}",
                op, chunk, product, c.g, ws, c.out.describe());
}

// Contiguous versions of the As (chunk views need A's dims to nest): each A itself, or a copy in
// one shared scratch buffer.
int64_t strided_elems(std::span<const Tensor> as) {
  int64_t elems = 0;
  for (const Tensor& a : as)
    if (!a.is_contiguous()) elems += a.numel();
  return elems;
}

std::vector<Tensor> contiguous_as(OpContext& ctx, const std::vector<Tensor>& as) {
  const int64_t copy_elems = strided_elems(as);
  if (copy_elems == 0) return as;
  const Tensor buf = ctx.scratch(Scratch::kContiguousA, {copy_elems}, as[0].dtype());
  std::vector<Tensor> out;
  int64_t offset = 0;
  for (const Tensor& a : as) {
    if (a.is_contiguous()) {
      out.push_back(a);
      continue;
    }
    out.push_back(buf.narrow(0, offset, a.numel()).view(a.shape()));
    offset += a.numel();
    ctx.backend().copy(out.back(), a, ctx.stream());
  }
  return out;
}

// Computes sum_i as[i] @ bs[i] restricted to the part of the product at `select` into `dst`
// (contiguous, of that part's shape). One product goes straight into dst; several are added in
// an f32 accumulator in pair order and rounded once.
class ProductWriter {
 public:
  ProductWriter(OpContext& ctx, const MmRsCall& c, std::vector<Tensor> as, Tensor a_scale)
      : ctx_(ctx), c_(c), as_(std::move(as)), a_scale_(std::move(a_scale)) {}

  // Part of the product: all of it (d < 0), or chunk d of the scatter; on `stream` (default: the
  // compute stream). Several products share one accumulator: they must stay on one stream.
  bool single_product() const { return as_.size() == 1; }
  const Tensor& a0() const { return as_[0]; }
  const Tensor& a_scale() const { return a_scale_; }
  void write(int d, const Tensor& dst) { write(d, dst, ctx_.stream()); }
  void write(int d, const Tensor& dst, Stream& stream) {
    const int ws = ctx_.world_size();
    const bool whole = d < 0;
    const int split = whole || c_.last_dim() ? 0 : c_.g;
    const int64_t rows = c_.last_dim() ? 0 : c_.a().size(c_.g) / ws;
    const int64_t cols = c_.n() / ws;
    auto a_part = [&](const Tensor& a) {
      return whole || c_.last_dim() ? a : a.narrow(c_.g, d * rows, rows);
    };
    auto b_part = [&](const Tensor& b) {
      return !whole && c_.last_dim() ? b.narrow(1, d * cols, cols) : b;
    };
    Tensor sa = a_scale_;
    if (c_.rowwise()) sa = gemm_view(a_part(a_scale_), split, "A_scale");
    Tensor sb = c_.b_scale;
    if (c_.colwise() && !whole && c_.last_dim()) sb = c_.b_scale.narrow(1, d * cols, cols);
    Backend& be = ctx_.backend();
    if (as_.size() == 1) {
      be.gemm({.a = gemm_view(a_part(as_[0]), split, "A chunk"),
               .b = b_part(c_.bs[0]),
               .d = gemm_view(dst, split, "chunk"),
               .a_scale = sa,
               .b_scale = sb,
               .fast_accum = c_.scaled && c_.fast_accum},
              stream);
      return;
    }
    // Several products: unscaled (the scaled form takes one).
    const Tensor acc = ctx_.scratch(Scratch::kAccumulator, dst.shape(), DType::kF32);
    for (size_t i = 0; i < as_.size(); ++i) {
      be.gemm({.a = gemm_view(a_part(as_[i]), split, "A chunk"),
               .b = b_part(c_.bs[i]),
               .d = gemm_view(acc, split, "accumulator"),
               .accumulate = i > 0},
              stream);
    }
    ctx_.backend().copy(dst, acc, stream);
  }

 private:
  OpContext& ctx_;
  const MmRsCall& c_;
  std::vector<Tensor> as_;
  Tensor a_scale_;
};

void run_fallback(OpContext& ctx, const MmRsCall& c, ProductWriter& writer,
                  const MatmulReduceScatterOptions& options) {
  const Tensor product = ctx.scratch(Scratch::kPartial, product_shape(c.a(), c.n()), c.out.dtype());
  ctx.host_profile().stamp("scratch");
  writer.write(-1, product);
  ctx.host_profile().stamp("gemm");
  reduce_scatter(ctx, product, c.out, options.reduce_op, c.g);
  ctx.host_profile().stamp("scattered");
}

// The symmetric buffer both overlapped paths push into: this op's part of the shared workspace
// (detail::OpBuffer: the protocol of the file comment) holds, on every rank, ws slots of one
// output chunk each; slot s of rank d holds rank s's partial of d's chunk.

void run_split(OpContext& ctx, const MmRsCall& c, ProductWriter& writer,
               const MatmulReduceScatterOptions& options) {
  Backend& be = ctx.backend();
  Stream& compute = ctx.stream();
  Stream& copy = ctx.copy_stream();
  const int ws = ctx.world_size();
  const int rank = ctx.rank();
  const Dims chunk = c.out.shape();
  // The protocol (see the file comment): eager op number e in buffer e % 2, or buffer 2 behind
  // a barrier when captured.
  const Slots slots(ctx, c.out);
  SymmetricMemory& sm = slots.sm;
  const bool captured = slots.captured;
  const int landed_channel = captured ? kLandedChannel : kEagerLandedChannel;
  auto slot = [&](int owner, int src) { return slots.at(owner, src); };

  const Tensor staging = ctx.scratch(Scratch::kStaging, staging_shape(chunk, ws), c.out.dtype());
  auto landed_of = [&](int owner) { return sm.signal_pad_ptr(owner) + landed_channel * ws; };
  uint32_t* landed = landed_of(rank);
  ctx.mark("start", compute);
  if (captured) {
    // Every owner has finished reading its slots in every earlier op once all ranks are past
    // this barrier; only then may anyone push into them.
    sm.reset_and_barrier(landed, ws, kBarrierChannel, compute);
    ctx.mark("opened", compute);
  }
  // Chunk GEMMs alternate between the GEMM streams (one chunk's tail overlaps the next one's
  // start) unless several products share the accumulator.
  const bool two_streams = writer.single_product() && ctx.options().gemm_streams == 2;
  Stream& aux = ctx.gemm_stream(1);
  if (two_streams) {
    Event& start = ctx.event(ws + 1);
    start.record(compute);
    start.block(aux);
  }
  auto stream_of = [&](int i) -> Stream& { return two_streams ? ctx.gemm_stream(i) : compute; };
  for (int i = 1; i < ws; ++i) {
    const int dst = (rank + i) % ws;
    const Tensor part = staging.select(0, i - 1);
    Stream& stream = stream_of(i - 1);
    writer.write(dst, part, stream);
    if (ctx.tracing()) ctx.mark(fmt::format("gemm {}", dst), stream);
    Event& done = ctx.event(i);
    done.record(stream);
    done.block(copy);
    be.copy(slot(dst, rank), part, copy);  // copy engine, beside the next GEMM
    Stream& flags = ctx.flags_behind(0);   // behind the copy stream, which goes on at once
    be.write_flag(landed_of(dst) + rank, slots.number, flags);
    if (ctx.tracing()) ctx.mark(fmt::format("pushed to {}", dst), flags);
  }
  writer.write(rank, slot(rank, rank), stream_of(ws - 1));
  if (ctx.tracing()) ctx.mark(fmt::format("gemm {}", rank), stream_of(ws - 1));
  if (two_streams) {
    Event& aux_done = ctx.event(ws + 2);
    aux_done.record(aux);
    aux_done.block(compute);
  }
  ctx.mark("computed", compute);
  std::vector<Tensor> parts;
  for (int src = 0; src < ws; ++src)
    parts.push_back(slot(rank, src));
  Backend::FlagWait wait;
  wait.flags = landed;
  wait.value = slots.number;
  wait.count = ws;
  wait.skip = rank;
  wait.timeout = ctx.group().timeout();
  wait.rank = rank;
  wait.channel = landed_channel;
  be.reduce_when_flagged(c.out, parts, options.reduce_op, wait, compute);
  ctx.mark("reduced", compute);
  // This rank's own pushes (their staging is reused by the next op).
  Event& pushed = ctx.event(ws);
  pushed.record(copy);
  pushed.block(compute);
  ctx.join_flag_streams(compute);
  ctx.mark("end", compute);
}

// The dispatcher's key of a call: the product [M, K] @ [K, N] before the scatter (K summed over
// several products), and what else sets the paths' times.
std::string problem_key(OpContext& ctx, const MmRsCall& c, ReduceOp reduce_op) {
  int64_t k = 0;
  for (const Tensor& a : c.as)
    k += a.size(-1);
  const int64_t m = c.a().size(-1) == 0 ? 0 : c.a().numel() / c.a().size(-1);
  std::vector<std::string> variant;
  if (c.g != 0) variant.push_back(fmt::format("scatter dim {} of {}", c.g, c.a().dim()));
  if (c.as.size() > 1) variant.push_back(fmt::format("{} products", c.as.size()));
  if (c.rowwise()) variant.push_back("row-wise A scale");
  if (reduce_op == ReduceOp::kAvg) variant.push_back("avg");
  if (detail::off_16_bytes(c.as) || detail::off_16_bytes(c.bs) || detail::off_16_bytes(c.out) ||
      detail::off_16_bytes(c.a_scale) || detail::off_16_bytes(c.b_scale))
    variant.push_back("operands off 16-byte alignment");
  // Fast accumulation changes the GEMMs' times, so the paths' too; so does who may push the
  // native path's rows (auto: both routes measured, no variant).
  if (c.scaled && c.fast_accum) variant.push_back("fast accum");
  if (kernel_push_possible(ctx, c.n())) {
    if (ctx.options().kernel_push == KernelPush::kOn) variant.push_back("kernel push");
    if (ctx.options().kernel_push == KernelPush::kOff) variant.push_back("copy pushes");
  }
  return detail::problem_key(ctx, c.op, m, c.n(), k, c.a().dtype(), c.out.dtype(), c.bs[0],
                             fmt::format("{}", fmt::join(variant, ", ")));
}

// The call's NVTX range text: "matmul_reduce_scatter split: A bf16[4096, 3584] @ B [3584, 8192],
// scatter_dim 0, sum, ws 2" (several products: "As ... @ Bs ..."; scaled: ", row-wise scales" or
// ", tensor-wise scales").
std::string range_text(OpContext& ctx, const MmRsCall& c, ReduceOp reduce_op, Path path) {
  const bool several = c.as.size() > 1;
  return fmt::format("{} {}: {} {}{} @ {} {}, scatter_dim {}, {}{}, ws {}", c.op, path_name(path),
                     several ? "As" : "A", c.a().dtype(), detail::shapes_text(c.as),
                     several ? "Bs" : "B", detail::shapes_text(c.bs), c.g,
                     reduce_op_name(reduce_op), detail::scales_text(c.scaled, c.rowwise()),
                     ctx.world_size());
}

void run(OpContext& ctx, MmRsCall c, const MatmulReduceScatterOptions& options) {
  const HostProfile::Call profiled(ctx.host_profile());
  ctx.host_profile().stamp("run");
  const OpContext::StreamScope scope(ctx, options.stream);
  // Where the host's time goes before the first GPU work of the op (bench --trace).
  ctx.mark("call", ctx.stream());
  // A wait of an earlier op that timed out is reported here (see all_gather_matmul.cpp).
  ctx.backend().check_errors();
  ctx.forget_flag_streams();
  c.fast_accum = options.fast_accum;
  // The call's metadata: a call seen before skips the checks and the choice.
  detail::CallMemos& memos = ctx.call_memos();
  memos.start(c.op);
  memos.add(options.scatter_dim);
  memos.add(ctx.capturing());  // eager and captured calls may take different paths (dispatch.h)
  memos.add(options.fast_accum);
  memos.add(static_cast<int64_t>(options.reduce_op));
  memos.add(options.path ? static_cast<int64_t>(*options.path) : -1);
  memos.add(c.as);
  memos.add(c.bs);
  memos.add(c.a_scale);
  memos.add(c.b_scale);
  memos.add(c.out);
  const detail::CallMemo* memo = memos.find();
  ctx.host_profile().stamp("memo");
  if (memo != nullptr) {
    c.g = memo->dim;
  } else {
    validate(ctx, c, options.scatter_dim);
  }
  // On every call: the memos leave the data pointers out.
  detail::check_no_overlap(
      c.op,
      {c.as.size() > 1 ? detail::Operands("As", c.as) : detail::Operands("A", c.as[0]),
       c.bs.size() > 1 ? detail::Operands("Bs", c.bs) : detail::Operands("B", c.bs[0]),
       {"A_scale", c.a_scale},
       {"B_scale", c.b_scale}},
      {{"out", c.out}});
  std::vector<Tensor> as = contiguous_as(ctx, c.as);
  Tensor a_scale = c.a_scale;
  if (c.rowwise() && !a_scale.is_contiguous()) {
    a_scale = ctx.scratch(Scratch::kGatheredScale, c.a_scale.shape(), DType::kF32);
    ctx.backend().copy(a_scale, c.a_scale, ctx.stream());
  }
  ProductWriter writer(ctx, c, std::move(as), a_scale);
  ctx.host_profile().stamp("operands");
  const Tensor a0 = writer.a0();
  std::optional<NativeRsPlan> plan;
  auto run_path = [&](Route r) {
    const Path p = r.path;
    const nvtx::Range range(detail::path_color(p),
                            [&] { return range_text(ctx, c, options.reduce_op, p); });
    switch (p) {
      case Path::kNative:
        run_native(ctx, c, a0, writer.a_scale(), *plan, r.kernel_push, options);
        break;
      case Path::kSplit:
        run_split(ctx, c, writer, options);
        break;
      case Path::kFallback:
        run_fallback(ctx, c, writer, options);
        break;
    }
  };
  if (memo != nullptr) {
    if (memo->has_plan) plan = NativeRsPlan{memo->plan[0], memo->plan[1], memo->plan[2]};
    ctx.usage().record(c.op, memo->decision.path, memo->decision.reason, memo->decision.warns());
    ctx.host_profile().set_path(c.op, memo->decision.path);
    run_path({memo->decision.path, memo->decision.kernel_push});
    return;
  }
  const size_t symm_bytes = slots_symm_bytes(ctx.world_size(), chunk_bytes(c.out));
  detail::CallPaths paths;
  const NativeRsRoutes routes =
      native_rs_routes(ctx, c, a0, options.reduce_op, &paths.native_unsupported);
  plan = routes.plan;
  paths.native_copies = routes.copies;
  paths.native_kernel_pushes = routes.kernel_pushes;
  if (plan) paths.native_symm_bytes = symm_bytes;
  paths.key = problem_key(ctx, c, options.reduce_op);
  paths.run = run_path;
  const auto decision = detail::choose_path(ctx, options.path, symm_bytes, c.op, paths);
  ctx.usage().record(c.op, decision.path, decision.reason, decision.warns());
  // (Kept before the run: the key is the memos' one buffer.)
  if (decision.settled) {
    memos.remember({decision,
                    c.g,
                    plan.has_value(),
                    {plan ? plan->m : 0, plan ? plan->k : 0, plan ? plan->n : 0}});
  }
  ctx.host_profile().set_path(c.op, decision.path);
  ctx.host_profile().stamp("checks");
  run_path({decision.path, decision.kernel_push});
}

}  // namespace

Dims matmul_reduce_scatter_out_shape(const Tensor& a, const Tensor& b, int scatter_dim,
                                     int world_size) {
  Dims shape = product_shape(a, b.size(-1));
  const int g = scatter_dim < 0 ? scatter_dim + shape.size() : scatter_dim;
  ASYNCTP_CHECK(g >= 0 && g < shape.size(), "scatter_dim {} out of range for {}", scatter_dim,
                shape);
  ASYNCTP_CHECK(world_size > 0 && shape[g] % world_size == 0,
                "dim {} of the product {} is not divisible by the world size {}", g, shape,
                world_size);
  shape[g] /= world_size;
  return shape;
}

void matmul_reduce_scatter(OpContext& ctx, const Tensor& a, const Tensor& b, const Tensor& out,
                           const MatmulReduceScatterOptions& options) {
  run(ctx, MmRsCall{"matmul_reduce_scatter", {a}, {b}, Tensor(), Tensor(), out, 0, false}, options);
}

void matmul_reduce_scatter(OpContext& ctx, std::span<const Tensor> as, std::span<const Tensor> bs,
                           const Tensor& out, const MatmulReduceScatterOptions& options) {
  run(ctx,
      MmRsCall{"matmul_reduce_scatter",
               {as.begin(), as.end()},
               {bs.begin(), bs.end()},
               Tensor(),
               Tensor(),
               out,
               0,
               false},
      options);
}

void scaled_matmul_reduce_scatter(OpContext& ctx, const Tensor& a, const Tensor& a_scale,
                                  const Tensor& b, const Tensor& b_scale, const Tensor& out,
                                  const MatmulReduceScatterOptions& options) {
  run(ctx, MmRsCall{"scaled_matmul_reduce_scatter", {a}, {b}, a_scale, b_scale, out, 0, true},
      options);
}

void reserve_matmul_reduce_scatter(OpContext& ctx, std::span<const Tensor> as,
                                   std::span<const Tensor> bs,
                                   const MatmulReduceScatterOptions& options,
                                   std::optional<DType> out_dtype) {
  const char* op = "reserve_matmul_reduce_scatter";
  const OpContext::StreamScope scope(ctx, options.stream);
  ASYNCTP_CHECK(!as.empty() && as.size() == bs.size(),
                "{}: needs one or more products, one B per A; got {} As and {} Bs", op, as.size(),
                bs.size());
  for (size_t i = 0; i < as.size(); ++i) {
    ASYNCTP_CHECK(as[i].defined() && as[i].dim() >= 2, "{}: As[{}] must have rank >= 2, got {}", op,
                  i, as[i].describe());
    ASYNCTP_CHECK(bs[i].defined() && bs[i].dim() == 2 && bs[i].size(0) == as[i].size(-1),
                  "{}: Bs[{}] must be 2-D [{}, N], got {}", op, i, as[i].size(-1),
                  bs[i].describe());
  }
  const int ws = ctx.world_size();
  const Tensor& a = as[0];
  const int64_t n = bs[0].size(1);
  const Dims product = product_shape(a, n);
  const int rank = static_cast<int>(product.size());
  ASYNCTP_CHECK(options.scatter_dim >= -rank && options.scatter_dim < rank,
                "{}: scatter_dim {} is out of range for the product {}", op, options.scatter_dim,
                product);
  const int g = options.scatter_dim < 0 ? options.scatter_dim + rank : options.scatter_dim;
  ASYNCTP_CHECK(product[g] % ws == 0,
                "{}: dim {} of the product {} is not divisible by the world size {}", op, g,
                product, ws);
  Dims chunk = product;
  chunk[g] /= ws;
  const DType dtype = out_dtype.value_or(is_float8(a.dtype()) ? DType::kBF16 : a.dtype());
  const size_t esize = element_size(dtype);
  const size_t chunk_size = static_cast<size_t>(chunk.product()) * esize;
  const size_t symm_bytes = slots_symm_bytes(ws, chunk_size);
  const detail::PossiblePaths paths = detail::possible_paths(ctx, options.path, symm_bytes);
  // What every path does first: contiguous copies of strided As.
  if (const int64_t elems = strided_elems(as); elems > 0)
    ctx.reserve_scratch(Scratch::kContiguousA, elems * element_size(a.dtype()));
  // Several products add up in an f32 accumulator of what they write: a chunk (split), or all of
  // the product (fallback).
  if (as.size() > 1) {
    ctx.reserve_scratch(Scratch::kAccumulator,
                        (paths.fallback ? product : chunk).product() * sizeof(float));
  }
  if (paths.overlapped) {
    ctx.workspace().get(symm_bytes, ctx.stream());
    ctx.reserve_scratch(Scratch::kStaging, staging_shape(chunk, ws).product() * esize);
    // Shapes and strides only: the reservation covers the native path whatever the pointers of
    // the calls it is for.
    std::vector<Tensor> shaped_bs;
    for (const Tensor& b : bs)
      shaped_bs.push_back(detail::shape_only(b));
    MmRsCall call{op,
                  {as.begin(), as.end()},
                  {shaped_bs.begin(), shaped_bs.end()},
                  Tensor(),
                  Tensor(),
                  detail::shape_only_contiguous(dtype, chunk, a.device()),
                  g,
                  is_float8(a.dtype())};
    call.fast_accum = options.fast_accum;
    std::string why;
    const NativeRsRoutes routes =
        paths.native
            ? native_rs_routes(ctx, call,
                               detail::shape_only_contiguous(a.dtype(), a.shape(), a.device()),
                               options.reduce_op, &why)
            : NativeRsRoutes{};
    if (routes.plan) {
      // The GEMM's C holds the peers' products only where copy streams may push them (under
      // auto the choice is not made yet, and the tuning runs both).
      if (routes.copies) ctx.reserve_scratch(Scratch::kPartial, product.product() * esize);
      ctx.flags(native_done_flags(ws, detail::native_rs_pieces(n, chunk_size)));
    }
  }
  if (paths.fallback) {
    ctx.reserve_scratch(Scratch::kPartial, product.product() * esize);
    // Into an output that may be strided: its staging is one chunk.
    reserve_reduce_scatter(ctx, detail::shape_only_contiguous(dtype, product, a.device()),
                           /*out_contiguous=*/false, g);
  }
}

}  // namespace asynctp
