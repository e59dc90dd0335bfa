// Usage counters: every fused-op call records which path ran and why, so tests can assert the
// path and users can see when (and why) they silently lost the overlap. The first fallback of
// each (op, reason) is also logged as a warning.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>

namespace asynctp {

// kSplit: the pipeline of per-chunk GEMMs; kNative: one async-input GEMM that consumes
// (or publishes) chunks as they move; kFallback: the collective, then one GEMM (or the reverse).
enum class Path : uint8_t { kSplit, kFallback, kNative };
std::string_view path_name(Path path);

// How the caller wants an op to run: kAuto takes the fastest of native, split and the fallback
// (measured once per problem, see ops/dispatch.h), or the fallback where neither overlapped path
// can run.
enum class PathChoice : uint8_t { kAuto, kSplit, kFallback, kNative };
PathChoice parse_path_choice(std::string_view text);
std::string_view path_choice_name(PathChoice choice);

struct PathRecord {
  Path path = Path::kSplit;
  // Why the fallback ran (the caller asked, measured fastest, or what stops the overlapped
  // paths); empty for the other paths.
  std::string reason;
};

class Usage {
 public:
  // `warn`: log the first fallback of each (op, reason); off when the caller asked for it or the
  // dispatcher measured it fastest.
  void record(std::string_view op, Path path, std::string_view reason, bool warn = true);
  int64_t count(std::string_view op, Path path) const;
  std::optional<PathRecord> last(std::string_view op) const;
  // Every (op, path) with its count: "all_gather_matmul split 3".
  std::map<std::pair<std::string, Path>, int64_t> counts() const;
  void reset();

 private:
  struct PerOp {
    std::array<int64_t, 3> counts{};  // indexed by Path's value
    Path last = Path::kSplit;
    std::string reason;  // the last call's
    bool seen = false;
  };
  std::map<std::string, PerOp, std::less<>> ops_;
  std::set<std::pair<std::string, std::string>> warned_;
};

}  // namespace asynctp
