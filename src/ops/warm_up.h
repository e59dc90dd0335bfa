// Host-side agreement across the ranks and the warm-up that needs it: what the dispatcher's
// sustained tuning and the bench's timing share.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

namespace asynctp {

class Group;
class OpContext;

// The largest of every rank's value (each rank passes its own), through the group's store, whose
// every wait is bounded by the group's timeout; the same result on every rank.
double max_over_ranks(Group& group, double value);

// Runs `round` (collective: every rank runs the same rounds) back to back until every rank has
// spent `ms` milliseconds since `began`, synchronizing the backend after each batch: a GPU that
// comes out of a pause runs its first few hundred milliseconds of heavy work at other clocks
// than under sustained load (see docs/DECISIONS.md D22, D23). The first batch is one round,
// which times a round; from it each rank works out how many more rounds its time left takes
// (at most 10,000 a batch), and the ranks run the largest count; again, until no rank has time
// left. Returns the rounds run.
int64_t warm_up_for(OpContext& ctx, const std::function<void()>& round, double ms,
                    std::chrono::steady_clock::time_point began);

}  // namespace asynctp
