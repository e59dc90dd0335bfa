// The native paths of all_gather_matmul and matmul_reduce_scatter on the CPU backend, whose
// native GEMM emulates the kernel's contract (device/cpu_native_gemm.h): the walk from the pivot,
// per-piece ready waits on the flags in symmetric memory, done counters, and the reduce-scatter
// epilogue. On every world size of a node (1 to 8), with the streams' jitter on (every seed listed
// for STREAMS):
//
//   all_gather_matmul:     A_shard [.., s@g, .., k] -AG(g)-> A [ws*s rows, k]; out_i = A @ B_i.
//                          The emulation accumulates as the CPU reference GEMM does: the result
//                          equals the unfused all-gather then GEMM bit for bit.
//   matmul_reduce_scatter: P_r = A_r @ B [ws*rows, n]; out = chunk r of the sum over ranks. The
//                          contract's sum: rank r's own product in f32, then every peer's
//                          partial (rounded to out's dtype, as pushed) in rank order, x 1/ws for
//                          avg, rounded once; computed here from the references and compared bit
//                          for bit.
#include "ops/op_testing.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;  // NOLINT(google-build-using-namespace)
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

struct NativeAgCase {
  Dims shard;
  int gather_dim = 0;
  std::vector<int64_t> ns{24};
  DType dtype = DType::kBF16;
  DType out_dtype = DType::kBF16;
  Layout b_layout = Layout::kContiguous;
  bool return_a = false;
  // A returned A 2 bytes off a 16-byte boundary: the GEMM cannot store it (TMA), so the op
  // copies it after the GEMM instead.
  bool a_out_misaligned = false;
  size_t piece_bytes = 0;  // push pieces (0: one per shard)
  // float8 (dtype e4m3, B column-major), fast accumulation: A_scale per row (else one value),
  // B_scales per column (else one value).
  bool rowwise = false;
  bool colwise = false;
  // A_shard's layout: padded rows are not read in place (copied into the own slot first).
  Layout a_layout = Layout::kContiguous;

  bool scaled() const { return is_float8(dtype); }
  std::string describe() const {
    return fmt::format(
        "A_shard {}{}, gather_dim {}, Ns [{}], B {}, out {}{}{}, pieces of {} bytes{}", dtype,
        shard, gather_dim, fmt::join(ns, ", "), layout_name(b_layout), out_dtype,
        return_a ? ", returning A" : "", a_out_misaligned ? " (misaligned)" : "", piece_bytes,
        scaled() ? fmt::format(", A_scale {}, B_scales {}", rowwise ? "row-wise" : "tensor-wise",
                               colwise ? "column-wise" : "tensor-wise")
                 : "");
  }
};

void check_ag(OpContext& ctx, const NativeAgCase& c, uint64_t id,
              PathChoice path = PathChoice::kNative) {
  SCOPED_TRACE(c.describe());
  Backend& be = ctx.backend();
  const int ws = ctx.world_size();
  std::vector<OwnedTensor> shards, scales;
  for (int r = 0; r < ws; ++r) {
    shards.push_back(seeded(c.shard, c.dtype, {id, 1, uint64_t(r)}, Values::kRandom, c.a_layout));
    if (c.scaled() && c.rowwise) {
      scales.push_back(
          seeded(with_dim(c.shard, -1, 1), DType::kF32, {id, 3, uint64_t(r)}, Values::kPositive));
    }
  }
  if (c.scaled() && !c.rowwise)
    scales.push_back(seeded({1}, DType::kF32, {id, 3}, Values::kPositive));
  const OwnedTensor a_full = concat(be, shards, c.gather_dim);
  const OwnedTensor scale_full = c.rowwise ? concat(be, scales, c.gather_dim) : OwnedTensor();
  const Tensor a_scale_full =
      c.rowwise ? scale_full.tensor : (c.scaled() ? scales[0].tensor : Tensor());
  std::vector<OwnedTensor> bs_owned, b_scales_owned, expected, outs_owned;
  std::vector<Tensor> bs, b_scales, outs;
  for (size_t i = 0; i < c.ns.size(); ++i) {
    bs_owned.push_back(
        seeded({c.shard.back(), c.ns[i]}, c.dtype, {id, 2, i}, Values::kRandom, c.b_layout));
    bs.push_back(bs_owned.back());
    if (c.scaled()) {
      b_scales_owned.push_back(seeded(c.colwise ? Dims{1, c.ns[i]} : Dims{1}, DType::kF32,
                                      {id, 4, i}, Values::kPositive));
      b_scales.push_back(b_scales_owned.back());
    }
    expected.push_back(
        empty_host(all_gather_matmul_out_shape(shards[0], bs[i], c.gather_dim, ws), c.out_dtype));
    reference_gemm(be, a_full, bs[i], expected.back(), a_scale_full,
                   c.scaled() ? b_scales[i] : Tensor());
    outs_owned.push_back(filled(expected.back()->shape(), c.out_dtype, kSentinel));
    outs.push_back(outs_owned.back());
  }
  OwnedTensor a_out_storage;
  Tensor a_out;
  if (c.return_a && c.a_out_misaligned) {
    a_out_storage = filled({a_full->numel() + 1}, c.dtype, kSentinel);
    a_out = a_out_storage->narrow(0, 1, a_full->numel()).view(a_full->shape());
  } else if (c.return_a) {
    a_out_storage = filled(a_full->shape(), c.dtype, kSentinel);
    a_out = a_out_storage;
  }
  AllGatherMatmulOptions options;
  options.gather_dim = c.gather_dim;
  options.path = path;
  options.push_piece_bytes = c.piece_bytes;
  const char* op = c.scaled() ? "all_gather_scaled_matmul" : "all_gather_matmul";
  if (c.scaled()) {
    options.fast_accum = {true};
    all_gather_scaled_matmul(ctx, shards[ctx.rank()], scales[c.rowwise ? ctx.rank() : 0], bs,
                             b_scales, outs, a_out, options);
  } else {
    all_gather_matmul(ctx, shards[ctx.rank()], bs, outs, a_out, options);
  }
  ctx.stream().synchronize();
  expect_path(ctx, op, path == PathChoice::kSplit ? Path::kSplit : Path::kNative);
  for (size_t i = 0; i < outs.size(); ++i)
    EXPECT_TRUE(same_bits(outs[i], expected[i])) << "outs[" << i << "]";
  if (c.return_a) {
    EXPECT_TRUE(same_bits(a_out, a_full)) << "A_out";
  }
}

struct NativeRsCase {
  Dims a_shape;  // the product's rows split evenly into ws chunks of a multiple of 128 rows
  int scatter_dim = 0;
  int64_t n = 24;
  DType dtype = DType::kBF16;
  ReduceOp op = ReduceOp::kSum;
  Layout b_layout = Layout::kContiguous;
  // float8 (dtype e4m3, B column-major, out bf16), fast accumulation: A_scale per row (else one
  // value), B_scale per column (else one value).
  bool rowwise = false;
  bool colwise = false;

  bool scaled() const { return is_float8(dtype); }
  DType out_dtype() const { return scaled() ? DType::kBF16 : dtype; }
  std::string describe() const {
    return fmt::format(
        "A {}{}, scatter_dim {}, N {}, B {}, {}{}", dtype, a_shape, scatter_dim, n,
        layout_name(b_layout), reduce_op_name(op),
        scaled() ? fmt::format(", A_scale {}, B_scale {}", rowwise ? "row-wise" : "tensor-wise",
                               colwise ? "column-wise" : "tensor-wise")
                 : "");
  }
};

void check_rs(OpContext& ctx, const NativeRsCase& c, uint64_t id) {
  SCOPED_TRACE(c.describe());
  Backend& be = ctx.backend();
  const int ws = ctx.world_size(), rank = ctx.rank();
  const int64_t k = c.a_shape.back();
  std::vector<OwnedTensor> as, bs, a_scales, b_scales;
  OwnedTensor own_f32;               // P_rank in f32
  std::vector<OwnedTensor> rounded;  // P_r in out's dtype
  for (int r = 0; r < ws; ++r) {
    as.push_back(seeded(c.a_shape, c.dtype, {id, 1, uint64_t(r)}));
    bs.push_back(seeded({k, c.n}, c.dtype, {id, 2, uint64_t(r)}, Values::kRandom, c.b_layout));
    if (c.scaled()) {
      a_scales.push_back(seeded(c.rowwise ? with_dim(c.a_shape, -1, 1) : Dims{1}, DType::kF32,
                                {id, 3, uint64_t(r)}, Values::kPositive));
      b_scales.push_back(seeded(c.colwise ? Dims{1, c.n} : Dims{1}, DType::kF32,
                                {id, 4, uint64_t(r)}, Values::kPositive));
    }
    const Tensor sa = c.scaled() ? a_scales[r].tensor : Tensor();
    const Tensor sb = c.scaled() ? b_scales[r].tensor : Tensor();
    const Dims product = with_dim(c.a_shape, -1, c.n);
    rounded.push_back(empty_host(product, c.out_dtype()));
    reference_gemm(be, as[r], bs[r], rounded.back(), sa, sb);
    if (r == rank) {
      own_f32 = empty_host(product, DType::kF32);
      reference_gemm(be, as[r], bs[r], own_f32, sa, sb);
    }
  }
  const Dims out_shape = matmul_reduce_scatter_out_shape(as[0], bs[0], c.scatter_dim, ws);
  OwnedTensor expected = empty_host(out_shape, c.out_dtype());
  const Tensor own_chunk = chunk_of(own_f32, c.scatter_dim, ws, rank);
  const float inv = 1.0f / static_cast<float>(ws);
  for (int64_t i = 0; i < expected->numel(); ++i) {
    float x = get(own_chunk, i);
    for (int s = 0; s < ws; ++s)
      if (s != rank) x += get(chunk_of(rounded[s], c.scatter_dim, ws, rank), i);
    if (c.op == ReduceOp::kAvg) x *= inv;
    set(expected, i, x);
  }
  OwnedTensor out = empty_host(out_shape, c.out_dtype());
  fill_value(out, kSentinel);
  MatmulReduceScatterOptions options;
  options.reduce_op = c.op;
  options.scatter_dim = c.scatter_dim;
  options.path = PathChoice::kNative;
  if (c.scaled()) {
    options.fast_accum = true;
    scaled_matmul_reduce_scatter(ctx, as[rank], a_scales[rank], bs[rank], b_scales[rank], out,
                                 options);
  } else {
    matmul_reduce_scatter(ctx, as[rank], bs[rank], out, options);
  }
  ctx.stream().synchronize();
  expect_path(ctx, c.scaled() ? "scaled_matmul_reduce_scatter" : "matmul_reduce_scatter",
              Path::kNative);
  EXPECT_TRUE(same_bits(out, expected));
}

class NativePathsTest : public ::testing::TestWithParam<int> {};

TEST_P(NativePathsTest, AllGatherMatmulMatchesUnfusedBitForBit) {
  std::vector<NativeAgCase> cases;
  auto add = [&](NativeAgCase c) { cases.push_back(std::move(c)); };
  // Shards on the 128-row tile grid (the own chunk read in place), off it (tiles straddling
  // chunks, the own edge rows copied and flagged), 3-D on dim 0 and on dim 1 after a batch dim of
  // size 1, several Bs, a column-major B, both 16-bit dtypes and every output dtype.
  add({.shard = {128, 32}, .ns = {24, 8}, .out_dtype = DType::kF32});
  add({.shard = {40, 16}, .dtype = DType::kF16, .out_dtype = DType::kF16, .return_a = true});
  add({.shard = {2, 24, 32}, .ns = {16}, .b_layout = Layout::kTransposed});
  add({.shard = {1, 72, 16},
       .gather_dim = 1,
       .ns = {8, 16},
       .out_dtype = DType::kF32,
       .return_a = true});
  // 300 rows in pieces of 128 rows: the tiles of a chunk wait for the pieces they overlap.
  add({.shard = {300, 16}, .ns = {8}, .return_a = true, .piece_bytes = 128 * 16 * 2});
  // A returned A that the GEMM cannot store, copied after it: off the tile grid and on it.
  add({.shard = {40, 16}, .return_a = true, .a_out_misaligned = true});
  add({.shard = {128, 32}, .ns = {24, 8}, .return_a = true, .a_out_misaligned = true});
  auto statuses = run_ranks(GetParam(), [&](OpContext& ctx) {
    for (size_t i = 0; i < cases.size(); ++i)
      check_ag(ctx, cases[i], 100 + i);
  });
  EXPECT_RANKS_OK(statuses);
}

// float8 e4m3 with fast accumulation (B column-major, as the kernel reads it): every scale
// combination, the row-wise scales pushed with the shards (in pieces too) and the own chunk's
// read in place, on and off the tile grid, a returned A, every output dtype. The emulation
// scales (acc * sa) * sb as the CPU reference does: the same bits.
TEST_P(NativePathsTest, Float8AllGatherMatmulMatchesUnfusedBitForBit) {
  std::vector<NativeAgCase> cases;
  const DType outs[] = {DType::kBF16, DType::kF32, DType::kF16};
  int i = 0;
  for (bool rowwise : {false, true}) {
    for (bool colwise : {false, true}) {
      cases.push_back({.shard = i % 2 == 0 ? Dims{128, 32} : Dims{40, 48},
                       .ns = i == 3 ? std::vector<int64_t>{24, 16} : std::vector<int64_t>{24},
                       .dtype = DType::kF8E4M3,
                       .out_dtype = outs[i % 3],
                       .b_layout = Layout::kTransposed,
                       .return_a = i == 1,
                       .rowwise = rowwise,
                       .colwise = colwise});
      ++i;
    }
  }
  cases.push_back({.shard = {1, 300, 16},
                   .gather_dim = 1,
                   .ns = {8},
                   .dtype = DType::kF8E4M3,
                   .b_layout = Layout::kTransposed,
                   .piece_bytes = 128 * 16,
                   .rowwise = true,
                   .colwise = true});
  // A padded shard: copied into the own slot with its row-wise scales, read from there.
  cases.push_back({.shard = {40, 32},
                   .dtype = DType::kF8E4M3,
                   .b_layout = Layout::kTransposed,
                   .rowwise = true,
                   .a_layout = Layout::kPadded});
  auto statuses = run_ranks(GetParam(), [&](OpContext& ctx) {
    for (size_t j = 0; j < cases.size(); ++j)
      check_ag(ctx, cases[j], 400 + j);
  });
  EXPECT_RANKS_OK(statuses);
}

TEST_P(NativePathsTest, MatmulReduceScatterFollowsTheContractBitForBit) {
  const int ws = GetParam();
  std::vector<NativeRsCase> cases;
  auto add = [&](NativeRsCase c) { cases.push_back(std::move(c)); };
  add({.a_shape = {128 * ws, 32}});
  add({.a_shape = {128 * ws, 16},
       .n = 40,
       .dtype = DType::kF16,
       .op = ReduceOp::kAvg,
       .b_layout = Layout::kTransposed});
  add({.a_shape = {ws, 256, 16}, .n = 264, .op = ReduceOp::kAvg});
  add({.a_shape = {1, 128 * ws, 8}, .scatter_dim = 1, .n = 16, .dtype = DType::kF16});
  // float8 e4m3 with fast accumulation: the scales apply to the own product before the peers'
  // (scaled, rounded) partials are added. Chunks of 128 and 384 rows run on single CTAs, chunks
  // of 256 and 512 on pairs (kernels::pairs_can_sum), over two column tiles there.
  for (bool rowwise : {false, true}) {
    for (bool colwise : {false, true}) {
      add({.a_shape = {128 * ws, 48},
           .n = colwise ? 40 : 24,
           .dtype = DType::kF8E4M3,
           .op = rowwise && colwise ? ReduceOp::kAvg : ReduceOp::kSum,
           .b_layout = Layout::kTransposed,
           .rowwise = rowwise,
           .colwise = colwise});
    }
  }
  for (int64_t rows : {256, 384, 512}) {
    add({.a_shape = {rows * ws, 32},
         .n = rows == 384 ? 40 : 264,
         .dtype = DType::kF8E4M3,
         .op = rows == 512 ? ReduceOp::kAvg : ReduceOp::kSum,
         .b_layout = Layout::kTransposed,
         .rowwise = rows != 384,
         .colwise = rows == 256});
  }
  // Pushed by the GEMM (ContextOptions::kernel_push), by copy streams (the default), and by the
  // GEMM on odd ranks only: both raise the same flags into the same slots, so ranks may differ.
  // From 5 ranks on, by the GEMM only (the copy streams' schedule is the other tests' default;
  // three passes at ws 7 and 8 outlast ctest's limit under AddressSanitizer).
  std::vector<std::string_view> modes{"the GEMM"};
  if (ws <= 4) modes.insert(modes.end(), {"copy streams", "the GEMM on odd ranks"});
  for (const std::string_view pushes : modes) {
    SCOPED_TRACE(fmt::format("pushed by {}", pushes));
    const HarnessOptions options;
    auto statuses = run_processes(
        ws,
        [&](const RendezvousInfo& info) {
          ContextOptions context = options.context;
          context.kernel_push =
              pushes == "the GEMM" || (pushes != "copy streams" && info.rank % 2 == 1)
                  ? KernelPush::kOn
                  : KernelPush::kOff;
          auto ctx = OpContext::create(Group::create(info, rank_group_options(options, info.rank)),
                                       context);
          for (size_t i = 0; i < cases.size(); ++i)
            check_rs(*ctx, cases[i], 200 + i);
        },
        options);
    EXPECT_RANKS_OK(statuses);
  }
}

// `t`'s values in a copy 2 bytes off a 16-byte boundary (a view one element into its storage).
struct Misaligned {
  OwnedTensor storage;
  Tensor view;
};
Misaligned misaligned_copy(OpContext& ctx, const Tensor& t) {
  Misaligned m{empty_host({t.numel() + 1}, t.dtype()), Tensor()};
  m.view = m.storage->narrow(0, 1, t.numel()).view(t.shape());
  ctx.backend().copy(m.view, t, ctx.stream());
  ctx.stream().synchronize();
  return m;
}

// The native kernel loads A and B by TMA (16-byte aligned) and stores C 8-byte and the reduced
// output 4-byte aligned; a B, an A or an output off that alignment, with the shapes and strides
// of a call that ran native, takes the split path under auto, with the same result as split on
// the aligned operands, and the aligned call after it native again. Asked for, native says why,
// naming the offset.
TEST_P(NativePathsTest, OperandsOffTheKernelsAlignmentTakeSplitAndSayWhyWhenNativeIsAskedFor) {
  auto statuses = run_ranks(GetParam(), [](OpContext& ctx) {
    const int ws = ctx.world_size(), rank = ctx.rank();
    const OwnedTensor shard = seeded({128, 32}, DType::kBF16, {600, uint64_t(rank)});
    const OwnedTensor b = seeded({32, 24}, DType::kBF16, {601});
    const Misaligned b_off = misaligned_copy(ctx, b);
    OwnedTensor expected = empty_host({128 * ws, 24}, DType::kBF16);
    OwnedTensor out = empty_host({128 * ws, 24}, DType::kBF16);
    auto gather = [&](const Tensor& bt, const Tensor& into, PathChoice path) {
      AllGatherMatmulOptions options;
      options.path = path;
      const Tensor bs[] = {bt}, outs[] = {into};
      all_gather_matmul(ctx, shard, bs, outs, {}, options);
      ctx.stream().synchronize();
    };
    gather(b, expected, PathChoice::kAuto);
    expect_path(ctx, "all_gather_matmul", Path::kNative);
    gather(b_off.view, out, PathChoice::kAuto);
    expect_path(ctx, "all_gather_matmul", Path::kSplit);
    EXPECT_TRUE(same_bits(out, expected));
    const Misaligned out_off = misaligned_copy(ctx, out);  // C must be 8-byte aligned
    gather(b, out_off.view, PathChoice::kAuto);
    expect_path(ctx, "all_gather_matmul", Path::kSplit);
    EXPECT_TRUE(same_bits(out_off.view, expected));
    gather(b, out, PathChoice::kAuto);
    expect_path(ctx, "all_gather_matmul", Path::kNative);
    EXPECT_THAT([&] { gather(b_off.view, out, PathChoice::kNative); },
                ThrowsMessage<PathUnavailableError>(HasSubstr("b % 16 = 2")));

    const OwnedTensor a = seeded({128 * ws, 32}, DType::kBF16, {602, uint64_t(rank)});
    const Misaligned a_off = misaligned_copy(ctx, a);
    OwnedTensor rs_expected = empty_host({128, 24}, DType::kBF16);
    OwnedTensor rs_out = empty_host({128, 24}, DType::kBF16);
    auto scatter = [&](const Tensor& at, const Tensor& into, PathChoice path) {
      MatmulReduceScatterOptions options;
      options.path = path;
      matmul_reduce_scatter(ctx, at, b, into, options);
      ctx.stream().synchronize();
    };
    scatter(a, rs_out, PathChoice::kAuto);
    expect_path(ctx, "matmul_reduce_scatter", Path::kNative);
    // (The native sum rounds the peers' partials first: compared with the split path's.)
    scatter(a, rs_expected, PathChoice::kSplit);
    scatter(a_off.view, rs_out, PathChoice::kAuto);
    expect_path(ctx, "matmul_reduce_scatter", Path::kSplit);
    EXPECT_TRUE(same_bits(rs_out, rs_expected));
    const Misaligned rs_out_off = misaligned_copy(ctx, rs_out);  // the sum's 4-byte alignment
    scatter(a, rs_out_off.view, PathChoice::kAuto);
    expect_path(ctx, "matmul_reduce_scatter", Path::kSplit);
    EXPECT_TRUE(same_bits(rs_out_off.view, rs_expected));
    scatter(a, rs_out, PathChoice::kAuto);
    expect_path(ctx, "matmul_reduce_scatter", Path::kNative);
    EXPECT_THAT([&] { scatter(a_off.view, rs_out, PathChoice::kNative); },
                ThrowsMessage<PathUnavailableError>(HasSubstr("a % 16 = 2")));
  });
  EXPECT_RANKS_OK(statuses);
}

// float8 on the native path needs fast accumulation and a contiguous row-wise A_scale: asked for
// without them, both ops say why; under auto they run split.
TEST_P(NativePathsTest, Float8WithoutFastAccumulationOrWithAStridedScaleSaysWhy) {
  auto statuses = run_ranks(GetParam(), [](OpContext& ctx) {
    const int ws = ctx.world_size();
    const OwnedTensor a = seeded({64, 32}, DType::kF8E4M3, {500, uint64_t(ctx.rank())});
    const OwnedTensor sa = seeded({64, 1}, DType::kF32, {501}, Values::kPositive);
    const OwnedTensor padded_sa =
        seeded({64, 1}, DType::kF32, {501}, Values::kPositive, Layout::kPadded);
    const OwnedTensor b =
        seeded({32, 16}, DType::kF8E4M3, {502}, Values::kRandom, Layout::kTransposed);
    const OwnedTensor sb = seeded({1}, DType::kF32, {503}, Values::kPositive);
    const Tensor bs[] = {b}, b_scales[] = {sb};
    OwnedTensor out = empty_host({64 * ws, 16}, DType::kBF16);
    const Tensor outs[] = {out};
    auto gather = [&](const Tensor& a_scale, bool fast, PathChoice path) {
      AllGatherMatmulOptions options;
      options.path = path;
      if (fast) options.fast_accum = {true};
      all_gather_scaled_matmul(ctx, a, a_scale, bs, b_scales, outs, {}, options);
    };
    EXPECT_THAT([&] { gather(sa, false, PathChoice::kNative); },
                ThrowsMessage<PathUnavailableError>(
                    ::testing::HasSubstr("float8 without fast accumulation")));
    EXPECT_THAT(
        [&] { gather(padded_sa, true, PathChoice::kNative); },
        ThrowsMessage<PathUnavailableError>(::testing::HasSubstr("a strided row-wise A_scale")));
    gather(sa, false, PathChoice::kAuto);
    expect_path(ctx, "all_gather_scaled_matmul", Path::kSplit);
    gather(sa, true, PathChoice::kAuto);
    expect_path(ctx, "all_gather_scaled_matmul", Path::kNative);

    const OwnedTensor a2 = seeded({128 * ws, 32}, DType::kF8E4M3, {504, uint64_t(ctx.rank())});
    const OwnedTensor sa2 = seeded({1}, DType::kF32, {505}, Values::kPositive);
    OwnedTensor out2 = empty_host({128, 16}, DType::kBF16);
    EXPECT_THAT(
        [&] {
          scaled_matmul_reduce_scatter(ctx, a2, sa2, b, sb, out2, {.path = PathChoice::kNative});
        },
        ThrowsMessage<PathUnavailableError>(
            ::testing::HasSubstr("float8 without fast accumulation")));
  });
  EXPECT_RANKS_OK(statuses);
}

// Under auto the CPU backend, which does not time paths, takes the native path where it can run
// (ops/dispatch.h), back to back with the split path on the same buffers.
TEST_P(NativePathsTest, AutoTakesTheNativePathBesideTheSplitOne) {
  auto statuses = run_ranks(GetParam(), [](OpContext& ctx) {
    const int ws = ctx.world_size();
    for (int i = 0; i < 3; ++i) {
      const PathChoice path = i == 1 ? PathChoice::kSplit : PathChoice::kAuto;
      check_ag(ctx, {.shard = {64, 16}, .ns = {8}}, 300 + i, path);
      const OwnedTensor a = seeded({128 * ws, 16}, DType::kBF16, {310, uint64_t(ctx.rank())});
      const OwnedTensor b = seeded({16, 8}, DType::kBF16, {311});
      OwnedTensor out = empty_host({128, 8}, DType::kBF16);
      matmul_reduce_scatter(ctx, a, b, out, {.path = path});
      ctx.stream().synchronize();
      expect_path(ctx, "matmul_reduce_scatter", i == 1 ? Path::kSplit : Path::kNative);
    }
    EXPECT_EQ(ctx.usage().count("all_gather_matmul", Path::kNative), 2);
  });
  EXPECT_RANKS_OK(statuses);
}

// Every world size of one node, 1 to 8 (the other ops' tests take kWorldSizes): the native
// schedules' walk from the pivot, the pushes to r-1, r-2, ... and the reduce-scatter's rank order
// differ with each, and their shapes are small (0.1 to 0.6 s a world size in a Release build).
constexpr int kNodeWorldSizes[] = {1, 2, 3, 4, 5, 6, 7, 8};

INSTANTIATE_TEST_SUITE_P(WorldSizes, NativePathsTest, ::testing::ValuesIn(kNodeWorldSizes),
                         world_size_name);

}  // namespace
}  // namespace asynctp
