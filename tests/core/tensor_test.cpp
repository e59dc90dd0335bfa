// Dims and Tensor views. Every expected shape and stride below is what PyTorch gives for the same
// call on a tensor with the same shape and strides (torch.empty_strided(...).op(...).stride()).
#include <asynctp/tensor.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <vector>

#include "core/error.h"

namespace asynctp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// A backing store large enough for every view made here; tensors only point into it.
struct Arena {
  alignas(64) std::array<std::byte, 1 << 14> bytes{};
  void* data() { return bytes.data(); }
};

std::ptrdiff_t offset_bytes(const Tensor& view, const Tensor& base) {
  return static_cast<const std::byte*>(view.data()) - static_cast<const std::byte*>(base.data());
}

// ---------------------------------------------------------------------------------------------
// Dims

TEST(Dims, ConstructionAndAccess) {
  Dims d{2, 3, 4};
  EXPECT_EQ(d.size(), 3);
  EXPECT_FALSE(d.empty());
  EXPECT_EQ(d[0], 2);
  EXPECT_EQ(d.back(), 4);
  EXPECT_EQ(d.product(), 24);
  EXPECT_EQ(d.to_string(), "[2, 3, 4]");
  EXPECT_EQ(fmt::format("{}", d), "[2, 3, 4]");
  EXPECT_EQ(std::vector<int64_t>(d.begin(), d.end()), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(d.span().size(), 3u);

  Dims empty;
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(empty.product(), 1);  // a scalar has one element
  EXPECT_EQ(empty.to_string(), "[]");
  EXPECT_EQ(Dims::filled(3, 7), (Dims{7, 7, 7}));
  EXPECT_EQ(Dims::filled(0, 7), Dims{});
}

TEST(Dims, EditingAndEquality) {
  Dims d{2, 3};
  d.push_back(4);
  EXPECT_EQ(d, (Dims{2, 3, 4}));
  d.insert(0, 1);
  EXPECT_EQ(d, (Dims{1, 2, 3, 4}));
  d.insert(2, 9);
  EXPECT_EQ(d, (Dims{1, 2, 9, 3, 4}));
  d.insert(5, 8);
  EXPECT_EQ(d, (Dims{1, 2, 9, 3, 4, 8}));
  d.erase(2);
  EXPECT_EQ(d, (Dims{1, 2, 3, 4, 8}));
  d.erase(4);
  EXPECT_EQ(d, (Dims{1, 2, 3, 4}));
  d[3] = 5;
  EXPECT_EQ(d, (Dims{1, 2, 3, 5}));
  EXPECT_NE(d, (Dims{1, 2, 3}));
  EXPECT_NE(d, (Dims{1, 2, 3, 6}));
  EXPECT_EQ(Dims{0}.product(), 0);
}

TEST(Dims, CapacityErrorsNameTheSize) {
  const std::vector<int64_t> nine(9, 1);
  const std::span<const int64_t> values(nine);
  EXPECT_THAT([&] { Dims d(values); },
              ThrowsMessage<Error>(HasSubstr("at most 8 dims are supported, got 9")));
  EXPECT_THAT([] { Dims::filled(9, 1); },
              ThrowsMessage<Error>(HasSubstr("at most 8 dims are supported, got 9")));
  EXPECT_THAT([] { Dims::filled(-1, 1); }, ThrowsMessage<Error>(HasSubstr("dims size -1")));
  Dims full = Dims::filled(kMaxDims, 1);
  EXPECT_THAT([&] { full.push_back(1); }, ThrowsMessage<Error>(HasSubstr("at most 8 dims")));
  EXPECT_THAT([&] { full.insert(0, 1); }, ThrowsMessage<Error>(HasSubstr("at most 8 dims")));
  EXPECT_EQ(full.size(), kMaxDims);
}

// ---------------------------------------------------------------------------------------------
// Construction and properties

TEST(Tensor, ContiguousStrides) {
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Dims{12, 4, 1}));
  EXPECT_EQ(contiguous_strides({5}), (Dims{1}));
  EXPECT_EQ(contiguous_strides({}), Dims{});
  EXPECT_EQ(contiguous_strides({1, 1}), (Dims{1, 1}));
  // Size-0 dims count as 1, as in torch: empty(2, 0, 3).stride() == (3, 3, 1).
  EXPECT_EQ(contiguous_strides({2, 0, 3}), (Dims{3, 3, 1}));
  EXPECT_EQ(contiguous_strides({0}), (Dims{1}));
}

TEST(Tensor, PropertiesOfAContiguousTensor) {
  Arena arena;
  Tensor t(arena.data(), DType::kBF16, {4, 8});
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.data(), arena.data());
  EXPECT_EQ(t.data_as<uint16_t>(), static_cast<uint16_t*>(arena.data()));
  EXPECT_EQ(t.dtype(), DType::kBF16);
  EXPECT_EQ(t.device(), Device::cpu());
  EXPECT_EQ(t.dim(), 2);
  EXPECT_EQ(t.shape(), (Dims{4, 8}));
  EXPECT_EQ(t.strides(), (Dims{8, 1}));
  EXPECT_EQ(t.size(0), 4);
  EXPECT_EQ(t.size(-1), 8);
  EXPECT_EQ(t.stride(-2), 8);
  EXPECT_EQ(t.numel(), 32);
  EXPECT_EQ(t.element_size(), 2u);
  EXPECT_EQ(t.nbytes(), 64u);
  EXPECT_EQ(t.extent_bytes(), 64u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.describe(), "bf16[4, 8] strides [8, 1] on cpu");
}

TEST(Tensor, UndefinedAndScalarTensors) {
  Tensor undefined;
  EXPECT_FALSE(undefined.defined());
  EXPECT_EQ(undefined.describe(), "undefined tensor");

  float value = 3.0f;
  Tensor scalar(&value, DType::kF32, Dims{});
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.nbytes(), 4u);
  EXPECT_EQ(scalar.extent_bytes(), 4u);
  EXPECT_TRUE(scalar.is_contiguous());
  EXPECT_EQ(scalar.describe(), "f32[] strides [] on cpu");
  EXPECT_THAT([&] { scalar.size(0); },
              ThrowsMessage<Error>(HasSubstr("dim 0 out of range for a tensor of rank 0")));
}

TEST(Tensor, DevicesAndDescribe) {
  EXPECT_EQ(Device::cpu().to_string(), "cpu");
  EXPECT_EQ(Device::cuda(3).to_string(), "cuda:3");
  EXPECT_TRUE(Device::cuda(0).is_cuda());
  EXPECT_FALSE(Device::cuda(0).is_cpu());
  EXPECT_NE(Device::cuda(0), Device::cuda(1));
  EXPECT_NE(Device::cuda(0), Device::cpu());
  Arena arena;
  Tensor t(arena.data(), DType::kF8E4M3, {2, 3}, {1, 2}, Device::cuda(1));
  EXPECT_EQ(t.device(), Device::cuda(1));
  EXPECT_EQ(t.describe(), "f8e4m3[2, 3] strides [1, 2] on cuda:1");
}

TEST(Tensor, ConstructorErrorsNameTheValue) {
  Arena arena;
  EXPECT_THAT(
      [&] {
        Tensor(arena.data(), DType::kF32, {2, 3}, {1});
      },
      ThrowsMessage<Error>(HasSubstr("shape [2, 3] and strides [1] differ in rank")));
  EXPECT_THAT(
      [&] {
        Tensor(arena.data(), DType::kF32, {2, -3});
      },
      ThrowsMessage<Error>(HasSubstr("negative size -3 in dim 1 of shape [2, -3]")));
  EXPECT_THAT(
      [&] {
        Tensor(arena.data(), DType::kF32, {2, 3}, {3, -1});
      },
      ThrowsMessage<Error>(HasSubstr("negative stride -1 in dim 1 (strides [3, -1])")));
  EXPECT_THAT(
      [] {
        Tensor(nullptr, DType::kF32, {2, 3});
      },
      ThrowsMessage<Error>(HasSubstr("null data pointer for a tensor of shape [2, 3]")));
  // An empty tensor needs no memory.
  Tensor empty(nullptr, DType::kF32, {0, 3});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.extent_bytes(), 0u);
  // Errors carry the source location and the failed condition.
  EXPECT_THAT([] { Tensor(nullptr, DType::kF32, {1}); },
              ThrowsMessage<Error>(AllOf(HasSubstr("src/core/tensor.cpp:"),
                                         HasSubstr("check failed: data != nullptr"))));
}

TEST(Tensor, WrapDim) {
  Arena arena;
  Tensor t(arena.data(), DType::kF32, {2, 3, 4});
  EXPECT_EQ(t.wrap_dim(0), 0);
  EXPECT_EQ(t.wrap_dim(2), 2);
  EXPECT_EQ(t.wrap_dim(-1), 2);
  EXPECT_EQ(t.wrap_dim(-3), 0);
  EXPECT_THAT([&] { t.wrap_dim(3); },
              ThrowsMessage<Error>(HasSubstr("dim 3 out of range for a tensor of rank 3")));
  EXPECT_THAT([&] { t.wrap_dim(-4); },
              ThrowsMessage<Error>(HasSubstr("dim -4 out of range for a tensor of rank 3")));
  EXPECT_THAT([&] { t.stride(7); }, ThrowsMessage<Error>(HasSubstr("dim 7 out of range")));
}

TEST(Tensor, IsContiguous) {
  Arena arena;
  Tensor t(arena.data(), DType::kF32, {2, 3, 4});
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_FALSE(t.transpose(0, 1).is_contiguous());
  EXPECT_TRUE(t.narrow(0, 1, 1).is_contiguous());
  EXPECT_FALSE(t.narrow(2, 0, 2).is_contiguous());
  EXPECT_TRUE(t.select(0, 1).is_contiguous());
  EXPECT_FALSE(t.select(1, 1).is_contiguous());
  // Strides of size-1 dims do not matter, as in torch.
  EXPECT_TRUE(Tensor(arena.data(), DType::kF32, {1, 4}, {100, 1}).is_contiguous());
  EXPECT_TRUE(Tensor(arena.data(), DType::kF32, {3, 1, 4}, {4, 0, 1}).is_contiguous());
  // Broadcast (stride 0) dims are not contiguous.
  EXPECT_FALSE(Tensor(arena.data(), DType::kF32, {3, 4}, {0, 1}).is_contiguous());
  // An empty tensor is contiguous whatever its strides (torch: numel == 0 -> contiguous).
  EXPECT_TRUE(t.narrow(2, 0, 0).is_contiguous());
  EXPECT_TRUE(t.narrow(1, 1, 0).is_contiguous());
  EXPECT_TRUE(Tensor(nullptr, DType::kF32, {2, 0}, {1, 7}).is_contiguous());
}

TEST(Tensor, ExtentBytes) {
  Arena arena;
  Tensor t(arena.data(), DType::kF32, {2, 4});
  EXPECT_EQ(t.extent_bytes(), 32u);
  EXPECT_EQ(t.t().extent_bytes(), 32u);
  // [2, 2] of a [2, 4] row-major buffer: last element at 1*4 + 1*1.
  EXPECT_EQ(t.narrow(1, 0, 2).extent_bytes(), 24u);
  EXPECT_EQ(t.narrow(1, 0, 0).extent_bytes(), 0u);
  EXPECT_EQ(Tensor(arena.data(), DType::kF16, {3, 4}, {0, 1}).extent_bytes(), 8u);
}

// ---------------------------------------------------------------------------------------------
// Views

TEST(TensorViews, Narrow) {
  Arena arena;
  Tensor t(arena.data(), DType::kF32, {4, 6});
  Tensor rows = t.narrow(0, 1, 2);
  EXPECT_EQ(rows.shape(), (Dims{2, 6}));
  EXPECT_EQ(rows.strides(), (Dims{6, 1}));
  EXPECT_EQ(offset_bytes(rows, t), 6 * 4);
  Tensor cols = t.narrow(-1, 2, 3);
  EXPECT_EQ(cols.shape(), (Dims{4, 3}));
  EXPECT_EQ(cols.strides(), (Dims{6, 1}));
  EXPECT_EQ(offset_bytes(cols, t), 2 * 4);
  EXPECT_EQ(t.narrow(0, 4, 0).numel(), 0);  // empty at the end is allowed
  EXPECT_EQ(t.narrow(1, 0, 6).shape(), t.shape());
  // Narrowing a narrowed view offsets from the view.
  EXPECT_EQ(offset_bytes(rows.narrow(1, 1, 2), t), (6 + 1) * 4);
  EXPECT_EQ(rows.dtype(), DType::kF32);
  EXPECT_EQ(rows.device(), t.device());
}

TEST(TensorViews, NarrowErrorsNameTheArguments) {
  Arena arena;
  Tensor t(arena.data(), DType::kF32, {2, 4});
  EXPECT_THAT(
      [&] { t.narrow(1, 2, 3); },
      ThrowsMessage<Error>(HasSubstr(
          "narrow(dim=1, start=2, length=3) out of range for f32[2, 4] strides [4, 1] on cpu")));
  EXPECT_THAT([&] { t.narrow(0, -1, 1); },
              ThrowsMessage<Error>(HasSubstr("narrow(dim=0, start=-1, length=1)")));
  EXPECT_THAT([&] { t.narrow(0, 0, -1); },
              ThrowsMessage<Error>(HasSubstr("narrow(dim=0, start=0, length=-1)")));
  EXPECT_THAT([&] { t.narrow(0, 3, 0); },
              ThrowsMessage<Error>(HasSubstr("narrow(dim=0, start=3, length=0)")));
  EXPECT_THAT([&] { t.narrow(2, 0, 1); }, ThrowsMessage<Error>(HasSubstr("dim 2 out of range")));
}

TEST(TensorViews, Select) {
  Arena arena;
  Tensor t(arena.data(), DType::kBF16, {2, 3, 4});
  Tensor s0 = t.select(0, 1);
  EXPECT_EQ(s0.shape(), (Dims{3, 4}));
  EXPECT_EQ(s0.strides(), (Dims{4, 1}));
  EXPECT_EQ(offset_bytes(s0, t), 12 * 2);
  Tensor s1 = t.select(1, 2);
  EXPECT_EQ(s1.shape(), (Dims{2, 4}));
  EXPECT_EQ(s1.strides(), (Dims{12, 1}));
  EXPECT_EQ(offset_bytes(s1, t), 8 * 2);
  Tensor s2 = t.select(-1, 3);
  EXPECT_EQ(s2.shape(), (Dims{2, 3}));
  EXPECT_EQ(s2.strides(), (Dims{12, 4}));
  EXPECT_EQ(offset_bytes(s2, t), 3 * 2);
  Tensor scalar = s2.select(0, 1).select(0, 2);
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(offset_bytes(scalar, t), (12 + 8 + 3) * 2);
  EXPECT_THAT(
      [&] { t.select(1, 3); },
      ThrowsMessage<Error>(HasSubstr("select(dim=1, index=3) out of range for bf16[2, 3, 4]")));
  EXPECT_THAT([&] { t.select(3, 0); }, ThrowsMessage<Error>(HasSubstr("dim 3 out of range")));
}

TEST(TensorViews, TransposeAndT) {
  Arena arena;
  Tensor t(arena.data(), DType::kF32, {2, 3, 4});
  Tensor tr = t.transpose(0, 2);
  EXPECT_EQ(tr.shape(), (Dims{4, 3, 2}));
  EXPECT_EQ(tr.strides(), (Dims{1, 4, 12}));
  EXPECT_EQ(tr.data(), t.data());
  EXPECT_EQ(t.transpose(-1, -2).shape(), (Dims{2, 4, 3}));
  EXPECT_EQ(t.transpose(-1, -2).strides(), (Dims{12, 1, 4}));
  EXPECT_EQ(t.transpose(1, 1).strides(), t.strides());
  Tensor m(arena.data(), DType::kF32, {3, 5});
  EXPECT_EQ(m.t().shape(), (Dims{5, 3}));
  EXPECT_EQ(m.t().strides(), (Dims{1, 5}));
  EXPECT_EQ(m.t().t().strides(), m.strides());
  EXPECT_THAT([&] { t.transpose(0, 3); }, ThrowsMessage<Error>(HasSubstr("dim 3 out of range")));
}

TEST(TensorViews, Permute) {
  Arena arena;
  Tensor t(arena.data(), DType::kF32, {2, 3, 4});
  Tensor p = t.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Dims{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Dims{1, 12, 4}));
  Tensor q = t.permute({-1, -3, -2});
  EXPECT_EQ(q.shape(), p.shape());
  EXPECT_EQ(q.strides(), p.strides());
  EXPECT_EQ(t.permute({0, 1, 2}).strides(), t.strides());
  const std::array<int, 3> order{1, 2, 0};
  EXPECT_EQ(t.permute(std::span<const int>(order)).shape(), (Dims{3, 4, 2}));
  EXPECT_THAT(
      [&] {
        t.permute({1, 0});
      },
      ThrowsMessage<Error>(HasSubstr("permute order of 2 dims for f32[2, 3, 4]")));
  EXPECT_THAT(
      [&] {
        t.permute({0, 1, 0});
      },
      ThrowsMessage<Error>(HasSubstr("permute order repeats dim 0")));
  EXPECT_THAT(
      [&] {
        t.permute({0, -3, 1});
      },
      ThrowsMessage<Error>(HasSubstr("permute order repeats dim 0")));
  EXPECT_THAT([&] { t.permute({0, 1, 3}); }, ThrowsMessage<Error>(HasSubstr("dim 3 out of range")));
}

TEST(TensorViews, Movedim) {
  Arena arena;
  Tensor t(arena.data(), DType::kF32, {2, 3, 4});
  Tensor a = t.movedim(0, 2);
  EXPECT_EQ(a.shape(), (Dims{3, 4, 2}));
  EXPECT_EQ(a.strides(), (Dims{4, 1, 12}));
  Tensor b = t.movedim(-1, 0);
  EXPECT_EQ(b.shape(), (Dims{4, 2, 3}));
  EXPECT_EQ(b.strides(), (Dims{1, 12, 4}));
  Tensor c = t.movedim(2, 1);
  EXPECT_EQ(c.shape(), (Dims{2, 4, 3}));
  EXPECT_EQ(c.strides(), (Dims{12, 1, 4}));
  EXPECT_EQ(t.movedim(1, 1).strides(), t.strides());
  EXPECT_EQ(t.movedim(0, 2).movedim(2, 0).strides(), t.strides());
  EXPECT_THAT([&] { t.movedim(0, 3); }, ThrowsMessage<Error>(HasSubstr("dim 3 out of range")));
  EXPECT_THAT([&] { t.movedim(-4, 0); }, ThrowsMessage<Error>(HasSubstr("dim -4 out of range")));
}

TEST(TensorViews, Unsqueeze) {
  Arena arena;
  Tensor t(arena.data(), DType::kF32, {2, 3});
  EXPECT_EQ(t.unsqueeze(0).shape(), (Dims{1, 2, 3}));
  EXPECT_EQ(t.unsqueeze(0).strides(), (Dims{6, 3, 1}));
  EXPECT_EQ(t.unsqueeze(1).shape(), (Dims{2, 1, 3}));
  EXPECT_EQ(t.unsqueeze(1).strides(), (Dims{3, 3, 1}));
  EXPECT_EQ(t.unsqueeze(2).shape(), (Dims{2, 3, 1}));
  EXPECT_EQ(t.unsqueeze(2).strides(), (Dims{3, 1, 1}));
  EXPECT_EQ(t.unsqueeze(-1).strides(), (Dims{3, 1, 1}));
  EXPECT_EQ(t.unsqueeze(-3).strides(), (Dims{6, 3, 1}));
  EXPECT_TRUE(t.unsqueeze(1).is_contiguous());
  // Of a transposed view: torch gives empty(2, 3).t().unsqueeze(1).stride() == (1, 6, 3).
  EXPECT_EQ(t.t().unsqueeze(1).strides(), (Dims{1, 6, 3}));
  float value = 0;
  Tensor scalar(&value, DType::kF32, Dims{});
  EXPECT_EQ(scalar.unsqueeze(0).shape(), (Dims{1}));
  EXPECT_EQ(scalar.unsqueeze(-1).strides(), (Dims{1}));
  EXPECT_THAT([&] { t.unsqueeze(3); },
              ThrowsMessage<Error>(HasSubstr("unsqueeze dim 3 out of range for rank 2")));
  EXPECT_THAT([&] { t.unsqueeze(-4); },
              ThrowsMessage<Error>(HasSubstr("unsqueeze dim -4 out of range for rank 2")));
}

TEST(TensorViews, Flatten) {
  Arena arena;
  Tensor t(arena.data(), DType::kF32, {2, 3, 4});
  EXPECT_EQ(t.flatten().shape(), (Dims{24}));
  EXPECT_EQ(t.flatten().strides(), (Dims{1}));
  EXPECT_EQ(t.flatten(1).shape(), (Dims{2, 12}));
  EXPECT_EQ(t.flatten(1).strides(), (Dims{12, 1}));
  EXPECT_EQ(t.flatten(0, 1).shape(), (Dims{6, 4}));
  EXPECT_EQ(t.flatten(-2, -1).shape(), (Dims{2, 12}));
  EXPECT_EQ(t.flatten(1, 1).shape(), t.shape());
  // Rows of a contiguous tensor stay flattenable; the merged dims must be contiguous together.
  EXPECT_EQ(t.narrow(0, 1, 1).flatten().strides(), (Dims{1}));
  Tensor half = t.narrow(2, 0, 2);  // [2, 3, 2] strides [12, 4, 1]
  EXPECT_EQ(half.flatten(0, 1).shape(), (Dims{6, 2}));
  EXPECT_EQ(half.flatten(0, 1).strides(), (Dims{4, 1}));
  EXPECT_THAT([&] { half.flatten(); },
              ThrowsMessage<Error>(HasSubstr("strides are not compatible")));
  EXPECT_THAT([&] { t.transpose(0, 1).flatten(); },
              ThrowsMessage<Error>(HasSubstr("cannot view f32[3, 2, 4] strides [4, 12, 1]")));
  EXPECT_THAT([&] { t.flatten(2, 1); },
              ThrowsMessage<Error>(HasSubstr("flatten start_dim 2 > end_dim 1")));
  float value = 0;
  Tensor scalar(&value, DType::kF32, Dims{});
  EXPECT_EQ(scalar.flatten().shape(), (Dims{1}));
}

TEST(TensorViews, ViewOfAContiguousTensor) {
  Arena arena;
  Tensor t(arena.data(), DType::kF32, {2, 3, 4});
  EXPECT_EQ(t.view({6, 4}).strides(), (Dims{4, 1}));
  EXPECT_EQ(t.view({-1}).shape(), (Dims{24}));
  EXPECT_EQ(t.view({2, -1}).shape(), (Dims{2, 12}));
  EXPECT_EQ(t.view({4, -1, 3}).shape(), (Dims{4, 2, 3}));
  EXPECT_EQ(t.view({4, -1, 3}).strides(), (Dims{6, 3, 1}));
  EXPECT_EQ(t.view({1, 24, 1}).strides(), (Dims{24, 1, 1}));
  EXPECT_EQ(t.view({2, 3, 4}).strides(), t.strides());
  EXPECT_EQ(t.view({24}).data(), t.data());
}

TEST(TensorViews, ViewErrorsNameTheShapes) {
  Arena arena;
  Tensor t(arena.data(), DType::kF32, {2, 3, 4});
  EXPECT_THAT(
      [&] {
        t.view({-1, -1});
      },
      ThrowsMessage<Error>(HasSubstr("view shape [-1, -1] has more than one -1")));
  EXPECT_THAT(
      [&] {
        t.view({-2, 12});
      },
      ThrowsMessage<Error>(HasSubstr("view shape [-2, 12] has negative size -2")));
  EXPECT_THAT(
      [&] {
        t.view({5, 5});
      },
      ThrowsMessage<Error>(
          HasSubstr("cannot view f32[2, 3, 4] strides [12, 4, 1] on cpu (24 elements) as [5, 5] "
                    "(25 elements)")));
  EXPECT_THAT(
      [&] {
        t.view({5, -1});
      },
      ThrowsMessage<Error>(HasSubstr("cannot view f32[2, 3, 4] strides [12, 4, 1] on cpu "
                                     "as [5, -1]")));
  EXPECT_THAT([&] { t.view({0, -1}); }, ThrowsMessage<Error>(HasSubstr("as [0, -1]")));
}

// The cases where torch's view() refuses (and where it does not) on non-contiguous strides.
TEST(TensorViews, ViewOfStridedTensorsFollowsTorch) {
  Arena arena;
  Tensor t(arena.data(), DType::kF32, {2, 3, 4});
  Tensor tr = t.transpose(0, 1);  // [3, 2, 4] strides [4, 12, 1]
  // Splitting a dim is always possible...
  Tensor split = tr.view({3, 2, 2, 2});
  EXPECT_EQ(split.strides(), (Dims{4, 12, 2, 1}));
  EXPECT_EQ(tr.view({3, 1, 2, 4}).strides(), (Dims{4, 24, 12, 1}));
  // ...merging dims that are not contiguous with each other is not.
  EXPECT_THAT(
      [&] {
        tr.view({3, 8});
      },
      ThrowsMessage<Error>(AllOf(HasSubstr("cannot view f32[3, 2, 4] strides [4, 12, 1]"),
                                 HasSubstr("as [3, 8]"), HasSubstr("strides are not compatible"))));
  EXPECT_THROW(tr.view({6, 4}), Error);
  EXPECT_THROW(tr.view({24}), Error);

  Tensor m(arena.data(), DType::kF32, {4, 3});
  EXPECT_THROW(m.t().view({12}), Error);
  EXPECT_EQ(m.t().view({3, 2, 2}).strides(), (Dims{1, 6, 3}));

  Tensor narrowed = Tensor(arena.data(), DType::kF32, {4, 6}).narrow(1, 1, 4);  // strides [6, 1]
  EXPECT_EQ(narrowed.view({4, 2, 2}).strides(), (Dims{6, 2, 1}));
  EXPECT_EQ(narrowed.view({2, 2, 4}).strides(), (Dims{12, 6, 1}));
  EXPECT_THROW(narrowed.view({16}), Error);
  EXPECT_THROW(narrowed.view({2, 8}), Error);

  // Size-1 dims may carry any stride.
  Tensor odd(arena.data(), DType::kF32, {1, 4}, {100, 1});
  EXPECT_EQ(odd.view({4}).strides(), (Dims{1}));
  EXPECT_EQ(odd.view({2, 2}).strides(), (Dims{2, 1}));

  // Broadcast (stride 0) dims can be split but not merged with real ones.
  Tensor expanded(arena.data(), DType::kF32, {3, 4}, {0, 1});
  EXPECT_EQ(expanded.view({3, 2, 2}).strides(), (Dims{0, 2, 1}));
  EXPECT_THROW(expanded.view({12}), Error);
}

TEST(TensorViews, ViewOfEmptyAndScalarTensors) {
  Tensor empty(nullptr, DType::kF32, {0, 3});
  EXPECT_EQ(empty.view({3, 0}).shape(), (Dims{3, 0}));
  EXPECT_EQ(empty.view({3, 0}).strides(), (Dims{1, 1}));
  EXPECT_EQ(empty.view({-1}).shape(), (Dims{0}));
  EXPECT_EQ(empty.view({2, -1, 3}).shape(), (Dims{2, 0, 3}));
  EXPECT_THROW(empty.view({1}), Error);
  float value = 0;
  Tensor scalar(&value, DType::kF32, Dims{});
  EXPECT_EQ(scalar.view({1, 1}).shape(), (Dims{1, 1}));
  EXPECT_EQ(scalar.view({-1}).shape(), (Dims{1}));
  EXPECT_EQ(scalar.view(Dims{}).dim(), 0);
  EXPECT_EQ(Tensor(&value, DType::kF32, {1, 1}).view(Dims{}).dim(), 0);
}

TEST(TensorViews, ComputeViewStrides) {
  Dims out;
  EXPECT_TRUE(compute_view_strides({2, 3, 4}, {12, 4, 1}, {6, 4}, &out));
  EXPECT_EQ(out, (Dims{4, 1}));
  EXPECT_FALSE(compute_view_strides({3, 2, 4}, {4, 12, 1}, {3, 8}, &out));
  EXPECT_FALSE(compute_view_strides({2, 3}, {3, 1}, {7}, &out));
  EXPECT_TRUE(compute_view_strides({2, 3}, {3, 1}, {1, 2, 1, 3, 1}, &out));
  EXPECT_EQ(out.size(), 5);
  EXPECT_EQ(out[1], 3);
  EXPECT_EQ(out[3], 1);
}

TEST(TensorViews, ChunkFollowsTorch) {
  Arena arena;
  Tensor t(arena.data(), DType::kF32, {10, 2});
  auto sizes = [](const std::vector<Tensor>& chunks) {
    std::vector<int64_t> out;
    for (const auto& c : chunks)
      out.push_back(c.size(0));
    return out;
  };
  // Chunks of ceil(size / chunks); the last one smaller; fewer chunks than asked where the
  // ceil-sized pieces run out (torch.arange(10).chunk(6) gives 5 chunks of 2).
  EXPECT_EQ(sizes(t.chunk(3, 0)), (std::vector<int64_t>{4, 4, 2}));
  EXPECT_EQ(sizes(t.chunk(4, 0)), (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(sizes(t.chunk(5, 0)), (std::vector<int64_t>{2, 2, 2, 2, 2}));
  EXPECT_EQ(sizes(t.chunk(6, 0)), (std::vector<int64_t>{2, 2, 2, 2, 2}));
  EXPECT_EQ(sizes(t.chunk(7, 0)), (std::vector<int64_t>{2, 2, 2, 2, 2}));
  EXPECT_EQ(sizes(t.chunk(1, 0)), (std::vector<int64_t>{10}));
  EXPECT_EQ(sizes(t.chunk(10, 0)), (std::vector<int64_t>(10, 1)));
  EXPECT_EQ(sizes(t.chunk(20, 0)), (std::vector<int64_t>(10, 1)));

  auto chunks = t.chunk(3, 0);
  EXPECT_EQ(offset_bytes(chunks[0], t), 0);
  EXPECT_EQ(offset_bytes(chunks[1], t), 4 * 2 * 4);
  EXPECT_EQ(offset_bytes(chunks[2], t), 8 * 2 * 4);
  for (const auto& c : chunks)
    EXPECT_EQ(c.strides(), t.strides());

  auto cols = t.chunk(2, -1);
  ASSERT_EQ(cols.size(), 2u);
  EXPECT_EQ(cols[1].shape(), (Dims{10, 1}));
  EXPECT_EQ(cols[1].strides(), (Dims{2, 1}));
  EXPECT_EQ(offset_bytes(cols[1], t), 4);
}

TEST(TensorViews, ChunkOfAnEmptyDimGivesEmptyChunks) {
  // torch.empty(0, 2).chunk(3) gives 3 empty chunks (chunk() then goes through
  // split_with_sizes so that the number of chunks is kept).
  Tensor empty(nullptr, DType::kF32, {0, 2});
  auto chunks = empty.chunk(3, 0);
  ASSERT_EQ(chunks.size(), 3u);
  for (const auto& c : chunks)
    EXPECT_EQ(c.shape(), (Dims{0, 2}));
  EXPECT_EQ(empty.chunk(1, 0).size(), 1u);
}

TEST(TensorViews, ChunkErrors) {
  Arena arena;
  Tensor t(arena.data(), DType::kF32, {4});
  EXPECT_THAT([&] { t.chunk(0, 0); },
              ThrowsMessage<Error>(HasSubstr("chunk count must be positive, got 0")));
  EXPECT_THAT([&] { t.chunk(-2, 0); }, ThrowsMessage<Error>(HasSubstr("got -2")));
  EXPECT_THAT([&] { t.chunk(2, 1); }, ThrowsMessage<Error>(HasSubstr("dim 1 out of range")));
  float value = 0;
  EXPECT_THROW(Tensor(&value, DType::kF32, Dims{}).chunk(1, 0), Error);
}

TEST(TensorViews, WithData) {
  Arena arena;
  Tensor t = Tensor(arena.data(), DType::kF16, {4, 4}, Device::cuda(2)).t();
  std::byte other[64];
  Tensor moved = t.with_data(other);
  EXPECT_EQ(moved.data(), other);
  EXPECT_EQ(moved.shape(), t.shape());
  EXPECT_EQ(moved.strides(), t.strides());
  EXPECT_EQ(moved.dtype(), DType::kF16);
  EXPECT_EQ(moved.device(), Device::cuda(2));
}

}  // namespace
}  // namespace asynctp
