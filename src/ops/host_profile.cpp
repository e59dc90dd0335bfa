#include "ops/host_profile.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace asynctp {

namespace {

constexpr const char* kEntry = "entry";
constexpr const char* kReturn = "return";

double us_between(HostProfile::Clock::time_point from, HostProfile::Clock::time_point to) {
  return std::chrono::duration<double, std::micro>(to - from).count();
}

}  // namespace

void HostProfile::Series::add(double us) {
  if (samples.size() < kMaxSamples) {
    samples.push_back(static_cast<float>(us));
  } else {
    samples[static_cast<size_t>(count) % kMaxSamples] = static_cast<float>(us);
  }
  ++count;
  total_us += us;
}

double HostProfile::Series::median() const {
  if (samples.empty()) return 0;
  std::vector<float> sorted = samples;
  const auto mid = sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2);
  std::nth_element(sorted.begin(), mid, sorted.end());
  return *mid;
}

void HostProfile::set_enabled(bool on) {
  enabled_ = on;
  per_path_.clear();
}

void HostProfile::begin_call() {
  open_ = true;
  count_ = 0;
  op_ = nullptr;
  entered_ = Clock::now();
}

void HostProfile::end_call(bool failed) {
  const Clock::time_point returned = Clock::now();
  open_ = false;
  if (failed || op_ == nullptr) return;
  auto it = std::find_if(per_path_.begin(), per_path_.end(), [&](const PerPath& p) {
    return p.path == path_ && std::string_view(p.op) == op_;
  });
  if (it == per_path_.end()) {
    per_path_.push_back(PerPath{op_, path_, {}, {}});
    it = per_path_.end() - 1;
  }
  PerPath& per = *it;
  per.total.add(us_between(entered_, returned));
  // A label met twice in one call (a step taken per peer) files both phases under one name.
  auto file = [&](std::string_view from, std::string_view to, double us) {
    auto phase = std::find_if(per.phases.begin(), per.phases.end(),
                              [&](const PhaseSeries& s) { return s.from == from && s.to == to; });
    if (phase == per.phases.end()) {
      per.phases.push_back(PhaseSeries{from, to, {}});
      phase = per.phases.end() - 1;
    }
    phase->series.add(us);
  };
  const char* from = kEntry;
  Clock::time_point since = entered_;
  for (size_t i = 0; i < count_; ++i) {
    file(from, stamps_[i].first, us_between(since, stamps_[i].second));
    from = stamps_[i].first;
    since = stamps_[i].second;
  }
  file(from, kReturn, us_between(since, returned));
}

std::vector<HostProfile::Summary> HostProfile::summaries() const {
  std::vector<Summary> out;
  for (const PerPath& per : per_path_) {
    Summary s;
    s.op = per.op;
    s.path = per.path;
    s.calls = per.total.count;
    s.total_us = per.total.total_us;
    s.median_us = per.total.median();
    for (const PhaseSeries& p : per.phases) {
      s.phases.push_back(Phase{std::string(p.from), std::string(p.to), p.series.count,
                               p.series.total_us, p.series.median()});
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::string HostProfile::json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const Summary& s : summaries()) {
    nlohmann::json phases = nlohmann::json::array();
    for (const Phase& p : s.phases) {
      phases.push_back(
          {{"from", p.from},
           {"to", p.to},
           {"count", p.count},
           {"median_us", p.median_us},
           {"mean_us", p.count > 0 ? p.total_us / static_cast<double>(p.count) : 0},
           {"per_call_us", s.calls > 0 ? p.total_us / static_cast<double>(s.calls) : 0}});
    }
    j[s.op][std::string(path_name(s.path))] = {
        {"calls", s.calls},
        {"median_us", s.median_us},
        {"mean_us", s.calls > 0 ? s.total_us / static_cast<double>(s.calls) : 0},
        {"phases", std::move(phases)}};
  }
  return j.dump();
}

std::string HostProfile::table() const {
  std::string out;
  for (const Summary& s : summaries()) {
    out += fmt::format("{} ({}): {} calls, median {:.2f} us, mean {:.2f} us a call\n", s.op,
                       path_name(s.path), s.calls, s.median_us,
                       s.calls > 0 ? s.total_us / static_cast<double>(s.calls) : 0.0);
    for (const Phase& p : s.phases) {
      // Per call: a phase taken twice in a call counts twice.
      const double per_call = s.calls > 0 ? p.total_us / static_cast<double>(s.calls) : 0.0;
      out += fmt::format("  {:>10} > {:<10} median {:8.2f} us   mean {:8.2f} us a call\n", p.from,
                         p.to, p.median_us, per_call);
    }
  }
  return out;
}

}  // namespace asynctp
