#include <asynctp/group.h>

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <random>

#include <fmt/ranges.h>

#include "core/deadline.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/store.h"

namespace asynctp {

namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int env_int(const char* name, int min_value) {
  auto v = env(name);
  ASYNCTP_CHECK(v.has_value(),
                "environment variable {} is not set (it is set by torchrun or "
                "`asynctp launch`)",
                name);
  int value = 0;
  auto [ptr, ec] = std::from_chars(v->data(), v->data() + v->size(), value);
  ASYNCTP_CHECK(ec == std::errc() && ptr == v->data() + v->size() && value >= min_value,
                "environment variable {}='{}' is not an integer >= {}", name, *v, min_value);
  return value;
}

std::string random_hex(size_t digits) {
  std::random_device rd;
  std::string out;
  while (out.size() < digits)
    out += fmt::format("{:08x}", rd());
  return out.substr(0, digits);
}

}  // namespace

RendezvousInfo RendezvousInfo::from_env() {
  RendezvousInfo info;
  const bool any = env("RANK") || env("WORLD_SIZE") || env("MASTER_PORT");
  if (!any) {
    info.master_port = 0;  // single process: serve on a free port
    info.store_secret = store_secret_from_env(1);
    return info;
  }
  info.rank = env_int("RANK", 0);
  info.world_size = env_int("WORLD_SIZE", 1);
  ASYNCTP_CHECK(info.rank < info.world_size, "RANK={} is not below WORLD_SIZE={}", info.rank,
                info.world_size);
  info.local_rank = env("LOCAL_RANK") ? env_int("LOCAL_RANK", 0) : info.rank;
  info.local_world_size =
      env("LOCAL_WORLD_SIZE") ? env_int("LOCAL_WORLD_SIZE", 1) : info.world_size;
  ASYNCTP_CHECK(info.local_rank < info.local_world_size,
                "LOCAL_RANK={} is not below LOCAL_WORLD_SIZE={}", info.local_rank,
                info.local_world_size);
  info.master_addr = env("MASTER_ADDR").value_or("127.0.0.1");
  info.store_secret = store_secret_from_env(info.world_size);
  info.master_port = env_int("MASTER_PORT", 1);
  ASYNCTP_CHECK(info.master_port <= 65535, "MASTER_PORT={} is not a TCP port", info.master_port);
  // torchrun's own agent store may already own MASTER_PORT; ASYNCTP_STORE_PORT moves ours.
  if (const int64_t port = envvars::kStorePort.integer(); port != 0) {
    info.master_port = static_cast<int>(port);
  } else if (env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True") {
    info.master_port += 1;
  }
  return info;
}

std::string local_host_id() {
  if (auto id = envvars::kHostId.text()) return *id;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  return fmt::format("{}/{}", host, boot_id);
}

std::shared_ptr<Group> Group::from_env(GroupOptions options) {
  return create(RendezvousInfo::from_env(), std::move(options));
}

std::shared_ptr<Group> Group::create(const RendezvousInfo& info, GroupOptions options) {
  envvars::check_all();
  const GroupInfo ginfo{info.rank, info.world_size, info.local_rank, info.local_world_size};
  check_info(ginfo);
  std::shared_ptr<Group> group(new Group(ginfo, std::move(options)));
  set_log_rank(info.rank);
  int port = info.master_port;
  if (info.rank == 0 && group->options_.serve_store) {
    StoreServerOptions server_options;
    // Every rank holds one connection; a rank that timed out reconnects while the server may
    // not have seen the old one close yet.
    server_options.max_connections =
        std::max<size_t>(server_options.max_connections, 2 * size_t(info.world_size) + 64);
    try {
      group->server_ =
          std::make_unique<StoreServer>(info.master_addr, port, info.store_secret, server_options);
    } catch (const Error& e) {
      throw Error(fmt::format("rank 0: cannot serve the job's store: {}", e.what()));
    }
    port = group->server_->port();
  }
  ASYNCTP_CHECK(port > 0, "rank {}: no store port (MASTER_PORT) to connect to", info.rank);
  ASYNCTP_CHECK(!info.store_secret.empty(),
                "rank {}: no store secret (RendezvousInfo::store_secret; from_env reads {})",
                info.rank, envvars::kStoreSecret.name);
  group->store_ = std::make_shared<TcpStore>(info.master_addr, port, group->options_.timeout,
                                             info.rank, info.store_secret);
  group->owns_tcp_store_ = true;
  // The launcher (and the test harness) name the run, and remove its shared memory afterwards.
  group->exchange_identity(envvars::kRunId.text().value_or(random_hex(12)));
  return group;
}

std::shared_ptr<Group> Group::create(std::shared_ptr<Store> store, const GroupInfo& info,
                                     GroupOptions options) {
  envvars::check_all();
  check_info(info);
  ASYNCTP_CHECK(store != nullptr, "rank {}: Group::create needs a store, got null", info.rank);
  std::shared_ptr<Group> group(new Group(info, std::move(options)));
  // A host store may serve several of our groups (one per process group, or one made again after
  // the last was destroyed): each gets a namespace of its own, numbered by how many groups this
  // rank has made over the store. Every rank makes them in the same order (SPMD), so the numbers
  // agree without a round trip.
  const int64_t generation = store->add(fmt::format("asynctp/groups_made/{}", info.rank), 1);
  group->store_ =
      std::make_shared<PrefixStore>(std::move(store), fmt::format("asynctp/group/{}", generation));
  // Several groups of one run may be built over one host store (a world group and its TP
  // groups): a random suffix keeps their shared memory and sockets apart, while the run's
  // prefix keeps them findable by the launcher's clean-up.
  const auto run = envvars::kRunId.text();
  group->exchange_identity(run ? *run + "-" + random_hex(8) : random_hex(12));
  return group;
}

void Group::check_info(const GroupInfo& info) {
  ASYNCTP_CHECK(info.world_size >= 1, "world size must be at least 1, got {}", info.world_size);
  ASYNCTP_CHECK(info.rank >= 0 && info.rank < info.world_size, "rank {} out of range [0, {})",
                info.rank, info.world_size);
  ASYNCTP_CHECK(info.local_world_size >= 1, "rank {}: local world size must be at least 1, got {}",
                info.rank, info.local_world_size);
  ASYNCTP_CHECK(info.local_rank >= 0 && info.local_rank < info.local_world_size,
                "rank {}: local rank {} out of range [0, {})", info.rank, info.local_rank,
                info.local_world_size);
}

Group::Group(const GroupInfo& info, GroupOptions options)
    : info_(info), options_(std::move(options)) {}

void Group::exchange_identity(const std::string& rank0_run_id) {
  // Run id and node map: one round trip through the store.
  // A timeout here means a rank never came (it crashed, or was never started): name it, not
  // only the key its absence left unset.
  const auto from_rank = [&](int r, const std::string& key) {
    try {
      return store_->get(key);
    } catch (const TimeoutError& e) {
      ASYNCTP_TIMEOUT("rank {}: rank {} of {} never joined the group ({} never came): {}",
                      info_.rank, r, info_.world_size, key, e.what());
    }
  };
  if (info_.rank == 0) store_->set("asynctp/run_id", rank0_run_id);
  run_id_ = from_rank(0, "asynctp/run_id");
  const std::string host = options_.host_id.value_or(local_host_id());
  store_->set(fmt::format("asynctp/host/{}", info_.rank), host);
  std::vector<std::string> hosts;
  for (int r = 0; r < info_.world_size; ++r)
    hosts.push_back(from_rank(r, fmt::format("asynctp/host/{}", r)));
  set_node_map(hosts);
}

void Group::set_node_map(const std::vector<std::string>& node_keys) {
  std::vector<std::string> nodes;  // distinct keys in order of first appearance
  node_of_rank_.clear();
  for (const auto& h : node_keys) {
    auto it = std::find(nodes.begin(), nodes.end(), h);
    if (it == nodes.end()) it = nodes.insert(nodes.end(), h);
    node_of_rank_.push_back(static_cast<int>(it - nodes.begin()));
  }
  single_node_ = nodes.size() <= 1;
}

std::shared_ptr<Group> Group::split(std::span<const int> ranks) {
  ASYNCTP_CHECK(!ranks.empty(), "rank {}: split needs at least one rank", info_.rank);
  std::vector<int> list(ranks.begin(), ranks.end());
  int my_index = -1;
  for (size_t i = 0; i < list.size(); ++i) {
    ASYNCTP_CHECK(list[i] >= 0 && list[i] < info_.world_size,
                  "rank {}: split rank {} (index {}) is out of range [0, {})", info_.rank, list[i],
                  i, info_.world_size);
    ASYNCTP_CHECK(std::find(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(i), list[i]) ==
                      list.begin() + static_cast<std::ptrdiff_t>(i),
                  "rank {}: split lists rank {} twice", info_.rank, list[i]);
    if (list[i] == info_.rank) my_index = static_cast<int>(i);
  }
  ASYNCTP_CHECK(my_index >= 0, "rank {}: split({}) is called by a rank that is not in the list",
                info_.rank, fmt::join(list, ","));

  // The namespace: the list names the subgroup; the count tells repeated splits of one list
  // apart. Both are the same on every member, whatever else each member has split.
  const int64_t n = split_counts_[list]++;
  const std::string prefix = fmt::format("asynctp/split/{}/{}", fmt::join(list, ","), n);

  GroupInfo sub;
  sub.rank = my_index;
  sub.world_size = static_cast<int>(list.size());
  sub.local_rank = info_.local_rank;
  sub.local_world_size = info_.local_world_size;
  std::shared_ptr<Group> group(new Group(sub, options_));
  group->store_ = std::make_shared<PrefixStore>(store_, prefix);
  group->parent_ = shared_from_this();
  // Shared memory and sockets are named "asynctp-<run_id>-...": extend this group's run id by a
  // hash of the namespace (short, since socket names are), so names stay under the run's prefix.
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (const char c : prefix) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ull;
  }
  group->run_id_ = fmt::format("{}-{:08x}", run_id_, static_cast<uint32_t>(hash ^ (hash >> 32)));
  std::vector<std::string> node_keys;
  for (const int r : list) {
    group->global_ranks_.push_back(global_rank(r));
    node_keys.push_back(std::to_string(node_of(r)));
  }
  group->set_node_map(node_keys);
  return group;
}

int Group::global_rank(int group_rank) const {
  ASYNCTP_CHECK(group_rank >= 0 && group_rank < info_.world_size,
                "global_rank: rank {} out of range [0, {})", group_rank, info_.world_size);
  return global_ranks_.empty() ? group_rank : global_ranks_[static_cast<size_t>(group_rank)];
}

Group::~Group() {
  if (!owns_tcp_store_) return;
  // Rank 0 owns the store: keep serving until every rank has said it is done with it, so that
  // a slower rank's last store call does not fail. Bounded, since a crashed rank never says so.
  try {
    store_->add("asynctp/finished", 1);
    if (server_) {
      const Deadline deadline(std::min<Millis>(options_.timeout, Millis(30'000)));
      while (store_->add("asynctp/finished", 0) < info_.world_size && !deadline.expired()) {
        ::usleep(2000);
      }
    }
  } catch (const std::exception& e) {
    ASYNCTP_LOG_DEBUG("group shutdown: {}", e.what());
  }
}

void Group::barrier(const std::string& tag) {
  const std::string key = next_key("barrier/" + tag);
  if (store_->add(key, 1) == info_.world_size) store_->set(key + "/done", "1");
  store_->wait({key + "/done"});
}

std::string Group::next_key(const std::string& what) {
  return fmt::format("asynctp/{}/{}", what, key_counter_++);
}

}  // namespace asynctp
