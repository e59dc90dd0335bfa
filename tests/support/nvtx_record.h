// The test side of the NVTX test tool (support/nvtx_recorder.cpp): where NVTX_INJECTION64_PATH
// names it (the tests registered "/nvtx_tool", tests/CMakeLists.txt), NVTX loads it into this
// process at its first call, and these read what it recorded.
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace asynctp::testing {

// Whether this process runs under the test tool.
inline bool nvtx_tool_named() {
  return std::getenv("NVTX_INJECTION64_PATH") != nullptr;
}

// The loaded tool's `symbol`, or null where it is not loaded (yet).
inline void* nvtx_tool_symbol(const char* symbol) {
  const char* path = std::getenv("NVTX_INJECTION64_PATH");
  if (path == nullptr) return nullptr;
  void* handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  return handle == nullptr ? nullptr : dlsym(handle, symbol);
}

// The events recorded since the last clear, in order; nullopt where the tool is not loaded.
inline std::optional<std::vector<std::string>> nvtx_record() {
  auto* read = reinterpret_cast<const char* (*)()>(nvtx_tool_symbol("asynctp_nvtx_record"));
  if (read == nullptr) return std::nullopt;
  std::vector<std::string> events;
  std::istringstream lines(read());
  for (std::string line; std::getline(lines, line);)
    events.push_back(line);
  return events;
}

inline void nvtx_clear_record() {
  if (auto* clear = reinterpret_cast<void (*)()>(nvtx_tool_symbol("asynctp_nvtx_clear_record")))
    clear();
}

}  // namespace asynctp::testing
