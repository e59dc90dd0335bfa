// NVTX annotations for Nsight Systems (`nsys profile -t cuda,nvtx`) and any other NVTX tool, in
// the domain "asynctp" (kDomain): a range on the host thread around each op call, named after the
// op, its path and its shapes (ops/), and a name for each stream the ops use (the backends'
// create_stream).
//
// Cost without a tool: NVTX v3 is header-only; its first call looks for a tool (the library that
// NVTX_INJECTION64_PATH names, which nsys sets) and, finding none, makes every later call a no-op.
// attached() asks once and remembers: the domain's handle is null without a tool (or with a tool
// that ignores domains, which then sees no range of asynctp's). A Range then costs a call and a
// branch, and its text is never formatted.
//
// Built without the NVTX headers (ASYNCTP_WITH_NVTX=OFF, or none found: cmake/Nvtx.cmake),
// compiled_in() and attached() are false and every function here does nothing. This header does
// not depend on which: nothing above the device layer needs the NVTX headers or the build flag.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace asynctp::nvtx {

inline constexpr std::string_view kDomain = "asynctp";

// Range colours in the tool's timeline (ARGB).
inline constexpr uint32_t kNativeColor = 0xff76b900;    // the native path
inline constexpr uint32_t kSplitColor = 0xff1f77b4;     // the split path
inline constexpr uint32_t kFallbackColor = 0xffff7f0e;  // the fallback (NCCL + one GEMM)
inline constexpr uint32_t kCollectiveColor = 0xff8c8c8c;

// Whether this build carries the NVTX calls.
bool compiled_in();
// Whether a tool is attached to this process's NVTX calls (asked once; the first call loads the
// tool, if any).
bool attached();

// A range on the calling thread, in the asynctp domain, from construction to destruction.
class Range {
 public:
  // `describe()` returns the range's text (std::string); it is called only where a tool is
  // attached, so the text costs nothing otherwise.
  template <typename Describe>
  Range(uint32_t argb, Describe&& describe) {
    if (attached()) {
      push(argb, std::forward<Describe>(describe)());
      pushed_ = true;
    }
  }
  ~Range() {
    if (pushed_) pop();
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  static void push(uint32_t argb, const std::string& text);
  static void pop();
  bool pushed_ = false;
};

}  // namespace asynctp::nvtx
