// Buffer: ownership (the deleter runs exactly once), host allocation and views.
#include "core/buffer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <utility>

namespace asynctp {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(Buffer, HostAllocationIsPageAlignedAndWritable) {
  Buffer b = Buffer::host(10'000);
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(b.size(), 10'000u);
  EXPECT_EQ(b.device(), Device::cpu());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 4096, 0u);
  std::memset(b.data(), 0xAB, b.size());  // ASan would flag a short allocation
  Buffer zero = Buffer::host(0);
  EXPECT_FALSE(zero.empty());
  EXPECT_EQ(zero.size(), 0u);
}

TEST(Buffer, DeleterRunsOnceAcrossMoves) {
  int deleted = 0;
  int storage[4];
  {
    Buffer a(storage, sizeof(storage), Device::cpu(), [&](void* p) {
      EXPECT_EQ(p, storage);
      ++deleted;
    });
    Buffer b(std::move(a));
    EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): moved-from state is specified
    EXPECT_EQ(a.size(), 0u);
    EXPECT_EQ(b.data(), storage);
    Buffer c;
    c = std::move(b);
    EXPECT_EQ(c.size(), sizeof(storage));
    Buffer& alias = c;
    c = std::move(alias);  // self-move keeps the buffer
    EXPECT_EQ(c.data(), storage);
    EXPECT_EQ(deleted, 0);
  }
  EXPECT_EQ(deleted, 1);
}

TEST(Buffer, MoveAssignReleasesTheOldBuffer) {
  int deleted_a = 0, deleted_b = 0;
  int sa[1], sb[1];
  Buffer a(sa, 4, Device::cpu(), [&](void*) { ++deleted_a; });
  Buffer b(sb, 4, Device::cpu(), [&](void*) { ++deleted_b; });
  a = std::move(b);
  EXPECT_EQ(deleted_a, 1);
  EXPECT_EQ(deleted_b, 0);
  EXPECT_EQ(a.data(), sb);
  a.reset();
  EXPECT_EQ(deleted_b, 1);
  EXPECT_TRUE(a.empty());
  a.reset();
  EXPECT_EQ(deleted_b, 1);
}

TEST(Buffer, Views) {
  Buffer b = Buffer::host(64);
  Tensor whole = b.view({4, 4}, DType::kF32);
  EXPECT_EQ(whole.data(), b.data());
  EXPECT_EQ(whole.strides(), (Dims{4, 1}));
  Tensor tail = b.view({8}, DType::kBF16, 48);
  EXPECT_EQ(static_cast<char*>(tail.data()) - static_cast<char*>(b.data()), 48);
  EXPECT_EQ(tail.dtype(), DType::kBF16);
  Buffer on_gpu(reinterpret_cast<void*>(0x1000), 16, Device::cuda(1), nullptr);
  EXPECT_EQ(on_gpu.view({4}, DType::kF32).device(), Device::cuda(1));
  EXPECT_EQ(Buffer().view({0, 3}, DType::kF32).numel(), 0);
}

TEST(Buffer, ViewErrorsNameSizes) {
  Buffer b = Buffer::host(32);
  EXPECT_THAT(
      [&] {
        b.view({3, 3}, DType::kF32);
      },
      ThrowsMessage<Error>(
          HasSubstr("a f32[3, 3] view at byte offset 0 needs 36 bytes but the buffer holds 32")));
  EXPECT_THAT([&] { b.view({4}, DType::kF32, 20); },
              ThrowsMessage<Error>(HasSubstr("at byte offset 20 needs 36 bytes")));
  EXPECT_THAT([] { Buffer().view({1}, DType::kF32); },
              ThrowsMessage<Error>(HasSubstr("view of an empty buffer")));
}

TEST(Buffer, EmptyHost) {
  OwnedTensor t = empty_host({3, 5}, DType::kF16);
  EXPECT_EQ(t->shape(), (Dims{3, 5}));
  EXPECT_EQ(t->dtype(), DType::kF16);
  EXPECT_TRUE(t->is_contiguous());
  EXPECT_EQ(t.buffer.size(), 30u);
  EXPECT_EQ(t->data(), t.buffer.data());
  const Tensor& view = t;
  EXPECT_EQ(view.numel(), 15);
  OwnedTensor moved = std::move(t);
  EXPECT_EQ(moved->data(), moved.buffer.data());
  OwnedTensor none = empty_host({0}, DType::kF32);
  EXPECT_EQ(none->numel(), 0);
}

}  // namespace
}  // namespace asynctp
