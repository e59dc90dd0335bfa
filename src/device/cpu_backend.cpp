#include "device/cpu_backend.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/deadline.h"
#include "core/env.h"
#include "device/cpu_futex.h"
#include "device/cpu_loops.h"
#include "device/cpu_native_gemm.h"
#include "device/cpu_streams.h"
#include "device/native_params.h"
#include "kernels/activation.h"
#include "kernels/native/schedule.h"
#include "kernels/native/validate.h"

namespace asynctp {

namespace {

std::atomic<bool> g_poison{false};
std::atomic<bool> g_times_paths{false};

using cpu::as_cpu;
using cpu::load_row;
using cpu::store_row;

void check_host(const Tensor& t, const char* what) {
  ASYNCTP_CHECK(t.device().is_cpu(), "the cpu backend cannot touch {} on {}", what,
                t.device().to_string());
}

// Views a 2-D or 3-D GEMM operand as 3-D (batch 1 for 2-D; batch stride 0 when shared).
Tensor as_batched(const Tensor& t) {
  return t.dim() == 3 ? t : t.unsqueeze(0);
}

// Every method that takes a stream checks its arguments now and enqueues the work on the stream
// (NOTE [cpu streams]): the loops below run on the stream's worker, with the arguments copied.
class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int rank)
      : streams_(rank, static_cast<uint64_t>(envvars::kCpuStreamJitter.integer())),
        compute_(streams_.create("asynctp compute")),
        times_paths_(g_times_paths.load()) {}

  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::cpu(); }
  Buffer allocate(size_t bytes) override {
    Buffer buffer = Buffer::host(bytes);
    if (g_poison.load()) std::memset(buffer.data(), cpu::testing::kPoisonByte, bytes);
    return buffer;
  }
  Stream& compute_stream() override { return *compute_; }
  std::unique_ptr<Stream> create_stream(std::string_view name) override {
    return streams_.create(name);
  }
  // Torch's CPU tensors have no streams: every caller's handle is a view of the compute stream.
  std::unique_ptr<Stream> wrap_stream(void*) override {
    return std::make_unique<cpu::CpuStream>(*compute_);
  }
  std::unique_ptr<Event> create_event(bool) override { return cpu::make_cpu_event(); }
  bool capturing(Stream&) override { return false; }
  bool times_paths() const override { return times_paths_; }
  void synchronize() override { streams_.synchronize(); }
  void check_errors() override { streams_.check_errors(); }

  void copy(const Tensor& dst, const Tensor& src, Stream& stream) override {
    check_host(dst, "copy destination");
    check_host(src, "copy source");
    ASYNCTP_CHECK(dst.shape() == src.shape(), "copy: destination {} and source {} differ in shape",
                  dst.describe(), src.describe());
    as_cpu(stream, "copy").enqueue("copy", [dst, src] { run_copy(dst, src); });
  }

  void fill(const Tensor& dst, float value, Stream& stream) override {
    check_host(dst, "fill destination");
    as_cpu(stream, "fill").enqueue("fill", [dst, value] { run_fill(dst, value); });
  }

  // args.fast_accum is a permission this reference leaves unused: it accumulates in f32 always,
  // so a fast call gives the exact call's bits.
  void gemm(const GemmArgs& args, Stream& stream) override {
    validate_gemm(args);
    for (const Tensor* t : {&args.a, &args.b, &args.d})
      check_host(*t, "a GEMM operand");
    as_cpu(stream, "gemm").enqueue("gemm", [args] { run_gemm(args); });
  }

  void reduce(const Tensor& out, std::span<const Tensor> inputs, ReduceOp op,
              Stream& stream) override {
    check_reduce(out, inputs);
    as_cpu(stream, "reduce")
        .enqueue("reduce", [out, ins = std::vector<Tensor>(inputs.begin(), inputs.end()), op] {
          run_reduce(out, ins, op);
        });
  }

  void spin(int64_t cycles, Stream& stream) override {
    ASYNCTP_CHECK(cycles >= 0, "spin: cycles is {}, must be >= 0", cycles);
    // Sleeping, not spinning: the stream only has to be held, and a busy core would slow the
    // ranks' other threads on a small host.
    as_cpu(stream, "spin").enqueue("spin", [cycles] {
      pause_host(std::chrono::nanoseconds(cycles), HostPause::kSleep);
    });
  }

  // Flags in host memory that other processes (the ranks) map too: atomic accesses, as the CPU
  // symmetric memory's signals do, and a futex wake for the waiters.
  void write_flag(uint32_t* flag, uint32_t value, Stream& stream) override {
    ASYNCTP_CHECK(flag != nullptr, "write_flag: no flag");
    as_cpu(stream, "write_flag").enqueue("write_flag", [flag, value] {
      std::atomic_ref<uint32_t>(*flag).store(value, std::memory_order_release);
      cpu::futex_wake(flag);
    });
  }

  // A stream wait for *flag >= value (CUDA's GEQ: wrap-aware, (int32_t)(*flag - value) >= 0),
  // bounded by site.timeout from when the worker reaches it. Dropped by the fault switch
  // (cpu::testing::reset_flag_waits): enqueues nothing and holds back the latest native GEMM's
  // tiles counted in the flag.
  void wait_flag(const uint32_t* flag, uint32_t value, const FlagSite& site,
                 Stream& stream) override {
    ASYNCTP_CHECK(flag != nullptr, "wait_flag: no flag");
    cpu::CpuStream& s = as_cpu(stream, "wait_flag");
    if (cpu::testing::take_flag_waits(1) == 0) {
      cpu::testing::name_dropped_flag_wait(
          fmt::format("wait_flag for peer {} channel {}", site.peer, site.channel));
      if (counted_.faults && flag >= counted_.done && flag < counted_.done + counted_.count)
        counted_.faults->held.store(flag);
      return;
    }
    s.enqueue("wait_flag", [flag, value, site] {
      const Deadline deadline(site.timeout);
      auto up = [value](uint32_t v) { return static_cast<int32_t>(v - value) >= 0; };
      if (cpu::wait_word(flag, up, deadline)) return;
      ASYNCTP_TIMEOUT(
          "rank {}: waited {} for flag {} of peer {} on channel {} to reach {} (it holds {}: is "
          "the GEMM or the peer that raises it alive and in the same op?)",
          site.rank, deadline.describe(), static_cast<const void*>(flag), site.peer, site.channel,
          value, std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(flag)).load());
    });
  }

  void zero_flags(uint32_t* flags, size_t count, Stream& stream) override {
    ASYNCTP_CHECK(count == 0 || flags != nullptr, "zero_flags: {} flags at null", count);
    as_cpu(stream, "zero_flags").enqueue("zero_flags", [flags, count] {
      for (size_t i = 0; i < count; ++i)
        std::atomic_ref<uint32_t>(flags[i]).store(0, std::memory_order_release);
    });
  }

  std::string native_gemm_unsupported(const ChunkedGemmArgs& args) override {
    kernels::NativeGemmParams k;
    if (std::string why = native_params(args, &k); !why.empty()) return why;
    return kernels::native_gemm_unsupported(k);
  }

  // The kernel's emulation (device/cpu_native_gemm.h), on the stream's worker.
  void native_gemm(const ChunkedGemmArgs& args, Stream& stream) override {
    kernels::NativeGemmParams k;
    std::string why = native_params(args, &k);
    if (why.empty()) why = kernels::native_gemm_unsupported(k);
    ASYNCTP_CHECK(why.empty(), "native GEMM of a {} by b {} into d {}: {}", args.a.describe(),
                  args.b.describe(), args.d.describe(), why);
    cpu::CpuStream& s = as_cpu(stream, "native_gemm");
    const std::vector<cpu::NativeWait> waits = cpu::native_gemm_waits(k);
    const int64_t drop = cpu::testing::take_flag_waits(static_cast<int64_t>(waits.size()));
    if (drop >= 0) {
      const cpu::NativeWait& w = waits[static_cast<size_t>(drop)];
      cpu::testing::name_dropped_flag_wait(fmt::format(
          "native GEMM's {} wait for {} {} channel {}",
          w.kind == cpu::NativeWait::Kind::kReady ? "ready" : "sum",
          w.kind == cpu::NativeWait::Kind::kReady ? "chunk" : "peer", w.peer, w.channel));
    }
    auto faults = std::make_shared<cpu::NativeGemmFaults>();
    faults->drop = drop;
    s.enqueue("native_gemm", [k, faults] { cpu::run_native_gemm(k, faults.get()); });
    if (k.done != nullptr) {
      counted_ = {k.done, static_cast<size_t>(kernels::num_done_counters(kernels::resolved(k))),
                  std::move(faults)};
    }
  }

  void reduce_when_flagged(const Tensor& out, std::span<const Tensor> inputs, ReduceOp op,
                           const FlagWait& wait, Stream& stream) override {
    check_flag_wait(wait);
    check_reduce(out, inputs);
    as_cpu(stream, "reduce_when_flagged")
        .enqueue("reduce_when_flagged",
                 [out, ins = std::vector<Tensor>(inputs.begin(), inputs.end()), op, wait] {
                   run_wait_flags(wait);
                   run_reduce(out, ins, op);
                 });
  }

  void wait_flags(const FlagWait& wait, Stream& stream) override {
    check_flag_wait(wait);
    as_cpu(stream, "wait_flags").enqueue("wait_flags", [wait] { run_wait_flags(wait); });
  }

  void unary(UnaryOp op, const Tensor& out, const Tensor& in, Stream& stream) override {
    check_host(out, "unary output");
    check_host(in, "unary input");
    ASYNCTP_CHECK(out.shape() == in.shape(), "unary: output {} and input {} differ in shape",
                  out.describe(), in.describe());
    as_cpu(stream, "unary").enqueue("unary", [op, out, in] { run_unary(op, out, in); });
  }

  void swiglu_backward(const Tensor& grad_gate_up, const Tensor& grad_out, const Tensor& gate_up,
                       Stream& stream) override {
    check_host(grad_gate_up, "swiglu_backward output");
    check_host(grad_out, "swiglu_backward grad_out");
    check_host(gate_up, "swiglu_backward input");
    check_swiglu_backward(grad_gate_up, grad_out, gate_up);
    as_cpu(stream, "swiglu_backward").enqueue("swiglu_backward", [grad_gate_up, grad_out, gate_up] {
      run_swiglu_backward(grad_gate_up, grad_out, gate_up);
    });
  }
  void swiglu(const Tensor& out, const Tensor& gate_up, Stream& stream) override {
    check_host(out, "swiglu output");
    check_host(gate_up, "swiglu input");
    check_swiglu(out, gate_up);
    as_cpu(stream, "swiglu").enqueue("swiglu", [out, gate_up] { run_swiglu(out, gate_up); });
  }

 private:
  static void run_copy(const Tensor& dst, const Tensor& src) {
    if (dst.numel() == 0) return;
    if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
      std::memmove(dst.data(), src.data(), dst.nbytes());
      return;
    }
    const Tensor d = dst.dim() == 0 ? dst.unsqueeze(0) : dst;
    const Tensor s = src.dim() == 0 ? src.unsqueeze(0) : src;
    const int64_t n = d.size(-1);
    const int64_t ds = d.stride(-1);
    const int64_t ss = s.stride(-1);
    const size_t esize = d.element_size();
    std::vector<float> row(d.dtype() == s.dtype() ? 0 : n);
    cpu::for_each_row<2>(d.shape(), {&d.strides(), &s.strides()}, [&](const auto& off) {
      if (d.dtype() == s.dtype()) {
        char* dp = static_cast<char*>(d.data()) + off[0] * esize;
        const char* sp = static_cast<const char*>(s.data()) + off[1] * esize;
        if (ds == 1 && ss == 1) {
          std::memmove(dp, sp, n * esize);
        } else {
          for (int64_t j = 0; j < n; ++j)
            std::memcpy(dp + j * ds * esize, sp + j * ss * esize, esize);
        }
      } else {
        load_row(s.dtype(), s.data(), off[1], ss, n, row.data());
        store_row(d.dtype(), d.data(), off[0], ds, n, row.data());
      }
    });
  }

  static void run_fill(const Tensor& dst, float value) {
    if (dst.numel() == 0) return;
    const Tensor d = dst.dim() == 0 ? dst.unsqueeze(0) : dst;
    std::vector<float> row(d.size(-1), value);
    cpu::for_each_row<1>(d.shape(), {&d.strides()}, [&](const auto& off) {
      store_row(d.dtype(), d.data(), off[0], d.stride(-1), d.size(-1), row.data());
    });
  }

  static void run_gemm(const GemmArgs& args) {
    const Tensor a = as_batched(args.a);
    const Tensor b = as_batched(args.b);
    const Tensor d = as_batched(args.d);
    const int64_t batch = d.size(0), m = d.size(1), n = d.size(2), k = a.size(2);
    const bool scaled = args.a_scale.defined();
    Tensor sa, sb;
    if (scaled) {
      sa = args.a_scale.numel() == 1 ? Tensor() : as_batched(args.a_scale);
      sb = args.b_scale.numel() == 1 ? Tensor() : args.b_scale;
    }
    const float sa_all = scaled && !sa.defined() ? load_scalar(args.a_scale) : 1.0f;
    const float sb_all = scaled && !sb.defined() ? load_scalar(args.b_scale) : 1.0f;
    std::vector<float> b_panel(static_cast<size_t>(k * n));
    std::vector<float> a_row(k), acc(n), sb_row(n, sb_all);
    if (sb.defined()) load_row(sb.dtype(), sb.data(), 0, sb.stride(1), n, sb_row.data());
    for (int64_t bi = 0; bi < batch; ++bi) {
      const int64_t b_index = b.size(0) == 1 ? 0 : bi;
      if (bi == 0 || b.size(0) != 1) {
        for (int64_t kk = 0; kk < k; ++kk) {
          load_row(b.dtype(), b.data(), b_index * b.stride(0) + kk * b.stride(1), b.stride(2), n,
                   b_panel.data() + kk * n);
        }
      }
      for (int64_t i = 0; i < m; ++i) {
        load_row(a.dtype(), a.data(), bi * a.stride(0) + i * a.stride(1), a.stride(2), k,
                 a_row.data());
        const int64_t d_off = bi * d.stride(0) + i * d.stride(1);
        if (args.accumulate) {
          load_row(d.dtype(), d.data(), d_off, d.stride(2), n, acc.data());
        } else {
          std::fill(acc.begin(), acc.end(), 0.0f);
        }
        cpu::accumulate_row(a_row.data(), k, b_panel.data(), n, n, acc.data());
        if (scaled) {
          float sa_i = sa_all;
          if (sa.defined())
            load_row(sa.dtype(), sa.data(), bi * sa.stride(0) + i * sa.stride(1), 1, 1, &sa_i);
          for (int64_t j = 0; j < n; ++j)
            acc[j] = acc[j] * sa_i * sb_row[j];
        }
        store_row(d.dtype(), d.data(), d_off, d.stride(2), n, acc.data());
      }
    }
  }

  static void check_reduce(const Tensor& out, std::span<const Tensor> inputs) {
    check_host(out, "reduce output");
    ASYNCTP_CHECK(!inputs.empty(), "reduce needs at least one input");
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_host(inputs[i], "a reduce input");
      ASYNCTP_CHECK(inputs[i].shape() == out.shape(), "reduce input {} is {} but the output is {}",
                    i, inputs[i].describe(), out.describe());
    }
  }

  static void run_reduce(const Tensor& out, std::span<const Tensor> inputs, ReduceOp op) {
    if (out.numel() == 0) return;
    const Tensor o = out.dim() == 0 ? out.unsqueeze(0) : out;
    std::vector<Tensor> ins;
    for (const auto& t : inputs)
      ins.push_back(t.dim() == 0 ? t.unsqueeze(0) : t);
    const int64_t n = o.size(-1);
    std::vector<float> acc(n), row(n);
    const float count = static_cast<float>(ins.size());
    // Row offsets of every input follow from the row index; walk the output's rows and derive.
    const int rows_rank = o.dim() - 1;
    std::array<int64_t, kMaxDims> index{};
    const int64_t rows = o.numel() / n;
    for (int64_t r = 0; r < rows; ++r) {
      auto offset_of = [&](const Tensor& t) {
        int64_t off = 0;
        for (int dd = 0; dd < rows_rank; ++dd)
          off += index[dd] * t.stride(dd);
        return off;
      };
      load_row(ins[0].dtype(), ins[0].data(), offset_of(ins[0]), ins[0].stride(-1), n, acc.data());
      for (size_t i = 1; i < ins.size(); ++i) {
        load_row(ins[i].dtype(), ins[i].data(), offset_of(ins[i]), ins[i].stride(-1), n,
                 row.data());
        for (int64_t j = 0; j < n; ++j)
          acc[j] += row[j];
      }
      if (op == ReduceOp::kAvg) {
        for (int64_t j = 0; j < n; ++j)
          acc[j] /= count;
      }
      store_row(o.dtype(), o.data(), offset_of(o), o.stride(-1), n, acc.data());
      for (int dd = rows_rank - 1; dd >= 0; --dd) {
        if (++index[dd] < o.size(dd)) break;
        index[dd] = 0;
      }
    }
  }

  // The deadline starts when the worker reaches the wait, as a GPU wait's does.
  static void run_wait_flags(const FlagWait& wait) {
    const Deadline deadline(wait.timeout);
    for (int i = wait.first; i < wait.count; ++i) {
      if (i == wait.skip) continue;
      if (cpu::wait_word(
              wait.flags + i, [&](uint32_t v) { return flag_raised(v, wait.value); }, deadline)) {
        continue;
      }
      if (wait.of == FlagWait::Of::kShard) {
        ASYNCTP_TIMEOUT(
            "rank {}: waited {} for the shard of peer {} on channel {} (is that peer alive "
            "and in the same op?)",
            wait.rank, deadline.describe(), i, wait.channel);
      }
      ASYNCTP_TIMEOUT(
          "rank {}: the reduction waited {} for the partial of rank {} on channel {} (is "
          "that peer alive and in the same op?)",
          wait.rank, deadline.describe(), i, wait.channel);
    }
  }

  static void run_unary(UnaryOp op, const Tensor& out, const Tensor& in) {
    if (out.numel() == 0) return;
    const Tensor o = out.dim() == 0 ? out.unsqueeze(0) : out;
    const Tensor x = in.dim() == 0 ? in.unsqueeze(0) : in;
    const int64_t n = o.size(-1);
    std::vector<float> row(n);
    cpu::for_each_row<2>(o.shape(), {&o.strides(), &x.strides()}, [&](const auto& off) {
      load_row(x.dtype(), x.data(), off[1], x.stride(-1), n, row.data());
      for (float& v : row) {
        switch (op) {
          case UnaryOp::kSilu:
            v = kernels::silu_f32(v);
            break;
          case UnaryOp::kRelu:
            v = v > 0.0f ? v : (std::isnan(v) ? v : 0.0f);
            break;
          case UnaryOp::kGelu:
            v = 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
            break;
        }
      }
      store_row(o.dtype(), o.data(), off[0], o.stride(-1), n, row.data());
    });
  }

  static void run_swiglu(const Tensor& out, const Tensor& gate_up) {
    if (out.numel() == 0) return;
    const int64_t n = out.size(-1);
    std::vector<float> gate(n), up(n);
    cpu::for_each_row<2>(out.shape(), {&out.strides(), &gate_up.strides()}, [&](const auto& off) {
      const int64_t stride = gate_up.stride(-1);
      load_row(gate_up.dtype(), gate_up.data(), off[1], stride, n, gate.data());
      load_row(gate_up.dtype(), gate_up.data(), off[1] + n * stride, stride, n, up.data());
      for (int64_t j = 0; j < n; ++j)
        gate[j] = kernels::swiglu_f32(gate[j], up[j]);
      store_row(out.dtype(), out.data(), off[0], out.stride(-1), n, gate.data());
    });
  }

  static void run_swiglu_backward(const Tensor& grad_gate_up, const Tensor& grad_out,
                                  const Tensor& gate_up) {
    if (grad_out.numel() == 0) return;
    const int64_t n = grad_out.size(-1);
    std::vector<float> gate(n), up(n), d(n);
    cpu::for_each_row<3>(
        grad_out.shape(), {&grad_out.strides(), &gate_up.strides(), &grad_gate_up.strides()},
        [&](const auto& off) {
          const int64_t stride = gate_up.stride(-1), gstride = grad_gate_up.stride(-1);
          load_row(gate_up.dtype(), gate_up.data(), off[1], stride, n, gate.data());
          load_row(gate_up.dtype(), gate_up.data(), off[1] + n * stride, stride, n, up.data());
          load_row(grad_out.dtype(), grad_out.data(), off[0], grad_out.stride(-1), n, d.data());
          for (int64_t j = 0; j < n; ++j)
            kernels::swiglu_backward_f32(gate[j], up[j], d[j], &gate[j], &up[j]);
          store_row(grad_gate_up.dtype(), grad_gate_up.data(), off[2], gstride, n, gate.data());
          store_row(grad_gate_up.dtype(), grad_gate_up.data(), off[2] + n * gstride, gstride, n,
                    up.data());
        });
  }

  static float load_scalar(const Tensor& t) {
    float v = 0;
    load_row(t.dtype(), t.data(), 0, 1, 1, &v);
    return v;
  }

  // The contract's view of args, and every tensor on the host.
  static std::string native_params(const ChunkedGemmArgs& args, kernels::NativeGemmParams* k) {
    for (const Tensor* t : {&args.a, &args.b, &args.d, &args.own_a, &args.sum_parts, &args.sum_out,
                            &args.pre_out, &args.a_out})
      if (t->defined() && !t->device().is_cpu()) return "an operand is not in host memory";
    return to_native_params(args, k);
  }

  cpu::StreamSet streams_;
  std::unique_ptr<cpu::CpuStream> compute_;
  const bool times_paths_;  // cpu::testing::time_paths as the backend was made
  // The done counters of the latest native GEMM that counts any, and its faults: a dropped
  // wait_flag on one of them holds back its tiles.
  struct Counted {
    const uint32_t* done = nullptr;
    size_t count = 0;
    std::shared_ptr<cpu::NativeGemmFaults> faults;
  } counted_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int rank) {
  return std::make_unique<CpuBackend>(rank);
}

namespace cpu::testing {
void poison_allocations(bool on) {
  g_poison = on;
}
void time_paths(bool on) {
  g_times_paths = on;
}
}  // namespace cpu::testing

}  // namespace asynctp
