#include "ops/trace.h"

namespace asynctp {

void OpTrace::mark(std::string_view label, Stream& stream) {
  if (used_ == marks_.size()) marks_.emplace_back("", backend_.create_event(/*timing=*/true));
  auto& [name, event] = marks_[used_++];
  name = label;
  event->record(stream);
}

std::vector<std::pair<std::string, double>> OpTrace::read() {
  std::vector<std::pair<std::string, double>> out;
  if (used_ == 0) return out;
  for (size_t i = 0; i < used_; ++i)
    marks_[i].second->synchronize();
  for (size_t i = 0; i < used_; ++i)
    out.emplace_back(marks_[i].first, marks_[i].second->elapsed_ms(*marks_[0].second));
  return out;
}

}  // namespace asynctp
