#include "ops/dispatch.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/balanced_orders.h"
#include "core/deadline.h"
#include "core/env.h"
#include "core/log.h"
#include "ops/context.h"
#include "ops/warm_up.h"

namespace asynctp {

namespace {

// The cache's entries, or an empty object if there is no usable cache (said once per
// dispatcher, through `warned`).
nlohmann::json read_cache(const std::string& path, bool& warned) {
  std::ifstream in(path);
  if (!in) return nlohmann::json::object();
  try {
    nlohmann::json j = nlohmann::json::parse(in);
    const bool layout = j.is_object() && j.contains("entries") && j["entries"].is_object();
    const int version = j.is_object() && j.contains("version") && j["version"].is_number_integer()
                            ? j["version"].get<int>()
                            : 0;
    if (layout && version == Dispatcher::kCacheVersion) return j;
    if (std::exchange(warned, true)) return nlohmann::json::object();
    if (layout) {
      ASYNCTP_LOG_WARN(
          "dispatch cache {} holds choices measured on version {} of the paths, this is version "
          "{}: they are measured again and the file rewritten",
          path, version, Dispatcher::kCacheVersion);
    } else {
      ASYNCTP_LOG_WARN("dispatch cache {} has another layout; it will be rewritten", path);
    }
  } catch (const std::exception& e) {
    if (!std::exchange(warned, true)) {
      ASYNCTP_LOG_WARN("dispatch cache {} is unreadable ({}); it will be rewritten", path,
                       e.what());
    }
  }
  return nlohmann::json::object();
}

// Every route (the cache's names: route_name).
constexpr Route kRoutes[] = {Path::kNative, Route(Path::kNative, true), Path::kSplit,
                             Path::kFallback};

// A route as a number for the ranks' exchange through the store: 1 + its place in kRoutes (0:
// none), below kCodes.
constexpr int kCodes = 8;
static_assert(std::size(kRoutes) < kCodes);
int route_code(std::optional<Route> r) {
  if (!r) return 0;
  return static_cast<int>(std::find(std::begin(kRoutes), std::end(kRoutes), *r) -
                          std::begin(kRoutes)) +
         1;
}

// `rounds` rounded up to whole blocks of `rows` rounds (the balanced orders' rows).
size_t whole_blocks(size_t rounds, size_t rows) {
  return (rounds + rows - 1) / rows * rows;
}

}  // namespace

std::string_view route_name(Route r) {
  return r.path == Path::kNative && r.kernel_push ? "native_push" : path_name(r.path);
}

std::ostream& operator<<(std::ostream& os, Route r) {
  return os << route_name(r);
}

int Dispatcher::tuning_rounds(size_t candidates) {
  return static_cast<int>(whole_blocks(kTuneRuns, balanced_order_rows(candidates)));
}

std::string Dispatcher::default_cache_path() {
  namespace fs = std::filesystem;
  if (const auto dir = envvars::kCacheDir.text()) {
    return (fs::path(*dir) / "dispatch.json").string();
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return (fs::path(xdg) / "asynctp" / "dispatch.json").string();
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return (fs::path(home) / ".cache" / "asynctp" / "dispatch.json").string();
  }
  return "";
}

Dispatcher::Dispatcher(OpContext& ctx, std::string cache_path)
    : ctx_(ctx), cache_path_(std::move(cache_path)), pace_(envvars::kTunePace.number()) {
  if (cache_path_.empty()) cache_path_ = default_cache_path();
  if (cache_path_ == "off") cache_path_.clear();
}

std::optional<DispatchTiming> Dispatcher::decision(const std::string& key) const {
  auto it = decisions_.find(key);
  if (it == decisions_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::pair<Route, Route>> Dispatcher::disk_lookup(const std::string& key) {
  if (cache_path_.empty()) return std::nullopt;
  const nlohmann::json j = read_cache(cache_path_, cache_warned_);
  if (!j.contains("entries") || !j["entries"].contains(key)) return std::nullopt;
  // An entry is {"path": "split", "captured_path": "native", "<route>_us": ...}: anything else
  // was not written by this program, so it is reported rather than guessed at or silently
  // measured over.
  const nlohmann::json& entry = j["entries"][key];
  for (const char* field : {"path", "captured_path"}) {
    ASYNCTP_CHECK(entry.is_object() && (!entry.contains(field) || entry[field].is_string()),
                  "dispatch cache {}: entry '{}' must be an object whose \"{}\" is a string, "
                  "got {}{}; remove the entry (or the file) to measure it again",
                  cache_path_, key, field, entry.type_name(),
                  entry.is_object()
                      ? fmt::format(" with a \"{}\" of type {}", field, entry[field].type_name())
                      : "");
  }
  ASYNCTP_CHECK(!entry.contains("pace") || entry["pace"].is_number(),
                "dispatch cache {}: entry '{}' has a \"pace\" of type {} ({}), not a number; "
                "remove the entry (or the file) to measure it again",
                cache_path_, key, entry.contains("pace") ? entry["pace"].type_name() : "",
                entry.contains("pace") ? entry["pace"].dump() : "");
  // Measured at another pace (ASYNCTP_TUNE_PACE; entries without one were paced): not this
  // choice, measured anew and replaced.
  if (entry.value("pace", 1.0) != pace_) return std::nullopt;
  auto named = [&](const char* field) -> std::optional<Route> {
    const std::string name = entry.value(field, "");
    for (Route r : kRoutes)
      if (name == route_name(r)) return r;
    return std::nullopt;
  };
  const std::optional<Route> eager = named("path");
  const std::optional<Route> captured = named("captured_path");
  if (!eager || !captured) return std::nullopt;
  return std::pair{*eager, *captured};
}

void Dispatcher::disk_store(const std::string& key, const DispatchTiming& timing) {
  if (cache_path_.empty() || ctx_.group().local_rank() != 0) return;
  namespace fs = std::filesystem;
  try {
    const fs::path path(cache_path_);
    if (path.has_parent_path()) fs::create_directories(path.parent_path());
    nlohmann::json j = read_cache(cache_path_, cache_warned_);
    j["version"] = Dispatcher::kCacheVersion;
    nlohmann::json entry = {{"path", std::string(route_name(timing.path))},
                            {"captured_path", std::string(route_name(timing.captured_path))},
                            {"pace", timing.pace}};
    for (Route r : kRoutes) {
      if (timing.us(r) > 0) entry[fmt::format("{}_us", route_name(r))] = timing.us(r);
      if (timing.host_us(r) > 0)
        entry[fmt::format("{}_host_us", route_name(r))] = timing.host_us(r);
    }
    j["entries"][key] = std::move(entry);
    // Write beside and rename: readers never see a half-written file.
    const fs::path tmp = path.string() + fmt::format(".tmp{}", ::getpid());
    {
      std::ofstream out(tmp);
      out << j.dump(1) << "\n";
      if (!out) throw std::runtime_error("write failed");
    }
    fs::rename(tmp, path);
  } catch (const std::exception& e) {
    ASYNCTP_LOG_WARN("cannot write the dispatch cache {}: {} (the choice is kept in memory)",
                     cache_path_, e.what());
  }
}

std::vector<std::vector<double>> Dispatcher::over_ranks(const std::vector<double>& values) {
  // Through the store, whose every wait is bounded by the group's timeout (a collective on the
  // device would hang on a rank that never comes).
  Group& group = ctx_.group();
  const std::string key = group.next_key("dispatch/values");
  std::string mine;
  for (double v : values)
    mine += fmt::format("{:.17g} ", v);
  group.store().set(fmt::format("{}/{}", key, group.rank()), mine);
  std::vector<std::vector<double>> all(group.world_size(), std::vector<double>(values.size()));
  for (int r = 0; r < group.world_size(); ++r) {
    std::istringstream in(group.store().get(fmt::format("{}/{}", key, r)));
    for (double& v : all[r])
      in >> v;
  }
  return all;
}

Route Dispatcher::pick(const std::string& key, std::span<const Route> offered,
                       const std::function<void(Route)>& run) {
  // Every call of an op comes here: the remembered choice first. (A remembered route that can no
  // longer run here is chosen anew, as the first time.)
  const bool captured = ctx_.capturing();
  if (auto it = decisions_.find(key); it != decisions_.end()) {
    const DispatchTiming& t = it->second;
    const Route route = t.path_for(captured);
    if (std::find(offered.begin(), offered.end(), route) != offered.end()) return route;
    if (captured) {
      // Nothing can be measured during capture: of the routes offered now, the one measured
      // fastest on the device (the first offered where none was measured).
      Route best = offered.empty() ? route : offered[0];
      for (Route r : offered)
        if (t.us(r) > 0 && (t.us(best) <= 0 || t.us(r) < t.us(best))) best = r;
      ASYNCTP_LOG_INFO("{}: its captured path {} cannot run in this capture; taking {}", key,
                       route_name(route), route_name(best));
      return best;
    }
  }
  ASYNCTP_CHECK(!offered.empty(), "dispatcher: no path can run {}", key);
  for (size_t i = 0; i < offered.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      ASYNCTP_CHECK(offered[i] != offered[j], "dispatcher: path {} named twice for {}",
                    route_name(offered[i]), key);
    }
  }
  if (offered.size() == 1) return offered[0];
  Backend& be = ctx_.backend();
  if (captured) {
    ASYNCTP_LOG_INFO(
        "{}: first seen during CUDA-graph capture, where nothing can be measured: taking the {} "
        "path (run it once before capturing to have it measured)",
        key, route_name(offered[0]));
    return offered[0];
  }
  const int ws = ctx_.world_size();
  // 1. The disk cache, if every rank found the same entry and its paths can run on every rank.
  //    One exchange carries each rank's cached paths and the paths it can run: the ranks measure
  //    and choose among the paths they all can run, so that they all choose alike. It carries
  //    each rank's pace too: ranks at different paces would run different numbers of rounds.
  int mask = 0;
  for (Route r : offered)
    mask |= 1 << route_code(r);
  const std::optional<std::pair<Route, Route>> cached = disk_lookup(key);
  // Both cached routes in one number: eager + kCodes x captured (0: no entry).
  const int code = cached ? route_code(cached->first) + kCodes * route_code(cached->second) : 0;
  bool agree = code != 0;
  int shared = mask;
  const std::vector<std::vector<double>> exchanged =
      over_ranks({static_cast<double>(code), static_cast<double>(mask), pace_});
  for (size_t r = 0; r < exchanged.size(); ++r) {
    const std::vector<double>& theirs = exchanged[r];
    agree = agree && theirs[0] == code;
    shared &= static_cast<int>(theirs[1]);
    ASYNCTP_CHECK(theirs[2] == exchanged[0][2],
                  "dispatcher: {}: rank {} tunes at ASYNCTP_TUNE_PACE={:g}, rank 0 at {:g}; set "
                  "the same value on every rank",
                  key, r, theirs[2], exchanged[0][2]);
  }
  std::vector<Route> candidates;
  for (Route r : offered)
    if ((shared & (1 << route_code(r))) != 0) candidates.push_back(r);
  ASYNCTP_CHECK(!candidates.empty(), "dispatcher: no path can run {} on every rank", key);
  if (agree && (shared & (1 << route_code(cached->first))) != 0 &&
      (shared & (1 << route_code(cached->second))) != 0) {
    DispatchTiming t;
    t.path = cached->first;
    t.captured_path = cached->second;
    t.from_disk = true;
    t.pace = pace_;
    decisions_[key] = t;
    ASYNCTP_LOG_DEBUG("{}: {} eager, {} captured (from {})", key, route_name(t.path),
                      route_name(t.captured_path), cache_path_);
    // A capture runs the captured path, which this process has not run (nothing was measured):
    // what it allocates on first use (cuBLASLt plans and workspaces, float8 staging) cannot be
    // allocated during capture. One eager run of it now (on every rank: they all read the same
    // entry) prepares them, as the tuning's runs would have; the caller's run follows.
    if (t.captured_path != t.path) run(t.captured_path);
    return t.path;
  }
  if (candidates.size() == 1) {
    DispatchTiming t;
    t.path = t.captured_path = candidates[0];
    t.pace = pace_;
    decisions_[key] = t;
    ASYNCTP_LOG_INFO("{}: {}, the only path every rank can run", key, route_name(t.path));
    return t.path;
  }
  // 2. Measure: warm-up, then rounds on every rank, each run started from a device barrier (as
  //    the bench does) so that no rank's time includes waiting for a peer that is still
  //    finishing the previous run. The rounds follow the bench's balanced orders: every
  //    candidate runs right after every other one equally often (what ran before leaves its
  //    data in L2 and sets the clocks), in whole blocks of the orders. A close call (the two
  //    fastest within kCloseCall) gets kCloseCallRuns more rounds (whole blocks too): every rank
  //    sees the same values, so all extend together.
  const auto tuning_start = std::chrono::steady_clock::now();
  const size_t n = candidates.size();
  const std::vector<std::vector<size_t>> orders = balanced_orders(n);
  for (Route r : candidates)
    run(r);
  Stream& s = ctx_.stream();
  // At pace 0: rounds back to back until every rank has run them for kSustainedWarmupMs.
  double warmup_ms = 0.0;
  if (pace_ == 0.0) {
    const auto warm_start = std::chrono::steady_clock::now();
    warm_up_for(
        ctx_,
        [&] {
          for (Route r : candidates)
            run(r);
        },
        kSustainedWarmupMs, warm_start);
    warmup_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - warm_start)
            .count();
  }
  // The device time is the run's own only if the host has enqueued the run by the time the
  // stream reaches it (else the GPU's waits for the host count too, and the eager choice would
  // count them twice): each run starts behind a spin of twice the longest enqueueing of a run
  // (after the first, which holds one-time work), the same on every rank (a rank that started
  // earlier would wait for its peers' data), as `asynctp bench --hide-launch` hides the launch.
  // Runs candidate route r; the host's µs to enqueue it.
  auto enqueued_us = [&](Route r) {
    const auto enqueue = std::chrono::steady_clock::now();
    run(r);
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - enqueue)
        .count();
  };
  double enqueue_us = 0.0;
  for (Route r : candidates)
    enqueue_us = std::max(enqueue_us, enqueued_us(r));
  for (const std::vector<double>& theirs : over_ranks({enqueue_us}))
    enqueue_us = std::max(enqueue_us, theirs[0]);
  const auto hide_cycles =
      static_cast<int64_t>(std::min(2.0 * enqueue_us, kMaxHideUs) * be.spin_cycles_per_us());
  auto start = be.create_event(true);
  auto stop = be.create_event(true);
  std::vector<std::vector<double>> times(n);
  std::vector<std::vector<double>> host_times(n);
  int round = 0;
  auto measure = [&](int rounds) {
    for (int r = 0; r < rounds; ++r, ++round) {
      for (const size_t c : round_order(orders, static_cast<size_t>(round))) {
        ctx_.align_ranks();
        be.spin(hide_cycles, s);
        start->record(s);
        host_times[c].push_back(enqueued_us(candidates[c]));
        stop->record(s);
        stop->synchronize();
        const double us = 1000.0 * stop->elapsed_ms(*start);
        times[c].push_back(us);
        // Idle pace() times the run's length (see pace()), spinning: the bench's default.
        if (pace_ > 0)
          pause_host(std::chrono::duration<double, std::micro>(pace_ * us), HostPause::kSpin);
      }
    }
  };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // Each path's device and host times are its slowest rank's medians: the op ends for the job
  // when it ends on every rank (and the bench reports the slowest rank too). Every rank sees the
  // same values, so all extend together and all choose alike. [0, n): device; [n, 2n): host.
  auto slowest = [&] {
    std::vector<double> mine(2 * n), worst(2 * n, 0.0);
    for (size_t c = 0; c < n; ++c) {
      mine[c] = median(times[c]);
      mine[n + c] = median(host_times[c]);
    }
    for (const std::vector<double>& theirs : over_ranks(mine))
      for (size_t c = 0; c < 2 * n; ++c)
        worst[c] = std::max(worst[c], theirs[c]);
    return worst;
  };
  // Per candidate: the device time (captured calls' cost) and device + host time (eager calls').
  auto costs = [&](const std::vector<double>& worst) {
    std::vector<double> device(worst.begin(), worst.begin() + static_cast<ptrdiff_t>(n));
    std::vector<double> eager(n);
    for (size_t c = 0; c < n; ++c)
      eager[c] = worst[c] + worst[n + c];
    return std::pair{device, eager};
  };
  // The fastest candidate (ties: the earlier) and the runner-up's time.
  auto fastest = [&](const std::vector<double>& us) {
    size_t best = 0;
    for (size_t c = 1; c < n; ++c)
      if (us[c] < us[best]) best = c;
    double second = std::numeric_limits<double>::infinity();
    for (size_t c = 0; c < n; ++c)
      if (c != best) second = std::min(second, us[c]);
    return std::pair{best, second};
  };
  auto close_call = [&](const std::vector<double>& us) {
    const auto [best, second] = fastest(us);
    return second - us[best] < kCloseCall * us[best];
  };
  measure(tuning_rounds(n));  // (what the tests count on)
  std::vector<double> worst = slowest();
  if (auto [device, eager] = costs(worst); close_call(device) || close_call(eager)) {
    measure(static_cast<int>(whole_blocks(kCloseCallRuns, orders.size())));
    worst = slowest();
  }
  const auto [device, eager] = costs(worst);
  DispatchTiming t;
  for (size_t c = 0; c < n; ++c) {
    t.us(candidates[c]) = worst[c];
    t.host_us(candidates[c]) = worst[n + c];
  }
  t.path = candidates[fastest(eager).first];
  t.captured_path = candidates[fastest(device).first];
  t.pace = pace_;
  t.warmup_ms = warmup_ms;
  decisions_[key] = t;
  disk_store(key, t);
  std::string times_text;
  for (size_t c = 0; c < n; ++c)
    times_text += fmt::format("{}{} {:.1f} us + host {:.1f} us", c == 0 ? "" : ", ",
                              route_name(candidates[c]), worst[c], worst[n + c]);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - tuning_start;
  ASYNCTP_LOG_INFO("{}: {} eager, {} captured ({}, slowest of {} ranks; {} rounds {} in {:.2f} s)",
                   key, route_name(t.path), route_name(t.captured_path), times_text, ws, round,
                   pace_ > 0 ? fmt::format("at pace {:g}", pace_)
                             : fmt::format("back to back after {:.0f} ms of warm-up", warmup_ms),
                   took.count());
  return t.path_for(captured);
}

}  // namespace asynctp
