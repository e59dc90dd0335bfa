// matmul_reduce_scatter and scaled_matmul_reduce_scatter.
//
// Fused schedule on rank r of ws (P = A @ B, chunk d of P is what rank d keeps):
//
//   compute: barrier | GEMM chunk r+1 | GEMM chunk r+2 | ... | GEMM chunk r -> own slot | wait all | reduce
//   copy:                             | push r+1       | push r+2 ...         | push r-1 |
//
// Rank r computes the chunks in the order their owners need them, r+1 first, so at each step
// every rank feeds a different peer; each finished chunk is pushed by the copy engine into slot
// r of its owner's symmetric buffer (then put_signal), overlapping the next GEMM. The own chunk
// goes last, straight into the own slot. Once every peer has signalled, the owner adds the ws
// slots in f32 in rank order 0..ws-1 and rounds once: deterministic, identical on every run, and
// on the CPU backend identical to GEMM followed by reduce-scatter. The opening barrier makes sure
// every owner has finished reading its slots from the previous op before anyone pushes again.
//
// Symmetric buffer of each rank: [slot 0 | slot 1 | ... | slot ws-1], slot s = rank s's partial
// of this rank's chunk, in the output dtype.
#include "ops/collectives.h"
#include "ops/fused_matmul.h"
#include "ops/matmul_common.h"

namespace asynctp {

using detail::gemm_view;

namespace {

constexpr int kBarrierChannel = 0;
constexpr int kPushChannel = 1;  // "your chunk has landed in your buffer"

struct MmRsCall {
  const char* op;
  Tensor a;
  Tensor a_scale;  // undefined unless scaled
  Tensor b;
  Tensor b_scale;
  Tensor out;
  int g = 0;
  bool scaled = false;

  bool rowwise() const { return scaled && detail::is_rowwise_scale(a_scale, a); }
  bool colwise() const { return scaled && b_scale.numel() != 1; }
  bool last_dim() const { return g == a.dim() - 1; }
};

Dims product_shape(const Tensor& a, const Tensor& b) {
  Dims shape = a.shape();
  shape[shape.size() - 1] = b.size(-1);
  return shape;
}

void validate(Context& ctx, MmRsCall& c, int scatter_dim) {
  const char* op = c.op;
  detail::check_on_device(ctx, c.a, op, "A");
  detail::check_on_device(ctx, c.b, op, "B");
  detail::check_on_device(ctx, c.out, op, "out");
  ASYNCTP_CHECK(c.a.dim() >= 2, "{}: A must have rank >= 2, got {}", op, c.a.describe());
  ASYNCTP_CHECK(c.b.dim() == 2, "{}: B must be 2-D [K, N], got {}", op, c.b.describe());
  ASYNCTP_CHECK(c.b.size(0) == c.a.size(-1), "{}: B has {} rows but A's contraction dim (last) is {}",
                op, c.b.size(0), c.a.size(-1));
  detail::check_gemm_dtype(c.a, op, "A", c.scaled);
  detail::check_gemm_dtype(c.b, op, "B", c.scaled);
  if (!c.scaled) {
    ASYNCTP_CHECK(c.a.dtype() == c.b.dtype(), "{}: A is {} but B is {}", op, c.a.dtype(), c.b.dtype());
  } else {
    detail::check_on_device(ctx, c.a_scale, op, "A_scale");
    detail::check_on_device(ctx, c.b_scale, op, "B_scale");
    detail::check_a_scale(c.a_scale, c.a, op, "A_scale");
    detail::check_b_scale(c.b_scale, c.b.size(1), op, "B_scale");
  }
  detail::check_out_dtype(c.out, op, "out");
  const Dims product = product_shape(c.a, c.b);
  ASYNCTP_CHECK(scatter_dim >= -product.size() && scatter_dim < product.size(),
                "{}: scatter_dim {} is out of range for the product {} of rank {}", op, scatter_dim,
                product, product.size());
  c.g = scatter_dim < 0 ? scatter_dim + product.size() : scatter_dim;
  const int ws = ctx.world_size();
  ASYNCTP_CHECK(product[c.g] % ws == 0,
                "{}: scatter_dim {} of the product {} (size {}) is not divisible by the world size {}",
                op, c.g, product, product[c.g], ws);
  Dims chunk = product;
  chunk[c.g] /= ws;
  ASYNCTP_CHECK(c.out.shape() == chunk, "{}: out must have shape {} (the product {} scattered on dim "
                "{} over {} ranks), got {}", op, chunk, product, c.g, ws, c.out.describe());
}

void gemm(Context& ctx, Tensor a, Tensor b, Tensor d, Tensor a_scale, Tensor b_scale) {
  GemmArgs args;
  args.a = std::move(a);
  args.b = std::move(b);
  args.d = std::move(d);
  args.a_scale = std::move(a_scale);
  args.b_scale = std::move(b_scale);
  ctx.backend().gemm(args, ctx.stream());
}

// A contiguous version of t (t itself or a copy in scratch): chunk views need A's dims to nest.
Tensor contiguous(Context& ctx, const Tensor& t, Scratch purpose) {
  if (t.is_contiguous()) return t;
  Tensor copy = ctx.scratch(purpose, t.shape(), t.dtype());
  ctx.backend().copy(copy, t, ctx.stream());
  return copy;
}

void run_fallback(Context& ctx, const MmRsCall& c, const Tensor& a, const Tensor& a_scale,
                  const MatmulReduceScatterOptions& options) {
  const Tensor product = ctx.scratch(Scratch::kPartial, product_shape(c.a, c.b), c.out.dtype());
  gemm(ctx, gemm_view(a, 0, "A"), c.b, gemm_view(product, 0, "product"),
       c.rowwise() ? gemm_view(a_scale, 0, "A_scale") : a_scale, c.b_scale);
  reduce_scatter(ctx, c.out, product, options.reduce_op, c.g);
}

void run_fused(Context& ctx, const MmRsCall& c, const Tensor& a, const Tensor& a_scale,
               const MatmulReduceScatterOptions& options) {
  Backend& be = ctx.backend();
  Stream& compute = ctx.stream();
  Stream& copy = ctx.copy_stream();
  const int ws = ctx.world_size();
  const int rank = ctx.rank();
  const Dims chunk = c.out.shape();
  const size_t chunk_bytes = static_cast<size_t>(chunk.product()) * element_size(c.out.dtype());
  SymmetricMemory& sm = ctx.workspace().get(ws * chunk_bytes);
  auto slot = [&](int owner, int src) { return sm.buffer(owner, chunk, c.out.dtype(), src * chunk_bytes); };

  // Operands of chunk d: rows (dim g) of A, or columns of B when scattering on the last dim.
  const int split = c.last_dim() ? 0 : c.g;
  const int64_t rows = c.last_dim() ? 0 : chunk[c.g];
  const int64_t cols = c.b.size(1) / (c.last_dim() ? ws : 1);
  auto gemm_chunk = [&](int d, const Tensor& dst) {
    const Tensor a_d = c.last_dim() ? a : a.narrow(c.g, d * rows, rows);
    const Tensor b_d = c.last_dim() ? c.b.narrow(1, d * cols, cols) : c.b;
    Tensor sa = a_scale;
    if (c.rowwise()) sa = gemm_view(c.last_dim() ? a_scale : a_scale.narrow(c.g, d * rows, rows), split, "A_scale");
    Tensor sb = c.b_scale;
    if (c.colwise() && c.last_dim()) sb = c.b_scale.narrow(1, d * cols, cols);
    gemm(ctx, gemm_view(a_d, split, "A chunk"), b_d, gemm_view(dst, split, "chunk"), sa, sb);
  };

  sm.barrier(kBarrierChannel, compute);
  Dims staging_shape = chunk;
  staging_shape.insert(0, std::max(ws - 1, 1));
  const Tensor staging = ctx.scratch(Scratch::kStaging, staging_shape, c.out.dtype());
  for (int i = 1; i < ws; ++i) {
    const int dst = (rank + i) % ws;
    const Tensor part = staging.select(0, i - 1);
    gemm_chunk(dst, part);
    Event& done = ctx.event(i);
    done.record(compute);
    done.block(copy);
    be.copy(slot(dst, rank), part, copy);
    sm.put_signal(dst, kPushChannel, copy);
  }
  gemm_chunk(rank, slot(rank, rank));
  // Rank r-1 computes our chunk first, r-2 second, ...: wait in that order.
  for (int i = 1; i < ws; ++i) sm.wait_signal((rank - i + ws) % ws, kPushChannel, compute);
  std::vector<Tensor> parts;
  for (int src = 0; src < ws; ++src) parts.push_back(slot(rank, src));
  be.reduce(c.out, parts, options.reduce_op, compute);
  Event& pushed = ctx.event(ws);
  pushed.record(copy);
  pushed.block(compute);  // staging is free again once the op returns (in stream order)
}

void run(Context& ctx, MmRsCall c, const MatmulReduceScatterOptions& options) {
  validate(ctx, c, options.scatter_dim);
  const Tensor a = contiguous(ctx, c.a, Scratch::kContiguousA);
  const Tensor a_scale = c.rowwise() ? contiguous(ctx, c.a_scale, Scratch::kGatheredScale) : c.a_scale;
  const size_t symm_bytes = static_cast<size_t>(c.out.numel()) * ctx.world_size() * c.out.element_size();
  const auto decision = detail::choose_path(ctx, options.path, symm_bytes, c.op);
  ctx.usage().record(c.op, decision.path, decision.reason);
  if (decision.path == Path::kFused) {
    run_fused(ctx, c, a, a_scale, options);
  } else {
    run_fallback(ctx, c, a, a_scale, options);
  }
}

}  // namespace

Dims matmul_reduce_scatter_out_shape(const Tensor& a, const Tensor& b, int scatter_dim, int world_size) {
  Dims shape = product_shape(a, b);
  const int g = scatter_dim < 0 ? scatter_dim + shape.size() : scatter_dim;
  ASYNCTP_CHECK(g >= 0 && g < shape.size(), "scatter_dim {} out of range for {}", scatter_dim, shape);
  ASYNCTP_CHECK(world_size > 0 && shape[g] % world_size == 0,
                "dim {} of the product {} is not divisible by the world size {}", g, shape, world_size);
  shape[g] /= world_size;
  return shape;
}

void matmul_reduce_scatter(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& out,
                           const MatmulReduceScatterOptions& options) {
  run(ctx, MmRsCall{"matmul_reduce_scatter", a, Tensor(), b, Tensor(), out, 0, false}, options);
}

void scaled_matmul_reduce_scatter(Context& ctx, const Tensor& a, const Tensor& a_scale,
                                  const Tensor& b, const Tensor& b_scale, const Tensor& out,
                                  const MatmulReduceScatterOptions& options) {
  run(ctx, MmRsCall{"scaled_matmul_reduce_scatter", a, a_scale, b, b_scale, out, 0, true}, options);
}

}  // namespace asynctp
