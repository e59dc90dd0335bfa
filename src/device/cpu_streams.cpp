#include "device/cpu_streams.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "core/log.h"
#include "core/random.h"

namespace asynctp::cpu {

class HeldBack;

namespace {

using Clock = std::chrono::steady_clock;

// A failure that an event wait carries over from the stream it waited on: rethrown as it is (it
// already names the stream and op where it happened).
struct Carried {
  std::exception_ptr error;
};

// The failure `e` of `op` on `stream`, with its class kept and the place added to the message.
std::exception_ptr placed(const std::exception& e, const std::string& stream, const char* op) {
  const std::string message = fmt::format("{} [on {}, in {}]", e.what(), stream, op);
  if (dynamic_cast<const TimeoutError*>(&e) != nullptr)
    return std::make_exception_ptr(TimeoutError(message));
  if (dynamic_cast<const CaptureError*>(&e) != nullptr)
    return std::make_exception_ptr(CaptureError(message));
  return std::make_exception_ptr(Error(message));
}

std::atomic<int64_t> g_event_waits{0};
// Items enqueued and not yet completed on every stream of this process, and the streams
// (testing::synchronize_all).
std::atomic<int64_t> g_outstanding{0};
std::mutex g_all_mu;
std::vector<std::weak_ptr<Worker>> g_all;
std::atomic<int64_t> g_drop{-1};
std::atomic<bool> g_dropped{false};
std::atomic<testing::HoldBack> g_hold{testing::HoldBack::kLastItem};
std::atomic<int64_t> g_stall_ms{kFaultStall.count()};
std::mutex g_gate_mu;
std::shared_ptr<HeldBack> g_gate;  // guarded by g_gate_mu: the streams' gate since the reset
std::atomic<int64_t> g_flag_waits{0};
std::atomic<int64_t> g_flag_drop{-1};
std::atomic<bool> g_flag_dropped{false};
std::mutex g_flag_name_mu;
std::string g_flag_name;  // guarded by g_flag_name_mu

}  // namespace

// What the event fault switch (testing::reset_event_waits) holds back until release(), for at
// most kHoldLimit: the streams' items from the reset on (the gate), opened when the host reaches
// the wait to drop; and the work that wait was for, released when the stream whose wait was
// dropped reaches the point of that wait.
class HeldBack {
 public:
  explicit HeldBack(std::chrono::milliseconds stall = kFaultStall) : stall_(stall) {}
  // How long the held work stalls once released (see stall_while_the_streams_run).
  std::chrono::milliseconds stall() const { return stall_; }

  void release() {
    {
      const std::lock_guard lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
  }
  void wait_released() {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, kHoldLimit, [&] { return released_; });
  }

 private:
  const std::chrono::milliseconds stall_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
};

// The stall of held-back work once released (see HeldBack): `stall` (the fault switch's, as its
// reset before the dropped wait set it) during which the streams run. Where the host closes a gate
// in the meantime (its reset for the next op), the stall starts again once that gate opens: the
// held work then lands behind the next op's first items however slowly the host enqueues that op,
// as a held item on a GPU would (the host runs ahead there). The gates a stall waits through are
// bounded (each by kHoldLimit).
static void stall_while_the_streams_run(std::chrono::milliseconds stall) {
  constexpr int kMostGates = 4;
  for (int gates = 0;; ++gates) {
    std::this_thread::sleep_for(stall);
    std::shared_ptr<HeldBack> gate;
    {
      const std::lock_guard lock(g_gate_mu);
      gate = g_gate;
    }
    if (!gate || gates == kMostGates) return;
    gate->wait_released();
  }
}

// How far a worker has got, shared with the events recorded on it (they outlive neither the
// worker's thread nor need it: an event wait holds this, never the worker).
struct Progress {
  std::mutex mu;
  std::condition_variable advanced;
  uint64_t completed = 0;  // items 1..completed have run (or been skipped)
  // The latest failure: item failure_seq threw, items (failure_seq, skip_through] are skipped.
  std::exception_ptr failure;
  uint64_t failure_seq = 0;
  uint64_t skip_through = 0;
  uint64_t started = 0;  // items 1..started have been taken up by the worker
  // The event fault switch's bookkeeping since its last reset (while a wait is to be dropped):
  // the first item enqueued since, and the event records' marker items since.
  uint64_t op_start = 1;
  std::set<uint64_t> records;
  std::shared_ptr<HeldBack> gate;  // closed before item op_start (null: none)
  // The event fault switch's holds: item -> what releases it (see HeldBack).
  std::map<uint64_t, std::shared_ptr<HeldBack>> held;

  // Waits until item n has completed; the failure among items 1..n that was skipped through,
  // if any.
  std::exception_ptr wait_for(uint64_t n) {
    std::unique_lock lock(mu);
    advanced.wait(lock, [&] { return completed >= n; });
    if (failure && failure_seq <= n && n <= skip_through) return failure;
    return nullptr;
  }
  bool reached(uint64_t n) {
    const std::lock_guard lock(mu);
    return completed >= n;
  }
};

class Worker {
 public:
  Worker(std::string name, uint64_t jitter_seed)
      : name(std::move(name)), jitter_(jitter_seed != 0), rng_(jitter_seed) {
    thread_ = std::thread([this] { run(); });
  }

  // Runs what is queued, then stops: work enqueued on a stream always runs, as on a GPU.
  ~Worker() {
    {
      const std::lock_guard lock(progress->mu);
      stop_ = true;
    }
    queued_.notify_all();
    thread_.join();
    if (pending_) {
      try {
        std::rethrow_exception(pending_);
      } catch (const std::exception& e) {
        ASYNCTP_LOG_WARN("{} was destroyed with a failure nobody synchronized on: {}", name,
                         e.what());
      }
    }
  }

  uint64_t enqueue(const char* op, std::function<void()> work, bool jitter) {
    uint64_t seq = 0;
    {
      const std::lock_guard lock(progress->mu);
      throw_pending();
      seq = ++enqueued_;
      queue_.push_back({seq, op, std::move(work), jitter});
      g_outstanding.fetch_add(1);
    }
    queued_.notify_one();
    return seq;
  }

  void synchronize() {
    std::unique_lock lock(progress->mu);
    const uint64_t n = enqueued_;
    progress->advanced.wait(lock, [&] { return progress->completed >= n; });
    throw_pending();
  }

  void check_error() {
    const std::lock_guard lock(progress->mu);
    throw_pending();
  }

  // The event fault switch's reset: the items enqueued from now on wait for `gate`.
  void mark_op_start(std::shared_ptr<HeldBack> gate) {
    const std::lock_guard lock(progress->mu);
    progress->op_start = enqueued_ + 1;
    progress->records.clear();
    progress->gate = std::move(gate);
  }

  // Waits for everything enqueued so far, leaving a failure for the stream's own synchronize.
  void drain() {
    std::unique_lock lock(progress->mu);
    const uint64_t n = enqueued_;
    progress->advanced.wait(lock, [&] { return progress->completed >= n; });
  }

  const std::string name;
  const std::shared_ptr<Progress> progress = std::make_shared<Progress>();

 private:
  struct Item {
    uint64_t seq;
    const char* op;
    std::function<void()> work;
    bool jitter;
  };

  // With progress->mu held.
  void throw_pending() {
    if (!pending_) return;
    std::exception_ptr e = std::move(pending_);
    pending_ = nullptr;
    std::rethrow_exception(e);
  }

  void fail(uint64_t seq, std::exception_ptr error) {
    const std::lock_guard lock(progress->mu);
    progress->failure = error;
    progress->failure_seq = seq;
    progress->skip_through = enqueued_;
    if (!pending_) pending_ = std::move(error);
  }

  void run() {
    for (;;) {
      Item item;
      bool skip = false;
      std::shared_ptr<HeldBack> gate, held;
      {
        std::unique_lock lock(progress->mu);
        queued_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
        if (progress->gate && item.seq >= progress->op_start) gate = std::move(progress->gate);
      }
      if (gate) gate->wait_released();
      {
        const std::lock_guard lock(progress->mu);
        skip = progress->failure && item.seq > progress->failure_seq &&
               item.seq <= progress->skip_through;
        progress->started = item.seq;
        if (auto it = progress->held.find(item.seq); it != progress->held.end()) {
          held = std::move(it->second);
          progress->held.erase(it);
        }
      }
      if (held) {
        held->wait_released();
        stall_while_the_streams_run(held->stall());
      }
      if (!skip) {
        if (item.jitter && jitter_) {
          // Half the items run at once (a sleep costs ~50 us more than it asks for: that halves
          // the cost), the others after 0 to kMaxJitterUs.
          const uint64_t r = splitmix64(rng_);
          const auto us = static_cast<int64_t>((r >> 1) % (kMaxJitterUs + 1));
          if ((r & 1) != 0 && us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
        }
        try {
          item.work();
        } catch (const Carried& carried) {
          fail(item.seq, carried.error);
        } catch (const std::exception& e) {
          fail(item.seq, placed(e, name, item.op));
        } catch (...) {
          fail(item.seq, placed(Error("a non-standard exception"), name, item.op));
        }
      }
      item.work = nullptr;  // what it holds goes before the host may see it done
      {
        const std::lock_guard lock(progress->mu);
        progress->completed = item.seq;
      }
      progress->advanced.notify_all();
      g_outstanding.fetch_sub(1);
    }
  }

  bool jitter_;
  uint64_t rng_;
  // Guarded by progress->mu.
  std::deque<Item> queue_;
  std::condition_variable queued_;
  uint64_t enqueued_ = 0;
  std::exception_ptr pending_;  // the failure the host has not been told of
  bool stop_ = false;
  std::thread thread_;
};

CpuStream::CpuStream(std::string name, uint64_t jitter_seed)
    : worker_(std::make_shared<Worker>(std::move(name), jitter_seed)) {
  const std::lock_guard lock(g_all_mu);
  std::erase_if(g_all, [](const std::weak_ptr<Worker>& w) { return w.expired(); });
  g_all.push_back(worker_);
}

CpuStream::CpuStream(const CpuStream& other) : worker_(other.worker_) {}

CpuStream::~CpuStream() = default;

void CpuStream::synchronize() {
  worker_->synchronize();
}

uint64_t CpuStream::enqueue(const char* op, std::function<void()> work, bool jitter) {
  return worker_->enqueue(op, std::move(work), jitter);
}

void CpuStream::check_error() {
  worker_->check_error();
}

const std::string& CpuStream::name() const {
  return worker_->name;
}

StreamSet::StreamSet(int rank, uint64_t jitter_seed) : rank_(rank), jitter_seed_(jitter_seed) {}

StreamSet::~StreamSet() = default;

std::unique_ptr<CpuStream> StreamSet::create(std::string_view role) {
  const std::lock_guard lock(mu_);
  const int index = created_++;
  uint64_t seed = 0;
  if (jitter_seed_ != 0) {
    // One generator per (seed, rank, stream index); never 0, which means no jitter.
    uint64_t mix =
        jitter_seed_ ^ (static_cast<uint64_t>(rank_) << 40) ^ (static_cast<uint64_t>(index) << 20);
    seed = splitmix64(mix) | 1;
  }
  std::string name = fmt::format("cpu stream {}", index);
  if (!role.empty()) name += fmt::format(" ({})", role);
  auto stream = std::make_unique<CpuStream>(std::move(name), seed);
  std::erase_if(workers_, [](const std::weak_ptr<Worker>& w) { return w.expired(); });
  workers_.push_back(stream->worker_);
  return stream;
}

std::vector<std::shared_ptr<Worker>> StreamSet::live() {
  const std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<Worker>> out;
  for (const auto& w : workers_)
    if (auto s = w.lock()) out.push_back(std::move(s));
  return out;
}

void StreamSet::synchronize() {
  std::exception_ptr first;
  for (const auto& w : live()) {
    try {
      w->synchronize();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void StreamSet::check_errors() {
  for (const auto& w : live())
    w->check_error();
}

CpuStream& as_cpu(Stream& stream, const char* what) {
  auto* cpu = dynamic_cast<CpuStream*>(&stream);
  ASYNCTP_CHECK(cpu != nullptr, "{}: the stream is not a cpu backend's stream", what);
  return *cpu;
}

namespace {

// Opens the streams' gate of the event fault switch, if closed.
void open_gate() {
  std::shared_ptr<HeldBack> gate;
  {
    const std::lock_guard lock(g_gate_mu);
    gate = std::move(g_gate);
  }
  if (gate) gate->release();
}

class CpuEvent final : public Event {
 public:
  void record(Stream& stream) override {
    CpuStream& s = as_cpu(stream, "Event::record");
    auto mark = std::make_shared<Clock::time_point>();
    seq_ = s.enqueue(
        "event record", [mark] { *mark = Clock::now(); }, /*jitter=*/false);
    progress_ = s.worker().progress;
    time_ = std::move(mark);
    if (g_drop.load() >= 0) {
      const std::lock_guard lock(progress_->mu);
      progress_->records.insert(seq_);
    }
  }

  void block(Stream& stream) override {
    CpuStream& s = as_cpu(stream, "Event::block");
    const int64_t index = g_event_waits.fetch_add(1);
    if (index == g_drop.load()) {
      // Dropped: the work it waited for is held back until s reaches this point, so that
      // whatever s reads or writes of that work without the wait, it does too early.
      g_dropped = true;
      if (!progress_) return;
      auto held = std::make_shared<HeldBack>(std::chrono::milliseconds(g_stall_ms.load()));
      {
        const std::lock_guard lock(progress_->mu);
        // Item seq_ is the record's marker; the one before it, the last work recorded.
        uint64_t first = seq_ - 1;
        if (g_hold.load() == testing::HoldBack::kUncovered) {
          const auto it = progress_->records.lower_bound(seq_);
          const uint64_t previous = it == progress_->records.begin() ? 0 : *std::prev(it);
          first = std::max(progress_->op_start, previous + 1);
        }
        first = std::max(first, progress_->started + 1);
        if (first < seq_) progress_->held.emplace(first, held);
      }
      s.enqueue(
          "dropped event wait", [held] { held->release(); }, /*jitter=*/false);
      open_gate();
      return;
    }
    if (!progress_) return;  // never recorded: nothing to wait for (as in CUDA)
    s.enqueue(
        "event wait",
        [progress = progress_, n = seq_] {
          if (std::exception_ptr failure = progress->wait_for(n)) throw Carried{failure};
        },
        /*jitter=*/false);
  }

  void synchronize() override {
    if (progress_) progress_->wait_for(seq_);
  }

  float elapsed_ms(const Event& start) const override {
    const auto& s = dynamic_cast<const CpuEvent&>(start);
    ASYNCTP_CHECK(progress_ && s.progress_, "elapsed_ms on an event that was never recorded");
    ASYNCTP_CHECK(progress_->reached(seq_) && s.progress_->reached(s.seq_),
                  "elapsed_ms on an event that has not completed (synchronize on it first)");
    return std::chrono::duration<float, std::milli>(*time_ - *s.time_).count();
  }

 private:
  std::shared_ptr<Progress> progress_;
  uint64_t seq_ = 0;
  std::shared_ptr<Clock::time_point> time_;  // written by the marker item
};

}  // namespace

std::unique_ptr<Event> make_cpu_event() {
  return std::make_unique<CpuEvent>();
}

namespace testing {

void reset_event_waits(int64_t drop, HoldBack hold, std::chrono::milliseconds stall) {
  ASYNCTP_CHECK(stall.count() >= 0 && stall <= kHoldLimit,
                "reset_event_waits: stall {} ms is outside 0 .. kHoldLimit ({} ms)", stall.count(),
                kHoldLimit.count());
  open_gate();
  if (drop >= 0) {
    auto gate = std::make_shared<HeldBack>();
    {
      const std::lock_guard lock(g_gate_mu);
      g_gate = gate;
    }
    const std::lock_guard lock(g_all_mu);
    for (const auto& w : g_all)
      if (auto worker = w.lock()) worker->mark_op_start(gate);
  }
  g_hold = hold;
  g_stall_ms = stall.count();
  g_drop = drop;
  g_dropped = false;
  g_event_waits = 0;
}

int64_t event_waits() {
  return g_event_waits.load();
}

bool dropped_event_wait() {
  return g_dropped.load();
}

void reset_flag_waits(int64_t drop) {
  name_dropped_flag_wait("");
  g_flag_drop = drop;
  g_flag_dropped = false;
  g_flag_waits = 0;
}

int64_t flag_waits() {
  return g_flag_waits.load();
}

bool dropped_flag_wait() {
  return g_flag_dropped.load();
}

int64_t take_flag_waits(int64_t count) {
  const int64_t first = g_flag_waits.fetch_add(count);
  const int64_t drop = g_flag_drop.load();
  if (drop < first || drop >= first + count) return -1;
  g_flag_dropped = true;
  return drop - first;
}

void name_dropped_flag_wait(std::string name) {
  const std::lock_guard lock(g_flag_name_mu);
  g_flag_name = std::move(name);
}

std::string dropped_flag_wait_name() {
  const std::lock_guard lock(g_flag_name_mu);
  return g_flag_name;
}

void synchronize_all() {
  if (g_outstanding.load() == 0) return;
  std::vector<std::shared_ptr<Worker>> workers;
  {
    const std::lock_guard lock(g_all_mu);
    for (const auto& w : g_all)
      if (auto s = w.lock()) workers.push_back(std::move(s));
  }
  for (const auto& w : workers)
    w->drain();
}

}  // namespace testing

}  // namespace asynctp::cpu
