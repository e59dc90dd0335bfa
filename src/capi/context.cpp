// Contexts: making and releasing them, waiting for their work, what ran and what is held.
#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "capi/internal.h"
#include "ops/fused_matmul.h"

using namespace asynctp;
using namespace asynctp::capi;

namespace {

// Path as asynctp_path.
int32_t c_path(Path path) {
  switch (path) {
    case Path::kSplit:
      return ASYNCTP_PATH_SPLIT;
    case Path::kFallback:
      return ASYNCTP_PATH_FALLBACK;
    case Path::kNative:
      return ASYNCTP_PATH_NATIVE;
  }
  return -1;
}

// Copies text into buf[0..len) NUL-terminated, cut to fit.
void copy_out(std::string_view text, char* buf, size_t len) {
  if (buf == nullptr || len == 0) return;
  const size_t n = std::min(text.size(), len - 1);
  std::memcpy(buf, text.data(), n);
  buf[n] = '\0';
}

// A JSON document returned as the C ABI's *_json functions return it: *needed its size with the
// NUL, and as much of it as fits into buf.
void return_json(const std::string& text, char* buf, size_t len, size_t* needed) {
  if (buf == nullptr && len > 0) invalid("buf is NULL but len is {}", len);
  if (needed != nullptr) *needed = text.size() + 1;
  copy_out(text, buf, len);
}

}  // namespace

extern "C" {

void asynctp_context_options_init(asynctp_context_options* options) {
  if (options == nullptr) return;
  *options = asynctp_context_options{};
  options->struct_size = sizeof(asynctp_context_options);
  options->backend = nullptr;
  options->device_index = -1;
  options->max_workspace_bytes = -1;
  options->path = ASYNCTP_PATH_DEFAULT;
  options->dispatch_cache = nullptr;
}

asynctp_status asynctp_context_create(asynctp_group group, const asynctp_context_options* options,
                                      asynctp_context* out) {
  return guarded(__func__, [&] {
    check_out(out, "out");
    *out = nullptr;
    std::shared_ptr<Group> g = group_of(group, "group").group;
    asynctp_context_options o;
    asynctp_context_options_init(&o);
    if (options != nullptr) {
      // A caller compiled against an older header passes a shorter struct: its missing fields
      // keep their defaults.
      if (options->struct_size < static_cast<int32_t>(offsetof(asynctp_context_options, backend)) ||
          options->struct_size > static_cast<int32_t>(sizeof(asynctp_context_options)))
        invalid(
            "options->struct_size is {}, expected {} (set it with asynctp_context_options_init)",
            options->struct_size, sizeof(asynctp_context_options));
      std::memcpy(&o, options, options->struct_size);
    }
    ContextOptions copts;
    const std::string_view backend = o.backend == nullptr ? "auto" : o.backend;
    if (backend == "auto") {
      copts.backend = asynctp_cuda_available() ? "cuda" : "cpu";
    } else if (backend == "cpu" || backend == "cuda") {
      if (backend == "cuda" && !asynctp_cuda_available())
        unsupported("options->backend is \"cuda\", but {}", available_backends().size() > 1
                                                                ? "no GPU is visible"
                                                                : "this build has no CUDA backend");
      copts.backend = std::string(backend);
    } else {
      invalid("options->backend is \"{}\", expected \"cpu\", \"cuda\", \"auto\" or NULL", backend);
    }
    if (o.device_index < -1)
      invalid("options->device_index is {} (-1: the group's local rank, else >= 0)",
              o.device_index);
    copts.device_index = o.device_index;
    if (o.max_workspace_bytes < -1)
      invalid("options->max_workspace_bytes is {} (-1: the default, else >= 0)",
              o.max_workspace_bytes);
    if (o.max_workspace_bytes >= 0) copts.max_workspace_bytes = o.max_workspace_bytes;
    if (std::optional<PathChoice> path = path_of(o.path)) copts.path = *path;
    if (o.dispatch_cache != nullptr) copts.dispatch_cache = o.dispatch_cache;
    auto* handle = new asynctp_context_s{OpContext::create(std::move(g), std::move(copts))};
    register_handle(handle);
    *out = handle;
  });
}

asynctp_status asynctp_context_destroy(asynctp_context ctx) {
  return guarded(__func__, [&] {
    asynctp_context_s& c = context_of(ctx, "ctx");
    unregister_handle(ctx);
    std::unique_ptr<asynctp_context_s> owned(&c);
    // Let the work finish before the memory it uses goes; a failure here (a peer's timeout) is
    // reported, and the context is released all the same.
    owned->ctx->stream().synchronize();
  });
}

asynctp_status asynctp_synchronize(asynctp_context ctx) {
  return guarded(__func__, [&] { context_of(ctx, "ctx").ctx->stream().synchronize(); });
}

asynctp_status asynctp_last_path(asynctp_context ctx, const char* op, int32_t* path, char* reason,
                                 size_t reason_len) {
  return guarded(__func__, [&] {
    OpContext& c = *context_of(ctx, "ctx").ctx;
    if (op == nullptr) invalid("op is NULL");
    check_out(path, "path");
    if (reason == nullptr && reason_len > 0)
      invalid("reason is NULL but reason_len is {}", reason_len);
    const std::optional<PathRecord> last = c.usage().last(op);
    *path = last ? c_path(last->path) : -1;
    copy_out(last ? std::string_view(last->reason) : std::string_view(), reason, reason_len);
  });
}

asynctp_status asynctp_usage_json(asynctp_context ctx, char* buf, size_t len, size_t* needed) {
  return guarded(__func__, [&] {
    OpContext& c = *context_of(ctx, "ctx").ctx;
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [key, count] : c.usage().counts())
      j[key.first][std::string(path_name(key.second))] = count;
    return_json(j.dump(), buf, len, needed);
  });
}

asynctp_status asynctp_host_profile_set(asynctp_context ctx, int32_t enabled) {
  return guarded(__func__, [&] {
    OpContext& c = *context_of(ctx, "ctx").ctx;
    if (enabled != 0 && enabled != 1) invalid("enabled is {}, expected 0 or 1", enabled);
    c.host_profile().set_enabled(enabled != 0);
  });
}

asynctp_status asynctp_host_profile_json(asynctp_context ctx, char* buf, size_t len,
                                         size_t* needed) {
  return guarded(__func__, [&] {
    return_json(context_of(ctx, "ctx").ctx->host_profile().json(), buf, len, needed);
  });
}

}  // extern "C"
