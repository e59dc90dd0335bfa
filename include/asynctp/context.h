// Context: asynctp on one rank of one group. It holds what the ops need there (the execution
// backend, the symmetric workspaces, the communicator of the ordinary collectives, scratch) and
// records which path each op took. One per process and group; not thread-safe (like a CUDA
// stream, it is driven by one host thread). Every op of asynctp/ops.h takes one.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include <asynctp/group.h>
#include <asynctp/tensor.h>

namespace asynctp {

class OpContext;
namespace detail {
struct ContextAccess;
}

// kSplit: the pipeline of per-chunk GEMMs; kNative: one async-input GEMM that consumes
// (or publishes) chunks as they move; kFallback: the collective, then one GEMM (or the reverse).
enum class Path : uint8_t { kSplit, kFallback, kNative };
std::string_view path_name(Path path);

// How the caller wants an op to run: kAuto takes the fastest of native, split and the fallback
// (measured once per problem and cached on disk), or the fallback where neither overlapped path
// can run.
enum class PathChoice : uint8_t { kAuto, kSplit, kFallback, kNative };
PathChoice parse_path_choice(std::string_view text);
std::string_view path_choice_name(PathChoice choice);

// Who pushes the native matmul_reduce_scatter's peer rows (ContextOptions::kernel_push): copy
// streams (kOff), the GEMM itself (kOn), or whichever `auto` measures faster per problem (kAuto).
enum class KernelPush : uint8_t { kAuto, kOff, kOn };
// "auto", "0" / "off" / "false" / "no", "1" / "on" / "true" / "yes" (any case); throws Error
// naming anything else.
KernelPush parse_kernel_push(std::string_view text);
std::string_view kernel_push_name(KernelPush push);  // "auto", "0", "1"

struct PathRecord {
  Path path = Path::kSplit;
  // Why the fallback ran (the caller asked, measured fastest, or what stops the overlapped
  // paths); empty for the other paths.
  std::string reason;
};

// Usage counters: every fused-op call records which path ran and why, so tests can assert the
// path and users can see when (and why) they silently lost the overlap. The first fallback of
// each (op, reason) is also logged as a warning.
class Usage {
 public:
  // `warn`: log the first fallback of each (op, reason); off when the caller asked for it or the
  // dispatcher measured it fastest.
  void record(std::string_view op, Path path, std::string_view reason, bool warn = true);
  int64_t count(std::string_view op, Path path) const;
  std::optional<PathRecord> last(std::string_view op) const;
  // Every (op, path) with its count: "all_gather_matmul split 3".
  std::map<std::pair<std::string, Path>, int64_t> counts() const;
  void reset();

 private:
  struct PerOp {
    std::array<int64_t, 3> counts{};  // indexed by Path's value
    Path last = Path::kSplit;
    std::string reason;  // the last call's
    bool seen = false;
  };
  std::map<std::string, PerOp, std::less<>> ops_;
  std::set<std::pair<std::string, std::string>> warned_;
};

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
  // from the start and finish together, which delays the first push. 1 by default (see
  // docs/DECISIONS.md D6). ASYNCTP_GEMM_STREAMS sets it.
  int gemm_streams = default_gemm_streams();
  // The native all_gather_matmul pushes each shard in up to 4 pieces of at least this many bytes,
  // each with its own ready flag, so that a peer's GEMM starts on the first rows of a shard before
  // the whole shard has landed (the first wave's tiles of the next chunk wait for one piece, not
  // for the shard). 0: one piece per shard. Each piece costs two more host calls (copy, flag).
  // ASYNCTP_PUSH_PIECE_BYTES sets it. Default 0: pieces measured no faster (see
  // docs/DECISIONS.md D7).
  size_t push_piece_bytes = default_push_piece_bytes();
  // Copy streams the native matmul_reduce_scatter's pushes take by turns, piece by piece (1 to
  // kMaxPushStreams). Each piece first waits for its GEMM counter, a stream memory operation: on
  // the stream that made the previous copy it waits for that copy to drain; on two streams one's
  // wait overlaps the other's copy. Default 2 (see docs/DECISIONS.md D5). ASYNCTP_PUSH_STREAMS
  // sets it.
  int push_streams = default_push_streams();
  // An eager native matmul_reduce_scatter whose K (the product's inner dim) is at least this
  // pushes each finished chunk in at most 2 pieces on one copy stream, each piece's flags on that
  // stream behind its copy, in one driver call with the next piece's counter wait: a third of the
  // host calls of the schedule above (push_streams, up to 4 pieces, flags beside), which every
  // call of a smaller K and every CUDA graph takes. 0 (the default): every eager call, which
  // measured as fast or faster on every shape tried, push-bound ones (K = 1024) included (see
  // docs/DECISIONS.md D27). ASYNCTP_PUSH_INLINE_MIN_K sets it.
  int64_t push_inline_min_k = default_push_inline_min_k();
  // Who pushes the native matmul_reduce_scatter's peer rows. kOn: its GEMM, whose epilogue
  // stores each peer chunk's tiles into that peer's slot over NVLink and raises the piece's flag
  // there once the piece is stored, so that the op is one launch, with no copy streams, and the
  // peers' rows never pass through this GPU's memory. kOff: the GEMM stores them here and counts
  // them, and copy streams wait for the counts and push (push_streams, push_inline_min_k).
  // kAuto (the default): under PathChoice::kAuto the dispatcher measures both beside the other
  // paths and takes the faster per problem (dispatch.h); otherwise, and where nothing is
  // measured (the CPU backend), the copy streams. Both raise the same flags into the same
  // slots, so ranks may differ (but under auto a rank set to 0 or 1 offers one route, and the
  // ranks measure only the routes they all offer: set it alike everywhere). The GEMM pushes
  // for 2 to 8 ranks, N % 8 == 0, and operands its TMA stores can take (else the copy streams
  // push). At ws 2 its pushes saved 13-20 us of host time a call and 20-30% on products
  // of 1024^3 and 2048^3, and cost 5-13% on the large scatter anchors (bf16; float8 up to 33%),
  // where every byte must cross the link in the first half of the GEMM rather than over all of
  // it (docs/DECISIONS.md D32). ASYNCTP_KERNEL_PUSH sets it.
  KernelPush kernel_push = default_kernel_push();
  // Where the measured path choices of PathChoice::kAuto are kept between runs: "" the default
  // location ($ASYNCTP_CACHE_DIR/dispatch.json), "off" none.
  std::string dispatch_cache;

  static size_t default_max_workspace_bytes();
  static PathChoice default_path_choice();
  static int default_gemm_streams();
  static size_t default_push_piece_bytes();
  static int default_push_streams();
  static int64_t default_push_inline_min_k();
  static KernelPush default_kernel_push();
  static constexpr int kMaxPushStreams = 4;
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
  // Collective over the group: every rank of it makes its context with the same options.
  static std::unique_ptr<Context> create(std::shared_ptr<Group> group, ContextOptions options = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Group& group();
  int rank() const;
  int world_size() const;
  const ContextOptions& options() const;
  // Where the ops run and the tensors given to them live: the CPU, or the GPU of
  // ContextOptions::device_index.
  Device device() const;
  // The stream later ops run on, where their call names none: the caller's native stream (a
  // cudaStream_t, nullptr the legacy default stream; any handle on the CPU backend, whose
  // stream is its own). Not owned: the caller keeps it alive while ops use it. Until it is set,
  // a stream of the context's own. Every op forks its side streams from its stream by events as
  // it starts and joins them back into it before it returns, so a CUDA graph captured on that
  // stream holds the whole op.
  void set_stream(void* handle);
  // Blocks the host until every op enqueued so far on the context's stream has finished (each op
  // joins its side streams into it). Ops return once enqueued, on the CPU backend as on CUDA:
  // read their outputs after this (or after the caller's own synchronization of that stream).
  void synchronize();
  // The symmetric and local memory this context holds now.
  MemoryStats memory_stats() const;
  // Which path each op took, and why.
  Usage& usage();

 private:
  friend struct detail::ContextAccess;
  explicit Context(std::unique_ptr<OpContext> engine);

  std::unique_ptr<OpContext> engine_;
};

}  // namespace asynctp
