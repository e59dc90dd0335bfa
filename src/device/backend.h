// The execution interface the ops are written against: streams, events, copies, GEMM, the
// partial-sum reduction and a few elementwise kernels. A backend runs work in stream order; the
// CPU backend runs every call eagerly on the calling thread (its streams are in order by
// construction), the CUDA backend enqueues on CUDA streams.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/buffer.h"
#include "core/tensor.h"

namespace asynctp {

class Stream {
 public:
  virtual ~Stream() = default;
  // Blocks the host until everything enqueued so far has finished.
  virtual void synchronize() = 0;
  // cudaStream_t for CUDA streams, nullptr on the CPU backend.
  virtual void* native_handle() const = 0;
};

class Event {
 public:
  virtual ~Event() = default;
  // Captures the work enqueued on `stream` so far.
  virtual void record(Stream& stream) = 0;
  // Makes later work on `stream` wait for the recorded work.
  virtual void block(Stream& stream) = 0;
  virtual void synchronize() = 0;
  // Milliseconds from `start` to this event (both recorded and complete).
  virtual float elapsed_ms(const Event& start) const = 0;
};

enum class ReduceOp : uint8_t { kSum, kAvg };
std::string_view reduce_op_name(ReduceOp op);
ReduceOp parse_reduce_op(std::string_view text);

enum class UnaryOp : uint8_t { kSilu, kRelu, kGelu };

// D = A @ B (or D += A @ B), per batch entry, accumulated in f32 and rounded once into D.
//   a: [m, k] or [batch, m, k]   each matrix row- or column-major (one of its dims has stride 1)
//   b: [k, n] or [batch, k, n]   a 2-D b is shared by every batch entry
//   d: [m, n] or [batch, m, n]   f32, bf16 or f16
// float8 a/b need scales (f32): a_scale holds one element (tensor-wise) or has a's shape with
// the last dim 1 (row-wise); b_scale one element or shape [1, n] (column-wise). The result is
// (sum_k a*b) * a_scale[row] * b_scale[col], in that order.
struct GemmArgs {
  Tensor a;
  Tensor b;
  Tensor d;
  // acc starts from D's value instead of 0, so accumulating per K-slice in a fixed order gives
  // the same f32 sum as one product over all of K. Not allowed together with scales.
  bool accumulate = false;
  Tensor a_scale;
  Tensor b_scale;
};

// Shape, dtype and layout checks shared by every backend; throws naming the bad argument.
void validate_gemm(const GemmArgs& args);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;

  // Device memory (host memory on the CPU backend), not initialised.
  virtual Buffer allocate(size_t bytes) = 0;
  // The stream ops run on by default (the caller's stream).
  virtual Stream& compute_stream() = 0;
  virtual std::unique_ptr<Stream> create_stream() = 0;
  // timing: the event can be used with elapsed_ms (slightly more expensive on CUDA).
  virtual std::unique_ptr<Event> create_event(bool timing = false) = 0;
  // Whether work on the compute stream is being captured into a CUDA graph right now: nothing
  // may then allocate, synchronize or talk to the store.
  virtual bool capturing() = 0;

  // dst <- src, same shape, any strides, converting the dtype when they differ. Either side may
  // be host memory or memory mapped into this process from a peer.
  virtual void copy(const Tensor& dst, const Tensor& src, Stream& stream) = 0;
  virtual void fill(const Tensor& dst, float value, Stream& stream) = 0;
  virtual void gemm(const GemmArgs& args, Stream& stream) = 0;
  // out = sum (or mean) of inputs, all of out's shape: added in f32 in the order given, rounded
  // once; the same inputs in the same order give the same bits on every rank and every run.
  virtual void reduce(const Tensor& out, std::span<const Tensor> inputs, ReduceOp op,
                      Stream& stream) = 0;
  virtual void unary(UnaryOp op, const Tensor& out, const Tensor& in, Stream& stream) = 0;
  // Waits for all work on all streams of this backend.
  virtual void synchronize() = 0;
};

// "cpu", or "cuda" when built with the CUDA backend; `local_rank` picks the GPU.
std::unique_ptr<Backend> make_backend(std::string_view name, int local_rank);
std::vector<std::string> available_backends();

}  // namespace asynctp
