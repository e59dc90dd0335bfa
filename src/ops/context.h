// Context: everything a fused op needs on one rank of one group: the group, the execution
// backend and its streams, the symmetric workspace, the communicator for ordinary collectives,
// local scratch, and the usage counters. One per process and group; not thread-safe (like a
// CUDA stream, it is driven by one host thread).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "device/backend.h"
#include "device/communicator.h"
#include "ops/dispatch.h"
#include "ops/trace.h"
#include "ops/usage.h"
#include "runtime/group.h"
#include "symm/workspace.h"

namespace asynctp {

struct ContextOptions {
  // "cpu", "cuda", or "auto" (cuda where built and a GPU is visible, else cpu).
  std::string backend = "cpu";
  // The GPU (CUDA): -1 for the group's local rank modulo the visible GPUs, else its index.
  int device_index = -1;
  // Largest symmetric workspace per rank (each of the two: the shared one and the native
  // all_gather_matmul's push workspace); an op needing more takes the fallback.
  // ASYNCTP_MAX_WORKSPACE_MB overrides the default of 2048 MiB.
  size_t max_workspace_bytes = default_max_workspace_bytes();
  // Default path for every op (an op's own options may override it). ASYNCTP_PATH sets it.
  PathChoice path = default_path_choice();
  // Streams the chunk GEMMs of a fused op alternate between (1 or 2): with 2, the tail of one
  // chunk's GEMM may overlap the start of the next, but two chunk GEMMs can also share the SMs
  // from the start and finish together, which delays the first push. 1 by default: at ws 2 the
  // two were within noise; at ws 4 (4 x H200) 2 streams made the split matmul_reduce_scatter
  // 3% slower on three shapes and 14-36% slower and erratic on 8192x2048x8192, and the split
  // all_gather_matmul 1.5-4.5% slower. ASYNCTP_GEMM_STREAMS sets it.
  int gemm_streams = default_gemm_streams();
  // The native all_gather_matmul pushes each shard in up to 4 pieces of at least this many bytes,
  // each with its own ready flag, so that a peer's GEMM starts on the first rows of a shard before
  // the whole shard has landed (the first wave's tiles of the next chunk wait for one piece, not
  // for the shard). 0: one piece per shard. Each piece costs two more host calls (copy, flag).
  // ASYNCTP_PUSH_PIECE_BYTES sets it. Default 0: on 4 x H200 pieces of 8 MiB (2 for seed-4096 and
  // l3-8b-ffn-up, 4 for l3-70b-qkv) measured no faster (docs/PERFORMANCE.md).
  size_t push_piece_bytes = default_push_piece_bytes();
  // Copy streams the native matmul_reduce_scatter's pushes take by turns, piece by piece (1 to
  // kMaxPushStreams). Each piece first waits for its GEMM counter, a stream memory operation: on
  // the stream that made the previous copy it waits for that copy to drain (~3 us per piece on an
  // H200, scripts/experiments/ce_under_load.cu); on two streams one's wait overlaps the other's
  // copy. Default 2: at ws 2 (2 x H200) on push-bound shapes with 4 MiB pieces the native path
  // took 116-129 us on 2 streams against 122-139 on 1 (4096x{1024,2048}x4096), and the same on
  // the anchor shapes and on 16 MiB pieces (docs/PERFORMANCE.md); 3 streams were
  // better on one shape and worse on the other. ASYNCTP_PUSH_STREAMS sets it.
  int push_streams = default_push_streams();
  // Where the measured path choices are kept between runs (see ops/dispatch.h): "" the default
  // location, "off" none.
  std::string dispatch_cache;

  static size_t default_max_workspace_bytes();
  static PathChoice default_path_choice();
  static int default_gemm_streams();
  static size_t default_push_piece_bytes();
  static int default_push_streams();
  static constexpr int kMaxPushStreams = 4;
};

// Local (non-symmetric) scratch buffers, one per purpose, so that buffers in use at the same
// time never alias.
enum class Scratch : uint8_t {
  kGatheredA,      // all_gather_matmul: the gathered A when the caller does not want it back
  kGatheredScale,  // all_gather_scaled_matmul: gathered row-wise scales
  kAccumulator,    // f32 partial sums (contraction-dim gather)
  kContiguousA,    // a contiguous copy of an A whose strides do not allow chunk views
  kStaging,        // matmul_reduce_scatter: chunks computed for peers, before they are pushed
  kPartial,        // matmul_reduce_scatter fallback: the full local product
  kCollectiveIn,   // collectives on another dim than 0: input rearranged to dim 0
  kCollectiveOut,  // collectives on another dim than 0: output before it is rearranged back
  kCount
};

// What a context holds, in bytes on this rank.
struct MemoryStats {
  // This rank's share of both symmetric workspaces (the shared one and the push workspace).
  int64_t symmetric_bytes = 0;
  // The limit of each of them (ContextOptions::max_workspace_bytes).
  int64_t symmetric_limit = 0;
  // What the context allocated for itself: the scratch buffers and the chunk flags.
  int64_t local_bytes = 0;
};

class Context {
 public:
  static std::unique_ptr<Context> create(std::shared_ptr<Group> group, ContextOptions options = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Group& group() { return *group_; }
  int rank() const { return group_->rank(); }
  int world_size() const { return group_->world_size(); }
  const ContextOptions& options() const { return options_; }

  Backend& backend() { return *backend_; }
  // The stream later ops run on, where their call names none: the caller's native stream (a
  // cudaStream_t, nullptr the legacy default stream; any handle on the CPU backend names its
  // compute stream). Not owned: the caller keeps it alive while ops use it. Until it is set,
  // the backend's compute stream.
  void set_stream(void* handle) { stream_ = &wrapped_stream(handle); }
  // The stream of the op now running (a call's own stream, see StreamScope), else the one
  // set_stream set, else the backend's compute stream. Every op forks its side streams from it
  // by events as it starts and joins them back into it before it returns.
  Stream& stream() { return *stream_; }
  // The Stream over a native handle: made once per handle, then looked up (no allocation on the
  // ops' hot path).
  Stream& wrapped_stream(void* handle);
  // Whether the op's stream is being captured into a CUDA graph.
  bool capturing() { return backend_->capturing(stream()); }
  // For the span of one op call: stream() is the call's stream where it names one (the ops'
  // `stream` options), then back to what it was. An op on another stream than the op before it
  // first waits on its stream for everything enqueued on that one: the protocols of the
  // overlapped ops (all_gather_matmul.cpp) count on each op's pushes starting behind the
  // previous op's GEMMs. (Not where either stream is being captured: a capture may not wait for
  // work outside it, nor work outside wait for it; a captured op starts behind a barrier.)
  class StreamScope {
   public:
    StreamScope(Context& ctx, std::optional<void*> handle) : ctx_(ctx), saved_(ctx.stream_) {
      if (handle) ctx.stream_ = &ctx.wrapped_stream(*handle);
      try {
        ctx.follow_previous_op();
      } catch (...) {
        // The previous op's stream may be gone (a caller's stream destroyed since): forget it,
        // so that the context is not stuck on it, and leave stream() as it was.
        ctx.previous_op_stream_ = nullptr;
        ctx.stream_ = saved_;
        throw;
      }
    }
    ~StreamScope() {
      ctx_.previous_op_stream_ = ctx_.stream_;
      ctx_.stream_ = saved_;
    }
    StreamScope(const StreamScope&) = delete;
    StreamScope& operator=(const StreamScope&) = delete;

   private:
    Context& ctx_;
    Stream* saved_;
  };
  // The stream that moves data beside the op's stream.
  Stream& copy_stream() { return *copy_stream_; }
  // Push stream i (mod options().push_streams): 0 is copy_stream(), the others streams of their
  // own.
  Stream& push_stream(int i) {
    const int k = i % options_.push_streams;
    return k == 0 ? copy_stream() : *push_streams_[k - 1];
  }
  // The flags that say a push has landed go on a stream beside it: flag stream i (mod
  // options().push_streams) waits for everything enqueued on push_stream(i) so far and is
  // returned, for the flag's stream write (and any other bookkeeping behind the copy). Why: a
  // stream memory operation queued on the copy stream itself holds that stream's next copy until
  // the copy before it has drained, ~3-4 us per operation on an H200; eight back-to-back 4 MiB
  // pushes with a wait, a flag and a reset each took 173 us instead of 106, and 139 with the flag
  // and the reset beside them (scripts/experiments/ce_under_load.cu, docs/PERFORMANCE.md). An op
  // that uses it ends with join_flag_streams.
  Stream& flags_behind(int i);
  // Makes `stream` wait for everything enqueued so far on the flag streams used since the last
  // join (only those: under CUDA-graph capture an unused one is not part of the capture).
  void join_flag_streams(Stream& stream);
  // Forgets the flag streams an op that threw midway left unjoined. The ops call it as they
  // start: nothing of the new op waits for those, and a capture that starts now would not
  // contain them (joining one into a capturing stream would break the capture).
  void forget_flag_streams() { flag_used_.assign(flag_used_.size(), false); }
  // Stream i (mod options().gemm_streams) for chunk GEMMs: 0 is stream(), 1 a second one.
  Stream& gemm_stream(int i) { return i % options_.gemm_streams == 0 ? stream() : *aux_stream_; }
  // Pool of events for ordering between the two streams inside one op.
  Event& event(size_t index);

  SymmWorkspace& workspace() { return *workspace_; }
  // A second symmetric buffer (same limit), for ops into which peers write with no handshake
  // first: all_gather_matmul (both overlapped paths) pushes its shard into every peer's copy as
  // soon as it starts. In the shared workspace a peer could still be reading its own copy then (a
  // matmul_reduce_scatter's final reduction runs after its last barrier, or with no barrier after
  // it at all on the split path); here all_gather_matmul alone decides when a peer's copy is free
  // again (three gathered A's per rank: two that eager ops take by turns, one for ops captured
  // into CUDA graphs; see all_gather_matmul.cpp).
  SymmWorkspace& push_workspace() { return *push_workspace_; }
  Communicator& communicator() { return *communicator_; }
  Usage& usage() { return usage_; }
  Dispatcher& dispatcher() { return *dispatcher_; }
  // `count` u32 flags in device memory for one op's chunk signalling (ready / done flags of the
  // native path): 0 when handed out, and the op sets them back to 0 before it ends. Valid until
  // the next call; grows outside capture.
  uint32_t* flags(size_t count);

  // The symmetric and local memory this context holds now.
  MemoryStats memory_stats() const;

  // A contiguous view of `shape` in the scratch buffer for `purpose`, grown on demand. Valid
  // until the next call for the same purpose.
  Tensor scratch(Scratch purpose, Dims shape, DType dtype);
  // Grows the scratch buffer for `purpose` to at least `bytes` now (outside capture), so that
  // later scratch() calls within it allocate nothing.
  void reserve_scratch(Scratch purpose, size_t bytes);

  // Lines the ranks up on the device: a barrier on the symmetric workspace's pad (channel 0),
  // or the group's host barrier where there is no symmetric memory yet. For measurements that
  // must start together on every rank (the dispatcher's tuning runs, the bench).
  void align_ranks();

  // Diagnosis (ops/trace.h): while a trace is attached, ops mark their steps in it.
  void set_trace(OpTrace* trace) { trace_ = trace; }
  bool tracing() { return trace_ != nullptr && !capturing(); }
  void mark(std::string_view label, Stream& stream) {
    if (tracing()) trace_->mark(label, stream);
  }

 private:
  Context(std::shared_ptr<Group> group, ContextOptions options);

  std::shared_ptr<Group> group_;
  ContextOptions options_;
  std::unique_ptr<Backend> backend_;
  Stream* stream_ = nullptr;  // see stream()
  std::unordered_map<void*, std::unique_ptr<Stream>> wrapped_;
  Stream* previous_op_stream_ = nullptr;  // the stream the last op ran on
  std::unique_ptr<Event> switch_event_;   // orders an op after the last one on another stream
  void follow_previous_op();
  std::unique_ptr<Stream> copy_stream_;
  std::unique_ptr<Stream> aux_stream_;
  std::vector<std::unique_ptr<Stream>> push_streams_;  // push_streams - 1 beside copy_stream_
  std::vector<std::unique_ptr<Stream>> flag_streams_;  // push_streams of them
  // One event per flag stream for what it waits on, one for joining it (each block() takes the
  // event's latest record, so one object serves every push of an op).
  std::vector<std::unique_ptr<Event>> flag_events_;
  std::vector<bool> flag_used_;
  std::vector<std::unique_ptr<Event>> events_;
  std::unique_ptr<SymmAllocator> symm_allocator_;
  std::unique_ptr<SymmWorkspace> workspace_;
  std::unique_ptr<SymmWorkspace> push_workspace_;
  std::unique_ptr<Communicator> communicator_;
  std::array<Buffer, static_cast<size_t>(Scratch::kCount)> scratch_;
  Buffer flags_;
  Usage usage_;
  std::unique_ptr<Dispatcher> dispatcher_;
  OpTrace* trace_ = nullptr;
};

}  // namespace asynctp
