#include "ops/trace.h"

namespace asynctp {

void OpTrace::mark(std::string_view label, Stream& stream) {
  if (used_ == marks_.size()) marks_.push_back({"", backend_.create_event(/*timing=*/true), {}});
  Slot& slot = marks_[used_++];
  slot.label = label;
  slot.event->record(stream);
  slot.recorded = std::chrono::steady_clock::now();
}

std::vector<OpTrace::Mark> OpTrace::read() {
  std::vector<Mark> out;
  if (used_ == 0) return out;
  for (size_t i = 0; i < used_; ++i)
    marks_[i].event->synchronize();
  const Slot& first = marks_[0];
  for (size_t i = 0; i < used_; ++i) {
    const Slot& s = marks_[i];
    out.push_back({s.label, s.event->elapsed_ms(*first.event),
                   std::chrono::duration<double, std::milli>(s.recorded - first.recorded).count()});
  }
  return out;
}

}  // namespace asynctp
