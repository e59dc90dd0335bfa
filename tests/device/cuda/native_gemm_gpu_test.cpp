// The native async-input GEMM on one GPU (label gpu): against the obviously-correct reference
// kernel and cuBLASLt over odd shapes, both B layouts and every output dtype; chunks that land
// one by one while the kernel runs (ready flags set by the copy stream); a chunk that never lands
// (timeout error naming it); per-chunk completion counters that a copy stream waits on; the
// reduce-scatter epilogue of the own chunk (and its timeout); float8 with its scales. And the
// CUDA partial-sum reduction against the CPU backend's bits. Skips, saying why, without a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "core/deadline.h"
#include "device/backend.h"
#include "device/cuda/cuda_backend.h"
#include "device/cuda/cuda_graph.h"
#include "device/cuda/one_gpu.h"
#include "device/native_params.h"
#include "kernels/kernels.h"
#include "kernels/native/schedule.h"
#include "ops/cuda/gpu_testing.h"
#include "support/tensor_testing.h"

namespace asynctp::testing {
namespace {

struct Shape {
  int64_t m, n, k;
};

class NativeGemmTest : public ::testing::TestWithParam<std::tuple<Shape, DType, bool>> {};

TEST_P(NativeGemmTest, MatchesReferenceAndCublasLt) {
  SKIP_UNLESS_GPUS(1);
  const auto [shape, in_dtype, k_major] = GetParam();
  Gpu gpu;
  const uint64_t seed = seed_of({static_cast<uint64_t>(shape.m), static_cast<uint64_t>(shape.n),
                                 static_cast<uint64_t>(shape.k), static_cast<uint64_t>(k_major)});
  OwnedTensor a = gpu.upload({shape.m, shape.k}, in_dtype, seed);
  OwnedTensor b = gpu.upload_b(shape.k, shape.n, k_major, in_dtype, seed + 1);
  OwnedTensor expected = gpu.download(reference_product(gpu, a, b));
  for (DType out : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(fmt::format("{}x{}x{} {} B {} out {}", shape.m, shape.n, shape.k, in_dtype,
                             k_major ? "column-major" : "row-major", out));
    OwnedTensor d = gpu.empty({shape.m, shape.n}, out);
    gpu.be().fill(d, std::nanf(""), gpu.stream());
    ChunkedGemmArgs args;
    args.a = a;
    args.b = b;
    args.d = d;
    ASSERT_EQ(gpu.be().native_gemm_unsupported(args), "");
    gpu.be().native_gemm(args, gpu.stream());
    OwnedTensor got = gpu.download(d);
    // Both accumulate in f32 (in different orders): f32 results agree to rounding noise, 16-bit
    // results to one rounding of the output.
    EXPECT_LT(rel_diff(got, expected), out == DType::kF32 ? 1e-5 : 4e-3);
    if (out != DType::kF32 && out != in_dtype) continue;  // cuBLASLt has no bf16 -> f16 (or back)
    OwnedTensor lt = gpu.empty({shape.m, shape.n}, out);
    GemmArgs g;
    g.a = a;
    g.b = b;
    g.d = lt;
    gpu.be().gemm(g, gpu.stream());
    EXPECT_LT(rel_diff(got, gpu.download(lt)), out == DType::kF32 ? 1e-5 : 4e-3);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, NativeGemmTest,
    ::testing::Combine(::testing::Values(Shape{128, 256, 64}, Shape{1, 8, 8}, Shape{200, 312, 72},
                                         Shape{1000, 1000, 1000}, Shape{333, 520, 4104},
                                         Shape{2048, 768, 512}),
                       ::testing::Values(DType::kBF16, DType::kF16), ::testing::Bool()));

// The three epilogue / cluster variants compute every tile in the same order: same bits.
TEST(NativeGemm, RegisterStoreMatchesTmaStore) {
  SKIP_UNLESS_GPUS(1);
  Gpu gpu;
  OwnedTensor a = gpu.upload({300, 264}, DType::kBF16, 7);
  OwnedTensor b = gpu.upload({264, 520}, DType::kBF16, 8);
  OwnedTensor d1 = gpu.empty({300, 520}, DType::kBF16);
  OwnedTensor d2 = gpu.empty({300, 520}, DType::kBF16);
  kernels::NativeGemmParams k;
  k.a = a->data();
  k.lda = 264;
  k.b = b->data();
  k.ldb = 520;
  k.c = d1->data();
  k.ldc = 520;
  k.m = 300;
  k.n = 520;
  k.k = 264;
  const auto stream = static_cast<cudaStream_t>(gpu.stream().native_handle());
  ASSERT_EQ(kernels::async_gemm(k, stream), cudaSuccess);
  k.c = d2->data();
  k.force_register_store = true;
  ASSERT_EQ(kernels::async_gemm(k, stream), cudaSuccess);
  EXPECT_TRUE(same_bits(gpu.download(d1), gpu.download(d2))) << "register store";
  k.force_register_store = false;
  k.cluster = 2;  // CTA pairs sharing B through TMA multicast
  gpu.be().fill(d2, std::nanf(""), gpu.stream());
  ASSERT_EQ(kernels::async_gemm(k, stream), cudaSuccess);
  EXPECT_TRUE(same_bits(gpu.download(d1), gpu.download(d2))) << "clusters of two";
}

// The copy of A (a_out): every row of A as the kernel loaded it, bit for bit, by every kernel
// variant (TMA or register stores of C, f32 C, clusters of two, the tail split, the SwiGLU
// epilogue), the own chunk's rows from own_a (a's rows there are NaN, which the copy must not
// show); C is the same with and without the copy. Shapes off the tile grid in M and K.
TEST(NativeGemm, StoresACopyOfEveryRowOfAItLoads) {
  SKIP_UNLESS_GPUS(1);
  Gpu gpu;
  const auto stream = static_cast<cudaStream_t>(gpu.stream().native_handle());
  struct Variant {
    const char* name;
    DType out = DType::kBF16;
    int tail_split = 1;  // 0: the kernel's choice (it splits the first two shapes' last wave)
    bool registers = false;
    int cluster = 0;
    bool swiglu = false;
  };
  const Variant variants[] = {
      {.name = "TMA store"},
      {.name = "f32 C", .out = DType::kF32, .tail_split = 0},
      {.name = "tail split", .tail_split = 0},
      {.name = "register store", .registers = true},
      {.name = "clusters of two", .cluster = 2},
      {.name = "SwiGLU", .swiglu = true},
      {.name = "SwiGLU, register store", .registers = true, .swiglu = true}};
  for (const auto& [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {300, 520, 1000}, {1024, 1024, 2048}, {1000, 768, 136}}) {
    constexpr int64_t kChunkRows = 256;  // chunk 1 is the own one: rows [256, min(512, m))
    const int64_t own_rows = std::min<int64_t>(kChunkRows, m - kChunkRows);
    OwnedTensor real = gpu.upload({m, k}, DType::kBF16, 41);
    OwnedTensor a = gpu.upload({m, k}, DType::kBF16, 41);
    gpu.be().fill(a->narrow(0, kChunkRows, own_rows), std::nanf(""), gpu.stream());
    OwnedTensor own = gpu.empty({own_rows, k}, DType::kBF16);
    gpu.be().copy(own, real->narrow(0, kChunkRows, own_rows), gpu.stream());
    OwnedTensor b = gpu.upload({k, 2 * n}, DType::kBF16, 42);
    const OwnedTensor expected_a = gpu.download(real);
    for (const Variant& v : variants) {
      SCOPED_TRACE(fmt::format("{}x{}x{} {}", m, n, k, v.name));
      OwnedTensor d = gpu.empty({m, n}, v.out), plain = gpu.empty({m, n}, v.out);
      OwnedTensor copy = gpu.empty({m, k}, DType::kBF16);
      ChunkedGemmArgs args;
      args.a = a;
      args.b = v.swiglu ? b.tensor : b->narrow(1, 0, n);
      args.d = plain;
      args.chunk_rows = kChunkRows;
      args.own_a = own;
      args.own_chunk = 1;
      args.first_chunk = 1;
      args.swiglu = v.swiglu;
      args.tail_split = v.tail_split;
      auto run = [&] {
        if (!v.registers && v.cluster == 0) return gpu.be().native_gemm(args, gpu.stream());
        kernels::NativeGemmParams kp;
        ASSERT_EQ(to_native_params(args, &kp), "");
        kp.force_register_store = v.registers;
        kp.cluster = v.cluster;
        ASSERT_EQ(kernels::async_gemm(kp, stream), cudaSuccess);
      };
      run();
      args.d = d;
      args.a_out = copy;
      ASSERT_EQ(gpu.be().native_gemm_unsupported(args), "");
      run();
      EXPECT_TRUE(same_bits(gpu.download(copy), expected_a)) << "the copy of A";
      EXPECT_TRUE(same_bits(gpu.download(d), gpu.download(plain))) << "C";
    }
  }
}

TEST(NativeGemm, RejectsWhatTmaCannotAddress) {
  SKIP_UNLESS_GPUS(1);
  Gpu gpu;
  OwnedTensor a = gpu.upload({64, 104}, DType::kBF16, 1);
  OwnedTensor b = gpu.upload({104, 64}, DType::kBF16, 2);
  OwnedTensor d = gpu.empty({64, 64}, DType::kBF16);
  ChunkedGemmArgs args;
  args.a = a;
  args.b = b;
  args.d = d;
  EXPECT_EQ(gpu.be().native_gemm_unsupported(args), "");
  OwnedTensor wide = gpu.empty({64, 112}, DType::kBF16);
  args.a_out = wide->narrow(1, 1, 104);  // 2 bytes off a 16-byte boundary
  EXPECT_THAT(gpu.be().native_gemm_unsupported(args), ::testing::HasSubstr("the copy of A"));
  args.a_out = Tensor();
  args.a = a->narrow(1, 0, 99);  // row stride 104 (208 bytes): fine, K = 99 is a tail
  args.b = b->narrow(0, 0, 99);
  EXPECT_EQ(gpu.be().native_gemm_unsupported(args), "");
  OwnedTensor odd = gpu.upload({64, 99}, DType::kBF16, 3);  // row stride 198 bytes
  args.a = odd;
  EXPECT_THAT(gpu.be().native_gemm_unsupported(args), ::testing::HasSubstr("multiple of 16 bytes"));
  OwnedTensor f32 = gpu.upload({64, 99}, DType::kF32, 3);
  args.a = f32;
  EXPECT_THAT(gpu.be().native_gemm_unsupported(args), ::testing::HasSubstr("b is"));
  EXPECT_THROW(gpu.be().native_gemm(args, gpu.stream()), Error);
}

// Synchronizes and expects the TimeoutError of a device wait, its message holding each of `parts`.
void expect_timeout_on_sync(Gpu& gpu, std::initializer_list<std::string> parts) {
  try {
    gpu.be().synchronize();
    FAIL() << "expected a TimeoutError";
  } catch (const TimeoutError& e) {
    for (const std::string& part : parts)
      EXPECT_THAT(e.what(), ::testing::HasSubstr(part));
  }
}

// What the chunk-landing tests share: A [m, 512] (src) lands chunk by chunk into `gathered`
// (NaN until it does) while the GEMM by B [512, n] into the f32 D waits on `flag_count` ready
// flags, zeroed.
struct Landing {
  Landing(Gpu& gpu, int64_t m, int64_t n, int flag_count, uint64_t seed)
      : src(gpu.upload({m, 512}, DType::kBF16, seed)),
        b(gpu.upload({512, n}, DType::kBF16, seed + 1)),
        gathered(gpu.empty({m, 512}, DType::kBF16)),
        d(gpu.empty({m, n}, DType::kF32)),
        flags(gpu.be().allocate(flag_count * sizeof(uint32_t))),
        ready(static_cast<uint32_t*>(flags.data())) {
    gpu.be().fill(gathered, std::nanf(""), gpu.stream());
    gpu.be().zero_flags(ready, flag_count, gpu.stream());
    gpu.be().synchronize();
    args.a = gathered;
    args.b = b;
    args.d = d;
    args.ready = ready;
    args.timeout = default_timeout();  // meant to succeed: ASYNCTP_TIMEOUT bounds it
  }
  OwnedTensor src, b, gathered, d;
  Buffer flags;
  uint32_t* ready;
  ChunkedGemmArgs args;
};

// The AG+MM pattern: the kernel starts with no chunk present; the copy stream lands chunk after
// chunk (from first_chunk on) and raises its ready flag; the result equals the GEMM of the whole.
//
// With own_a (the AG+MM own shard read in place), the first chunk's whole tiles come from own_a;
// on the tile grid it is never copied nor flagged, and off it (chunk_rows 250, 50) a tile over
// its edge waits for the copy that lands its edge rows (native_gemm_own_edge_rows), only those.
TEST(NativeGemm, ConsumesChunksAsTheyLand) {
  SKIP_UNLESS_GPUS(1);
  for (const auto& [m, chunk_rows, first, use_own] :
       std::vector<std::tuple<int64_t, int64_t, int, bool>>{{1024, 256, 2, false},
                                                            {1000, 250, 1, false},
                                                            {4096, 1024, 3, false},
                                                            {1024, 256, 2, true},
                                                            {1000, 250, 1, true},
                                                            {1000, 250, 3, true},
                                                            {1000, 50, 3, true}}) {
    SCOPED_TRACE(
        fmt::format("m {} chunk_rows {} first {} own_a {}", m, chunk_rows, first, use_own));
    Gpu gpu;
    auto copy_stream = gpu.be().create_stream("test copy");
    const int chunks = static_cast<int>((m + chunk_rows - 1) / chunk_rows);
    Landing t(gpu, m, 768, chunks, 11);
    const OwnedTensor& src = t.src;
    ChunkedGemmArgs& args = t.args;
    uint32_t* ready = t.ready;
    args.chunk_rows = chunk_rows;
    args.first_chunk = first;
    const int64_t first_rows = std::min(chunk_rows, m - first * chunk_rows);
    OwnedTensor own = gpu.empty({first_rows, 512}, DType::kBF16);
    // The chunks land by copies within the GPU, which are kernels: one SM is left to them
    // (a GEMM holding every SM would hold them back until its timeout).
    args.reserve_sms = 1;
    if (use_own) {
      gpu.be().copy(own, src->narrow(0, first * chunk_rows, first_rows), gpu.stream());
      args.own_a = own;
      args.own_chunk = first;
    }
    // Whole tiles of the own chunk never look at the gathered buffer; only the tiles over its
    // edges (off the 128-row tile grid) read its first head and last tail rows there. Row by
    // row, the own rows that some tile not wholly inside the chunk covers:
    const Backend::OwnEdgeRows edges = gpu.be().native_gemm_own_edge_rows(args);
    std::vector<bool> from_a(first_rows, false);
    for (int64_t m0 = 0; use_own && m0 < m; m0 += 128) {
      const int64_t own_first = first * chunk_rows;
      if (m0 >= own_first && m0 + 128 <= own_first + chunk_rows) continue;
      for (int64_t r = std::max(m0, own_first); r < std::min(m0 + 128, own_first + first_rows); ++r)
        from_a[r - own_first] = true;
    }
    for (int64_t r = 0; r < first_rows; ++r) {
      EXPECT_EQ(from_a[r], r < edges.head || r >= first_rows - edges.tail) << "own row " << r;
    }
    gpu.be().native_gemm(args, gpu.stream());  // enqueued first: it waits for the copies below
    for (int i = 0; i < chunks; ++i) {
      const int c = (first + i) % chunks;
      const int64_t rows = std::min(chunk_rows, m - c * chunk_rows);
      if (use_own && c == first) {
        // Only the edge rows: the rest of the chunk stays NaN in the gathered buffer.
        if (!edges.any()) continue;
        for (const auto& [begin, count] :
             {std::pair{int64_t{0}, edges.head}, std::pair{rows - edges.tail, edges.tail}}) {
          if (count == 0) continue;
          gpu.be().copy(t.gathered->narrow(0, c * chunk_rows + begin, count),
                        src->narrow(0, c * chunk_rows + begin, count), *copy_stream);
        }
      } else {
        gpu.be().copy(t.gathered->narrow(0, c * chunk_rows, rows),
                      src->narrow(0, c * chunk_rows, rows), *copy_stream);
      }
      gpu.be().write_flag(ready + c, 1, *copy_stream);
    }
    OwnedTensor got = gpu.download(t.d);
    EXPECT_LT(rel_diff(got, gpu.download(reference_product(gpu, src, t.b))), 1e-5);
  }
}

// Chunks that land in pieces (ready_rows < chunk_rows, the AG+MM's pushes of big shards): each
// tile waits only for the pieces its rows overlap. Pieces off the 128-row tile grid and a short
// last piece; within each chunk the pieces land last to first (a tile over two pieces must wait
// for both); a flag array with room to spare (ready_stride above the chunk count). Then a piece
// that never lands: the timeout names its chunk and piece.
TEST(NativeGemm, ConsumesChunksLandingInPieces) {
  SKIP_UNLESS_GPUS(1);
  for (const auto& [m, chunk_rows, ready_rows, first] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int>>{
           {1000, 250, 96, 1}, {4096, 1024, 256, 3}, {1024, 512, 512, 0}}) {
    SCOPED_TRACE(fmt::format("m {} chunk_rows {} ready_rows {}", m, chunk_rows, ready_rows));
    Gpu gpu;
    auto copy_stream = gpu.be().create_stream("test copy");
    const int chunks = static_cast<int>((m + chunk_rows - 1) / chunk_rows);
    const int pieces = static_cast<int>((chunk_rows + ready_rows - 1) / ready_rows);
    const int stride = chunks + 3;
    Landing t(gpu, m, 640, pieces * stride, 21);
    ChunkedGemmArgs& args = t.args;
    uint32_t* ready = t.ready;
    args.chunk_rows = chunk_rows;
    args.first_chunk = first;
    args.ready_rows = ready_rows;
    args.ready_stride = stride;
    args.reserve_sms = 1;                      // for the copies (kernels within one GPU)
    gpu.be().native_gemm(args, gpu.stream());  // enqueued first: it waits for the copies below
    auto land = [&](int c, int j) {
      const int64_t begin = c * chunk_rows + j * ready_rows;
      const int64_t end = std::min({m, (c + 1) * chunk_rows, begin + ready_rows});
      gpu.be().copy(t.gathered->narrow(0, begin, end - begin), t.src->narrow(0, begin, end - begin),
                    *copy_stream);
      gpu.be().write_flag(ready + j * stride + c, 1, *copy_stream);
    };
    for (int i = 0; i < chunks; ++i) {
      for (int j = pieces - 1; j >= 0; --j)
        land((first + i) % chunks, j);
    }
    OwnedTensor got = gpu.download(t.d);
    EXPECT_LT(rel_diff(got, gpu.download(reference_product(gpu, t.src, t.b))), 1e-5);

    // Every flag up but one piece of chunk (first + 1): the timeout names chunk and piece.
    if (pieces > 1) {
      const int c = (first + 1) % chunks;
      gpu.be().zero_flags(ready + (pieces - 1) * stride + c, 1, gpu.stream());
      args.timeout = std::chrono::milliseconds(200);
      args.rank = 3;
      gpu.be().native_gemm(args, gpu.stream());
      expect_timeout_on_sync(gpu, {fmt::format("chunk {} of A (piece {})", c, pieces - 1)});
    }
  }
}

// Flags that count ops up instead of going 0 -> 1 (the eager native all_gather_matmul's): a
// flag is raised once it has reached ready_value, wrapping through 2^32. A flag one op behind
// holds its tile back until the timeout, which names the chunk; one op ahead lets it through.
TEST(NativeGemm, OpNumberedFlagsWrapAround) {
  SKIP_UNLESS_GPUS(1);
  for (const uint32_t number : {uint32_t{7}, uint32_t{0xFFFFFFFF}, uint32_t{0}}) {
    SCOPED_TRACE(fmt::format("op number {}", number));
    Gpu gpu;
    auto copy_stream = gpu.be().create_stream("test copy");
    Landing t(gpu, 512, 384, 4, 31);
    ChunkedGemmArgs& args = t.args;
    args.chunk_rows = 128;
    args.first_chunk = 1;
    args.ready_value = number;
    // Before the op: every flag at the previous op's number (0xFFFFFFFF before 0).
    for (int c = 0; c < 4; ++c)
      gpu.be().write_flag(t.ready + c, number - 1, gpu.stream());
    gpu.be().native_gemm(args, gpu.stream());  // waits for the copies below
    for (int i = 0; i < 4; ++i) {
      const int c = (1 + i) % 4;
      gpu.be().copy(t.gathered->narrow(0, c * 128, 128), t.src->narrow(0, c * 128, 128),
                    *copy_stream);
      // Chunk 3's peer is one op ahead already.
      gpu.be().write_flag(t.ready + c, c == 3 ? number + 1 : number, *copy_stream);
    }
    OwnedTensor got = gpu.download(t.d);
    EXPECT_LT(rel_diff(got, gpu.download(reference_product(gpu, t.src, t.b))), 1e-5);

    // The next op's number with chunk 2 still at this one: it times out naming chunk 2.
    gpu.be().write_flag(t.ready + 0, number + 1, gpu.stream());
    gpu.be().write_flag(t.ready + 1, number + 1, gpu.stream());
    args.ready_value = number + 1;
    args.timeout = std::chrono::milliseconds(200);
    gpu.be().native_gemm(args, gpu.stream());
    expect_timeout_on_sync(gpu, {"chunk 2"});
  }
}

// Rejected piece layouts: more rows per piece than per chunk, flags that would overlap.
TEST(NativeGemm, RejectsBadPieceLayouts) {
  SKIP_UNLESS_GPUS(1);
  Gpu gpu;
  OwnedTensor a = gpu.upload({512, 256}, DType::kBF16, 1);
  OwnedTensor b = gpu.upload({256, 256}, DType::kBF16, 2);
  OwnedTensor d = gpu.empty({512, 256}, DType::kBF16);
  ChunkedGemmArgs args;
  args.a = a;
  args.b = b;
  args.d = d;
  args.chunk_rows = 128;
  args.ready = reinterpret_cast<const uint32_t*>(uintptr_t{1} << 20);
  args.ready_rows = 256;
  EXPECT_THAT(gpu.be().native_gemm_unsupported(args), ::testing::HasSubstr("ready_rows"));
  args.ready_rows = 64;
  args.ready_stride = 3;  // 4 chunks
  EXPECT_THAT(gpu.be().native_gemm_unsupported(args), ::testing::HasSubstr("ready_stride"));
  args.ready_stride = 4;
  EXPECT_EQ(gpu.be().native_gemm_unsupported(args), "");
}

TEST(NativeGemm, ChunkThatNeverLandsTimesOutNamingIt) {
  SKIP_UNLESS_GPUS(1);
  Gpu gpu;
  OwnedTensor a = gpu.upload({512, 256}, DType::kBF16, 1);
  OwnedTensor b = gpu.upload({256, 256}, DType::kBF16, 2);
  OwnedTensor d = gpu.empty({512, 256}, DType::kBF16);
  Buffer flags = gpu.be().allocate(4 * sizeof(uint32_t));
  auto* ready = static_cast<uint32_t*>(flags.data());
  gpu.be().zero_flags(ready, 4, gpu.stream());
  for (int c : {0, 2, 3})
    gpu.be().write_flag(ready + c, 1, gpu.stream());
  ChunkedGemmArgs args;
  args.a = a;
  args.b = b;
  args.d = d;
  args.chunk_rows = 128;
  args.ready = ready;
  args.timeout = std::chrono::milliseconds(200);
  args.rank = 5;
  gpu.be().native_gemm(args, gpu.stream());
  expect_timeout_on_sync(gpu, {"rank 5", "chunk 1"});
  // The context stays usable: the same GEMM with every chunk ready succeeds.
  gpu.be().write_flag(ready + 1, 1, gpu.stream());
  gpu.be().native_gemm(args, gpu.stream());
  EXPECT_NO_THROW(gpu.be().synchronize());
}

// The MM+RS pattern: the kernel counts finished rows per chunk; a copy stream waits for each
// chunk's count and copies it out while later chunks are still being computed.
// The tail split: tiles of a mostly idle last wave cut into K-ranges whose f32 partials the last
// range adds in a fixed order. Same result as the unsplit GEMM to f32 rounding, the same bits
// on every run, and every output dtype; the parts chosen follow the rule in kernels.h. Shapes:
// fewer tiles than SMs (every part on its own CTA, 4 parts) and a last wave 45% full (2 parts).
// The backend's workspace is per stream: on another stream the same bits, and captured into a
// CUDA graph on a stream never used outside capture too.
TEST(NativeGemm, TailSplitMatchesUnsplitAndRepeatsBitForBit) {
  SKIP_UNLESS_GPUS(1);
  Gpu gpu;
  for (const auto& [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1024, 1024, 2048}, {300, 520, 1000}, {2048, 3072, 512}}) {
    OwnedTensor a = gpu.upload({m, k}, DType::kBF16, 31);
    OwnedTensor b = gpu.upload({k, n}, DType::kBF16, 32);
    for (DType out : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(fmt::format("{}x{}x{} out {}", m, n, k, out));
      auto run = [&](int tail_split, Stream* stream = nullptr) {
        OwnedTensor d = gpu.empty({m, n}, out);
        gpu.be().fill(d, std::nanf(""), gpu.stream());
        ChunkedGemmArgs args;
        args.a = a;
        args.b = b;
        args.d = d;
        args.tail_split = tail_split;
        if (stream != nullptr) {
          gpu.be().synchronize();
          gpu.be().native_gemm(args, *stream);
          stream->synchronize();
        } else {
          gpu.be().native_gemm(args, gpu.stream());
        }
        return gpu.download(d);
      };
      const OwnedTensor whole = run(1);
      const OwnedTensor split = run(0);
      // f32 sums of the same products in another order: rounding noise of f32, and not nothing
      // (the split did run: some of a million f32 sums come out in other bits).
      EXPECT_LT(rel_diff(split, whole), out == DType::kF32 ? 1e-5 : 4e-3);
      if (out == DType::kF32) {
        EXPECT_FALSE(same_bits(split, whole)) << "the tail split did not run";
      }
      EXPECT_TRUE(same_bits(split, run(0))) << "two runs differ";
      {
        auto other = gpu.be().create_stream("test other");  // its own workspace, freed with it
        EXPECT_TRUE(same_bits(split, run(0, other.get()))) << "another stream differs";
      }
      {
        // Captured on a stream that never ran a native GEMM outside capture, as
        // torch.cuda.graph's own capture stream: the replays split the tail too (the backend's
        // captured workspace), the same bits as eager, replay after replay.
        auto fresh = gpu.be().create_stream("test capture");
        OwnedTensor d = gpu.empty({m, n}, out);
        ChunkedGemmArgs args;
        args.a = a;
        args.b = b;
        args.d = d;
        gpu.be().synchronize();
        cuda::Graph graph;
        graph.begin_capture(*fresh);
        gpu.be().native_gemm(args, *fresh);
        graph.end_capture();
        for (int replay = 0; replay < 2; ++replay) {
          gpu.be().fill(d, std::nanf(""), *fresh);
          graph.replay(*fresh);
          fresh->synchronize();
          EXPECT_TRUE(same_bits(split, gpu.download(d))) << "replay " << replay << " differs";
        }
      }
      EXPECT_LT(rel_diff(run(2), whole), out == DType::kF32 ? 1e-5 : 4e-3);
    }
    // The rule: as many parts as the idle CTAs of the last wave take, 4 k-blocks deep at least,
    // 4 at most.
    kernels::NativeGemmParams kargs;
    kargs.m = m;
    kargs.n = n;
    kargs.k = k;
    kargs.c_dtype = DType::kBF16;
    kargs.split_workspace = reinterpret_cast<void*>(uintptr_t{1} << 20);
    int sms = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    const int64_t tiles = ((m + 127) / 128) * ((n + 255) / 256);
    const int64_t tail = tiles % sms;
    int64_t expected = tail == 0 ? 1 : std::min<int64_t>({sms / tail, (k + 63) / 64 / 4, 4});
    if (expected < 2) expected = 1;
    EXPECT_EQ(kernels::async_gemm_tail_split(kargs), expected);
    kargs.tail_split = 1;
    EXPECT_EQ(kernels::async_gemm_tail_split(kargs), 1);
  }
}

// Each done counter's count once its rows are stored, by counter (native_gemm_done_order gives
// them in walk order).
std::vector<uint32_t> done_counts(Backend& be, const ChunkedGemmArgs& args) {
  std::vector<uint32_t> counts;
  for (const auto& [index, count] : be.native_gemm_done_order(args)) {
    if (static_cast<size_t>(index) >= counts.size()) counts.resize(index + 1);
    counts[index] = count;
  }
  return counts;
}

TEST(NativeGemm, PublishesFinishedChunks) {
  SKIP_UNLESS_GPUS(1);
  for (DType out : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(fmt::format("out {}", out));
    Gpu gpu;
    auto copy_stream = gpu.be().create_stream("test copy");
    const int64_t m = 1024, chunk_rows = 256;
    const int chunks = 4, first = 1;
    // K deep enough for the tail split (24 tiles leave the last wave mostly idle): only the last
    // part of a split tile stores and counts it.
    OwnedTensor a = gpu.upload({m, 1024}, DType::kBF16, 21);
    OwnedTensor b = gpu.upload({1024, 520}, DType::kBF16, 22);
    OwnedTensor d = gpu.empty({m, 520}, out);
    OwnedTensor copied = gpu.empty({m, 520}, out);
    gpu.be().fill(copied, std::nanf(""), gpu.stream());
    Buffer flags = gpu.be().allocate(chunks * sizeof(uint32_t));
    auto* done = static_cast<uint32_t*>(flags.data());
    gpu.be().zero_flags(done, chunks, gpu.stream());
    gpu.be().synchronize();
    ChunkedGemmArgs args;
    args.a = a;
    args.b = b;
    args.d = d;
    args.chunk_rows = chunk_rows;
    args.first_chunk = first;
    args.done = done;
    gpu.be().native_gemm(args, gpu.stream());
    const std::vector<uint32_t> counts = done_counts(gpu.be(), args);
    ASSERT_EQ(counts.size(), static_cast<size_t>(chunks));
    for (int i = 0; i < chunks; ++i) {
      const int c = (first + i) % chunks;
      gpu.be().wait_flag(done + c, counts[c], {.peer = c, .channel = 0}, *copy_stream);
      gpu.be().copy(copied->narrow(0, c * chunk_rows, chunk_rows),
                    d->narrow(0, c * chunk_rows, chunk_rows), *copy_stream);
    }
    copy_stream->synchronize();
    EXPECT_TRUE(same_bits(gpu.download(copied), gpu.download(d)));
    std::vector<uint32_t> host(chunks);
    ASSERT_EQ(cudaMemcpy(host.data(), done, chunks * sizeof(uint32_t), cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (int c = 0; c < chunks; ++c)
      EXPECT_EQ(host[c], counts[c]) << "chunk " << c;
  }
}

// The reduce-scatter epilogue (the native matmul_reduce_scatter): chunk 2 of 4 is the own chunk,
// last in the walk; its tiles wait for the peers' parts (flags per piece, raised to op number 7
// beforehand), add them in rank order to the f32 product and store the reduced rows into `out`;
// they neither touch D nor count in done, while the other chunks' pieces are counted in full.
// Pieces of 128 rows, or of 256 columns (3: 256, 256, 8); column tail (n 520), the tail split
// (24 tiles), bf16 sum and f16 mean, the reduced rows stored by TMA and (an output whose row
// stride the TMA cannot take) from registers; on single CTAs and, with counted pieces by columns
// (whole 256-row chunks and pieces), on CTA pairs.
TEST(NativeGemm, ReducesTheOwnChunkWithThePeersParts) {
  SKIP_UNLESS_GPUS(1);
  for (const auto& [dt, op, padded, by_cols, pairs] :
       {std::tuple{DType::kBF16, ReduceOp::kSum, false, false, false},
        std::tuple{DType::kF16, ReduceOp::kAvg, false, false, false},
        std::tuple{DType::kBF16, ReduceOp::kAvg, true, false, false},
        std::tuple{DType::kBF16, ReduceOp::kSum, false, true, false},
        std::tuple{DType::kBF16, ReduceOp::kSum, false, true, true},
        std::tuple{DType::kF16, ReduceOp::kAvg, true, true, true}}) {
    SCOPED_TRACE(fmt::format("out {} {}{}, pieces by {}{}", dt, reduce_op_name(op),
                             padded ? " padded output" : "", by_cols ? "columns" : "rows",
                             pairs ? ", CTA pairs" : ""));
    Gpu gpu;
    const int64_t rows = 256, n = 520, k = 1024;
    const int chunks = 4, own = 2, pieces = by_cols ? 3 : 2;
    OwnedTensor a = gpu.upload({chunks * rows, k}, DType::kBF16, 31);
    OwnedTensor b = gpu.upload({k, n}, DType::kBF16, 32);
    OwnedTensor d = gpu.empty({chunks * rows, n}, dt);
    gpu.be().fill(d, std::nanf(""), gpu.stream());
    OwnedTensor parts = gpu.upload({chunks, rows, n}, dt, 33);
    // Padded: row stride n + 2 (not a multiple of 16 bytes), so stored from registers.
    OwnedTensor out_buf = gpu.empty({rows, padded ? n + 2 : n}, dt);
    const Tensor out = out_buf->narrow(1, 0, n);
    Buffer flag_buf = gpu.be().allocate((pieces * chunks + chunks * pieces) * sizeof(uint32_t));
    auto* landed = static_cast<uint32_t*>(flag_buf.data());
    uint32_t* done = landed + pieces * chunks;
    gpu.be().zero_flags(landed, 2 * pieces * chunks, gpu.stream());
    for (int q = 0; q < pieces; ++q) {
      for (int s = 0; s < chunks; ++s) {
        if (s != own) gpu.be().write_flag(landed + q * chunks + s, 7, gpu.stream());
      }
    }
    ChunkedGemmArgs args;
    args.a = a;
    args.b = b;
    args.d = d;
    args.chunk_rows = rows;
    args.first_chunk = own + 1;
    args.done = done;
    args.done_rows = by_cols ? 0 : rows / pieces;
    args.done_cols = by_cols ? 256 : 0;
    args.sum_chunk = own;
    args.sum_parts = parts;
    args.sum_out = out;
    args.sum_self = own;
    args.sum_avg = op == ReduceOp::kAvg;
    args.sum_flags = landed;
    args.sum_value = 7;
    // The second pair case waits on the parts by 128-row pieces: a pair's two CTAs on different
    // flags (the flags of 3 pieces are up; these take 2).
    const bool sum_by_rows = !by_cols || (pairs && padded);
    args.sum_rows = sum_by_rows ? rows / 2 : 0;
    args.sum_cols = sum_by_rows ? 0 : 256;
    args.sum_flag_stride = chunks;
    if (pairs) {
      kernels::NativeGemmParams kp;
      ASSERT_EQ(to_native_params(args, &kp), "");
      kp.cluster = 2;
      ASSERT_TRUE(kernels::uses_cluster(kp));
      ASSERT_EQ(kernels::async_gemm(kp, static_cast<cudaStream_t>(gpu.stream().native_handle())),
                cudaSuccess);
    } else {
      gpu.be().native_gemm(args, gpu.stream());
    }

    const OwnedTensor ref = gpu.download(reference_product(gpu, a->narrow(0, own * rows, rows), b));
    const OwnedTensor host_parts = gpu.download(parts);
    OwnedTensor want = empty_host({rows, n}, DType::kF32);
    for (int64_t i = 0; i < rows * n; ++i) {
      float x = get(ref, i);
      for (int s = 0; s < chunks; ++s) {
        if (s != own) x += get(host_parts, s * rows * n + i);
      }
      set(want, i, op == ReduceOp::kAvg ? x / chunks : x);
    }
    EXPECT_LT(rel_diff(gpu.download(out), want), 4e-3);
    // The other chunks as a plain GEMM; the own chunk's rows of D never written.
    const OwnedTensor got_d = gpu.download(d);
    const OwnedTensor ref_all = gpu.download(reference_product(gpu, a, b));
    OwnedTensor got_others = empty_host({(chunks - 1) * rows * n}, DType::kF32);
    OwnedTensor want_others = empty_host({(chunks - 1) * rows * n}, DType::kF32);
    int64_t j = 0, untouched = 0;
    for (int64_t i = 0; i < chunks * rows * n; ++i) {
      if (i / (rows * n) == own) {
        untouched += std::isnan(get(got_d, i)) ? 1 : 0;
        continue;
      }
      set(got_others, j, get(got_d, i));
      set(want_others, j++, get(ref_all, i));
    }
    EXPECT_EQ(untouched, rows * n);
    EXPECT_LT(rel_diff(got_others, want_others), 4e-3);
    std::vector<uint32_t> host(chunks * pieces);
    ASSERT_EQ(cudaMemcpy(host.data(), done, host.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost),
              cudaSuccess);
    const std::vector<uint32_t> counts = done_counts(gpu.be(), args);
    ASSERT_EQ(counts.size(), host.size());
    for (int i = 0; i < chunks * pieces; ++i)
      EXPECT_EQ(host[i], i / pieces == own ? 0u : counts[i]) << "piece " << i;
    if (padded) {
      // Parts whose row stride the TMA cannot take (1044 bytes) are refused, with the reason.
      OwnedTensor wide = gpu.empty({chunks, rows, n + 2}, dt);
      args.sum_parts = wide->narrow(2, 0, n);
      EXPECT_THAT(gpu.be().native_gemm_unsupported(args), ::testing::HasSubstr("part stride"));
    }
  }
}

// The kernel's own pushes (push_chunks): each other chunk's tiles go to its push_c (here local
// buffers standing for the owners' slots, [rows, n] with a padded row stride), never to C; the
// CTA that completes a piece raises its push flag to push_value and sets the counter back to 0;
// the own chunk is reduced with the parts as without. On single CTAs and on pairs, each whole and
// with the last wave split by K.
TEST(NativeGemm, PushesThePeersChunksItselfAndRaisesTheirFlags) {
  SKIP_UNLESS_GPUS(1);
  for (const auto& [pairs, tail_split] :
       {std::pair{false, 1}, std::pair{false, 4}, std::pair{true, 1}, std::pair{true, 4}}) {
    SCOPED_TRACE(fmt::format("{}, tail split {}", pairs ? "CTA pairs" : "single CTAs", tail_split));
    Gpu gpu;
    const int64_t rows = 256, n = 520, k = 1024, ld = n + 8;
    const int chunks = 4, own = 1, pieces = 3;
    const uint32_t value = 9;
    OwnedTensor a = gpu.upload({chunks * rows, k}, DType::kBF16, 41);
    OwnedTensor b = gpu.upload({k, n}, DType::kBF16, 42);
    OwnedTensor d = gpu.empty({chunks * rows, n}, DType::kBF16);
    gpu.be().fill(d, std::nanf(""), gpu.stream());
    OwnedTensor parts = gpu.upload({chunks, rows, n}, DType::kBF16, 43);
    OwnedTensor out = gpu.empty({rows, n}, DType::kBF16);
    OwnedTensor slots = gpu.empty({chunks, rows, ld}, DType::kBF16);
    gpu.be().fill(slots, std::nanf(""), gpu.stream());
    // landed (the parts' flags, all up), done, pushed: [pieces][chunks] each.
    Buffer flag_buf = gpu.be().allocate(3 * pieces * chunks * sizeof(uint32_t));
    auto* landed = static_cast<uint32_t*>(flag_buf.data());
    uint32_t* done = landed + pieces * chunks;
    uint32_t* pushed = done + pieces * chunks;
    gpu.be().zero_flags(landed, 3 * pieces * chunks, gpu.stream());
    for (int q = 0; q < pieces; ++q) {
      for (int s = 0; s < chunks; ++s) {
        if (s != own) gpu.be().write_flag(landed + q * chunks + s, 7, gpu.stream());
      }
    }
    ChunkedGemmArgs args;
    args.a = a;
    args.b = b;
    args.d = d;
    args.chunk_rows = rows;
    args.first_chunk = own + 1;
    args.tail_split = tail_split;
    args.done = done;
    args.done_cols = 256;
    args.sum_chunk = own;
    args.sum_parts = parts;
    args.sum_out = out;
    args.sum_self = own;
    args.sum_flags = landed;
    args.sum_value = 7;
    args.sum_cols = 256;
    args.sum_flag_stride = chunks;
    args.push_chunks = chunks;
    args.push_ld = ld;
    args.push_flag_stride = chunks;
    args.push_value = value;
    for (int c = 0; c < chunks; ++c) {
      if (c == own) continue;
      args.push_c[c] = slots->narrow(0, c, 1).data();
      args.push_flags[c] = pushed + c;
    }
    kernels::NativeGemmParams kp;
    ASSERT_EQ(to_native_params(args, &kp), "");
    kp.cluster = pairs ? 2 : 1;
    ASSERT_EQ(kernels::uses_cluster(kp), pairs);
    const size_t split_bytes = kernels::async_gemm_split_workspace_bytes();
    Buffer split_ws = gpu.be().allocate(split_bytes);
    gpu.be().zero_flags(static_cast<uint32_t*>(split_ws.data()), split_bytes / sizeof(uint32_t),
                        gpu.stream());
    kp.split_workspace = split_ws.data();
    EXPECT_EQ(kernels::async_gemm_tail_split(kp) > 1, tail_split > 1);
    ASSERT_EQ(kernels::async_gemm(kp, static_cast<cudaStream_t>(gpu.stream().native_handle())),
              cudaSuccess);
    gpu.stream().synchronize();

    const OwnedTensor ref_all = gpu.download(reference_product(gpu, a, b));
    const OwnedTensor host_parts = gpu.download(parts);
    const OwnedTensor got_out = gpu.download(out);
    const OwnedTensor got_slots = gpu.download(slots);
    const OwnedTensor got_d = gpu.download(d);
    OwnedTensor want_out = empty_host({rows, n}, DType::kF32);
    for (int64_t i = 0; i < rows * n; ++i) {
      float x = get(ref_all, own * rows * n + i);
      for (int s = 0; s < chunks; ++s) {
        if (s != own) x += get(host_parts, s * rows * n + i);
      }
      set(want_out, i, x);
    }
    EXPECT_LT(rel_diff(got_out, want_out), 4e-3);
    // Each other chunk in its slot (the padding and the own slot untouched), nothing in C.
    OwnedTensor got_pushed = empty_host({(chunks - 1) * rows * n}, DType::kF32);
    OwnedTensor want_pushed = empty_host({(chunks - 1) * rows * n}, DType::kF32);
    int64_t j = 0, untouched = 0;
    for (int c = 0; c < chunks; ++c) {
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t col = 0; col < ld; ++col) {
          const float v = get(got_slots, (c * rows + r) * ld + col);
          if (c == own || col >= n) {
            untouched += std::isnan(v) ? 1 : 0;
            continue;
          }
          set(got_pushed, j, v);
          set(want_pushed, j++, get(ref_all, (c * rows + r) * n + col));
        }
      }
    }
    EXPECT_EQ(untouched, rows * ld + (chunks - 1) * rows * (ld - n));
    EXPECT_LT(rel_diff(got_pushed, want_pushed), 4e-3);
    int64_t c_untouched = 0;
    for (int64_t i = 0; i < chunks * rows * n; ++i)
      c_untouched += std::isnan(get(got_d, i)) ? 1 : 0;
    EXPECT_EQ(c_untouched, chunks * rows * n) << "the kernel stored into C";
    std::vector<uint32_t> host(2 * pieces * chunks);
    ASSERT_EQ(cudaMemcpy(host.data(), done, host.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (int i = 0; i < pieces * chunks; ++i) {
      EXPECT_EQ(host[i], 0u) << "done counter " << i << " not set back to 0";
      const int q = i / chunks, c = i % chunks;
      EXPECT_EQ(host[pieces * chunks + i], c == own ? 0u : value)
          << "push flag of chunk " << c << ", piece " << q;
    }
  }
}

// A peer whose part never lands: the own chunk's tiles give up after the timeout, and the error
// names this rank, the peer and the piece's channel.
TEST(NativeGemm, PeerPartThatNeverLandsTimesOutNamingIt) {
  SKIP_UNLESS_GPUS(1);
  Gpu gpu;
  const int64_t rows = 256, n = 256;
  OwnedTensor a = gpu.upload({2 * rows, 256}, DType::kBF16, 41);
  OwnedTensor b = gpu.upload({256, n}, DType::kBF16, 42);
  OwnedTensor d = gpu.empty({2 * rows, n}, DType::kBF16);
  OwnedTensor parts = gpu.upload({2, rows, n}, DType::kBF16, 43);
  OwnedTensor out = gpu.empty({rows, n}, DType::kBF16);
  Buffer flag_buf = gpu.be().allocate(4 * sizeof(uint32_t));
  auto* landed = static_cast<uint32_t*>(flag_buf.data());
  gpu.be().zero_flags(landed, 4, gpu.stream());
  gpu.be().write_flag(landed + 1, 3, gpu.stream());  // piece 0 of peer 1; piece 1 never
  ChunkedGemmArgs args;
  args.a = a;
  args.b = b;
  args.d = d;
  args.chunk_rows = rows;
  args.first_chunk = 1;
  args.timeout = std::chrono::milliseconds(200);
  args.rank = 5;
  args.sum_chunk = 0;
  args.sum_parts = parts;
  args.sum_out = out;
  args.sum_self = 0;
  args.sum_flags = landed;
  args.sum_value = 3;
  args.sum_rows = 128;
  args.sum_flag_stride = 2;
  args.sum_channel = 12;
  gpu.be().native_gemm(args, gpu.stream());
  expect_timeout_on_sync(gpu, {"rank 5", "partial of rank 1", "channel 13"});
  gpu.be().write_flag(landed + 3, 3, gpu.stream());
  gpu.be().native_gemm(args, gpu.stream());
  EXPECT_NO_THROW(gpu.be().synchronize());

  // Pieces by columns: n 512 in two of 256, the second never lands.
  OwnedTensor b2 = gpu.upload({256, 512}, DType::kBF16, 44);
  OwnedTensor d2 = gpu.empty({2 * rows, 512}, DType::kBF16);
  OwnedTensor parts2 = gpu.upload({2, rows, 512}, DType::kBF16, 45);
  OwnedTensor out2 = gpu.empty({rows, 512}, DType::kBF16);
  gpu.be().zero_flags(landed, 4, gpu.stream());
  gpu.be().write_flag(landed + 1, 4, gpu.stream());
  args.b = b2;
  args.d = d2;
  args.sum_parts = parts2;
  args.sum_out = out2;
  args.sum_value = 4;
  args.sum_rows = 0;
  args.sum_cols = 256;
  gpu.be().native_gemm(args, gpu.stream());
  expect_timeout_on_sync(gpu, {"rank 5", "partial of rank 1", "channel 13"});
}

// The partial-sum reduction (every matmul_reduce_scatter ends with it) gives the CPU backend's
// bits: 1 to 12 inputs (the kernel loads 8 at a time), sum and mean, every 16-bit dtype and f32,
// on the vectorized path and the generic one (an odd element count).
TEST(CudaReduce, MatchesTheCpuBackendBitForBit) {
  SKIP_UNLESS_GPUS(1);
  Gpu gpu;
  std::unique_ptr<Backend> cpu = make_backend("cpu", 0);
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int64_t n : {int64_t{4104}, int64_t{1001}}) {
      for (int count : {1, 2, 3, 4, 7, 8, 9, 12}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
          SCOPED_TRACE(fmt::format("{} n {} inputs {} {}", dt, n, count, reduce_op_name(op)));
          std::vector<OwnedTensor> host, dev;
          std::vector<Tensor> host_views, dev_views;
          for (int j = 0; j < count; ++j) {
            host.push_back(empty_host({n}, dt));
            fill_seeded(host.back(), seed_of({41, static_cast<uint64_t>(j)}), Values::kRandom);
            dev.push_back(gpu.empty({n}, dt));
            gpu.be().copy(dev.back(), host.back(), gpu.stream());
            host_views.push_back(host.back());
            dev_views.push_back(dev.back());
          }
          OwnedTensor want = empty_host({n}, dt);
          cpu->reduce(want, host_views, op, cpu->compute_stream());
          cpu->compute_stream().synchronize();  // the CPU backend's streams run asynchronously
          OwnedTensor out = gpu.empty({n}, dt);
          gpu.be().reduce(out, dev_views, op, gpu.stream());
          const OwnedTensor got = gpu.download(out);
          EXPECT_EQ(std::memcmp(got->data(), want->data(), got->nbytes()), 0);
        }
      }
    }
  }
}

// The flagged reduction (the split matmul_reduce_scatter's): the inputs land on another stream,
// each followed by its flag, while the reduction already waits; the same bits as reduce().
// A flag that never comes up: a TimeoutError naming rank, peer and channel; then the backend is
// usable again.
TEST(CudaReduce, WhenFlaggedWaitsForTheCopiesThenMatchesReduce) {
  SKIP_UNLESS_GPUS(1);
  Gpu gpu;
  auto copy_stream = gpu.be().create_stream("test copy");
  const int64_t n = 1 << 20;
  std::vector<OwnedTensor> src, dst;
  std::vector<Tensor> views;
  for (int j = 0; j < 4; ++j) {
    src.push_back(gpu.upload({n}, DType::kBF16, 70 + j));
    dst.push_back(gpu.empty({n}, DType::kBF16));
    gpu.be().fill(dst.back(), std::nanf(""), gpu.stream());
    views.push_back(dst.back());
  }
  Buffer flag_buf = gpu.be().allocate(4 * sizeof(uint32_t));
  auto* flags = static_cast<uint32_t*>(flag_buf.data());
  gpu.be().zero_flags(flags, 4, gpu.stream());
  gpu.be().copy(dst[2], src[2], gpu.stream());  // the "own" partial, not flagged
  gpu.be().synchronize();
  Backend::FlagWait wait;
  wait.flags = flags;
  wait.count = 4;
  wait.skip = 2;
  wait.timeout = default_timeout();  // meant to succeed: ASYNCTP_TIMEOUT bounds it
  wait.rank = 2;
  wait.channel = 5;
  OwnedTensor out = gpu.empty({n}, DType::kBF16);
  gpu.be().reduce_when_flagged(out, views, ReduceOp::kSum, wait, gpu.stream());
  for (int j : {3, 0, 1}) {
    gpu.be().copy(dst[j], src[j], *copy_stream);
    gpu.be().write_flag(flags + j, 1, *copy_stream);
  }
  OwnedTensor want = gpu.empty({n}, DType::kBF16);
  gpu.be().reduce(want, views, ReduceOp::kSum, gpu.stream());
  const OwnedTensor got_h = gpu.download(out);
  const OwnedTensor want_h = gpu.download(want);
  EXPECT_EQ(std::memcmp(got_h->data(), want_h->data(), got_h->nbytes()), 0);

  gpu.be().zero_flags(flags + 1, 1, gpu.stream());
  wait.timeout = std::chrono::milliseconds(200);
  gpu.be().reduce_when_flagged(out, views, ReduceOp::kSum, wait, gpu.stream());
  expect_timeout_on_sync(gpu, {"rank 2", "partial of rank 1 on channel 5"});
  gpu.be().write_flag(flags + 1, 1, gpu.stream());
  gpu.be().reduce_when_flagged(out, views, ReduceOp::kSum, wait, gpu.stream());
  EXPECT_NO_THROW(gpu.be().synchronize());
}

// wait_flags (the split all_gather_matmul's wait before each chunk's GEMM): later work of the
// stream runs only once flags [first, count) have reached the value (op numbers here); one
// that never does times out naming the peer (its index) and the channel, and the stream goes on.
TEST(CudaWaitFlags, HoldsTheStreamUntilTheFlagsAreUpThenTimesOutNamingThePeer) {
  SKIP_UNLESS_GPUS(1);
  Gpu gpu;
  auto copy_stream = gpu.be().create_stream("test copy");
  const int64_t n = 1 << 20;
  OwnedTensor src = gpu.upload({n}, DType::kBF16, 81);
  OwnedTensor landed = gpu.empty({n}, DType::kBF16);
  OwnedTensor seen = gpu.empty({n}, DType::kBF16);
  gpu.be().fill(landed, std::nanf(""), gpu.stream());
  Buffer flag_buf = gpu.be().allocate(4 * sizeof(uint32_t));
  auto* flags = static_cast<uint32_t*>(flag_buf.data());
  gpu.be().zero_flags(flags, 4, gpu.stream());
  for (int j = 0; j < 4; ++j)
    gpu.be().write_flag(flags + j, 6, gpu.stream());  // the previous op's number
  gpu.be().synchronize();
  Backend::FlagWait wait;
  wait.flags = flags;
  wait.value = 7;
  wait.first = 2;
  wait.count = 3;                    // flag 2 only
  wait.timeout = default_timeout();  // meant to succeed: ASYNCTP_TIMEOUT bounds it
  wait.rank = 1;
  wait.channel = 8;
  wait.of = Backend::FlagWait::Of::kShard;
  gpu.be().wait_flags(wait, gpu.stream());
  gpu.be().copy(seen, landed, gpu.stream());  // must see the copy below
  gpu.be().copy(landed, src, *copy_stream);
  gpu.be().write_flag(flags + 2, 7, *copy_stream);
  const OwnedTensor got = gpu.download(seen);
  const OwnedTensor want = gpu.download(src);
  EXPECT_EQ(std::memcmp(got->data(), want->data(), got->nbytes()), 0);

  wait.value = 8;
  wait.timeout = std::chrono::milliseconds(200);
  gpu.be().wait_flags(wait, gpu.stream());
  expect_timeout_on_sync(gpu, {"rank 1", "shard of peer 2 on channel 8"});
  gpu.be().write_flag(flags + 2, 8, gpu.stream());
  gpu.be().wait_flags(wait, gpu.stream());
  EXPECT_NO_THROW(gpu.be().synchronize());
}

// ---- float8 ----------------------------------------------------------------------------------

// The largest relative difference of one row: max over rows of ||actual_i - expected_i|| /
// ||expected_i||, so that a scale wrong on a single row shows (the whole matrix's norm hides it).
double max_row_rel_diff(const Tensor& actual_host, const Tensor& expected_host) {
  const int64_t n = expected_host.size(1);
  double worst = 0;
  for (int64_t i = 0; i < expected_host.size(0); ++i) {
    double num = 0, den = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double e = get(expected_host, i * n + j);
      const double d = get(actual_host, i * n + j) - e;
      num += d * d;
      den += e * e;
    }
    const double diff = den == 0 ? std::sqrt(num) : std::sqrt(num / den);
    // A NaN row (a NaN read where a real value was due) is the worst there is: std::max would
    // drop it.
    if (!std::isfinite(diff)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, diff);
  }
  return worst;
}

// The float8 (e4m3) native GEMM with fast accumulation, every scale combination (row-wise A and
// column-wise B, tensor-wise, none) and output dtype, shapes off the tile grid in M, N and K (K a
// multiple of 16, the TMA's row alignment in bytes) and a split tail wave (333 x 520 x 4096):
// against the reference kernel (f32 accumulation in k order, then the scales), row by row, and
// against cuBLASLt's scaled GEMM with fast accumulation. The tensor cores' fast float8 sum keeps
// about 14 mantissa bits: over these K its error stays under 1e-2 of a row's norm.
TEST(NativeFloat8, MatchesReferenceAndCublasLtWithEveryScale) {
  SKIP_UNLESS_GPUS(1);
  Gpu gpu;
  struct Case {
    Shape shape;
    bool rowwise, colwise, scaled;
  };
  const Case cases[] = {
      {{128, 256, 128}, true, true, true},      {{1, 8, 16}, true, true, true},
      {{200, 312, 144}, false, true, true},     {{200, 312, 144}, true, false, true},
      {{1000, 1000, 1024}, false, false, true}, {{333, 520, 4096}, true, true, true},
      {{2048, 768, 512}, true, true, true},     {{260, 264, 272}, false, false, false}};
  for (const Case& c : cases) {
    const auto [m, n, k] = c.shape;
    const uint64_t seed =
        seed_of({static_cast<uint64_t>(m), static_cast<uint64_t>(n), static_cast<uint64_t>(k), 8});
    OwnedTensor a = gpu.upload({m, k}, DType::kF8E4M3, seed);
    OwnedTensor b = gpu.upload_b(k, n, /*k_major=*/true, DType::kF8E4M3, seed + 1);
    OwnedTensor sa =
        gpu.upload(c.rowwise ? Dims{m} : Dims{1}, DType::kF32, seed + 2, Values::kPositive);
    OwnedTensor sb =
        gpu.upload(c.colwise ? Dims{1, n} : Dims{1}, DType::kF32, seed + 3, Values::kPositive);
    OwnedTensor ref = gpu.empty({m, n}, DType::kF32);
    ChunkedGemmArgs args;
    args.a = a;
    args.b = b;
    args.d = ref;
    if (c.scaled) {
      args.a_scale = sa;
      args.b_scale = sb;
    }
    kernels::NativeGemmParams kp;
    ASSERT_EQ(to_native_params(args, &kp), "");
    ASSERT_EQ(kernels::reference_gemm(kp, static_cast<cudaStream_t>(gpu.stream().native_handle())),
              cudaSuccess);
    const OwnedTensor expected = gpu.download(ref);
    for (DType out : {DType::kBF16, DType::kF32, DType::kF16}) {
      SCOPED_TRACE(fmt::format("{}x{}x{} A scale {} B scale {} out {}", m, n, k,
                               !c.scaled   ? "none"
                               : c.rowwise ? "row-wise"
                                           : "tensor-wise",
                               !c.scaled   ? "none"
                               : c.colwise ? "column-wise"
                                           : "tensor-wise",
                               out));
      OwnedTensor d = gpu.empty({m, n}, out);
      args.d = d;
      ASSERT_EQ(gpu.be().native_gemm_unsupported(args), "");
      gpu.be().native_gemm(args, gpu.stream());
      const OwnedTensor got = gpu.download(d);
      EXPECT_LT(max_row_rel_diff(got, expected), 1e-2);
      if (!c.scaled) continue;  // cuBLASLt's float8 GEMM takes scales
      OwnedTensor lt = gpu.empty({m, n}, out);
      GemmArgs g;
      g.a = a;
      g.b = b;
      g.d = lt;
      g.a_scale = c.rowwise ? sa->view({m, 1}) : sa.tensor;
      g.b_scale = sb;
      g.fast_accum = true;
      gpu.be().gemm(g, gpu.stream());
      EXPECT_LT(max_row_rel_diff(got, gpu.download(lt)), 1e-2) << "against cuBLASLt";
    }
  }
}

// A float8 problem on the GPU: e4m3 A [m, k] and B [k, n] (column-major), row-wise A scales [m]
// and column-wise B scales [1, n] (positive), seeded from `seed`; args() into d.
struct Float8Problem {
  OwnedTensor a, b, sa, sb;
  Float8Problem(Gpu& gpu, int64_t m, int64_t n, int64_t k, uint64_t seed)
      : a(gpu.upload({m, k}, DType::kF8E4M3, seed)),
        b(gpu.upload_b(k, n, true, DType::kF8E4M3, seed + 1)),
        sa(gpu.upload({m}, DType::kF32, seed + 2, Values::kPositive)),
        sb(gpu.upload({1, n}, DType::kF32, seed + 3, Values::kPositive)) {}
  ChunkedGemmArgs args(const Tensor& d) const {
    ChunkedGemmArgs args;
    args.a = a;
    args.b = b;
    args.d = d;
    args.a_scale = sa;
    args.b_scale = sb;
    return args;
  }
};

// float8 runs on CTA pairs sharing B by default (cluster_of); single CTAs and the register store
// compute every tile in the same order: the same bits, row-wise scales, off the tile grid.
TEST(NativeFloat8, SingleCtasAndRegisterStoresMatchPairs) {
  SKIP_UNLESS_GPUS(1);
  Gpu gpu;
  const int64_t m = 700, n = 520;
  const Float8Problem f8(gpu, m, n, 400, 91);
  OwnedTensor pairs = gpu.empty({m, n}, DType::kBF16);
  kernels::NativeGemmParams kp;
  ASSERT_EQ(to_native_params(f8.args(pairs), &kp), "");
  ASSERT_TRUE(kernels::uses_cluster(kp));
  const auto stream = static_cast<cudaStream_t>(gpu.stream().native_handle());
  ASSERT_EQ(kernels::async_gemm(kp, stream), cudaSuccess);
  const OwnedTensor expected = gpu.download(pairs);
  for (const bool registers : {false, true}) {
    OwnedTensor d = gpu.empty({m, n}, DType::kBF16);
    kp.c = d->data();
    kp.cluster = 1;
    kp.force_register_store = registers;
    ASSERT_EQ(kernels::async_gemm(kp, stream), cudaSuccess);
    EXPECT_TRUE(same_bits(gpu.download(d), expected))
        << (registers ? "register store" : "single CTAs");
  }
}

// The tail split on pairs: 20 pair tiles (1024 x 1280) leave most clusters idle, so each tile is
// cut into K-ranges (both CTAs of a pair take the same ones, each keeping its own rows' parts).
// Within the rounding of the unsplit GEMM, not its bits (f32 sums in another order, rounded to
// bf16 over 1.3 million elements), the same bits run after run.
TEST(NativeFloat8, TailSplitOnPairsMatchesUnsplitAndRepeatsBitForBit) {
  SKIP_UNLESS_GPUS(1);
  Gpu gpu;
  const int64_t m = 1024, n = 1280;
  const Float8Problem f8(gpu, m, n, 2048, 95);
  auto run = [&](int tail_split) {
    OwnedTensor d = gpu.empty({m, n}, DType::kBF16);
    gpu.be().fill(d, std::nanf(""), gpu.stream());
    ChunkedGemmArgs args = f8.args(d);
    args.tail_split = tail_split;
    kernels::NativeGemmParams kp;
    EXPECT_EQ(to_native_params(args, &kp), "");
    EXPECT_TRUE(kernels::uses_cluster(kp));
    kp.split_workspace = reinterpret_cast<void*>(uintptr_t{1} << 20);  // for the rule only
    EXPECT_EQ(kernels::async_gemm_tail_split(kp) > 1, tail_split != 1);
    gpu.be().native_gemm(args, gpu.stream());
    return gpu.download(d);
  };
  const OwnedTensor whole = run(1);
  const OwnedTensor split = run(0);
  EXPECT_LT(rel_diff(split, whole), 4e-3);
  EXPECT_FALSE(same_bits(split, whole)) << "the tail split did not run";
  EXPECT_TRUE(same_bits(split, run(0))) << "two runs differ";
}

// The own chunk's rows take their scales from own_a_scale, wherever the tile read them from:
// a's and a_scale's own rows are NaN (which must not show), own_a and own_a_scale hold the real
// ones; chunks of 200 rows, off the tile grid, so tiles straddle the own chunk's edges (their
// rows read from a, which for those edge rows holds the real values, as the op copies them).
TEST(NativeFloat8, OwnChunkRowsTakeTheOwnScales) {
  SKIP_UNLESS_GPUS(1);
  Gpu gpu;
  const int64_t m = 600, n = 264, k = 256, rows = 200;
  const Float8Problem real(gpu, m, n, k, 81);
  OwnedTensor ref = gpu.empty({m, n}, DType::kF32);
  ChunkedGemmArgs args = real.args(ref);
  kernels::NativeGemmParams kp;
  ASSERT_EQ(to_native_params(args, &kp), "");
  ASSERT_EQ(kernels::reference_gemm(kp, static_cast<cudaStream_t>(gpu.stream().native_handle())),
            cudaSuccess);
  const OwnedTensor expected = gpu.download(ref);

  // Chunk 1 (rows [200, 400)) is the own one. a keeps the real values of the rows that edge
  // tiles read (native_gemm_own_edge_rows), NaN elsewhere in the chunk; a_scale is NaN there.
  const Float8Problem f8(gpu, m, n, k, 81);  // the same values, NaN written over below
  const Tensor a = f8.a, sa = f8.sa;
  OwnedTensor own = gpu.empty({rows, k}, DType::kF8E4M3);
  gpu.be().copy(own, real.a->narrow(0, rows, rows), gpu.stream());
  OwnedTensor own_sa = gpu.empty({rows}, DType::kF32);
  gpu.be().copy(own_sa, real.sa->narrow(0, rows, rows), gpu.stream());
  gpu.be().fill(sa.narrow(0, rows, rows), std::nanf(""), gpu.stream());
  OwnedTensor d = gpu.empty({m, n}, DType::kBF16);
  args.a = a;
  args.a_scale = sa;
  args.d = d;
  args.chunk_rows = rows;
  args.first_chunk = 1;
  args.own_a = own;
  args.own_a_scale = own_sa;
  args.own_chunk = 1;
  const Backend::OwnEdgeRows edges = gpu.be().native_gemm_own_edge_rows(args);
  ASSERT_LT(edges.head + edges.tail, rows);
  gpu.be().fill(a.narrow(0, rows + edges.head, rows - edges.head - edges.tail), std::nanf(""),
                gpu.stream());
  ASSERT_EQ(gpu.be().native_gemm_unsupported(args), "");
  gpu.be().native_gemm(args, gpu.stream());
  EXPECT_LT(max_row_rel_diff(gpu.download(d), expected), 1e-2);
}

// What the float8 kernel cannot take, each said: an N-major B (wgmma reads 8-bit operands
// K-major), a row stride off 16 bytes, scales on 16-bit inputs, a scale of the wrong size.
TEST(NativeFloat8, RejectsWhatItCannotRun) {
  SKIP_UNLESS_GPUS(1);
  Gpu gpu;
  OwnedTensor a = gpu.upload({64, 128}, DType::kF8E4M3, 1);
  OwnedTensor b = gpu.upload_b(128, 64, true, DType::kF8E4M3, 2);
  OwnedTensor d = gpu.empty({64, 64}, DType::kBF16);
  OwnedTensor s = gpu.upload({64}, DType::kF32, 3, Values::kPositive);
  ChunkedGemmArgs args;
  args.a = a;
  args.b = b;
  args.d = d;
  args.a_scale = s;
  args.b_scale = s;
  EXPECT_EQ(gpu.be().native_gemm_unsupported(args), "");
  OwnedTensor row_major = gpu.upload({128, 64}, DType::kF8E4M3, 2);
  args.b = row_major;
  EXPECT_THAT(gpu.be().native_gemm_unsupported(args), ::testing::HasSubstr("k-major B"));
  args.b = b;
  args.a = a->narrow(1, 0, 120).narrow(0, 0, 64);  // K 120 of row stride 128: fine
  args.b = b->narrow(0, 0, 120);
  EXPECT_EQ(gpu.be().native_gemm_unsupported(args), "");
  OwnedTensor odd = gpu.upload({64, 120}, DType::kF8E4M3, 4);  // row stride 120 bytes
  args.a = odd;
  EXPECT_THAT(gpu.be().native_gemm_unsupported(args), ::testing::HasSubstr("multiple of 16 bytes"));
  args.a = a;
  args.b = b;
  args.a_scale = s->narrow(0, 0, 32);
  EXPECT_THAT(gpu.be().native_gemm_unsupported(args), ::testing::HasSubstr("a_scale"));
  OwnedTensor a16 = gpu.upload({64, 128}, DType::kBF16, 5);
  OwnedTensor b16 = gpu.upload_b(128, 64, true, DType::kBF16, 6);
  args.a = a16;
  args.b = b16;
  args.a_scale = s;
  EXPECT_THAT(gpu.be().native_gemm_unsupported(args),
              ::testing::HasSubstr("scales are for float8"));
}

}  // namespace
}  // namespace asynctp::testing
