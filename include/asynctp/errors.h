// The errors asynctp throws, and the bound on its waits. Every failed precondition throws
// asynctp::Error with a message that names the offending argument and value, then the source
// file, line and failed check; messages survive release builds.
#pragma once

#include <chrono>
#include <stdexcept>

namespace asynctp {

// Base of every error the library throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A wait (store, signal, barrier, rank startup) that ran past its deadline. The message names the
// rank that waited and, where there is one, the peer and channel it waited on. After one from a
// device wait (signal, barrier, chunk flag) the ranks' signal pads and chunk flags no longer
// agree — a late peer may still raise one — so the op's group cannot be trusted for further
// collective work: drop its Context (and Group) and start anew.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A buffer (a symmetric workspace, the chunk flags, a scratch buffer) that an op would have to
// grow while its stream is being captured into a CUDA graph, where nothing may allocate or
// rendezvous. The message names the buffer and the bytes it needs. Nothing was enqueued; run the
// op once, or reserve for it (reserve_all_gather_matmul, reserve_matmul_reduce_scatter), before
// capturing it.
class CaptureError : public Error {
 public:
  using Error::Error;
};

// A path the caller asked for (PathChoice::kNative or kSplit, ASYNCTP_PATH_NATIVE or _SPLIT)
// cannot run this call: its arguments are off that path's contract (dtype, shape, alignment,
// accumulation) or its symmetric workspace would pass the limit. The message says which. Nothing
// was enqueued, and the same call on auto runs.
class PathUnavailableError : public Error {
 public:
  using Error::Error;
};

// Every wait is bounded by a timeout in milliseconds.
using Millis = std::chrono::milliseconds;

// Default timeout for every wait: ASYNCTP_TIMEOUT seconds if set (fractions allowed; "inf" and
// anything above 1e7 s mean 1e7 s), else 300 s.
Millis default_timeout();

}  // namespace asynctp
