// The CPU backend's other kernels: strided copies with dtype conversion, fill, the fixed-order
// reduction, the unary ops, events; the backend factory; the communicators' shared checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>

#include "device/backend.h"
#include "device/communicator.h"
#include "device/cpu_backend.h"
#include "device/cpu_streams.h"
#include "support/tensor_testing.h"

namespace asynctp {
namespace {

using testing::bits_at;
using testing::error_of;
using testing::fill_seeded;
using testing::get;
using ::testing::HasSubstr;
using testing::same_bits;
using testing::seed_of;
using testing::Values;

class CpuBackendTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend_ = make_cpu_backend();
  Stream& stream() { return backend_->compute_stream(); }
};

TEST_F(CpuBackendTest, IdentifiesItself) {
  EXPECT_EQ(backend_->name(), "cpu");
  EXPECT_TRUE(backend_->device().is_cpu());
  EXPECT_EQ(stream().native_handle(), nullptr);
  Buffer buf = backend_->allocate(100);
  ASSERT_FALSE(buf.empty());
  EXPECT_EQ(buf.size(), 100u);
  EXPECT_TRUE(buf.device().is_cpu());
  std::memset(buf.data(), 0xAB, buf.size());  // writable (ASan checks the bounds)
}

// spin holds the stream, not the host: a cycle is a nanosecond on the CPU backend.
TEST_F(CpuBackendTest, SpinHoldsTheStreamNotTheHost) {
  const auto t0 = std::chrono::steady_clock::now();
  backend_->spin(500'000'000, stream());
  const auto called = std::chrono::steady_clock::now() - t0;
  stream().synchronize();
  const auto passed = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(passed, std::chrono::milliseconds(500));
  EXPECT_LT(called, std::chrono::milliseconds(250));
  EXPECT_THAT([&] { backend_->spin(-1, stream()); },
              ::testing::ThrowsMessage<Error>(HasSubstr("spin: cycles is -1")));
}

TEST(BackendFactoryTest, MakesCpuAndNamesUnknownBackends) {
  EXPECT_EQ(make_backend("cpu", 0)->name(), "cpu");
  EXPECT_THAT(available_backends(), ::testing::Contains("cpu"));
  EXPECT_THAT(error_of([] { make_backend("tpu", 0); }), HasSubstr("unknown backend 'tpu'"));
  EXPECT_THAT(error_of([] { make_backend("cpu", 0, -2); }),
              HasSubstr("device_index must be -1 (by local rank) or a GPU's index, got -2"));
  const auto available = available_backends();
  if (std::find(available.begin(), available.end(), "cuda") == available.end()) {
    EXPECT_THAT(error_of([] { make_backend("cuda", 0); }), HasSubstr("no CUDA backend"));
    // auto: cpu where the build has no CUDA.
    EXPECT_EQ(make_backend("auto", 0)->name(), "cpu");
  }
}

TEST(ReduceOpTest, NamesRoundTrip) {
  EXPECT_EQ(reduce_op_name(ReduceOp::kSum), "sum");
  EXPECT_EQ(reduce_op_name(ReduceOp::kAvg), "avg");
  EXPECT_EQ(parse_reduce_op("sum"), ReduceOp::kSum);
  EXPECT_EQ(parse_reduce_op("avg"), ReduceOp::kAvg);
  EXPECT_EQ(parse_reduce_op("mean"), ReduceOp::kAvg);
  EXPECT_THAT(error_of([] { parse_reduce_op("max"); }), HasSubstr("got 'max'"));
}

// --- copy ------------------------------------------------------------------------------------

TEST_F(CpuBackendTest, CopyContiguousSameDtypeIsExact) {
  OwnedTensor src = empty_host({3, 5}, DType::kBF16);
  OwnedTensor dst = empty_host({3, 5}, DType::kBF16);
  fill_seeded(src, seed_of({1}), Values::kRandom);
  backend_->copy(dst, src, stream());
  EXPECT_TRUE(same_bits(dst, src));
}

TEST_F(CpuBackendTest, CopyStridedSameDtype) {
  // Transposed source into a padded destination; the padding must stay untouched.
  OwnedTensor src = testing::empty_transposed({4, 6}, DType::kF16);
  OwnedTensor dst = testing::empty_padded({4, 6}, DType::kF16, 2);
  fill_seeded(src, seed_of({2}), Values::kRandom);
  std::memset(dst.buffer.data(), 0x5A, dst.buffer.size());
  backend_->copy(dst, src, stream());
  EXPECT_TRUE(same_bits(dst, src));
  const auto* raw = static_cast<const uint16_t*>(dst.buffer.data());
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(raw[r * 8 + 6], 0x5A5A);
    EXPECT_EQ(raw[r * 8 + 7], 0x5A5A);
  }
}

TEST_F(CpuBackendTest, CopyPermuted3d) {
  OwnedTensor storage = empty_host({2, 3, 4}, DType::kF32);
  fill_seeded(storage, seed_of({3}), Values::kRandom);
  const Tensor src = storage->permute({2, 0, 1});  // [4, 2, 3], no unit inner stride
  OwnedTensor dst = empty_host({4, 2, 3}, DType::kF32);
  backend_->copy(dst, src, stream());
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 2; ++j) {
      for (int64_t k = 0; k < 3; ++k) {
        EXPECT_EQ(get(dst, (i * 2 + j) * 3 + k), get(storage, (j * 3 + k) * 4 + i));
      }
    }
  }
}

TEST_F(CpuBackendTest, CopyConvertsEveryDtypePair) {
  for (DType from : kFloatDTypes) {
    for (DType to : kFloatDTypes) {
      SCOPED_TRACE(fmt::format("{} -> {}", from, to));
      OwnedTensor src = testing::empty_transposed({3, 4}, from);
      OwnedTensor dst = testing::empty_padded({3, 4}, to, 1);
      fill_seeded(src, seed_of({4, static_cast<uint64_t>(from)}), Values::kRandom);
      backend_->copy(dst, src, stream());
      for (int64_t i = 0; i < 12; ++i) {
        // Through f32, rounded as the casts in core/dtype.h round.
        OwnedTensor one = empty_host({1}, to);
        testing::set(one, 0, get(src, i));
        ASSERT_EQ(bits_at(dst, i), bits_at(one, 0)) << "element " << i << " = " << get(src, i);
      }
    }
  }
}

TEST_F(CpuBackendTest, CopyScalarsAndEmpty) {
  float a = 1.5f, b = 0.0f;
  backend_->copy(Tensor(&b, DType::kF32, {}), Tensor(&a, DType::kF32, {}), stream());
  stream().synchronize();
  EXPECT_EQ(b, 1.5f);
  uint16_t h = 0;
  backend_->copy(Tensor(&h, DType::kBF16, {}), Tensor(&a, DType::kF32, {}), stream());
  stream().synchronize();
  EXPECT_EQ(h, float_to_bf16_bits(1.5f));
  EXPECT_NO_THROW(backend_->copy(Tensor(nullptr, DType::kF32, {0, 3}),
                                 Tensor(nullptr, DType::kBF16, {0, 3}), stream()));
}

TEST_F(CpuBackendTest, CopyChecksShapesAndDevices) {
  OwnedTensor a = empty_host({2, 3}, DType::kF32);
  OwnedTensor b = empty_host({3, 2}, DType::kF32);
  EXPECT_THAT(error_of([&] { backend_->copy(a, b, stream()); }),
              HasSubstr("destination f32[2, 3] strides [3, 1] on cpu and source f32[3, 2]"));
  const Tensor on_gpu(a->data(), DType::kF32, {2, 3}, Device::cuda(0));
  EXPECT_THAT(error_of([&] { backend_->copy(on_gpu, a, stream()); }),
              HasSubstr("cannot touch copy destination on cuda:0"));
  EXPECT_THAT(error_of([&] { backend_->copy(a, on_gpu, stream()); }),
              HasSubstr("cannot touch copy source on cuda:0"));
}

// --- fill ------------------------------------------------------------------------------------

TEST_F(CpuBackendTest, FillStridedLeavesTheRestAlone) {
  for (DType dtype : kFloatDTypes) {
    SCOPED_TRACE(fmt::format("{}", dtype));
    OwnedTensor storage = empty_host({4, 5}, dtype);
    testing::fill_value(storage, -1.0f);
    const Tensor inner = storage->narrow(0, 1, 2).narrow(1, 1, 3);  // [2, 3] of [4, 5]
    backend_->fill(inner, 2.5f, stream());
    for (int64_t r = 0; r < 4; ++r) {
      for (int64_t c = 0; c < 5; ++c) {
        const bool in = r >= 1 && r < 3 && c >= 1 && c < 4;
        EXPECT_EQ(get(storage, r * 5 + c), in ? 2.5f : -1.0f) << "at [" << r << ", " << c << "]";
      }
    }
  }
}

TEST_F(CpuBackendTest, FillRoundsIntoTheDtype) {
  OwnedTensor t = empty_host({3}, DType::kBF16);
  backend_->fill(t, 1.0f / 3.0f, stream());
  for (int64_t i = 0; i < 3; ++i)
    EXPECT_EQ(bits_at(t, i), float_to_bf16_bits(1.0f / 3.0f));
  float scalar = 0;
  backend_->fill(Tensor(&scalar, DType::kF32, {}), 7.0f, stream());
  stream().synchronize();
  EXPECT_EQ(scalar, 7.0f);
}

// --- reduce ----------------------------------------------------------------------------------

// f32 sum of the inputs in the order given (then / n for avg), the reference the backend's
// reduction must match bit for bit.
std::vector<float> reduce_in_order(const std::vector<Tensor>& inputs, ReduceOp op) {
  std::vector<float> acc = testing::to_vector(inputs[0]);
  for (size_t i = 1; i < inputs.size(); ++i) {
    const auto row = testing::to_vector(inputs[i]);
    for (size_t j = 0; j < acc.size(); ++j)
      acc[j] += row[j];
  }
  if (op == ReduceOp::kAvg) {
    for (float& v : acc)
      v /= static_cast<float>(inputs.size());
  }
  return acc;
}

TEST_F(CpuBackendTest, ReduceAddsInTheGivenOrderAndRoundsOnce) {
  std::vector<OwnedTensor> owned;
  std::vector<Tensor> inputs;
  for (int i = 0; i < 5; ++i) {
    // Mixed layouts and dtypes: every input is read as f32.
    owned.push_back(i % 2 == 0
                        ? testing::empty_transposed({3, 7}, DType::kF32)
                        : testing::empty_padded({3, 7}, i == 3 ? DType::kBF16 : DType::kF32, 2));
    fill_seeded(owned.back(), seed_of({5, static_cast<uint64_t>(i)}), Values::kRandom);
    inputs.push_back(owned.back());
  }
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    for (DType out_dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(fmt::format("{} into {}", reduce_op_name(op), out_dtype));
      OwnedTensor out = testing::empty_padded({3, 7}, out_dtype, 1);
      backend_->reduce(out, inputs, op, stream());
      const auto expected = reduce_in_order(inputs, op);
      for (int64_t j = 0; j < 21; ++j) {
        OwnedTensor one = empty_host({1}, out_dtype);
        testing::set(one, 0, expected[j]);
        ASSERT_EQ(bits_at(out, j), bits_at(one, 0)) << "element " << j;
      }
      // The same inputs in the same order: the same bits again.
      OwnedTensor again = empty_host({3, 7}, out_dtype);
      backend_->reduce(again, inputs, op, stream());
      EXPECT_TRUE(same_bits(again, out));
    }
  }
}

// The split matmul_reduce_scatter's reduction: it waits for every flag but the skipped one,
// then reduces as reduce() does; a flag that never comes up is a TimeoutError naming the rank,
// the peer (the flag's index) and the channel.
TEST_F(CpuBackendTest, ReduceWhenFlaggedWaitsForEveryFlagButTheSkippedOne) {
  std::vector<OwnedTensor> ins;
  std::vector<Tensor> views;
  for (int j = 0; j < 3; ++j) {
    ins.push_back(empty_host({5}, DType::kBF16));
    fill_seeded(ins.back(), seed_of({61, static_cast<uint64_t>(j)}), Values::kRandom);
    views.push_back(ins.back());
  }
  OwnedTensor want = empty_host({5}, DType::kBF16);
  backend_->reduce(want, views, ReduceOp::kSum, stream());
  uint32_t flags[3] = {0, 0, 0};
  Backend::FlagWait wait;
  wait.flags = flags;
  wait.count = 3;
  wait.skip = 1;
  wait.timeout = std::chrono::milliseconds(50);
  wait.rank = 1;
  wait.channel = 5;
  backend_->write_flag(&flags[0], 1, stream());
  OwnedTensor got = empty_host({5}, DType::kBF16);
  // The wait runs on the stream; its timeout surfaces at the stream's next synchronize.
  auto reduce_now = [&] {
    backend_->reduce_when_flagged(got, views, ReduceOp::kSum, wait, stream());
    stream().synchronize();
  };
  EXPECT_THAT(reduce_now,
              ::testing::ThrowsMessage<TimeoutError>(::testing::AllOf(
                  HasSubstr("rank 1"), HasSubstr("partial of rank 2"), HasSubstr("channel 5"))));
  // A flag is up for op `value` (1 here) when it holds that number or the next (a peer one op
  // ahead), not any other.
  backend_->write_flag(&flags[2], 7, stream());
  EXPECT_THROW(reduce_now(), TimeoutError);
  backend_->write_flag(&flags[2], 2, stream());
  reduce_now();
  EXPECT_TRUE(same_bits(got, want));
  EXPECT_EQ(flags[1], 0u) << "the skipped flag is left alone";
}

TEST_F(CpuBackendTest, ReduceOrderIsTheOneGiven) {
  // Values chosen so that the f32 sum depends on the order: (big + small) - big != small.
  float big = 1e8f, small = 1.0f, minus_big = -1e8f;
  const Tensor tb(&big, DType::kF32, {1}), ts(&small, DType::kF32, {1}),
      tm(&minus_big, DType::kF32, {1});
  float out = -1;
  const Tensor to(&out, DType::kF32, {1});
  const Tensor order1[] = {tb, ts, tm};
  backend_->reduce(to, order1, ReduceOp::kSum, stream());
  stream().synchronize();
  EXPECT_EQ(out, 0.0f);  // 1e8 + 1 rounds back to 1e8
  const Tensor order2[] = {tb, tm, ts};
  backend_->reduce(to, order2, ReduceOp::kSum, stream());
  stream().synchronize();
  EXPECT_EQ(out, 1.0f);
  backend_->reduce(to, order2, ReduceOp::kAvg, stream());
  stream().synchronize();
  EXPECT_EQ(out, 1.0f / 3.0f);
}

TEST_F(CpuBackendTest, ReduceThreeDimensionalStrided) {
  OwnedTensor storage = empty_host({2, 3, 4, 5}, DType::kF32);
  fill_seeded(storage, seed_of({6}), Values::kSmallInts);
  std::vector<Tensor> inputs;
  for (int i = 0; i < 2; ++i)
    inputs.push_back(storage->select(0, i).permute({2, 0, 1}));  // [5,3,4]
  OwnedTensor out = empty_host({5, 3, 4}, DType::kF32);
  backend_->reduce(out, inputs, ReduceOp::kSum, stream());
  const auto expected = reduce_in_order(inputs, ReduceOp::kSum);
  for (int64_t j = 0; j < out->numel(); ++j)
    ASSERT_EQ(get(out, j), expected[j]) << "element " << j;
}

TEST_F(CpuBackendTest, ReduceChecksItsInputs) {
  OwnedTensor out = empty_host({2, 3}, DType::kF32);
  OwnedTensor good = empty_host({2, 3}, DType::kF32);
  OwnedTensor bad = empty_host({3, 2}, DType::kF32);
  EXPECT_THAT(error_of([&] { backend_->reduce(out, {}, ReduceOp::kSum, stream()); }),
              HasSubstr("at least one input"));
  const Tensor inputs[] = {good, bad};
  EXPECT_THAT(error_of([&] { backend_->reduce(out, inputs, ReduceOp::kSum, stream()); }),
              HasSubstr("reduce input 1 is f32[3, 2]"));
}

// --- unary -----------------------------------------------------------------------------------

double reference_unary(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::kSilu:
      return x / (1.0 + std::exp(-x));
    case UnaryOp::kRelu:
      return x > 0 ? x : 0.0;
    case UnaryOp::kGelu:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
  }
  return 0;
}

TEST_F(CpuBackendTest, UnaryOpsMatchReference) {
  OwnedTensor in = testing::empty_transposed({6, 8}, DType::kF32);
  for (int64_t i = 0; i < 48; ++i)
    testing::set(in, i, -6.0f + 0.25f * static_cast<float>(i));
  for (UnaryOp op : {UnaryOp::kSilu, UnaryOp::kRelu, UnaryOp::kGelu}) {
    SCOPED_TRACE(static_cast<int>(op));
    OwnedTensor out = testing::empty_padded({6, 8}, DType::kF32, 3);
    backend_->unary(op, out, in, stream());
    for (int64_t i = 0; i < 48; ++i) {
      const double x = get(in, i);
      EXPECT_NEAR(get(out, i), reference_unary(op, x), 2e-6 * (1.0 + std::fabs(x))) << "x = " << x;
    }
  }
}

TEST_F(CpuBackendTest, UnaryEdgeCasesAndDtypes) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float xs[] = {nan, -0.0f, -3.0f, 2.0f};
  float ys[4];
  backend_->unary(UnaryOp::kRelu, Tensor(ys, DType::kF32, {4}), Tensor(xs, DType::kF32, {4}),
                  stream());
  stream().synchronize();
  EXPECT_TRUE(std::isnan(ys[0]));
  EXPECT_EQ(ys[2], 0.0f);
  EXPECT_EQ(ys[3], 2.0f);
  // bf16 in, f16 out: computed in f32 and rounded once.
  OwnedTensor in = empty_host({5}, DType::kBF16);
  OwnedTensor out = empty_host({5}, DType::kF16);
  fill_seeded(in, seed_of({7}), Values::kRandom);
  backend_->unary(UnaryOp::kSilu, out, in, stream());
  for (int64_t i = 0; i < 5; ++i) {
    const float x = get(in, i);
    EXPECT_EQ(bits_at(out, i), float_to_f16_bits(x / (1.0f + std::exp(-x))));
  }
  EXPECT_THAT(error_of([&] {
                backend_->unary(UnaryOp::kGelu, Tensor(ys, DType::kF32, {2, 2}),
                                Tensor(xs, DType::kF32, {4}), stream());
              }),
              HasSubstr("output f32[2, 2] strides [2, 1] on cpu and input f32[4]"));
}

// --- swiglu ----------------------------------------------------------------------------------

// out[.., j] = silu(g) * u, g = gate_up[.., j], u = gate_up[.., N + j], in f32, rounded once:
// strided operands (a column-major gate_up, a padded out), 3-D, and mixed dtypes.
TEST_F(CpuBackendTest, SwigluTakesTheGateThenTheUpHalf) {
  struct Case {
    Dims out_shape;
    DType in_dtype, out_dtype;
    bool strided;
  };
  for (const Case& c : {Case{{6, 5}, DType::kF32, DType::kF32, true},
                        Case{{2, 3, 8}, DType::kBF16, DType::kF16, false},
                        Case{{7, 4}, DType::kF16, DType::kBF16, true}}) {
    SCOPED_TRACE(fmt::format("out {}{}, in {}", c.out_dtype, c.out_shape, c.in_dtype));
    Dims in_shape = c.out_shape;
    const int64_t n = c.out_shape[c.out_shape.size() - 1];
    in_shape[in_shape.size() - 1] = 2 * n;
    OwnedTensor in = c.strided ? testing::empty_transposed(in_shape, c.in_dtype)
                               : empty_host(in_shape, c.in_dtype);
    fill_seeded(in, seed_of({11}), Values::kRandom);
    OwnedTensor out = c.strided ? testing::empty_padded(c.out_shape, c.out_dtype, 3)
                                : empty_host(c.out_shape, c.out_dtype);
    backend_->swiglu(out, in, stream());
    stream().synchronize();
    OwnedTensor expected = empty_host(c.out_shape, c.out_dtype);
    for (int64_t i = 0; i < expected->numel(); ++i) {
      const float g = get(in, i / n * 2 * n + i % n);
      const float u = get(in, i / n * 2 * n + n + i % n);
      testing::set(expected, i, g / (1.0f + std::exp(-g)) * u);
    }
    EXPECT_TRUE(same_bits(out, expected));
  }
}

TEST_F(CpuBackendTest, SwigluChecksItsShapes) {
  OwnedTensor in = empty_host({4, 6}, DType::kF32);
  OwnedTensor out = empty_host({4, 4}, DType::kF32);
  EXPECT_THAT(error_of([&] { backend_->swiglu(out, in, stream()); }),
              HasSubstr("swiglu: gate_up must be [4, 8] for out f32[4, 4]"));
  OwnedTensor ints = empty_host({4, 8}, DType::kI64);
  EXPECT_THAT(error_of([&] { backend_->swiglu(out, ints, stream()); }),
              HasSubstr("is not f32, bf16 or f16"));
}

// [dG | dU] with dG = d * u * s * (1 + g * (1 - s)), s = sigmoid(g), and dU = d * silu(g), in f32,
// each rounded once: strided operands (a column-major gate_up, a padded grad_out, a
// column-major grad_gate_up), 3-D, and a dtype of each operand's own.
TEST_F(CpuBackendTest, SwigluBackwardGivesTheGateThenTheUpGradient) {
  struct Case {
    Dims out_shape;
    DType in_dtype, grad_dtype, out_dtype;
    bool strided;
  };
  for (const Case& c : {Case{{6, 5}, DType::kF32, DType::kF32, DType::kF32, true},
                        Case{{2, 3, 8}, DType::kBF16, DType::kBF16, DType::kBF16, false},
                        Case{{7, 4}, DType::kF16, DType::kBF16, DType::kF32, true}}) {
    SCOPED_TRACE(fmt::format("grad_out {}{}, gate_up {}, grad_gate_up {}", c.grad_dtype,
                             c.out_shape, c.in_dtype, c.out_dtype));
    Dims in_shape = c.out_shape;
    const int64_t n = c.out_shape[c.out_shape.size() - 1];
    in_shape[in_shape.size() - 1] = 2 * n;
    OwnedTensor in = c.strided ? testing::empty_transposed(in_shape, c.in_dtype)
                               : empty_host(in_shape, c.in_dtype);
    fill_seeded(in, seed_of({12}), Values::kRandom);
    OwnedTensor d = c.strided ? testing::empty_padded(c.out_shape, c.grad_dtype, 3)
                              : empty_host(c.out_shape, c.grad_dtype);
    fill_seeded(d, seed_of({13}), Values::kRandom);
    OwnedTensor out = c.strided ? testing::empty_transposed(in_shape, c.out_dtype)
                                : empty_host(in_shape, c.out_dtype);
    backend_->swiglu_backward(out, d, in, stream());
    stream().synchronize();
    OwnedTensor expected = empty_host(in_shape, c.out_dtype);
    for (int64_t i = 0; i < d->numel(); ++i) {
      const int64_t gi = i / n * 2 * n + i % n;
      const float g = get(in, gi), u = get(in, gi + n), dv = get(d, i);
      const float s = 1.0f / (1.0f + std::exp(-g));
      testing::set(expected, gi, dv * u * (s * (1.0f + g * (1.0f - s))));
      testing::set(expected, gi + n, dv * (g / (1.0f + std::exp(-g))));
    }
    EXPECT_TRUE(same_bits(out, expected));
  }
}

TEST_F(CpuBackendTest, SwigluBackwardChecksItsShapes) {
  OwnedTensor in = empty_host({4, 8}, DType::kF32);
  OwnedTensor d = empty_host({4, 4}, DType::kF32);
  OwnedTensor narrow = empty_host({4, 4}, DType::kF32);
  EXPECT_THAT(
      error_of([&] { backend_->swiglu_backward(narrow, d, in, stream()); }),
      HasSubstr("swiglu_backward: grad_gate_up must be [4, 8] like gate_up, got f32[4, 4]"));
  OwnedTensor out = empty_host({4, 8}, DType::kF32);
  OwnedTensor wide = empty_host({4, 8}, DType::kF32);
  EXPECT_THAT(error_of([&] { backend_->swiglu_backward(out, wide, in, stream()); }),
              HasSubstr("swiglu_backward: gate_up must be [4, 16] for grad_out f32[4, 8]"));
  OwnedTensor ints = empty_host({4, 8}, DType::kI64);
  EXPECT_THAT(
      error_of([&] { backend_->swiglu_backward(ints, d, in, stream()); }),
      ::testing::AllOf(HasSubstr("grad_gate_up i64[4, 8]"), HasSubstr("is not f32, bf16 or f16")));
}

// --- streams and events ----------------------------------------------------------------------

TEST_F(CpuBackendTest, EventsMeasureNonNegativeTime) {
  auto start = backend_->create_event();
  auto end = backend_->create_event();
  auto side = backend_->create_stream("test side");
  start->record(stream());
  OwnedTensor a = empty_host({64, 64}, DType::kF32);
  OwnedTensor d = empty_host({64, 64}, DType::kF32);
  fill_seeded(a, seed_of({8}), Values::kRandom);
  backend_->gemm({a, a, d}, stream());
  end->record(stream());
  end->block(*side);
  side->synchronize();
  end->synchronize();
  backend_->synchronize();
  EXPECT_GE(end->elapsed_ms(*start), 0.0f);
  EXPECT_GE(start->elapsed_ms(*start), 0.0f);
  auto never = backend_->create_event();
  EXPECT_THAT(error_of([&] { never->elapsed_ms(*start); }), HasSubstr("never recorded"));
  EXPECT_THAT(error_of([&] { end->elapsed_ms(*never); }), HasSubstr("never recorded"));
}

// A stream's failure names the stream by its index (0 is the compute stream) and the role it was
// created for.
TEST_F(CpuBackendTest, AStreamsFailureNamesItsRole) {
  auto side = backend_->create_stream("test side");
  cpu::as_cpu(*side, "test").enqueue("test item", [] { ASYNCTP_FAIL("boom"); });
  EXPECT_THAT(error_of([&] { side->synchronize(); }),
              HasSubstr("[on cpu stream 1 (test side), in test item]"));
}

// --- communicator checks ---------------------------------------------------------------------

TEST(CommunicatorValidationTest, AllGather) {
  OwnedTensor in = empty_host({2, 3}, DType::kF32);
  OwnedTensor out = empty_host({6, 3}, DType::kF32);
  EXPECT_NO_THROW(validate_all_gather(out, in, 3));
  EXPECT_THAT(error_of([&] { validate_all_gather(out, in, 2); }),
              HasSubstr("output must be [4, 3] for input f32[2, 3]"));
  OwnedTensor bf = empty_host({6, 3}, DType::kBF16);
  EXPECT_THAT(error_of([&] { validate_all_gather(bf, in, 3); }),
              HasSubstr("input is f32 but output is bf16"));
  EXPECT_THAT(error_of([&] { validate_all_gather(out, in->t(), 3); }), HasSubstr("contiguous"));
  EXPECT_THAT(error_of([&] { validate_all_gather(out, Tensor(), 3); }), HasSubstr("must be given"));
}

TEST(CommunicatorValidationTest, ReduceScatter) {
  OwnedTensor in = empty_host({6, 3}, DType::kF32);
  OwnedTensor out = empty_host({2, 3}, DType::kF32);
  EXPECT_NO_THROW(validate_reduce_scatter(out, in, 3));
  EXPECT_THAT(error_of([&] { validate_reduce_scatter(out, in, 4); }),
              HasSubstr("input dim 0 (6) is not divisible by the world size 4"));
  EXPECT_THAT(error_of([&] { validate_reduce_scatter(out, in, 2); }),
              HasSubstr("output must be [3, 3] for input f32[6, 3]"));
  OwnedTensor flat = empty_host({6}, DType::kF32);
  EXPECT_THAT(error_of([&] { validate_reduce_scatter(out, flat, 3); }),
              HasSubstr("must have the same rank"));
}

}  // namespace
}  // namespace asynctp
