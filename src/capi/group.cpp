// Groups: from the torchrun variables, over the caller's store (its C callbacks adapted to a
// CallbackStore), and subgroups.
#include <algorithm>

#include "capi/internal.h"

using namespace asynctp;
using namespace asynctp::capi;

namespace {

GroupOptions group_options(int64_t timeout_ms) {
  GroupOptions options;
  if (timeout_ms > 0) options.timeout = Millis(timeout_ms);
  return options;
}

asynctp_group new_group_handle(std::shared_ptr<Group> group) {
  auto* handle = new asynctp_group_s{std::move(group)};
  register_handle(handle);
  return handle;
}

// A callback's non-zero result as an exception: 2 is a timeout (as ASYNCTP_ERROR_TIMEOUT).
[[noreturn]] void callback_failed(std::string_view callback, const std::string& key, int code) {
  if (code == ASYNCTP_ERROR_TIMEOUT)
    throw TimeoutError(fmt::format("the store's {} callback timed out on key '{}'", callback, key));
  throw StoreFailure(
      fmt::format("the store's {} callback failed on key '{}' (returned {})", callback, key, code));
}

StoreCallbacks adapt(const asynctp_store_callbacks& cb) {
  StoreCallbacks out;
  out.set = [cb](const std::string& key, const std::string& value) {
    if (int rc = cb.set(cb.user, key.c_str(), value.data(), value.size()); rc != 0)
      callback_failed("set", key, rc);
  };
  out.get = [cb](const std::string& key, Millis timeout) -> std::optional<std::string> {
    const void* value = nullptr;
    size_t len = 0;
    const int rc = cb.get(cb.user, key.c_str(), timeout.count(), &value, &len);
    if (rc == ASYNCTP_ERROR_TIMEOUT) return std::nullopt;
    if (rc != 0) callback_failed("get", key, rc);
    if (value == nullptr && len > 0)
      throw StoreFailure(fmt::format(
          "the store's get callback gave a NULL value of {} bytes for key '{}'", len, key));
    return std::string(static_cast<const char*>(value), len);
  };
  out.add = [cb](const std::string& key, int64_t delta) {
    int64_t result = 0;
    if (int rc = cb.add(cb.user, key.c_str(), delta, &result); rc != 0)
      callback_failed("add", key, rc);
    return result;
  };
  out.check = [cb](const std::string& key) {
    int32_t is_set = 0;
    if (int rc = cb.check(cb.user, key.c_str(), &is_set); rc != 0)
      callback_failed("check", key, rc);
    return is_set != 0;
  };
  out.erase = [cb](const std::string& key) {
    if (int rc = cb.erase(cb.user, key.c_str()); rc != 0) callback_failed("erase", key, rc);
  };
  return out;
}

}  // namespace

extern "C" {

asynctp_status asynctp_group_from_env(int64_t timeout_ms, asynctp_group* out) {
  return guarded(__func__, [&] {
    check_out(out, "out");
    *out = nullptr;
    *out = new_group_handle(Group::from_env(group_options(timeout_ms)));
  });
}

asynctp_status asynctp_group_from_store(const asynctp_store_callbacks* store, int32_t rank,
                                        int32_t world_size, int32_t local_rank, int64_t timeout_ms,
                                        asynctp_group* out) {
  return guarded(__func__, [&] {
    check_out(out, "out");
    *out = nullptr;
    if (store == nullptr) invalid("store is NULL");
    if (store->struct_size != static_cast<int32_t>(sizeof(asynctp_store_callbacks)))
      invalid("store->struct_size is {}, expected {}", store->struct_size,
              sizeof(asynctp_store_callbacks));
    for (auto [fn, name] : {std::pair<const void*, const char*>{(const void*)store->set, "set"},
                            {(const void*)store->get, "get"},
                            {(const void*)store->add, "add"},
                            {(const void*)store->check, "check"},
                            {(const void*)store->erase, "erase"}}) {
      if (fn == nullptr) invalid("store->{} is NULL", name);
    }
    if (world_size < 1) invalid("world_size is {} (>= 1 expected)", world_size);
    if (rank < 0 || rank >= world_size) invalid("rank is {}, outside 0..{}", rank, world_size - 1);
    if (local_rank < 0) invalid("local_rank is {} (>= 0 expected)", local_rank);
    const GroupOptions options = group_options(timeout_ms);
    auto callback_store = std::make_shared<CallbackStore>(adapt(*store), options.timeout, rank);
    GroupInfo info;
    info.rank = rank;
    info.world_size = world_size;
    info.local_rank = local_rank;
    // The caller names the GPU (local_rank) itself; the local world size is read by nothing but
    // GroupInfo's own bound (local_rank below it), so the group's size, or more, serves.
    info.local_world_size = std::max(world_size, local_rank + 1);
    *out = new_group_handle(Group::create(std::move(callback_store), info, options));
  });
}

asynctp_status asynctp_group_split(asynctp_group parent, const int32_t* ranks, int32_t n,
                                   asynctp_group* out) {
  return guarded(__func__, [&] {
    check_out(out, "out");
    *out = nullptr;
    Group& g = *group_of(parent, "parent").group;
    if (n < 1 || n > g.world_size())
      invalid("n is {}, outside 1..{} (the parent's world size)", n, g.world_size());
    if (ranks == nullptr) invalid("ranks is NULL but n is {}", n);
    std::vector<int> list(ranks, ranks + n);
    std::vector<bool> seen(g.world_size(), false);
    bool member = false;
    for (int32_t i = 0; i < n; ++i) {
      if (list[i] < 0 || list[i] >= g.world_size())
        invalid("ranks[{}] is {}, outside the parent's 0..{}", i, list[i], g.world_size() - 1);
      if (seen[list[i]]) invalid("ranks[{}] repeats rank {}", i, list[i]);
      seen[list[i]] = true;
      member = member || list[i] == g.rank();
    }
    if (!member)
      invalid("this rank ({} of the parent) is not in ranks [{}]: only members call split",
              g.rank(), fmt::join(list, ", "));
    *out = new_group_handle(g.split(list));
  });
}

asynctp_status asynctp_group_rank(asynctp_group group, int32_t* rank) {
  return guarded(__func__, [&] {
    check_out(rank, "rank");
    *rank = group_of(group, "group").group->rank();
  });
}

asynctp_status asynctp_group_world_size(asynctp_group group, int32_t* world_size) {
  return guarded(__func__, [&] {
    check_out(world_size, "world_size");
    *world_size = group_of(group, "group").group->world_size();
  });
}

asynctp_status asynctp_group_destroy(asynctp_group group) {
  return guarded(__func__, [&] {
    group_of(group, "group");
    unregister_handle(group);
    delete group;
  });
}

}  // extern "C"
