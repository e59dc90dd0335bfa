// Where the host time of an eager op call goes, phase by phase (ASYNCTP_HOST_PROFILE=1, or
// HostProfile::set_enabled; the C ABI's asynctp_host_profile_*). An eager call's host time delays
// its GPU work whenever the GPU is idle, and the acceptance bounds it (20 us from Python), so the
// profile says which step of a call costs what on the machine that runs it, GPU included, without
// a profiler.
//
// A call is the span of one Call scope: the C ABI opens it as it is entered (before the
// descriptors are converted), or the op itself where C++ calls it. Inside, the op stamps its
// steps: every literal label it passes to OpContext::mark (the trace's labels: "call", "start",
// "gemm", "joined", "end", ...) and the profile's own stamps ("run", "memo", "checks", "forked",
// "pushes", "gathered", "scattered", ...). A phase is the time from one stamp to the next, named
// "<from> > <to>"; the first one starts at "entry", the last one ends at "return" (the op and the
// C ABI returned). Each call is filed under its op and the path it took (set_path); a call that
// threw, or never chose a path, is dropped.
//
// Per (op, path) and phase the profile keeps the count, the sum and the last kMaxSamples
// samples, so that the report gives medians (one slow call, a page fault, a preempted thread,
// moves a mean far more than a median). Off, a call costs one branch per stamp.
//
// Not thread-safe, like the OpContext that holds it (one host thread drives a context).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <asynctp/context.h>

namespace asynctp {

class HostProfile {
 public:
  using Clock = std::chrono::steady_clock;

  // Samples kept per phase (the latest ones) for the medians.
  static constexpr size_t kMaxSamples = 4096;
  // Stamps one call may hold; later ones are counted in the call's last phase.
  static constexpr size_t kMaxStamps = 48;

  // One op call: the outermost scope of a call opens and files it; a nested one (the op inside
  // the C ABI's scope) does nothing.
  class Call {
   public:
    explicit Call(HostProfile& profile)
        : profile_(profile.enabled_ && !profile.open_ ? &profile : nullptr) {
      if (profile_ != nullptr) profile_->begin_call();
    }
    ~Call() {
      if (profile_ != nullptr) profile_->end_call(std::uncaught_exceptions() > uncaught_);
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    HostProfile* profile_;
    int uncaught_ = std::uncaught_exceptions();
  };

  bool enabled() const { return enabled_; }
  // Turns the profile on or off; either way what it gathered so far is dropped.
  void set_enabled(bool on);
  // Whether a call is open (stamps are taken).
  bool open() const { return open_; }

  // The step `label` (a string literal: kept by address) ends now.
  void stamp(const char* label) {
    if (!open_) return;
    if (count_ < kMaxStamps) stamps_[count_++] = {label, Clock::now()};
  }
  // The op and path the open call is filed under (op: a string literal).
  void set_path(const char* op, Path path) {
    op_ = op;
    path_ = path;
  }

  struct Phase {
    std::string from, to;
    int64_t count = 0;
    double total_us = 0;
    double median_us = 0;
  };
  struct Summary {
    std::string op;
    Path path = Path::kNative;
    int64_t calls = 0;
    double total_us = 0;        // the sum over the calls, entry to return
    double median_us = 0;       // of one call, entry to return
    std::vector<Phase> phases;  // in the order they first occurred
  };
  // Every (op, path) seen since the profile was last enabled, in the order first seen.
  std::vector<Summary> summaries() const;
  // The summaries as JSON: {"all_gather_matmul": {"native": {"calls": n, "median_us": ...,
  // "mean_us": ..., "phases": [{"from": "entry", "to": "call", "count": n, "median_us": ...,
  // "mean_us": ...}, ...]}}}.
  std::string json() const;
  // The summaries as a table for people, one line per phase (empty when nothing was filed).
  std::string table() const;

 private:
  struct Series {
    int64_t count = 0;
    double total_us = 0;
    std::vector<float> samples;  // a ring of the latest kMaxSamples
    void add(double us);
    double median() const;
  };
  struct PhaseSeries {
    std::string_view from, to;
    Series series;
  };
  struct PerPath {
    const char* op;
    Path path;
    Series total;
    std::vector<PhaseSeries> phases;
  };

  void begin_call();
  void end_call(bool failed);

  bool enabled_ = false;
  bool open_ = false;
  Clock::time_point entered_;
  std::array<std::pair<const char*, Clock::time_point>, kMaxStamps> stamps_{};
  size_t count_ = 0;
  const char* op_ = nullptr;
  Path path_ = Path::kNative;
  std::vector<PerPath> per_path_;
};

}  // namespace asynctp
