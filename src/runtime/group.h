// Group: the ranks of one job and how to reach them. Built from the variables torchrun (and
// `asynctp launch`) set: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
// Rank 0 serves the store on MASTER_ADDR:MASTER_PORT (or ASYNCTP_STORE_PORT when set); everyone,
// rank 0 included, is a client of it.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/deadline.h"
#include "runtime/store.h"

namespace asynctp {

struct RendezvousInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;

  // Reads the torchrun variables; throws naming a missing or malformed one. With none of them
  // set, returns a single-rank job (rank 0 of 1) on a free local port.
  static RendezvousInfo from_env();
};

struct GroupOptions {
  // Bound on every wait of this group (store calls, signals, barriers).
  Millis timeout = default_timeout();
  // Rank 0 starts the store server. Off when the server lives elsewhere (the test harness).
  bool serve_store = true;
  // Identifies the node this rank runs on: ASYNCTP_HOST_ID if set, else the host name and boot
  // id. Ranks with different ids are taken to be on different nodes.
  std::optional<std::string> host_id;
};

class Group {
 public:
  static std::shared_ptr<Group> from_env(GroupOptions options = {});
  static std::shared_ptr<Group> create(const RendezvousInfo& info, GroupOptions options = {});
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return info_.rank; }
  int world_size() const { return info_.world_size; }
  int local_rank() const { return info_.local_rank; }
  int local_world_size() const { return info_.local_world_size; }
  Millis timeout() const { return options_.timeout; }
  Store& store() { return *store_; }

  // Same on every rank of the job: names shared resources (ASYNCTP_RUN_ID if set).
  const std::string& run_id() const { return run_id_; }
  // Index of the node a rank runs on (in order of first appearance); all on one node?
  int node_of(int rank) const { return node_of_rank_.at(rank); }
  bool single_node() const { return single_node_; }

  // Every rank waits here until all have arrived (through the store; for host-side steps only).
  void barrier(const std::string& tag);
  // A fresh key prefix, the same on every rank as long as every rank makes the same calls in the
  // same order (true of SPMD code): "<what>/<n>".
  std::string next_key(const std::string& what);

 private:
  Group(const RendezvousInfo& info, GroupOptions options);

  RendezvousInfo info_;
  GroupOptions options_;
  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<Store> store_;
  std::string run_id_;
  std::vector<int> node_of_rank_;
  bool single_node_ = true;
  int64_t key_counter_ = 0;
};

// This machine's identity for node detection (see GroupOptions::host_id).
std::string local_host_id();

}  // namespace asynctp
