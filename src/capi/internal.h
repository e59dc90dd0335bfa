// The C ABI's internals: what the opaque handles hold, the live-handle registry that turns a
// stale or foreign handle into ASYNCTP_ERROR_INVALID_ARGUMENT instead of a crash, the mapping
// from exceptions to statuses (with the message kept in a thread-local last error), and the
// conversion of asynctp_tensor descriptors into Tensors with every field checked.
#pragma once

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <asynctp/group.h>
#include <asynctp/tensor.h>
#include "asynctp/asynctp_c.h"
#include "core/dtype.h"
#include "core/error.h"
#include "ops/context.h"

struct asynctp_group_s {
  std::shared_ptr<asynctp::Group> group;
};

struct asynctp_context_s {
  // The context holds its own shared_ptr to the group, so destroying the group handle first is
  // safe.
  std::unique_ptr<asynctp::OpContext> ctx;
};

namespace asynctp::capi {

// A bad argument found by the C layer itself (a descriptor, a handle, an option).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A valid request this build or backend cannot serve.
class Unsupported : public Error {
 public:
  using Error::Error;
};

// fmt-formatted throw helpers (no file and line: the message names the C argument).
template <typename... Args>
[[noreturn]] void invalid(fmt::format_string<Args...> format, Args&&... args) {
  throw InvalidArgument(fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
[[noreturn]] void unsupported(fmt::format_string<Args...> format, Args&&... args) {
  throw Unsupported(fmt::format(format, std::forward<Args>(args)...));
}

// An out-pointer argument must not be NULL.
inline void check_out(const void* out, std::string_view arg) {
  if (out == nullptr) invalid("{} is NULL", arg);
}

// A failure of the caller's store callbacks (not of its arguments).
class StoreFailure : public Error {
 public:
  using Error::Error;
};

// The status for the exception in flight, whose message becomes this thread's last error. Call
// only from a catch block.
asynctp_status status_from_current_exception(const char* function);
void clear_last_error();
void set_last_error(std::string message);

// Runs body (which may throw) and returns its status: every public function is one call of this,
// so that no exception crosses the C boundary.
template <typename Fn>
asynctp_status guarded(const char* function, Fn&& body) noexcept {
  try {
    clear_last_error();
    body();
    return ASYNCTP_OK;
  } catch (...) {
    return status_from_current_exception(function);
  }
}

// Live handles. A handle is registered when made and unregistered before it is freed; any other
// pointer (NULL, freed, garbage) is rejected naming the argument.
void register_handle(const void* handle);
void unregister_handle(const void* handle);
asynctp_group_s& group_of(asynctp_group handle, std::string_view arg);
asynctp_context_s& context_of(asynctp_context handle, std::string_view arg);

// A C argument's name for messages: "out", or element `index` of a list, "bs[1]" (formatted only
// when a message is: every eager call converts its descriptors, and most never fail).
struct ArgName {
  ArgName(const char* base) : base(base) {}       // NOLINT(google-explicit-constructor)
  ArgName(std::string_view base) : base(base) {}  // NOLINT(google-explicit-constructor)
  ArgName(std::string_view base, int64_t index) : base(base), index(index) {}
  std::string_view base;
  int64_t index = -1;
};

// A required tensor: every field checked, naming `arg` ("bs[1]", "out"), and its device must be
// the context's.
Tensor tensor_of(const asynctp_tensor* desc, ArgName arg, const OpContext& ctx);
// An optional tensor: NULL, or data == NULL with ndim == -1, is "no tensor" (undefined).
Tensor optional_tensor_of(const asynctp_tensor* desc, ArgName arg, const OpContext& ctx);
// `count` tensors from an array; count must be at least 1 and at most kMaxTensorList.
std::vector<Tensor> tensors_of(const asynctp_tensor* descs, int32_t count, std::string_view arg,
                               std::string_view count_arg, const OpContext& ctx);
inline constexpr int32_t kMaxTensorList = 64;

// A reserve call's descriptors: like tensor_of, but data may be NULL whatever the size (only
// shapes, dtypes and strides matter to sizing).
Tensor shape_only_tensor_of(const asynctp_tensor* desc, ArgName arg, const OpContext& ctx);

std::optional<PathChoice> path_of(int32_t path);
ReduceOp reduce_op_of(int32_t op);

}  // namespace asynctp::capi

template <>
struct fmt::formatter<asynctp::capi::ArgName> : fmt::formatter<std::string_view> {
  auto format(const asynctp::capi::ArgName& a, format_context& ctx) const {
    if (a.index < 0) return fmt::formatter<std::string_view>::format(a.base, ctx);
    return fmt::format_to(ctx.out(), "{}[{}]", a.base, a.index);
  }
};
