#include <asynctp/context.h>

#include <string>

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

KernelPush parse_kernel_push(std::string_view text) {
  std::string lower(text);
  for (char& ch : lower)
    ch = static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
  if (lower == "auto") return KernelPush::kAuto;
  if (lower == "0" || lower == "off" || lower == "false" || lower == "no") return KernelPush::kOff;
  if (lower == "1" || lower == "on" || lower == "true" || lower == "yes") return KernelPush::kOn;
  ASYNCTP_FAIL("kernel_push must be auto, 0 (copy streams push) or 1 (the GEMM pushes), got '{}'",
               text);
}

std::string_view kernel_push_name(KernelPush push) {
  switch (push) {
    case KernelPush::kAuto:
      return "auto";
    case KernelPush::kOff:
      return "0";
    case KernelPush::kOn:
      return "1";
  }
  return "?";
}

static_assert(static_cast<size_t>(Path::kNative) < 3, "Usage::PerOp::counts is indexed by Path");

void Usage::record(std::string_view op, Path path, std::string_view reason, bool warn) {
  // Every eager call passes here: no allocation once the op has been seen.
  auto it = ops_.find(op);
  if (it == ops_.end()) it = ops_.emplace(std::string(op), PerOp{}).first;
  PerOp& per_op = it->second;
  ++per_op.counts[static_cast<size_t>(path)];
  per_op.last = path;
  per_op.seen = true;
  if (per_op.reason != reason) per_op.reason.assign(reason);
  if (warn && path == Path::kFallback &&
      warned_.emplace(std::string(op), std::string(reason)).second) {
    ASYNCTP_LOG_WARN("{} takes the unfused fallback: {}", op, reason);
  }
}

int64_t Usage::count(std::string_view op, Path path) const {
  auto it = ops_.find(op);
  return it == ops_.end() ? 0 : it->second.counts[static_cast<size_t>(path)];
}

std::optional<PathRecord> Usage::last(std::string_view op) const {
  auto it = ops_.find(op);
  if (it == ops_.end() || !it->second.seen) return std::nullopt;
  return PathRecord{it->second.last, it->second.reason};
}

std::map<std::pair<std::string, Path>, int64_t> Usage::counts() const {
  std::map<std::pair<std::string, Path>, int64_t> all;
  for (const auto& [op, per_op] : ops_) {
    for (size_t p = 0; p < per_op.counts.size(); ++p)
      if (per_op.counts[p] > 0) all[{op, static_cast<Path>(p)}] = per_op.counts[p];
  }
  return all;
}

void Usage::reset() {
  ops_.clear();
}

}  // namespace asynctp
