#include "passes/bucketing.h"

#include <algorithm>
#include <map>
#include <unordered_set>

#include "core/error.h"
#include "graph/kernel.h"
#include "passes/collective_match.h"
#include "passes/graph_edit.h"

namespace asynctp::passes {

namespace {

struct Member {
  std::string coll, wait, input;
  TensorMeta in, out;
  size_t bytes = 0;
};

struct Group {
  bool gather = true;
  std::string group, reduce_op;
  int64_t group_size = 0;
  std::vector<Member> members;
};

size_t bytes_of(const TensorMeta& m) {
  const auto dtype = graph::dtype_from_torch(m.dtype);
  const size_t es =
      dtype ? element_size(*dtype) : (m.dtype == "int64" || m.dtype == "float64" ? 8 : 4);
  return static_cast<size_t>(m.shape.product()) * es;
}

// Candidates by (kind, group, dtype, reduce op), in graph order.
std::map<std::string, Group> candidates(const Graph& g, FusionReport& report) {
  const Users users = g.users();
  std::map<std::string, Group> groups;
  for (const auto& n : g.nodes()) {
    const bool gather = n.target == kAllGather;
    if (!gather && n.target != kReduceScatter) continue;
    const auto& us = users_of(users, n.name);
    const std::string input = node_arg(n, 0);
    const TensorMeta* in = tensor_meta(g, input);
    const TensorMeta* out = tensor_meta(g, n.name);
    if (us.size() != 1 || g.find(us[0])->target != kWait || in == nullptr || out == nullptr ||
        n.args.size() < (gather ? 3u : 4u)) {
      continue;
    }
    Group key_group;
    key_group.gather = gather;
    key_group.group_size = n.args[gather ? 1 : 2].i;
    key_group.group = n.args[gather ? 2 : 3].s;
    key_group.reduce_op = gather ? "" : n.args[1].s;
    const std::string key = fmt::format("{}|{}|{}|{}", gather ? "ag" : "rs", key_group.group,
                                        out->dtype, key_group.reduce_op);
    auto [it, fresh] = groups.emplace(key, key_group);
    it->second.members.push_back({n.name, us[0], input, *in, *out, bytes_of(*out)});
  }
  return groups;
}

std::vector<std::vector<Member>> plan(const Graph& g, const Group& grp,
                                      const BucketOptions& options) {
  const Users users = g.users();
  std::vector<std::vector<Member>> buckets;
  std::vector<Member> pending = grp.members;
  size_t bucket_idx = 0;
  auto cap_of = [&](size_t i) {
    const double mb = options.cap_mb[std::min(i, options.cap_mb.size() - 1)];
    return static_cast<size_t>(mb * 1024.0 * 1024.0);
  };
  while (!pending.empty()) {
    std::vector<Member> deferred, cur;
    std::unordered_set<std::string> cur_desc;
    size_t cur_bytes = 0;
    auto close = [&] {
      if (cur.size() > 1) buckets.push_back(cur);
      if (!cur.empty()) ++bucket_idx;
      cur.clear();
      cur_desc.clear();
      cur_bytes = 0;
    };
    for (const auto& m : pending) {
      // Neither may depend on the other: m on a member of the open bucket, or (possible once
      // earlier buckets merged other collectives) a member on m.
      const auto m_desc = descendants(g, users, m.coll);
      const bool feeds_member = std::any_of(
          cur.begin(), cur.end(), [&](const Member& c) { return m_desc.count(c.coll) > 0; });
      if (cur_desc.count(m.coll) || feeds_member) {
        deferred.push_back(m);
        continue;
      }
      if (!cur.empty() && cur_bytes + m.bytes > cap_of(bucket_idx)) close();
      cur.push_back(m);
      cur_bytes += m.bytes;
      cur_desc.insert(m_desc.begin(), m_desc.end());
    }
    close();
    if (deferred.size() == pending.size()) break;  // cannot happen: the first always joins
    pending = std::move(deferred);
  }
  return buckets;
}

Meta meta(const Dims& shape, const std::string& dtype, const std::string& device) {
  return Meta::of(contiguous_meta(shape, dtype, device));
}

void merge(Graph& g, const Group& grp, const std::vector<Member>& bucket, FusionReport& report,
           size_t index) {
  size_t pos = 0;
  for (const auto& m : bucket)
    pos = std::max(pos, g.index_of(m.coll) + 1);
  const std::string dtype = bucket[0].out.dtype, device = bucket[0].out.device;
  const int64_t ws = grp.group_size;
  const std::string stem =
      g.unique_name(grp.gather ? "bucket_all_gather" : "bucket_reduce_scatter");
  auto add = [&](const std::string& base, const std::string& target, std::vector<Value> args,
                 Meta m = {}) {
    const std::string name = g.unique_name(base);
    g.insert(pos++, make_call(name, target, std::move(args), {}, std::move(m)));
    return name;
  };
  std::vector<Value> parts, sizes;
  int64_t total = 0;
  for (const auto& m : bucket) {
    const int64_t n = grp.gather ? m.in.shape.product() : m.in.shape.product() / ws;
    total += n;
    sizes.push_back(Value::integer(n));
    const Dims shape = grp.gather ? Dims{n} : Dims{ws, n};
    parts.push_back(
        Value::node(add(stem + "_in", "aten.reshape.default",
                        {Value::node(m.input), int_list(shape)}, meta(shape, dtype, device))));
  }
  std::string wait, flat;
  if (grp.gather) {
    flat = add(stem + "_flat", "aten.cat.default", {Value::of_list(parts), Value::integer(0)},
               meta({total}, dtype, device));
    const std::string coll =
        add(stem, kAllGather, {Value::node(flat), Value::integer(ws), Value::string(grp.group)},
            meta({ws * total}, dtype, device));
    wait = add(stem + "_wait", kWait, {Value::node(coll)}, meta({ws * total}, dtype, device));
    wait = add(stem + "_rows", "aten.reshape.default", {Value::node(wait), int_list({ws, total})},
               meta({ws, total}, dtype, device));
  } else {
    const std::string cat =
        add(stem + "_cat", "aten.cat.default", {Value::of_list(parts), Value::integer(1)},
            meta({ws, total}, dtype, device));
    flat = add(stem + "_flat", "aten.reshape.default", {Value::node(cat), int_list({ws * total})},
               meta({ws * total}, dtype, device));
    const std::string coll = add(stem, kReduceScatter,
                                 {Value::node(flat), Value::string(grp.reduce_op),
                                  Value::integer(ws), Value::string(grp.group)},
                                 meta({total}, dtype, device));
    wait = add(stem + "_wait", kWait, {Value::node(coll)}, meta({total}, dtype, device));
  }
  const std::string split =
      add(stem + "_split", "aten.split_with_sizes.default",
          {Value::node(wait), Value::of_list(sizes), Value::integer(grp.gather ? 1 : 0)});
  size_t total_bytes = 0;
  for (size_t i = 0; i < bucket.size(); ++i) {
    const Member& m = bucket[i];
    const int64_t n = sizes[i].i;
    const Dims piece = grp.gather ? Dims{ws, n} : Dims{n};
    const std::string item =
        add(stem + "_item", "_operator.getitem",
            {Value::node(split), Value::integer(static_cast<int64_t>(i))},
            Meta::of({piece, grp.gather ? Dims{total, 1} : Dims{1}, dtype, device}));
    const std::string out =
        add(stem + "_out", "aten.reshape.default", {Value::node(item), int_list(m.out.shape)},
            meta(m.out.shape, dtype, device));
    g.replace_all_uses(m.wait, out);
    total_bytes += m.bytes;
  }
  for (const auto& m : bucket) {
    g.erase(m.wait);
    g.erase(m.coll);
  }
  const std::string coll_name = stem;
  for (const auto& m : bucket) {
    report.set(m.coll, grp.gather ? "all_gather" : "reduce_scatter", Outcome::kBucketed,
               fmt::format("into {} with {} other {} ({} bytes in all, bucket {})", coll_name,
                           bucket.size() - 1, grp.gather ? "all-gathers" : "reduce-scatters",
                           total_bytes, index));
  }
}

}  // namespace

void bucket_collectives(Graph& g, const BucketOptions& options, FusionReport& report) {
  if (options.cap_mb.empty()) return;
  for (double mb : options.cap_mb)
    ASYNCTP_CHECK(mb > 0, "bucket cap must be positive, got {} MiB", mb);
  auto groups = candidates(g, report);
  size_t index = 0;
  for (auto& [key, grp] : groups) {
    // Merging one group moves dependencies around (a member's users now wait for the whole
    // bucket): re-sort, and take this group's members in the current order.
    stable_topological_sort(g);
    std::sort(grp.members.begin(), grp.members.end(), [&](const Member& a, const Member& b) {
      return g.index_of(a.coll) < g.index_of(b.coll);
    });
    for (const auto& bucket : plan(g, grp, options))
      merge(g, grp, bucket, report, index++);
  }
  stable_topological_sort(g);
  g.validate();
}

}  // namespace asynctp::passes
