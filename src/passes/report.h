// The fusion report: one entry per collective of the input graph saying what became of it:
// fused into which node, bucketed into which collective, or why it was left alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace asynctp::passes {

enum class Outcome : uint8_t {
  kFused,      // replaced by a fused node
  kBucketed,   // merged with others into one collective
  kUnmatched,  // no pattern applies (e.g. the gathered tensor feeds no matmul)
  kBlocked,    // a pattern applies but something prevented the fusion (--strict makes it an error)
};
std::string_view outcome_name(Outcome outcome);

struct ReportEntry {
  std::string collective;  // node name in the input graph
  std::string kind;        // all_gather, reduce_scatter, all_reduce
  Outcome outcome = Outcome::kUnmatched;
  std::string detail;  // "into fused_all_gather_matmul (2 matmuls: mm, mm_1)" or the reason
};

class FusionReport {
 public:
  // Adds or overwrites the entry of `collective` (the last word on a collective wins).
  void set(const std::string& collective, const std::string& kind, Outcome outcome,
           std::string detail);
  const ReportEntry* find(const std::string& collective) const;
  const std::vector<ReportEntry>& entries() const { return entries_; }
  int count(Outcome outcome) const;
  // One line per collective: "all_gather all_gather_into_tensor: fused: into ...".
  std::string text() const;
  std::string json() const;

 private:
  std::vector<ReportEntry> entries_;
};

}  // namespace asynctp::passes
