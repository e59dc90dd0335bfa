// Group: some ranks of one job and how to reach them. Three ways to make one:
//   - from the variables torchrun (and `asynctp launch`) set: RANK, WORLD_SIZE, LOCAL_RANK,
//     LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and ASYNCTP_STORE_SECRET. Rank 0 serves a
//     TcpStore on MASTER_ADDR:MASTER_PORT (or ASYNCTP_STORE_PORT when set), bound to that
//     address only; everyone, rank 0 included, is a client of it, admitted by the secret;
//   - over any Store (a host framework's, through CallbackStore) with the ranks given;
//   - as a subgroup of another group (split): any subset of its ranks, in any order, with its own
//     namespace in the parent's store. The TP and DP groups of a 2-D mesh live side by side.
// Every resource named after a group (store keys, shared memory, sockets, NCCL ids) is distinct
// per group: keys live in the group's own store namespace, and run_id() differs per group.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <asynctp/errors.h>
#include <asynctp/store.h>

namespace asynctp {

class StoreServer;

struct RendezvousInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // The job's store secret (ASYNCTP_STORE_SECRET): every store connection proves it knows it.
  std::string store_secret;

  // Reads the torchrun variables and ASYNCTP_STORE_SECRET; throws naming a missing or malformed
  // one (the secret is required with several ranks: see store_secret_from_env). With none of
  // them set, returns a single-rank job (rank 0 of 1) on a free local port with a random secret.
  static RendezvousInfo from_env();
};

// Where a rank sits in a group built over a given store.
struct GroupInfo {
  int rank = 0;
  int world_size = 1;
  // The rank's index among the ranks of its node (the GPU it drives), and how many there are.
  int local_rank = 0;
  int local_world_size = 1;
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

class Group : public std::enable_shared_from_this<Group> {
 public:
  static std::shared_ptr<Group> from_env(GroupOptions options = {});
  static std::shared_ptr<Group> create(const RendezvousInfo& info, GroupOptions options = {});
  // A group over `store`, which every rank of it passes. The group's keys live under
  // "asynctp/group/<n>" of it, n counting the groups this rank has made over that store, so
  // that several groups can share one store as long as every rank makes them in the same order
  // (else give each its own PrefixStore). Rank 0 chooses the run id (ASYNCTP_RUN_ID plus a random
  // suffix, or random) and every rank posts its host id: one round trip. options.serve_store is
  // ignored: the store is the caller's, and outlives the group through the shared_ptr.
  static std::shared_ptr<Group> create(std::shared_ptr<Store> store, const GroupInfo& info,
                                       GroupOptions options = {});
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return info_.rank; }
  int world_size() const { return info_.world_size; }
  int local_rank() const { return info_.local_rank; }
  int local_world_size() const { return info_.local_world_size; }
  Millis timeout() const { return options_.timeout; }
  Store& store() { return *store_; }
  const std::shared_ptr<Store>& shared_store() const { return store_; }

  // The subgroup of this group's ranks `ranks` (ranks[i] becomes rank i of it). Called by those
  // ranks only, each with the same list; no other rank takes part. Its keys live under
  // "asynctp/split/<ranks>/<n>" of this group's store, n counting the splits of that list made
  // so far, so that disjoint subgroups (the TP groups {0,1} and {2,3} of 4) and repeated splits
  // never share a key. It keeps this group (and so its store) alive. A member's local rank and
  // local world size are its own here (the GPU it drives).
  std::shared_ptr<Group> split(std::span<const int> ranks);
  // The rank in the root group (the world) of this group's rank `group_rank`.
  int global_rank(int group_rank) const;

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
  Group(const GroupInfo& info, GroupOptions options);
  static void check_info(const GroupInfo& info);
  // Rank 0 posts `rank0_run_id`, every rank its host id; sets run_id_ and the node map.
  void exchange_identity(const std::string& rank0_run_id);
  void set_node_map(const std::vector<std::string>& node_keys);

  GroupInfo info_;
  GroupOptions options_;
  std::unique_ptr<StoreServer> server_;
  std::shared_ptr<Store> store_;
  // Root groups made from a RendezvousInfo: every rank reports when it is done with the store,
  // and rank 0 keeps serving it until all have.
  bool owns_tcp_store_ = false;
  // Subgroups: the parent, kept alive, and each rank's rank in the root group.
  std::shared_ptr<Group> parent_;
  std::vector<int> global_ranks_;
  std::string run_id_;
  std::vector<int> node_of_rank_;
  bool single_node_ = true;
  int64_t key_counter_ = 0;
  std::map<std::vector<int>, int64_t> split_counts_;
};

// This machine's identity for node detection (see GroupOptions::host_id).
std::string local_host_id();

}  // namespace asynctp
