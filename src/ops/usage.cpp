#include <asynctp/context.h>

#include "core/error.h"
#include "core/log.h"

namespace asynctp {

std::string_view path_name(Path path) {
  switch (path) {
    case Path::kSplit:
      return "split";
    case Path::kNative:
      return "native";
    case Path::kFallback:
      return "fallback";
  }
  return "?";
}

PathChoice parse_path_choice(std::string_view text) {
  if (text == "auto") return PathChoice::kAuto;
  if (text == "split") return PathChoice::kSplit;
  if (text == "fallback" || text == "unfused") return PathChoice::kFallback;
  if (text == "native") return PathChoice::kNative;
  ASYNCTP_FAIL("path must be auto, native, split or fallback, got '{}'", text);
}

std::string_view path_choice_name(PathChoice choice) {
  switch (choice) {
    case PathChoice::kAuto:
      return "auto";
    case PathChoice::kSplit:
      return "split";
    case PathChoice::kFallback:
      return "fallback";
    case PathChoice::kNative:
      return "native";
  }
  return "?";
}

void Usage::record(std::string_view op, Path path, std::string_view reason, bool warn) {
  ++counts_[{std::string(op), path}];
  last_[std::string(op)] = PathRecord{path, std::string(reason)};
  if (warn && path == Path::kFallback &&
      warned_.emplace(std::string(op), std::string(reason)).second) {
    ASYNCTP_LOG_WARN("{} takes the unfused fallback: {}", op, reason);
  }
}

int64_t Usage::count(std::string_view op, Path path) const {
  auto it = counts_.find({std::string(op), path});
  return it == counts_.end() ? 0 : it->second;
}

std::optional<PathRecord> Usage::last(std::string_view op) const {
  auto it = last_.find(op);
  if (it == last_.end()) return std::nullopt;
  return it->second;
}

void Usage::reset() {
  counts_.clear();
  last_.clear();
}

}  // namespace asynctp
