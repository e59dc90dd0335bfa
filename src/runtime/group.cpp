#include "runtime/group.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <random>

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"

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
  return std::shared_ptr<Group>(new Group(info, std::move(options)));
}

Group::Group(const RendezvousInfo& info, GroupOptions options)
    : info_(info), options_(std::move(options)) {
  ASYNCTP_CHECK(info.world_size >= 1, "world size must be at least 1, got {}", info.world_size);
  ASYNCTP_CHECK(info.rank >= 0 && info.rank < info.world_size, "rank {} out of range [0, {})",
                info.rank, info.world_size);
  set_log_rank(info.rank);
  int port = info.master_port;
  if (info.rank == 0 && options_.serve_store) {
    server_ = std::make_unique<StoreServer>(info.master_addr, port);
    port = server_->port();
  }
  ASYNCTP_CHECK(port > 0, "rank {}: no store port (MASTER_PORT) to connect to", info.rank);
  store_ = std::make_unique<Store>(info.master_addr, port, options_.timeout, info.rank);

  // Run id and node map: one round trip through the store.
  if (info.rank == 0)
    store_->set("asynctp/run_id", envvars::kRunId.text().value_or(random_hex(12)));
  run_id_ = store_->get("asynctp/run_id");
  const std::string host = options_.host_id.value_or(local_host_id());
  store_->set(fmt::format("asynctp/host/{}", info.rank), host);
  std::vector<std::string> hosts;
  for (int r = 0; r < info.world_size; ++r)
    hosts.push_back(store_->get(fmt::format("asynctp/host/{}", r)));
  std::vector<std::string> nodes;  // distinct host ids in order of first appearance
  for (const auto& h : hosts) {
    auto it = std::find(nodes.begin(), nodes.end(), h);
    if (it == nodes.end()) it = nodes.insert(nodes.end(), h);
    node_of_rank_.push_back(static_cast<int>(it - nodes.begin()));
  }
  single_node_ =
      std::all_of(node_of_rank_.begin(), node_of_rank_.end(), [](int n) { return n == 0; });
}

Group::~Group() {
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
