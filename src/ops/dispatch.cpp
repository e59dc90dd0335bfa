#include "ops/dispatch.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/deadline.h"
#include "core/log.h"
#include "ops/context.h"

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

int path_code(std::optional<Path> p) {
  return !p ? 0 : *p == Path::kFused ? 1 : 2;
}

}  // namespace

std::string Dispatcher::default_cache_path() {
  namespace fs = std::filesystem;
  if (const char* dir = std::getenv("ASYNCTP_CACHE_DIR"); dir != nullptr && *dir != '\0') {
    return (fs::path(dir) / "dispatch.json").string();
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return (fs::path(xdg) / "asynctp" / "dispatch.json").string();
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return (fs::path(home) / ".cache" / "asynctp" / "dispatch.json").string();
  }
  return "";
}

Dispatcher::Dispatcher(Context& ctx, std::string cache_path)
    : ctx_(ctx), cache_path_(std::move(cache_path)) {
  if (cache_path_.empty()) cache_path_ = default_cache_path();
  if (cache_path_ == "off") cache_path_.clear();
}

std::optional<DispatchTiming> Dispatcher::decision(const std::string& key) const {
  auto it = decisions_.find(key);
  if (it == decisions_.end()) return std::nullopt;
  return it->second;
}

std::optional<Path> Dispatcher::disk_lookup(const std::string& key) {
  if (cache_path_.empty()) return std::nullopt;
  const nlohmann::json j = read_cache(cache_path_, cache_warned_);
  if (!j.contains("entries") || !j["entries"].contains(key)) return std::nullopt;
  const std::string path = j["entries"][key].value("path", "");
  if (path == "native") return Path::kNative;
  if (path == "fused") return Path::kFused;
  return std::nullopt;
}

void Dispatcher::disk_store(const std::string& key, const DispatchTiming& timing) {
  if (cache_path_.empty() || ctx_.group().local_rank() != 0) return;
  namespace fs = std::filesystem;
  try {
    const fs::path path(cache_path_);
    if (path.has_parent_path()) fs::create_directories(path.parent_path());
    nlohmann::json j = read_cache(cache_path_, cache_warned_);
    j["version"] = Dispatcher::kCacheVersion;
    j["entries"][key] = {{"path", std::string(path_name(timing.path))},
                         {"fused_us", timing.fused_us},
                         {"native_us", timing.native_us}};
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

Path Dispatcher::pick(const std::string& key, const std::function<void(Path)>& run) {
  if (auto it = decisions_.find(key); it != decisions_.end()) return it->second.path;
  Backend& be = ctx_.backend();
  if (be.capturing()) {
    ASYNCTP_LOG_INFO(
        "{}: first seen during CUDA-graph capture, where nothing can be measured: taking the "
        "native "
        "path (run it once before capturing to have it measured)",
        key);
    return Path::kNative;
  }
  const int ws = ctx_.world_size();
  // 1. The disk cache, if every rank found the same entry (every rank sees every rank's code).
  const int code = path_code(disk_lookup(key));
  bool agree = code != 0;
  for (const std::vector<double>& theirs : over_ranks({static_cast<double>(code)}))
    agree = agree && theirs[0] == code;
  if (agree) {
    DispatchTiming t;
    t.path = code == 1 ? Path::kFused : Path::kNative;
    t.from_disk = true;
    decisions_[key] = t;
    ASYNCTP_LOG_DEBUG("{}: {} (from {})", key, path_name(t.path), cache_path_);
    return t.path;
  }
  // 2. Measure: warm-up, then interleaved timed runs on every rank, each run started from a
  //    device barrier (as the bench does) so that no rank's time includes waiting for a peer
  //    that is still finishing the previous run. A close call (within kCloseCall) gets
  //    kCloseCallRuns more rounds: every rank sees the same values, so all extend together.
  run(Path::kFused);
  run(Path::kNative);
  Stream& s = ctx_.stream();
  auto start = be.create_event(true);
  auto stop = be.create_event(true);
  std::vector<double> fused, native;
  auto measure = [&](int rounds) {
    for (int i = 0; i < rounds; ++i) {
      // Alternating which path goes first: neither always follows the other.
      const bool fused_first = (fused.size() % 2) == 0;
      for (Path p : {fused_first ? Path::kFused : Path::kNative,
                     fused_first ? Path::kNative : Path::kFused}) {
        ctx_.align_ranks();
        start->record(s);
        run(p);
        stop->record(s);
        stop->synchronize();
        const double us = 1000.0 * stop->elapsed_ms(*start);
        (p == Path::kFused ? fused : native).push_back(us);
        // Idle as long as the run took (see kTunePace), spinning: the bench's default.
        pause_host(std::chrono::duration<double, std::micro>(kTunePace * us), HostPause::kSpin);
      }
    }
  };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // Each path's time is its slowest rank's median: the op ends for the job when it ends on every
  // rank (and the bench reports the slowest rank too). Every rank sees the same values, so all
  // extend together and all choose alike.
  auto slowest = [&] {
    std::pair<double, double> t{0, 0};
    for (const std::vector<double>& theirs : over_ranks({median(fused), median(native)})) {
      t.first = std::max(t.first, theirs[0]);
      t.second = std::max(t.second, theirs[1]);
    }
    return t;
  };
  measure(kTuneRuns);
  auto [fused_us, native_us] = slowest();
  if (std::abs(fused_us - native_us) < kCloseCall * std::min(fused_us, native_us)) {
    measure(kCloseCallRuns);
    std::tie(fused_us, native_us) = slowest();
  }
  DispatchTiming t;
  t.fused_us = fused_us;
  t.native_us = native_us;
  t.path = t.native_us <= t.fused_us ? Path::kNative : Path::kFused;
  decisions_[key] = t;
  disk_store(key, t);
  ASYNCTP_LOG_INFO("{}: {} (fused {:.1f} us, native {:.1f} us, slowest of {} ranks)", key,
                   path_name(t.path), t.fused_us, t.native_us, ws);
  return t.path;
}

}  // namespace asynctp
