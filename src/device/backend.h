// The execution interface the ops are written against: streams, events, copies, GEMM, the
// partial-sum reduction and a few elementwise kernels. A backend runs work in stream order,
// asynchronously to the host: the CUDA backend on CUDA streams, the CPU backend on worker
// threads (NOTE [cpu streams] in device/cpu_streams.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <asynctp/ops.h>
#include <asynctp/tensor.h>

#include "core/buffer.h"
#include "core/dtype.h"
#include "kernels/native/params.h"

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
  // A permission, as torch._scaled_mm's use_fast_accum: the backend may accumulate float8
  // products faster and less exactly. CUDA: cuBLASLt's fast accumulation
  // (CUBLASLT_MATMUL_DESC_FAST_ACCUM: Hopper and Ada keep the running sum in the tensor cores'
  // narrower accumulator instead of promoting it to f32 every few K steps). The CPU backend, the
  // reference, accumulates in exact f32 either way, so its results do not depend on the flag.
  // Without float8 operands it changes nothing.
  bool fast_accum = false;
};

// Whether a flag raised to op numbers (counting up through 2^32) is up for op `value`: it holds
// that number or the next one (the protocols bound a peer to one op ahead). A flag left behind
// by any number of ops is down however far the count has gone. With value 1, for 0/1 flags:
// flag != 0.
constexpr bool flag_raised(uint32_t flag, uint32_t value) {
  return flag - value <= 1u;
}

// Shape, dtype and layout checks shared by every backend; throws naming the bad argument.
void validate_gemm(const GemmArgs& args);

// The async-input GEMM (the native path of the fused ops): d = a @ b in one persistent kernel
// whose rows of a arrive in chunks of chunk_rows rows (the last may be shorter). The kernel
// walks the chunks from first_chunk on, wrapping around, and
//   - before reading chunk c of a, waits until ready[c] is up for op ready_value (flag_raised:
//     0/1 flags, or op numbers) (bounded by `timeout`; a timeout is reported as a TimeoutError
//     naming `rank` and the chunk at the next synchronization);
//   - after storing the output rows of chunk c, counts them in done[c]: chunk c of d is complete
//     once done[c] reaches its count in native_gemm_done_order(args).
// ready and done are device arrays of one u32 per chunk (or null); the caller zeroes them.
// The schedule and protocol fields (chunk_rows, ready*, done*, own_chunk, sum_*, ...) are the
// kernel's own (kernels::NativeGemmSchedule, kernels/native/params.h, which documents each);
// the backend derives the operands' pointers, strides and dtypes from the tensors below.
struct ChunkedGemmArgs : kernels::NativeGemmSchedule {
  Tensor a;  // [m, k], unit column stride
  Tensor b;  // [k, n], row-major or column-major (a transposed [n, k])
  Tensor d;  // [m, n], unit column stride
  std::chrono::milliseconds timeout{60'000};
  // Chunk own_chunk's rows as the caller holds them ([rows of that chunk, k], unit column
  // stride): read from here, without waiting for ready[own_chunk], by every tile wholly inside
  // the chunk (all of them unless native_gemm_own_edge_rows says otherwise).
  Tensor own_a;
  // The reduce-scatter epilogue's partials, sum_parts[s] for every s but sum_self (d's dtype,
  // bf16 or f16, each [chunk rows, n] with a unit column stride; n even), and its output.
  Tensor sum_parts;  // [parts, chunk rows, n]
  Tensor sum_out;    // [chunk rows, n]
  // The SwiGLU epilogue's (NativeGemmSchedule::swiglu: b is [k, 2n], d [m, n]) pre-activation
  // output, [m, 2n] with a unit column stride, f32, bf16 or f16; undefined: none.
  Tensor pre_out;
  // A copy of every row of A as the GEMM reads it (own_chunk's from own_a), [m, k] of a's dtype
  // with a unit column stride, written beside the main loop (kernels::NativeGemmOperands::a_out);
  // undefined: none.
  Tensor a_out;
  // The scaled GEMM (float8 e4m3 a and b, b k-major): d = (a @ b) * a_scale * b_scale, f32 (see
  // kernels::NativeGemmOperands). a_scale: one value (tensor-wise) or one per row of a ([m] or
  // [m, 1], contiguous); own_a_scale: own_a's rows' (one value, or one per row of own_a), which
  // the own chunk's rows take; b_scale: one value or one per column of d ([n] or [1, n],
  // contiguous). Undefined: 1. The products accumulate in the tensor cores' fast float8 mode.
  Tensor a_scale, own_a_scale, b_scale;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // What the backend runs on, for keys of measured choices ("cpu", "NVIDIA H200", ...).
  virtual std::string hardware() const { return std::string(name()); }
  virtual Device device() const = 0;

  // Device memory (host memory on the CPU backend), not initialised.
  virtual Buffer allocate(size_t bytes) = 0;
  // The stream ops run on where the caller names none (OpContext::set_stream, the ops' stream
  // options): one the backend creates.
  virtual Stream& compute_stream() = 0;
  // A new stream. `name` says what it is for ("asynctp copy rank 0"): the CUDA backend names the
  // stream so in NVTX tools (nsys shows its row by it), the CPU backend's errors name it so.
  virtual std::unique_ptr<Stream> create_stream(std::string_view name) = 0;
  // A Stream over the caller's native stream, which it does not own (the caller keeps it alive
  // while the wrapper is used). CUDA: a cudaStream_t, nullptr the legacy default stream. CPU:
  // any handle names the backend's compute stream, so the wrapper is a view of it.
  virtual std::unique_ptr<Stream> wrap_stream(void* handle) = 0;
  // timing: the event can be used with elapsed_ms (slightly more expensive on CUDA).
  virtual std::unique_ptr<Event> create_event(bool timing = false) = 0;
  // Whether work on `stream` is being captured into a CUDA graph right now: nothing may then
  // allocate, synchronize or talk to the store. The ops ask about their own stream, the caller's.
  virtual bool capturing(Stream& stream) = 0;
  // Whether the dispatcher chooses among an op's paths by timing them here (CUDA). The CPU
  // backend, a reference whose ranks are threads sharing the host's cores, says no: its timings
  // would pick a path by noise, so auto there takes the overlapped path (ops/dispatch.h).
  virtual bool times_paths() const { return false; }

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
  // out[.., j] = silu(g) * u with g = gate_up[.., j], u = gate_up[.., N + j], in f32
  // (kernels::swiglu_f32), rounded once. gate_up: [.., 2N] (the gate's columns, then the up
  // projection's); out: [.., N], the same leading dims; any strides, f32, bf16 or f16.
  virtual void swiglu(const Tensor& out, const Tensor& gate_up, Stream& stream) = 0;
  // swiglu's backward, in one pass: grad_gate_up[.., j] = d_gate and grad_gate_up[.., N + j] =
  // d_up of (g, u) = (gate_up[.., j], gate_up[.., N + j]) and d = grad_out[.., j], in f32
  // (kernels::swiglu_backward_f32), each rounded once. grad_gate_up and gate_up: [.., 2N];
  // grad_out: [.., N], the same leading dims; any strides, f32, bf16 or f16.
  virtual void swiglu_backward(const Tensor& grad_gate_up, const Tensor& grad_out,
                               const Tensor& gate_up, Stream& stream) = 0;
  // Waits for all work on all streams of this backend.
  virtual void synchronize() = 0;
  // Throws the TimeoutError of a bounded device-side wait that gave up since the last check (a
  // host read; the CPU backend: the first failure of any stream not yet reported).
  virtual void check_errors() {}

  // The native async-input GEMM (see ChunkedGemmArgs). native_gemm_unsupported says why this
  // backend cannot run `args` ("" when it can); native_gemm throws where it cannot. CUDA: the
  // kernel (Hopper); CPU: its emulation, which follows the same contract
  // (device/cpu_native_gemm.h).
  virtual std::string native_gemm_unsupported(const ChunkedGemmArgs& args) = 0;
  virtual void native_gemm(const ChunkedGemmArgs& args, Stream& stream) = 0;
  // Every counter of done[] with the count it reaches once its rows are all stored, in the
  // kernel's walk order (of each, its last tile): the order to wait for them in (they may complete
  // a little out of it: only the waits' pace depends on it). One conversion of `args` for all.
  // The contract's (kernels/native/schedule.h), the same on every backend.
  struct DoneCounter {
    int index;
    uint32_t count;
  };
  std::vector<DoneCounter> native_gemm_done_order(const ChunkedGemmArgs& args);
  // With own_a given: the rows of own_chunk that tiles still read from `a` (tiles that straddle
  // the chunk's edges, off the kernel's tile grid): its first `head` and last `tail` rows (both 0:
  // none). Those rows must be in `a` too and ready[own_chunk] (its pieces) raised.
  struct OwnEdgeRows {
    int64_t head = 0, tail = 0;
    bool any() const { return head + tail > 0; }
  };
  OwnEdgeRows native_gemm_own_edge_rows(const ChunkedGemmArgs& args);
  // Stream-ordered operations on u32 flags in device memory (this device's, or a peer's mapped
  // into this process), carried out by the stream's front
  // end (no SM needed, so they progress beside a kernel that holds every SM): set *flag (after
  // all earlier work of the stream, whose writes it makes visible: that includes work another
  // stream did before an event this stream waited on, as the ops' flag streams do), and hold
  // later work of the stream until *flag >= value (acquire). zero_flags sets count flags to 0.
  // wait_flag's site names the wait in its timeout: bounded by site.timeout on the CPU backend
  // (a TimeoutError naming rank, peer and channel); a CUDA stream memory wait has no bound.
  struct FlagSite {
    int rank = 0;      // the waiting rank
    int peer = -1;     // whose data the flag stands for (for a done counter: the chunk's owner)
    int channel = -1;  // which of that peer's flags (for a done counter: the piece)
    std::chrono::milliseconds timeout{60'000};
  };
  virtual void write_flag(uint32_t* flag, uint32_t value, Stream& stream) = 0;
  // Holds `stream` for `cycles` (>= 0) device clock cycles: a measurement's delay, during which
  // the host enqueues what follows (asynctp bench --hide-launch). A one-thread kernel on CUDA
  // (SM clock); a nanosecond a cycle on the CPU backend, sleeping.
  virtual void spin(int64_t cycles, Stream& stream) = 0;
  // At least as many of spin()'s cycles as pass in a microsecond (a spin of n µs x this lasts
  // at least n µs): 1000 on the CPU backend; on CUDA the highest SM clock in MHz.
  virtual double spin_cycles_per_us() const { return 1000.0; }
  // write_flag() of each, in order, in one enqueueing where the backend can (one driver call on
  // CUDA: every host call counts in an eager op's host time).
  struct FlagWrite {
    uint32_t* flag;
    uint32_t value;
  };
  virtual void write_flags(std::span<const FlagWrite> writes, Stream& stream) {
    for (const FlagWrite& w : writes)
      write_flag(w.flag, w.value, stream);
  }
  virtual void wait_flag(const uint32_t* flag, uint32_t value, const FlagSite& site,
                         Stream& stream) = 0;
  // write_flags(writes), then wait_flag(flag, value, site) behind them: one driver call on CUDA.
  virtual void write_flags_then_wait(std::span<const FlagWrite> writes, const uint32_t* flag,
                                     uint32_t value, const FlagSite& site, Stream& stream) {
    write_flags(writes, stream);
    wait_flag(flag, value, site, stream);
  }
  virtual void zero_flags(uint32_t* flags, size_t count, Stream& stream) = 0;
  // reduce(), once flags[i] is up for op `value` for every i in [first, count) but `skip`
  // (flag_raised: 0/1 flags with value 1, or op numbers counting up through 2^32)
  // (acquire: the inputs that peers copied in before raising their flag with write_flag are
  // complete). The flags are left
  // as they are; the wait takes place for an empty output too. Bounded by `timeout` (once for the
  // whole call, not per flag or per block of a kernel): a TimeoutError naming `rank`, the missing
  // flag's index as the peer, and `channel`.
  struct FlagWait {
    const uint32_t* flags = nullptr;  // flags [first, count) of this array, but `skip`
    uint32_t value = 1;
    int first = 0;
    int count = 0;
    int skip = -1;
    std::chrono::milliseconds timeout{60'000};
    int rank = 0;
    int channel = -1;
    // What the flags stand for, for the timeout's message: a partial for a reduction, or a
    // peer's shard (wait_flags of an all-gather).
    enum class Of { kPartial, kShard } of = Of::kPartial;
  };
  virtual void reduce_when_flagged(const Tensor& out, std::span<const Tensor> inputs, ReduceOp op,
                                   const FlagWait& wait, Stream& stream) = 0;
  // Holds later work of the stream until the flags are raised, as reduce_when_flagged waits
  // (bounded the same way). On CUDA one block of a kernel: it needs an SM, so enqueue it where no
  // kernel of another stream holds them all.
  virtual void wait_flags(const FlagWait& wait, Stream& stream) = 0;

 protected:
  // reduce_when_flagged's flags: none, or `count` of them at a non-null address.
  static void check_flag_wait(const FlagWait& wait);
  // swiglu's shapes and dtypes.
  static void check_swiglu(const Tensor& out, const Tensor& gate_up, const char* op = "swiglu",
                           const char* out_name = "out");
  // swiglu_backward's: grad_out as swiglu's out, grad_gate_up as gate_up.
  static void check_swiglu_backward(const Tensor& grad_gate_up, const Tensor& grad_out,
                                    const Tensor& gate_up);
};

// "cpu", "cuda" when built with the CUDA backend, or "auto": cuda where built and a GPU is
// visible, else cpu. The GPU: device_index where it is >= 0, else local_rank modulo the visible
// GPUs.
std::unique_ptr<Backend> make_backend(std::string_view name, int local_rank, int device_index = -1);
std::vector<std::string> available_backends();

}  // namespace asynctp
