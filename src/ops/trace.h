// Timing marks inside an op, for diagnosis without a profiler (asynctp bench --trace): an op
// records a timing event on one of its streams at each step (a chunk's GEMM enqueued, a push
// landed, the closing barrier passed), and the reader gets each mark's time after the first.
// Marks are taken only while a trace is attached to the Context and nothing is being captured
// into a CUDA graph; otherwise ops skip them (one branch).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "device/backend.h"

namespace asynctp {

class OpTrace {
 public:
  explicit OpTrace(Backend& backend) : backend_(backend) {}

  // Records a timing event on `stream` (events are reused between runs).
  void mark(std::string_view label, Stream& stream);
  // Each mark's milliseconds after the first mark of this run, in recording order; waits for
  // the last one. Empty if nothing was marked.
  std::vector<std::pair<std::string, double>> read();
  // Starts a new run (the events stay allocated).
  void clear() { used_ = 0; }

 private:
  Backend& backend_;
  std::vector<std::pair<std::string, std::unique_ptr<Event>>> marks_;
  size_t used_ = 0;
};

}  // namespace asynctp
