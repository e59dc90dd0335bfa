// The bucketing pass: merges independent all-gathers (and, separately, reduce-scatters) of the
// same group, dtype (and reduce op) into one collective on one flat buffer, greedily in graph
// order, up to a size cap per bucket index (bytes of the collectives' outputs).
//
//   all-gather bucket:     flat = cat([x_i.reshape(-1)]); w = wait(all_gather(flat))
//                          out_i = split_with_sizes(w.reshape(ws, -1), [numel x_i],
//                          1)[i].reshape(..)
//   reduce-scatter bucket: flat = cat([x_i.reshape(ws, -1)], 1).reshape(-1); w = wait(rs(flat))
//                          out_i = split_with_sizes(w, [numel x_i / ws])[i].reshape(..)
// A collective that depends on one already in the open bucket never joins it (it waits for a
// later bucket). The graph is topologically sorted afterwards: users of an early member's result
// move below the merged collective, which is always possible because members are independent.
#pragma once

#include <vector>

#include "graph/ir.h"
#include "passes/report.h"

namespace asynctp::passes {

struct BucketOptions {
  // Cap in MiB of bucket i: cap_mb[min(i, size - 1)]. Empty: no bucketing.
  std::vector<double> cap_mb;
};

void bucket_collectives(graph::Graph& g, const BucketOptions& options, FusionReport& report);

}  // namespace asynctp::passes
