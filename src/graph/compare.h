// Comparing two runs of a graph (as given, and after the passes) output by output.
#pragma once

#include <string>
#include <vector>

#include "graph/kernel.h"

namespace asynctp::graph {

// Largest relative error ||a - b|| / ||b|| accepted for results in `dtype` when only the order of
// summation and the rounding of intermediates differ (the passes change both: fused sums add in
// f32 where the graph rounded after every add).
double default_tolerance(DType dtype);

struct OutputDiff {
  size_t index = 0;
  std::string dtype;
  double rel_error = 0;
  double tolerance = 0;
  bool ok = true;
  std::string note;  // set when the outputs cannot be compared (None vs tensor, shapes)
};

// One entry per output; `tolerance` < 0 takes default_tolerance of each output's dtype.
std::vector<OutputDiff> compare_outputs(const std::vector<RtValue>& got,
                                        const std::vector<RtValue>& ref, double tolerance = -1);

}  // namespace asynctp::graph
