// The op-level API around the fused ops: the caller's stream (per call or set on the context),
// the single-B overloads, reserve and the memory stats, and the CaptureError of a buffer that
// would grow while the op's stream is captured.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "op_testing.h"
#include "ops/collectives.h"
#include "ops/fused_matmul.h"
#include "support/multiprocess.h"
#include "symm/symmetric_memory.h"

namespace asynctp {
namespace {

using namespace asynctp::testing;  // NOLINT(google-build-using-namespace)
using ::testing::HasSubstr;

// Stand-ins for a caller's native streams (the CPU backend takes any handle).
void* const kStreamA = reinterpret_cast<void*>(uintptr_t{0x1000});
void* const kStreamB = reinterpret_cast<void*>(uintptr_t{0x2000});

// ws 3: A_shard [4, 8] -> A [12, 8] @ B [8, 6] -> out [12, 6]; the product [12, 6] reduce-
// scattered on dim 0 -> [4, 6].
TEST(CallerStreamTest, OpsOnAWrappedOrSetStreamGiveTheSameBits) {
  auto statuses = run_ranks(3, [](OpContext& ctx) {
    const int r = ctx.rank();
    OwnedTensor a = seeded({4, 8}, DType::kF32, {1, static_cast<uint64_t>(r)});
    OwnedTensor b = seeded({8, 6}, DType::kF32, {2});
    OwnedTensor a_full = seeded({12, 8}, DType::kF32, {3, static_cast<uint64_t>(r)});
    OwnedTensor want_ag = empty_host({12, 6}, DType::kF32);
    OwnedTensor want_rs = empty_host({4, 6}, DType::kF32);
    OwnedTensor want_coll = empty_host({12, 8}, DType::kF32);
    Stream& own = ctx.stream();
    all_gather_matmul(ctx, a, b, want_ag);
    matmul_reduce_scatter(ctx, a_full, b, want_rs);
    all_gather(ctx, a, want_coll);

    // Per call: the call's stream, and the context's again afterwards.
    OwnedTensor ag = empty_host({12, 6}, DType::kF32);
    OwnedTensor rs = empty_host({4, 6}, DType::kF32);
    OwnedTensor coll = empty_host({12, 8}, DType::kF32);
    all_gather_matmul(ctx, a, b, ag, {}, {.stream = kStreamA});
    matmul_reduce_scatter(ctx, a_full, b, rs, {.stream = kStreamB});
    all_gather(ctx, a, coll, 0, kStreamA);
    EXPECT_EQ(&ctx.stream(), &own);
    EXPECT_TRUE(same_bits(ag, want_ag));
    EXPECT_TRUE(same_bits(rs, want_rs));
    EXPECT_TRUE(same_bits(coll, want_coll));

    // Set on the context: one wrapper per handle, made once.
    ctx.set_stream(kStreamA);
    Stream& wrapped = ctx.stream();
    EXPECT_NE(&wrapped, &own);
    EXPECT_EQ(&ctx.wrapped_stream(kStreamA), &wrapped);
    EXPECT_NE(&ctx.wrapped_stream(kStreamB), &wrapped);
    fill_seeded(ag, 9, Values::kRandom);
    fill_seeded(rs, 9, Values::kRandom);
    all_gather_matmul(ctx, a, b, ag);
    matmul_reduce_scatter(ctx, a_full, b, rs, {.path = PathChoice::kFallback});
    EXPECT_TRUE(same_bits(ag, want_ag));
    EXPECT_TRUE(same_bits(rs, want_rs));
    EXPECT_EQ(&ctx.stream(), &wrapped);
    ctx.set_stream(nullptr);
    EXPECT_NE(&ctx.stream(), &wrapped);
  });
  EXPECT_RANKS_OK(statuses);
}

TEST(SingleBTest, OverloadsEqualTheSpanForms) {
  auto statuses = run_ranks(2, [](OpContext& ctx) {
    const int r = ctx.rank();
    OwnedTensor a = seeded({3, 16}, DType::kBF16, {1, static_cast<uint64_t>(r)});
    OwnedTensor b = seeded({16, 8}, DType::kBF16, {2});
    OwnedTensor out = empty_host({6, 8}, DType::kBF16);
    OwnedTensor a_out = empty_host({6, 16}, DType::kBF16);
    OwnedTensor want = empty_host({6, 8}, DType::kBF16);
    OwnedTensor want_a = empty_host({6, 16}, DType::kBF16);
    const Tensor bs[] = {b.tensor};
    const Tensor want_outs[] = {want.tensor};
    all_gather_matmul(ctx, a, bs, want_outs, want_a);
    all_gather_matmul(ctx, a, b, out, a_out);
    EXPECT_TRUE(same_bits(out, want));
    EXPECT_TRUE(same_bits(a_out, want_a));

    OwnedTensor a8 = seeded({3, 16}, DType::kF8E4M3, {3, static_cast<uint64_t>(r)});
    OwnedTensor b8 = seeded({16, 8}, DType::kF8E4M3, {4});
    OwnedTensor a_scale =
        seeded({3, 1}, DType::kF32, {5, static_cast<uint64_t>(r)}, Values::kPositive);
    OwnedTensor b_scale = seeded({1, 8}, DType::kF32, {6}, Values::kPositive);
    const Tensor b8s[] = {b8.tensor};
    const Tensor b_scales[] = {b_scale.tensor};
    all_gather_scaled_matmul(ctx, a8, a_scale, b8s, b_scales, want_outs);
    all_gather_scaled_matmul(ctx, a8, a_scale, b8, b_scale, out);
    EXPECT_TRUE(same_bits(out, want));
    EXPECT_EQ(ctx.usage().count("all_gather_scaled_matmul", Path::kSplit), 2);
  });
  EXPECT_RANKS_OK(statuses);
}

// After reserve, the calls it was made for allocate nothing: the memory stats do not move.
// Shapes at ws 2: A_shard [8, 32] (A [16, 32]) @ Bs [32, 24], [32, 8]; the contraction-dim
// gather of A_shard [16, 16] (K 32); the products [16, 32] @ [32, 24] (one, and two with a
// strided A) reduce-scattered on dim 0 and on the last dim.
TEST(ReserveTest, ReservedCallsAllocateNothing) {
  for (const PathChoice path : {PathChoice::kAuto, PathChoice::kSplit, PathChoice::kFallback}) {
    auto statuses = run_ranks(2, [path](OpContext& ctx) {
      const int r = ctx.rank();
      const MemoryStats fresh = ctx.memory_stats();
      EXPECT_EQ(fresh.symmetric_bytes, 0);
      EXPECT_EQ(fresh.local_bytes, 0);
      EXPECT_EQ(fresh.symmetric_limit, static_cast<int64_t>(ctx.options().max_workspace_bytes));

      OwnedTensor a = seeded({8, 32}, DType::kBF16, {1, static_cast<uint64_t>(r)});
      OwnedTensor ak = seeded({16, 16}, DType::kBF16, {2, static_cast<uint64_t>(r)});
      OwnedTensor b0 = seeded({32, 24}, DType::kBF16, {3});
      OwnedTensor b1 = seeded({32, 8}, DType::kBF16, {4});
      OwnedTensor p0 = seeded({16, 32}, DType::kBF16, {5, static_cast<uint64_t>(r)});
      OwnedTensor p1 = seeded({16, 32}, DType::kBF16, {6, static_cast<uint64_t>(r)},
                              Values::kRandom, Layout::kTransposed);
      // Descriptors for reserve: an address that is never read (a Tensor holds no null data).
      void* const nowhere = reinterpret_cast<void*>(uintptr_t{256});
      const Tensor a_desc(nowhere, DType::kBF16, {8, 32});
      const Tensor ak_desc(nowhere, DType::kBF16, {16, 16});
      const Tensor bs[] = {b0.tensor, b1.tensor};
      const Tensor b_pair[] = {b0.tensor, b0.tensor};
      const Tensor ps[] = {p0.tensor, p1.tensor};
      const Tensor p_descs[] = {Tensor(nowhere, DType::kBF16, {16, 32}), p1.tensor};
      const AllGatherMatmulOptions ag{.path = path};
      const AllGatherMatmulOptions ag_k{.gather_dim = -1, .path = path};
      const MatmulReduceScatterOptions rs{.path = path};
      const MatmulReduceScatterOptions rs_last{.scatter_dim = -1, .path = path};
      reserve_all_gather_matmul(ctx, a_desc, bs, /*return_a=*/false, ag);
      reserve_all_gather_matmul(ctx, ak_desc, bs, /*return_a=*/false, ag_k);
      reserve_matmul_reduce_scatter(ctx, std::span(p_descs, 1), std::span(bs, 1), rs);
      reserve_matmul_reduce_scatter(ctx, p_descs, b_pair, rs_last);
      const MemoryStats reserved = ctx.memory_stats();
      EXPECT_GT(reserved.local_bytes, 0);
      if (path != PathChoice::kFallback) {
        EXPECT_GT(reserved.symmetric_bytes, 0);
      }

      OwnedTensor out0 = empty_host({16, 24}, DType::kBF16);
      OwnedTensor out1 = empty_host({16, 8}, DType::kBF16);
      const Tensor outs[] = {out0.tensor, out1.tensor};
      all_gather_matmul(ctx, a, bs, outs, {}, ag);
      all_gather_matmul(ctx, ak, bs, outs, {}, ag_k);
      OwnedTensor rs_out = empty_host({8, 24}, DType::kBF16);
      OwnedTensor rs_last_out = empty_host({16, 12}, DType::kBF16);
      matmul_reduce_scatter(ctx, p0, b0, rs_out, rs);
      matmul_reduce_scatter(ctx, ps, b_pair, rs_last_out, rs_last);
      ctx.stream().synchronize();  // the operands go with this scope
      const MemoryStats after = ctx.memory_stats();
      EXPECT_EQ(after.local_bytes, reserved.local_bytes);
      // The fallback's collectives stage through the communicator's own buffers, which reserve
      // does not size: on the CPU backend the symmetric-memory communicator grows the shared
      // workspace (NCCL, on CUDA, needs none of it).
      if (path != PathChoice::kFallback) {
        EXPECT_EQ(after.symmetric_bytes, reserved.symmetric_bytes);
      }
    });
    EXPECT_RANKS_OK(statuses) << path_choice_name(path);
  }
}

// The CPU backend, but its streams say they are being captured while `capture` is set: the
// capture checks' view of a CUDA-graph capture, which the CPU backend cannot do.
class CapturingCpuBackend final : public Backend {
 public:
  bool capture = false;

  std::string_view name() const override { return cpu_->name(); }
  Device device() const override { return cpu_->device(); }
  Buffer allocate(size_t bytes) override { return cpu_->allocate(bytes); }
  Stream& compute_stream() override { return cpu_->compute_stream(); }
  std::unique_ptr<Stream> create_stream(std::string_view name) override {
    return cpu_->create_stream(name);
  }
  std::unique_ptr<Stream> wrap_stream(void* handle) override { return cpu_->wrap_stream(handle); }
  std::unique_ptr<Event> create_event(bool timing) override { return cpu_->create_event(timing); }
  bool capturing(Stream&) override { return capture; }
  void copy(const Tensor& dst, const Tensor& src, Stream& s) override { cpu_->copy(dst, src, s); }
  void fill(const Tensor& dst, float value, Stream& s) override { cpu_->fill(dst, value, s); }
  void gemm(const GemmArgs& args, Stream& s) override { cpu_->gemm(args, s); }
  void reduce(const Tensor& out, std::span<const Tensor> inputs, ReduceOp op, Stream& s) override {
    cpu_->reduce(out, inputs, op, s);
  }
  void unary(UnaryOp op, const Tensor& out, const Tensor& in, Stream& s) override {
    cpu_->unary(op, out, in, s);
  }
  void swiglu_backward(const Tensor& grad_gate_up, const Tensor& grad_out, const Tensor& gate_up,
                       Stream& s) override {
    cpu_->swiglu_backward(grad_gate_up, grad_out, gate_up, s);
  }
  void swiglu(const Tensor& out, const Tensor& gate_up, Stream& s) override {
    cpu_->swiglu(out, gate_up, s);
  }
  void synchronize() override { cpu_->synchronize(); }
  std::string native_gemm_unsupported(const ChunkedGemmArgs& args) override {
    return cpu_->native_gemm_unsupported(args);
  }
  void native_gemm(const ChunkedGemmArgs& args, Stream& s) override { cpu_->native_gemm(args, s); }
  void spin(int64_t cycles, Stream& s) override { cpu_->spin(cycles, s); }
  void write_flag(uint32_t* flag, uint32_t value, Stream& s) override {
    cpu_->write_flag(flag, value, s);
  }
  void wait_flag(const uint32_t* flag, uint32_t value, const FlagSite& site, Stream& s) override {
    cpu_->wait_flag(flag, value, site, s);
  }
  void zero_flags(uint32_t* flags, size_t count, Stream& s) override {
    cpu_->zero_flags(flags, count, s);
  }
  void reduce_when_flagged(const Tensor& out, std::span<const Tensor> inputs, ReduceOp op,
                           const FlagWait& wait, Stream& s) override {
    cpu_->reduce_when_flagged(out, inputs, op, wait, s);
  }
  void wait_flags(const FlagWait& wait, Stream& s) override { cpu_->wait_flags(wait, s); }

 private:
  std::unique_ptr<Backend> cpu_ = make_backend("cpu", 0);
};

TEST(CaptureErrorTest, AWorkspaceThatWouldGrowDuringCaptureNamesItself) {
  auto statuses = run_ranks(1, [](OpContext& ctx) {
    CapturingCpuBackend backend;
    const auto allocator = make_symm_allocator(backend, ctx.group());
    SymmWorkspace workspace(*allocator, backend, size_t{4} << 20, "the test workspace");
    Stream& stream = backend.compute_stream();
    workspace.get(4096, stream);  // outside capture: grows
    const size_t capacity = workspace.capacity();
    ASSERT_GE(capacity, 4096u);
    ASSERT_LT(capacity, workspace.max_bytes());  // growing further is within the limit
    backend.capture = true;
    EXPECT_EQ(workspace.get(capacity, stream).size(), capacity);  // no growth: fine
    try {
      workspace.get(capacity + 1, stream);
      ADD_FAILURE() << "no CaptureError";
    } catch (const CaptureError& e) {
      EXPECT_THAT(e.what(), HasSubstr(fmt::format("the test workspace must grow to {} bytes (it "
                                                  "has {})",
                                                  capacity + 1, capacity)));
    }
    EXPECT_EQ(workspace.capacity(), capacity);  // never reallocated
  });
  EXPECT_RANKS_OK(statuses);
}

}  // namespace
}  // namespace asynctp
