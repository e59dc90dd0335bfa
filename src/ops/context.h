// OpContext: the engine behind a public Context (asynctp/context.h), everything a fused op needs
// on one rank of one group: the group, the execution
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

#include <asynctp/context.h>
#include <asynctp/group.h>

#include "device/backend.h"
#include "device/communicator.h"
#include "ops/dispatch.h"
#include "ops/host_profile.h"
#include "ops/trace.h"
#include "symm/workspace.h"

namespace asynctp {

namespace detail {
class CallMemos;
}

// Local (non-symmetric) scratch buffers, one per purpose, so that buffers in use at the same
// time never alias.
enum class Scratch : uint8_t {
  kGatheredA,      // all_gather_matmul: the gathered A when the caller does not want it back
  kGatheredScale,  // all_gather_scaled_matmul: gathered row-wise scales
  kAccumulator,    // f32 partial sums (contraction-dim gather)
  kPreActivation,  // all_gather_matmul_swiglu, split and fallback: the f32 products [.., 2N]
  kContiguousA,    // a contiguous copy of an A whose strides do not allow chunk views
  kStaging,        // matmul_reduce_scatter: chunks computed for peers, before they are pushed
  kPartial,        // matmul_reduce_scatter fallback: the full local product
  kCollectiveIn,   // collectives on another dim than 0: input rearranged to dim 0
  kCollectiveOut,  // collectives on another dim than 0: output before it is rearranged back
  kCount
};

class OpContext {
 public:
  static std::unique_ptr<OpContext> create(std::shared_ptr<Group> group,
                                           ContextOptions options = {});
  ~OpContext();
  OpContext(const OpContext&) = delete;
  OpContext& operator=(const OpContext&) = delete;

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
    StreamScope(OpContext& ctx, std::optional<void*> handle) : ctx_(ctx), saved_(ctx.stream_) {
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
    OpContext& ctx_;
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
  // the copy before it has drained (see docs/DECISIONS.md D4). An op that uses it ends with
  // join_flag_streams.
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
  // What the ops worked out for calls seen before (ops/call_memo.h).
  detail::CallMemos& call_memos() { return *call_memos_; }
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

  // Lines the ranks up on the device, on stream(): what follows on any rank's stream runs after
  // every rank's stream has reached this point. A barrier on the symmetric workspace's pad
  // (channel 0; where no op made a workspace yet, one of the smaller of 1 MiB and the limit is
  // made, collectively, outside capture), else a one-element all-reduce through the
  // communicator. For measurements that must start together on every rank (the dispatcher's
  // tuning runs, the bench) and the public barrier().
  void align_ranks();

  // Diagnosis (ops/trace.h): while a trace is attached, ops mark their steps in it. A literal
  // label also ends a phase of the host profile's open call (ops/host_profile.h); a formatted one
  // (a label per peer, made only while tracing) does not.
  void set_trace(OpTrace* trace) { trace_ = trace; }
  bool tracing() { return trace_ != nullptr && !capturing(); }
  void mark(const char* label, Stream& stream) {
    host_profile_.stamp(label);
    if (tracing()) trace_->mark(label, stream);
  }
  void mark(std::string_view label, Stream& stream) {
    if (tracing()) trace_->mark(label, stream);
  }
  // The host time of the ops' calls, phase by phase (ops/host_profile.h); on from the start
  // where ASYNCTP_HOST_PROFILE is set, and then printed to stderr when the context goes.
  HostProfile& host_profile() { return host_profile_; }

 private:
  OpContext(std::shared_ptr<Group> group, ContextOptions options);

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
  Buffer barrier_token_;  // align_ranks' all-reduce without symmetric memory: one f32 zero
  Tensor barrier_token() {
    return Tensor(barrier_token_.data(), DType::kF32, {1}, backend_->device());
  }
  Usage usage_;
  std::unique_ptr<Dispatcher> dispatcher_;
  std::unique_ptr<detail::CallMemos> call_memos_;
  OpTrace* trace_ = nullptr;
  HostProfile host_profile_;
};

namespace detail {
// The engine of a public Context, for the library's own code (the public header only
// forward-declares this, so a user reaches none of the OpContext's internals).
struct ContextAccess {
  static OpContext& engine(Context& ctx) { return *ctx.engine_; }
};
}  // namespace detail

}  // namespace asynctp
