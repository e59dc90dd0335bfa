#include "ops/context.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "core/env.h"
#include "core/log.h"
#include "ops/call_memo.h"
#include "symm/symm_communicator.h"
#ifdef ASYNCTP_WITH_CUDA
#include "device/cuda/cuda_backend.h"
#include "device/cuda/nccl_communicator.h"
#endif

namespace asynctp {

size_t ContextOptions::default_max_workspace_bytes() {
  // Below 2^44 MiB (the registry's bound), so the product fits in 64 bits.
  return static_cast<size_t>(envvars::kMaxWorkspaceMb.number() * 1024.0 * 1024.0);
}

PathChoice ContextOptions::default_path_choice() {
  return parse_path_choice(envvars::kPath.choice());
}

int ContextOptions::default_gemm_streams() {
  return static_cast<int>(envvars::kGemmStreams.integer());
}

size_t ContextOptions::default_push_piece_bytes() {
  return static_cast<size_t>(envvars::kPushPieceBytes.integer());
}

int ContextOptions::default_push_streams() {
  static_assert(envvars::kPushStreams.max == kMaxPushStreams);
  return static_cast<int>(envvars::kPushStreams.integer());
}

int64_t ContextOptions::default_push_inline_min_k() {
  return static_cast<int64_t>(envvars::kPushInlineMinK.integer());
}

KernelPush ContextOptions::default_kernel_push() {
  return parse_kernel_push(envvars::kKernelPush.choice());
}

std::unique_ptr<OpContext> OpContext::create(std::shared_ptr<Group> group, ContextOptions options) {
  ASYNCTP_CHECK(group != nullptr, "OpContext::create needs a group");
  return std::unique_ptr<OpContext>(new OpContext(std::move(group), std::move(options)));
}

OpContext::OpContext(std::shared_ptr<Group> group, ContextOptions options)
    : group_(std::move(group)), options_(std::move(options)) {
  backend_ = make_backend(options_.backend, group_->local_rank(), options_.device_index);
  stream_ = &backend_->compute_stream();
  switch_event_ = backend_->create_event();
  ASYNCTP_CHECK(options_.gemm_streams == 1 || options_.gemm_streams == 2,
                "ContextOptions::gemm_streams must be 1 or 2, got {}", options_.gemm_streams);
  ASYNCTP_CHECK(
      options_.push_streams >= 1 && options_.push_streams <= ContextOptions::kMaxPushStreams,
      "ContextOptions::push_streams must be from 1 to {}, got {}", ContextOptions::kMaxPushStreams,
      options_.push_streams);
  ASYNCTP_CHECK(options_.push_inline_min_k >= 0,
                "ContextOptions::push_inline_min_k must be 0 or more, got {}",
                options_.push_inline_min_k);
  // The side streams, by role and rank ("asynctp copy rank 0"): how nsys lists them
  // (device/nvtx.h).
  auto side_stream = [&](std::string_view role) {
    return backend_->create_stream(fmt::format("asynctp {} rank {}", role, rank()));
  };
  copy_stream_ = side_stream("copy");
  aux_stream_ = side_stream("gemm");
  for (int i = 1; i < options_.push_streams; ++i)
    push_streams_.push_back(side_stream(fmt::format("push {}", i)));
  for (int i = 0; i < options_.push_streams; ++i) {
    flag_streams_.push_back(side_stream(fmt::format("flags {}", i)));
    flag_events_.push_back(backend_->create_event());
    flag_events_.push_back(backend_->create_event());
  }
  flag_used_.assign(flag_streams_.size(), false);
  symm_allocator_ = make_symm_allocator(*backend_, *group_);
  workspace_ = std::make_unique<SymmWorkspace>(
      *symm_allocator_, *backend_, options_.max_workspace_bytes, "the symmetric workspace");
  push_workspace_ = std::make_unique<SymmWorkspace>(
      *symm_allocator_, *backend_, options_.max_workspace_bytes, "the symmetric push workspace");
#ifdef ASYNCTP_WITH_CUDA
  // NCCL refuses two ranks on one GPU; where ranks may share one (tests), the collectives go
  // through symmetric memory or the store.
  if (backend_->device().is_cuda()) {
    if (const int per_gpu = cuda_ranks_per_gpu(); per_gpu == 1) {
      communicator_ = make_nccl_communicator(*backend_, *group_);
    } else {
      ASYNCTP_LOG_WARN(
          "ASYNCTP_SHARED_GPUS={}: up to {} ranks may share a GPU (for tests, not for speed): no "
          "NCCL, each native GEMM on 1/{} of the SMs, path timings that mean nothing elsewhere",
          per_gpu, per_gpu, per_gpu);
    }
  }
#endif
  if (!communicator_) {
    // The symmetric-memory collectives stage at least one f32 per rank in the workspace; under a
    // smaller limit (0 turns symmetric memory off) the store carries the fallbacks' collectives.
    const bool symm_fits = options_.max_workspace_bytes >= sizeof(float) * world_size();
    communicator_ = symm_allocator_->unavailable_reason().empty() && symm_fits
                        ? make_symm_communicator(*backend_, *workspace_, rank(), world_size())
                        : make_store_communicator(*backend_, *group_);
  }
  dispatcher_ = std::make_unique<Dispatcher>(*this, options_.dispatch_cache);
  call_memos_ = std::make_unique<detail::CallMemos>();
  host_profile_.set_enabled(envvars::kHostProfile.flag());
}

Stream& OpContext::wrapped_stream(void* handle) {
  std::unique_ptr<Stream>& s = wrapped_[handle];
  if (!s) s = backend_->wrap_stream(handle);
  return *s;
}

void OpContext::follow_previous_op() {
  Stream& s = stream();
  if (previous_op_stream_ == nullptr || previous_op_stream_ == &s) return;
  if (backend_->capturing(*previous_op_stream_) || backend_->capturing(s)) return;
  switch_event_->record(*previous_op_stream_);
  switch_event_->block(s);
}

MemoryStats OpContext::memory_stats() const {
  MemoryStats stats;
  stats.symmetric_bytes =
      static_cast<int64_t>(workspace_->capacity() + push_workspace_->capacity());
  stats.symmetric_limit = static_cast<int64_t>(options_.max_workspace_bytes);
  size_t local = flags_.size() + barrier_token_.size();
  for (const Buffer& b : scratch_)
    local += b.size();
  stats.local_bytes = static_cast<int64_t>(local);
  return stats;
}

uint32_t* OpContext::flags(size_t count) {
  if (flags_.size() < std::max<size_t>(count, 1) * sizeof(uint32_t)) {
    ASYNCTP_CAPTURE_CHECK(!capturing(),
                          "the op's {} chunk flags ({} bytes) must be allocated while its stream "
                          "is captured into a CUDA graph; run the op once or reserve for it "
                          "before capturing it",
                          count, count * sizeof(uint32_t));
    if (!flags_.empty()) backend_->synchronize();
    const size_t allocated = std::max<size_t>(count, 64);
    flags_ = backend_->allocate(allocated * sizeof(uint32_t));
    // The ops keep their flags at 0 between calls; they start that way.
    backend_->zero_flags(static_cast<uint32_t*>(flags_.data()), allocated, stream());
  }
  return static_cast<uint32_t*>(flags_.data());
}

OpContext::~OpContext() {
  try {
    backend_->synchronize();
  } catch (...) {
  }
  if (host_profile_.enabled()) {
    if (const std::string table = host_profile_.table(); !table.empty()) {
      fmt::print(stderr, "asynctp host profile, rank {} of {}:\n{}", rank(), world_size(), table);
    }
  }
}

void OpContext::align_ranks() {
  SymmWorkspace& symm = workspace();
  // The barrier needs the signal pads only: any workspace will do, the smallest where none was
  // made (a collective allocation, which a capture may not make).
  const size_t bytes = std::max<size_t>(symm.capacity(), 1);
  if (symm.unavailable_reason().empty() && symm.fits(bytes) &&
      (symm.capacity() > 0 || !capturing())) {
    symm.get(bytes, stream()).barrier(0, stream());
  } else {
    // A one-element f32 sum of zeros (zeroed once: it stays zero), its own buffer.
    if (barrier_token_.empty()) {
      ASYNCTP_CAPTURE_CHECK(!capturing(),
                            "barrier: its first call without symmetric memory makes a 4-byte "
                            "buffer, which a CUDA-graph capture may not; call it once before "
                            "capturing it");
      barrier_token_ = backend_->allocate(sizeof(float));
      backend_->fill(barrier_token(), 0.f, stream());
    }
    communicator().all_reduce(barrier_token(), ReduceOp::kSum, stream());
  }
}

Stream& OpContext::flags_behind(int i) {
  const size_t k = static_cast<size_t>(i % options_.push_streams);
  Event& pushed = *flag_events_[2 * k];
  pushed.record(push_stream(i));
  pushed.block(*flag_streams_[k]);
  flag_used_[k] = true;
  return *flag_streams_[k];
}

void OpContext::join_flag_streams(Stream& stream) {
  for (size_t k = 0; k < flag_streams_.size(); ++k) {
    if (!flag_used_[k]) continue;
    flag_used_[k] = false;
    Event& flagged = *flag_events_[2 * k + 1];
    flagged.record(*flag_streams_[k]);
    flagged.block(stream);
  }
}

Event& OpContext::event(size_t index) {
  while (events_.size() <= index)
    events_.push_back(backend_->create_event());
  return *events_[index];
}

Tensor OpContext::scratch(Scratch purpose, Dims shape, DType dtype) {
  reserve_scratch(purpose, static_cast<size_t>(shape.product()) * element_size(dtype));
  return scratch_[static_cast<size_t>(purpose)].view(shape, dtype);
}

namespace {
// Scratch's names, in its order, for messages.
constexpr std::array<std::string_view, static_cast<size_t>(Scratch::kCount)> kScratchNames = {
    "gathered A", "gathered scale", "accumulator",      "contiguous A",
    "staging",    "partial",        "collective input", "collective output"};
}  // namespace

void OpContext::reserve_scratch(Scratch purpose, size_t bytes) {
  Buffer& buf = scratch_[static_cast<size_t>(purpose)];
  if (buf.size() >= bytes) return;
  ASYNCTP_CAPTURE_CHECK(
      !capturing(),
      "the {} scratch buffer must grow to {} bytes (it has {}) while the op's stream is captured "
      "into a CUDA graph, where nothing may allocate; run the op once or reserve for it before "
      "capturing it",
      kScratchNames[static_cast<size_t>(purpose)], bytes, buf.size());
  if (!buf.empty()) backend_->synchronize();  // in-flight work may still use the old one
  buf = backend_->allocate(bytes);
}

}  // namespace asynctp
