// Symmetric memory: one allocation of the same size on every rank of a group, every peer's copy
// mapped into this process, each with a signal pad for point-to-point synchronization.
//
// NOTE [signal pads and channels]
// Each rank's allocation is laid out as [signal pad | data]. The pad is a kNumChannels x
// world_size array of u32 flags; flag [channel][src] of rank dst belongs to the pair (src, dst)
// on that channel.
//   put_signal(dst, ch):  on rank dst's pad, waits for flag [ch][me] to be 0, then sets it to 1
//                         (release: everything this rank wrote before is visible to dst).
//   wait_signal(src, ch): on my pad, waits for flag [ch][src] to be 1, then resets it to 0
//                         (acquire: everything src wrote before its put_signal is visible).
//   barrier(ch):          put_signal to every peer, then wait_signal from every peer.
// A flag goes 0 -> 1 -> 0 once per handshake, so a channel can be reused by the next op without
// any reset; ops that need two independent handshakes in flight use two channels.
// Channels in use (every symmetric allocation has its own pad): 0 the barriers of every op;
// on the context's push workspace, 1 to 4 the chunk-ready flags of all_gather_matmul (both
// paths; the split one uses piece 0 only) captured into a CUDA graph, which are not handshakes:
// a peer raises flag [1 + q][src] with a stream memory write after pushing piece q of its shard,
// the GEMMs read it, and the owner sets it back to 0 in the op's closing barrier
// (reset_and_barrier); 8 to 11 the same flags of all_gather_matmul run eagerly, which carry op
// numbers: the peer writes the op's number, the GEMMs wait for that number, nobody resets them
// (see all_gather_matmul.cpp). On the shared workspace, 6 the eager split
// matmul_reduce_scatter's landed flags, which carry op numbers the same way
// (see matmul_reduce_scatter.cpp), and 5 its landed flags when captured into a CUDA graph, also
// raised by stream memory writes after pushes, [5][src] = src's partial has landed; its
// reduction kernel waits for them (bounded by the group's timeout, one timeout for the whole
// launch), and the owner sets them back to 0 in the next such op's opening barrier; 12 to 15
// and 16 to 19 the same flags of the native matmul_reduce_scatter, eager and captured, one
// channel per piece of a chunk (its GEMM waits for them in its own chunk's tiles).
// Every wait is bounded by the group's timeout and fails with a TimeoutError that names this rank,
// the peer and the channel.
//
// They are enqueued on the given stream, on CUDA and on the CPU backend alike (NOTE [cpu
// streams]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <asynctp/tensor.h>
#include "core/dtype.h"
#include "device/backend.h"

namespace asynctp {

class Group;

inline constexpr int kNumChannels = 20;

// Bytes of the signal pad in front of every rank's data: kNumChannels x world_size u32 flags,
// rounded up to a page so that the data region stays page-aligned.
constexpr size_t signal_pad_bytes(int world_size) {
  constexpr size_t kAlign = 4096;
  return (sizeof(uint32_t) * kNumChannels * static_cast<size_t>(world_size) + kAlign - 1) / kAlign *
         kAlign;
}

class SymmetricMemory {
 public:
  virtual ~SymmetricMemory() = default;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  size_t size() const { return size_; }

  // Base of `peer`'s data region, mapped in this process.
  virtual void* buffer_ptr(int peer) = 0;
  // Base of `peer`'s signal pad (kNumChannels * world_size u32 flags).
  virtual uint32_t* signal_pad_ptr(int peer) = 0;

  virtual void barrier(int channel, Stream& stream) = 0;
  // Sets this rank's `count` u32 flags at `flags` (device memory of this rank, e.g. its own pad
  // or an op's counters) to 0, then barrier(channel): every peer past the barrier sees them 0.
  // One kernel on CUDA instead of stream writes before a barrier (see docs/DECISIONS.md D20).
  virtual void reset_and_barrier(uint32_t* flags, int count, int channel, Stream& stream) = 0;
  virtual void put_signal(int peer, int channel, Stream& stream) = 0;
  virtual void wait_signal(int peer, int channel, Stream& stream) = 0;

  // A contiguous view of `shape` in `peer`'s data region at `byte_offset`; throws if it does not
  // fit.
  Tensor buffer(int peer, Dims shape, DType dtype, size_t byte_offset = 0);

  // How many eager ops have numbered a use of this allocation (the op numbers the eager fused
  // ops' flags carry: all_gather_matmul on the push workspace, matmul_reduce_scatter on the
  // shared one, each over both of its paths): 0 for a fresh allocation, whose pad is all zero.
  // Every rank counts the same uses, in the same order.
  uint32_t next_use() { return ++uses_; }

 protected:
  SymmetricMemory(int rank, int world_size, size_t size, Device device)
      : rank_(rank), world_size_(world_size), size_(size), device_(device) {}
  void check_peer(int peer, const char* what) const;
  void check_channel(int channel, const char* what) const;
  // reset_and_barrier's flags: none, or `count` of them at a non-null address.
  void check_reset(const uint32_t* flags, int count) const;

  int rank_;
  int world_size_;
  size_t size_;
  Device device_;
  uint32_t uses_ = 0;
};

// Makes symmetric allocations for one group (a collective call: every rank of the group must
// allocate the same sizes in the same order).
class SymmAllocator {
 public:
  virtual ~SymmAllocator() = default;
  // Empty when symmetric memory works in this group, else why not (e.g. it spans nodes).
  virtual const std::string& unavailable_reason() const = 0;
  virtual std::unique_ptr<SymmetricMemory> allocate(size_t bytes) = 0;
};

// The allocator for a backend: POSIX shared memory for "cpu", CUDA VMM for "cuda".
std::unique_ptr<SymmAllocator> make_symm_allocator(Backend& backend, Group& group);

}  // namespace asynctp
