#include "passes/report.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace asynctp::passes {

std::string_view outcome_name(Outcome outcome) {
  switch (outcome) {
    case Outcome::kFused:
      return "fused";
    case Outcome::kBucketed:
      return "bucketed";
    case Outcome::kUnmatched:
      return "not fused";
    case Outcome::kBlocked:
      return "NOT FUSED (pattern matched)";
  }
  return "?";
}

void FusionReport::set(const std::string& collective, const std::string& kind, Outcome outcome,
                       std::string detail) {
  for (auto& e : entries_) {
    if (e.collective == collective) {
      e.kind = kind;
      e.outcome = outcome;
      e.detail = std::move(detail);
      return;
    }
  }
  entries_.push_back({collective, kind, outcome, std::move(detail)});
}

const ReportEntry* FusionReport::find(const std::string& collective) const {
  for (const auto& e : entries_) {
    if (e.collective == collective) return &e;
  }
  return nullptr;
}

int FusionReport::count(Outcome outcome) const {
  return static_cast<int>(
      std::count_if(entries_.begin(), entries_.end(),
                    [&](const ReportEntry& e) { return e.outcome == outcome; }));
}

std::string FusionReport::text() const {
  std::string out;
  for (const auto& e : entries_) {
    out += fmt::format("{:<14} {:<28} {}: {}\n", e.kind, e.collective, outcome_name(e.outcome),
                       e.detail);
  }
  out += fmt::format(
      "{} collectives: {} fused, {} bucketed, {} not fused ({} of them matched a "
      "pattern)\n",
      entries_.size(), count(Outcome::kFused), count(Outcome::kBucketed),
      count(Outcome::kUnmatched) + count(Outcome::kBlocked), count(Outcome::kBlocked));
  return out;
}

std::string FusionReport::json() const {
  nlohmann::ordered_json doc = nlohmann::ordered_json::array();
  for (const auto& e : entries_) {
    const char* outcome = e.outcome == Outcome::kFused      ? "fused"
                          : e.outcome == Outcome::kBucketed ? "bucketed"
                          : e.outcome == Outcome::kBlocked  ? "blocked"
                                                            : "unmatched";
    doc.push_back({{"collective", e.collective},
                   {"kind", e.kind},
                   {"outcome", outcome},
                   {"detail", e.detail}});
  }
  return doc.dump();
}

}  // namespace asynctp::passes
