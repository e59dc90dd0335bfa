// Timing marks inside an op, for diagnosis without a profiler (asynctp bench --trace): an op
// records a timing event on one of its streams at each step (a chunk's GEMM enqueued, a push
// landed, the closing barrier passed), and the reader gets each mark's time after the first, on
// the device and on the host (when the op enqueued it: where the device runs ahead of the host,
// the host's enqueueing sets the pace, and the two columns show it).
// Marks are taken only while a trace is attached to the OpContext and nothing is being captured
// into a CUDA graph; otherwise ops skip them (one branch).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "device/backend.h"

namespace asynctp {

class OpTrace {
 public:
  struct Mark {
    std::string label;
    double device_ms = 0;  // the event's time after the first mark's event
    double host_ms = 0;    // when the op recorded it, after the first mark was recorded
  };

  explicit OpTrace(Backend& backend) : backend_(backend) {}

  // Records a timing event on `stream` (events are reused between runs) and the host's clock.
  void mark(std::string_view label, Stream& stream);
  // Every mark of this run, in recording order; waits for the last one. Empty if nothing was
  // marked.
  std::vector<Mark> read();
  // Starts a new run (the events stay allocated).
  void clear() { used_ = 0; }

 private:
  struct Slot {
    std::string label;
    std::unique_ptr<Event> event;
    std::chrono::steady_clock::time_point recorded;
  };
  Backend& backend_;
  std::vector<Slot> marks_;
  size_t used_ = 0;
};

}  // namespace asynctp
