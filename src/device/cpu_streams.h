// The CPU backend's streams and events, which run asynchronously as CUDA's do, so that a missing
// event edge between an op's streams shows on the CPU as it would on a GPU.
//
// NOTE [cpu streams]
// Each stream is a worker thread that runs the closures enqueued on it, one after the other, in
// enqueue order; the host returns from an enqueue at once. Items are numbered 1, 2, ... per
// stream as they are enqueued.
//   Event::record(s):  the event stands for s's items up to its current enqueue count n (a marker
//                      item, which takes the time for elapsed_ms, is item n).
//   Event::block(s):   enqueues on s an item that waits until the recorded stream has completed
//                      its item n; later items of s run after it.
//   Event::synchronize, Stream::synchronize: the host waits until that point is completed.
// With ASYNCTP_CPU_STREAM_JITTER set to a seed, each work item (not the event items) first
// sleeps, one time in two, a random 0 to kMaxJitterUs microseconds, drawn from the stream's own
// generator seeded by (seed, rank, stream index), so the relative pace of streams and ranks changes
// from seed to seed and a consumer that does not wait for its producer reads too early. Failures:
// an item that throws marks its stream failed; the items enqueued on it up to then are skipped
// (they count as completed, so nothing waits on them forever), and so is the rest of every stream
// that waits on an event covering the failed item. The error is thrown on the host, once, by the
// next enqueue or synchronize of that stream (or Backend::synchronize, Backend::check_errors), with
// its class (TimeoutError stays one) and a message that names the stream and the op; items enqueued
// after that run normally.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "device/backend.h"

namespace asynctp::cpu {

// The largest random delay before a work item when jitter is on.
inline constexpr int kMaxJitterUs = 200;
// How long the fault switches hold back the work a dropped wait was for (the event switch: from
// when the stream whose wait was dropped reaches that point, unless its reset says otherwise).
inline constexpr std::chrono::milliseconds kFaultStall{20};
// The longest the event fault switch holds a stream for a release (see testing::reset_event_waits)
// that may never come: where the held work is what the releasing stream waits for itself.
inline constexpr std::chrono::milliseconds kHoldLimit{200};

class Worker;

class CpuStream final : public Stream {
 public:
  // A new stream with a worker of its own.
  CpuStream(std::string name, uint64_t jitter_seed);
  // A view of `other`'s worker (a wrapped caller stream names the compute stream).
  explicit CpuStream(const CpuStream& other);
  ~CpuStream() override;

  void synchronize() override;
  void* native_handle() const override { return nullptr; }

  // Runs `work` on the worker after everything enqueued before; `op` names it in errors. jitter:
  // whether the seeded delay precedes it (work items; not event bookkeeping). Throws the stream's
  // failure not yet reported instead of enqueueing. Returns the item's number.
  uint64_t enqueue(const char* op, std::function<void()> work, bool jitter = true);
  // Throws the stream's failure not yet reported, if any, without waiting.
  void check_error();
  const std::string& name() const;
  Worker& worker() const { return *worker_; }

 private:
  friend class StreamSet;
  std::shared_ptr<Worker> worker_;
};

// The streams of one backend: made here, numbered in creation order (0 the compute stream),
// each with its jitter generator; waited for together.
class StreamSet {
 public:
  // jitter_seed: 0 for no delays (see ASYNCTP_CPU_STREAM_JITTER).
  StreamSet(int rank, uint64_t jitter_seed);
  ~StreamSet();
  // A stream named "cpu stream <index> (<role>)" (the role left out where empty).
  std::unique_ptr<CpuStream> create(std::string_view role);
  // Waits for every live stream; throws the first failure not yet reported (after waiting for
  // all of them).
  void synchronize();
  // Throws the first failure not yet reported of any live stream, without waiting.
  void check_errors();

 private:
  std::vector<std::shared_ptr<Worker>> live();

  int rank_;
  uint64_t jitter_seed_;
  std::mutex mu_;
  int created_ = 0;
  std::vector<std::weak_ptr<Worker>> workers_;
};

// `stream` as a CPU stream; throws naming `what` if it belongs to another backend.
CpuStream& as_cpu(Stream& stream, const char* what);

std::unique_ptr<Event> make_cpu_event();

// The test-only fault switch of the event waits: every Event::block call of this process is
// counted from 0 since the last reset, and the one numbered `drop` (if any) does not wait; instead
// the recorded work it stood for is held back: the `hold` part of it waits until the blocked
// stream reaches the point of the dropped wait (a marker item there; at most kHoldLimit), then
// `stall` more (kFaultStall unless told; 0 to kHoldLimit), of the streams' running time (a stall
// that the next reset's gate, below, interrupts starts again when it opens): the schedule in which
// a missing wait shows. A longer stall shows a race whose other side is a slow item (a GEMM under a
// sanitizer, on a loaded machine) that the blocked stream runs after the wait. So that this
// work has not run already (the host enqueues an op slower than the workers run it, where a GPU's
// host runs ahead), no stream starts an item enqueued after a reset with a wait to drop until the
// host has reached that wait (at most kHoldLimit; a reset opens the streams too). The tests that
// prove each event wait of an op necessary drop them one at a time.
namespace testing {
enum class HoldBack {
  kLastItem,  // the last item of the recorded work
  // The items of the recorded work that no earlier event of that stream stands for: those
  // enqueued since the reset (where the caller resets before each op and its inputs' writes) and
  // after the stream's previous event record. For a consumer that races with an earlier item
  // than the last (a copy that reads what the consumer writes next) which no other wait covers.
  kUncovered,
};
void reset_event_waits(int64_t drop = -1, HoldBack hold = HoldBack::kLastItem,
                       std::chrono::milliseconds stall = kFaultStall);
// Event::block calls since the last reset.
int64_t event_waits();
// Whether the wait to drop was reached (and dropped) since the last reset.
bool dropped_event_wait();

// The test-only fault switch of the flag waits (the native paths' waits for ready, landed and
// done flags): every flag wait of this process is numbered from 0 since the last reset, in host
// order: a Backend::wait_flag call takes one number, a native GEMM call one for each distinct
// flag it waits for (cpu_native_gemm.h, in walk order). The one numbered `drop` does not wait:
// a dropped wait_flag enqueues nothing and holds back the tiles that the latest native GEMM
// counts in that flag (before the first of them it sleeps kFaultStall); a native GEMM reads what
// its dropped wait guarded as it starts, as a CTA of its first wave would. The tests that prove
// each flag wait of an op necessary drop them one at a time.
void reset_flag_waits(int64_t drop = -1);
// Flag waits numbered since the last reset.
int64_t flag_waits();
// Whether the wait to drop was reached (and dropped) since the last reset.
bool dropped_flag_wait();
// Numbers `count` flag waits; the index among them of the one to drop, or -1 (then marked
// dropped).
int64_t take_flag_waits(int64_t count);
// What the dropped wait waited for ("" until one is dropped), as its dropper names it.
void name_dropped_flag_wait(std::string name);
std::string dropped_flag_wait_name();
// Waits for everything enqueued so far on every CPU stream of this process (failures stay for
// their streams to report). For tests' host reads and writes of tensors whose stream they do not
// know; a test of an op's edges synchronizes the op's stream only.
void synchronize_all();
}  // namespace testing

}  // namespace asynctp::cpu
