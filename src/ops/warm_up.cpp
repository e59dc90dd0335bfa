#include "ops/warm_up.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "ops/context.h"

namespace asynctp {

double max_over_ranks(Group& group, double value) {
  const std::string key = group.next_key("tools/max");
  group.store().set(fmt::format("{}/{}", key, group.rank()), fmt::format("{:.17g}", value));
  double result = value;
  for (int r = 0; r < group.world_size(); ++r) {
    result = std::max(result, std::stod(group.store().get(fmt::format("{}/{}", key, r))));
  }
  return result;
}

int64_t warm_up_for(OpContext& ctx, const std::function<void()>& round, double ms,
                    std::chrono::steady_clock::time_point began) {
  using Ms = std::chrono::duration<double, std::milli>;
  int64_t rounds = 0;
  for (int64_t batch = 1; batch > 0;) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < batch; ++i)
      round();
    ctx.backend().synchronize();
    rounds += batch;
    const auto t1 = std::chrono::steady_clock::now();
    const double per_round = Ms(t1 - t0).count() / static_cast<double>(batch);
    const double left = ms - Ms(t1 - began).count();
    const double mine = left <= 0 ? 0.0 : std::min(10000.0, std::ceil(left / per_round));
    batch = static_cast<int64_t>(max_over_ranks(ctx.group(), mine));
  }
  return rounds;
}

}  // namespace asynctp
