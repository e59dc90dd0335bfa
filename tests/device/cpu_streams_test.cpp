// The CPU streams' test-only fault switch of the event waits (cpu::testing::reset_event_waits)
// and the poisoned allocations: the mechanics that tests/ops/event_edges_test.cpp relies on to
// show a missing event wait. A producer stream writes x (a fill), the consumer copies x into y
// behind an event wait on the producer: with the wait, y is always the new x; with it dropped, the
// fill is held back until the consumer has passed the wait's place, so y is always the old x.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "device/backend.h"
#include "device/cpu_backend.h"
#include "device/cpu_streams.h"
#include "support/tensor_testing.h"

namespace asynctp {
namespace {

using cpu::testing::HoldBack;

class CpuStreamFaultsTest : public ::testing::Test {
 protected:
  void TearDown() override { cpu::testing::reset_event_waits(); }

  // Runs the producer's fills of x (and of z after it, where two_fills), its event record, the
  // consumer's wait (the first Event::block since the reset, dropped where drop), and the
  // consumer's copy of x into y; returns y.
  float consumer_reads(bool drop, HoldBack hold, bool two_fills) {
    auto producer = backend_->create_stream("producer");
    auto consumer = backend_->create_stream("consumer");
    auto event = backend_->create_event();
    OwnedTensor x = empty_host({1}, DType::kF32);
    OwnedTensor z = empty_host({1}, DType::kF32);
    OwnedTensor y = empty_host({1}, DType::kF32);
    testing::fill_value(x, 0.0f);
    testing::fill_value(z, 0.0f);
    testing::fill_value(y, -1.0f);
    cpu::testing::reset_event_waits(drop ? 0 : -1, hold);
    backend_->fill(x, 1.0f, *producer);
    if (two_fills) backend_->fill(z, 1.0f, *producer);
    event->record(*producer);
    event->block(*consumer);
    backend_->copy(y, x, *consumer);
    EXPECT_EQ(cpu::testing::event_waits(), 1);
    EXPECT_EQ(cpu::testing::dropped_event_wait(), drop);
    cpu::testing::reset_event_waits();
    backend_->synchronize();
    return testing::get(y, 0);
  }

  std::unique_ptr<Backend> backend_ = make_cpu_backend();
};

TEST_F(CpuStreamFaultsTest, AWaitOrdersTheConsumerAfterTheRecordedWork) {
  EXPECT_EQ(consumer_reads(/*drop=*/false, HoldBack::kLastItem, /*two_fills=*/false), 1.0f);
  EXPECT_EQ(consumer_reads(/*drop=*/false, HoldBack::kUncovered, /*two_fills=*/true), 1.0f);
}

TEST_F(CpuStreamFaultsTest, ADroppedWaitHoldsTheRecordedWorkBackUntilTheConsumerPassedIt) {
  // The last item recorded (x's fill) is held: the host enqueues it, and the consumer's copy,
  // long before the producer may start it (the streams wait for the host to reach the wait).
  EXPECT_EQ(consumer_reads(/*drop=*/true, HoldBack::kLastItem, /*two_fills=*/false), 0.0f);
  // x's fill, followed by z's: every item since the reset is held.
  EXPECT_EQ(consumer_reads(/*drop=*/true, HoldBack::kUncovered, /*two_fills=*/true), 0.0f);
}

// The stall a reset asks for holds the released work behind a slow item that the consumer runs
// after the dropped wait: the producer's fill of x lands after the consumer's own (slower than
// kFaultStall) write of x.
TEST_F(CpuStreamFaultsTest, ALongerStallLandsTheHeldWorkBehindTheConsumersSlowItem) {
  auto producer = backend_->create_stream("producer");
  auto consumer = backend_->create_stream("consumer");
  auto event = backend_->create_event();
  OwnedTensor x = empty_host({1}, DType::kF32);
  testing::fill_value(x, 0.0f);
  cpu::testing::reset_event_waits(0, HoldBack::kLastItem, std::chrono::milliseconds(150));
  backend_->fill(x, 1.0f, *producer);
  event->record(*producer);
  event->block(*consumer);
  cpu::as_cpu(*consumer, "slow")
      .enqueue(
          "slow", [] { std::this_thread::sleep_for(std::chrono::milliseconds(40)); },
          /*jitter=*/false);
  backend_->fill(x, 2.0f, *consumer);
  EXPECT_TRUE(cpu::testing::dropped_event_wait());
  cpu::testing::reset_event_waits();
  backend_->synchronize();
  EXPECT_EQ(testing::get(x, 0), 1.0f) << "the held fill ran before the consumer's";
}

TEST_F(CpuStreamFaultsTest, AStallLongerThanTheHoldLimitIsRefused) {
  EXPECT_THROW(
      cpu::testing::reset_event_waits(0, HoldBack::kLastItem, cpu::kHoldLimit + cpu::kFaultStall),
      Error);
  EXPECT_THROW(
      cpu::testing::reset_event_waits(0, HoldBack::kLastItem, std::chrono::milliseconds(-1)),
      Error);
}

TEST(CpuAllocationPoisonTest, FillsAllocationsWithThePoisonWhileOn) {
  auto backend = make_cpu_backend();
  cpu::testing::poison_allocations(true);
  Buffer poisoned = backend->allocate(64);
  cpu::testing::poison_allocations(false);
  const auto* bytes = static_cast<const unsigned char*>(poisoned.data());
  for (size_t i = 0; i < poisoned.size(); ++i)
    ASSERT_EQ(bytes[i], cpu::testing::kPoisonByte) << "byte " << i;
  // Read as a flag, the poison is raised for any small op number (a positive int32).
  uint32_t word = 0;
  std::memcpy(&word, bytes, sizeof(word));
  EXPECT_GT(static_cast<int32_t>(word), 1 << 20);
}

}  // namespace
}  // namespace asynctp
