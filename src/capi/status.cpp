// Statuses, the thread-local last error, the live-handle registry and the library queries.
#include <exception>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <unordered_set>

#include "capi/internal.h"
#ifdef ASYNCTP_WITH_CUDA
#include "device/cuda/cuda_backend.h"
#endif

namespace asynctp::capi {

namespace {

thread_local std::string t_last_error;

// An asynctp::Error that is not a TimeoutError is a failed ASYNCTP_CHECK. Most are preconditions
// of the ops (a shape, a dtype, a layout: the caller's arguments); the few that report a failing
// CUDA, NCCL or system call say so at the start of their message (cuda_check.h's macros, and
// ASYNCTP_SYSCHECK's errno text after the call's context), and those are internal.
bool is_external_failure(std::string_view message) {
  for (std::string_view marker :
       {"CUDA error", "CUDA driver error", "NCCL error", "cuBLAS", "cublasLt", "CUresult"}) {
    if (message.find(marker) != std::string_view::npos) return true;
  }
  return false;
}

std::shared_mutex g_handles_mutex;
std::unordered_set<const void*>& live_handles() {
  static auto* handles = new std::unordered_set<const void*>();  // never destroyed: outlives
                                                                 // handles freed at exit
  return *handles;
}

bool is_live(const void* handle) {
  std::shared_lock lock(g_handles_mutex);
  return live_handles().count(handle) != 0;
}

}  // namespace

void clear_last_error() {
  t_last_error.clear();
}

void set_last_error(std::string message) {
  t_last_error = std::move(message);
}

asynctp_status status_from_current_exception(const char* function) {
  asynctp_status status = ASYNCTP_ERROR_INTERNAL;
  std::string message;
  try {
    throw;
  } catch (const InvalidArgument& e) {
    status = ASYNCTP_ERROR_INVALID_ARGUMENT;
    message = e.what();
  } catch (const Unsupported& e) {
    status = ASYNCTP_ERROR_UNSUPPORTED;
    message = e.what();
  } catch (const StoreFailure& e) {
    status = ASYNCTP_ERROR_INTERNAL;
    message = e.what();
  } catch (const PathUnavailableError& e) {
    status = ASYNCTP_ERROR_UNSUPPORTED;
    message = e.what();
  } catch (const CaptureError& e) {
    status = ASYNCTP_ERROR_CAPTURE;
    message = e.what();
  } catch (const TimeoutError& e) {
    status = ASYNCTP_ERROR_TIMEOUT;
    message = e.what();
  } catch (const Error& e) {
    message = e.what();
    status = is_external_failure(message) ? ASYNCTP_ERROR_INTERNAL : ASYNCTP_ERROR_INVALID_ARGUMENT;
  } catch (const std::bad_alloc&) {
    message = "out of host memory";
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "unknown exception";
  }
  set_last_error(fmt::format("{}: {}", function, message));
  return status;
}

void register_handle(const void* handle) {
  std::unique_lock lock(g_handles_mutex);
  live_handles().insert(handle);
}

void unregister_handle(const void* handle) {
  std::unique_lock lock(g_handles_mutex);
  live_handles().erase(handle);
}

asynctp_group_s& group_of(asynctp_group handle, std::string_view arg) {
  if (handle == nullptr) invalid("{} is NULL", arg);
  if (!is_live(handle))
    invalid("{} ({}) is not a live asynctp_group (destroyed, or never made)", arg,
            static_cast<const void*>(handle));
  return *handle;
}

asynctp_context_s& context_of(asynctp_context handle, std::string_view arg) {
  if (handle == nullptr) invalid("{} is NULL", arg);
  if (!is_live(handle))
    invalid("{} ({}) is not a live asynctp_context (destroyed, or never made)", arg,
            static_cast<const void*>(handle));
  return *handle;
}

}  // namespace asynctp::capi

using namespace asynctp;
using namespace asynctp::capi;

extern "C" {

int32_t asynctp_api_version(void) {
  return ASYNCTP_C_API_VERSION;
}

const char* asynctp_version(void) {
  return ASYNCTP_VERSION_STRING;
}

const char* asynctp_last_error(void) {
  return t_last_error.c_str();
}

int32_t asynctp_cuda_available(void) {
#ifdef ASYNCTP_WITH_CUDA
  try {
    return cuda_device_count() > 0 ? 1 : 0;
  } catch (...) {
    return 0;
  }
#else
  return 0;
#endif
}

}  // extern "C"
