#include "device/backend.h"

#include "device/cpu_backend.h"
#include "device/native_params.h"
#include "kernels/native/schedule.h"
#ifdef ASYNCTP_WITH_CUDA
#include "device/cuda/cuda_backend.h"
#endif

namespace asynctp {

std::string_view reduce_op_name(ReduceOp op) {
  return op == ReduceOp::kSum ? "sum" : "avg";
}

ReduceOp parse_reduce_op(std::string_view text) {
  if (text == "sum") return ReduceOp::kSum;
  if (text == "avg" || text == "mean") return ReduceOp::kAvg;
  ASYNCTP_FAIL("reduce_op must be 'sum' or 'avg', got '{}'", text);
}

namespace {
bool has_unit_stride(const Tensor& t) {
  return t.stride(-1) == 1 || t.stride(-2) == 1 || t.size(-1) == 1 || t.size(-2) == 1;
}
}  // namespace

void validate_gemm(const GemmArgs& args) {
  const Tensor& a = args.a;
  const Tensor& b = args.b;
  const Tensor& d = args.d;
  ASYNCTP_CHECK(a.defined() && b.defined() && d.defined(), "gemm: a, b and d must all be given");
  ASYNCTP_CHECK(a.dim() == 2 || a.dim() == 3, "gemm: a must be 2-D or 3-D, got {}", a.describe());
  ASYNCTP_CHECK(d.dim() == a.dim(), "gemm: d {} must have a's rank ({})", d.describe(), a.dim());
  ASYNCTP_CHECK(b.dim() == 2 || b.dim() == a.dim(), "gemm: b {} must be 2-D or have a's rank",
                b.describe());
  if (a.dim() == 3) {
    ASYNCTP_CHECK(a.size(0) == d.size(0), "gemm: batch of a ({}) and d ({}) differ", a.size(0),
                  d.size(0));
    ASYNCTP_CHECK(b.dim() == 2 || b.size(0) == a.size(0), "gemm: batch of a ({}) and b ({}) differ",
                  a.size(0), b.size(0));
  }
  ASYNCTP_CHECK(a.size(-2) == d.size(-2), "gemm: a has {} rows but d has {}", a.size(-2),
                d.size(-2));
  ASYNCTP_CHECK(a.size(-1) == b.size(-2), "gemm: a's inner dim {} differs from b's {} rows",
                a.size(-1), b.size(-2));
  ASYNCTP_CHECK(b.size(-1) == d.size(-1), "gemm: b has {} columns but d has {}", b.size(-1),
                d.size(-1));
  ASYNCTP_CHECK(d.dtype() == DType::kF32 || d.dtype() == DType::kBF16 || d.dtype() == DType::kF16,
                "gemm: output dtype must be f32, bf16 or f16, got {}", d.dtype());
  for (const Tensor* t : {&a, &b, &d}) {
    ASYNCTP_CHECK(has_unit_stride(*t), "gemm: operand {} has no unit stride in its matrix dims",
                  t->describe());
  }
  const bool f8 = is_float8(a.dtype()) || is_float8(b.dtype());
  if (f8) {
    ASYNCTP_CHECK(is_float8(a.dtype()) && is_float8(b.dtype()),
                  "gemm: float8 needs both operands in float8, got a {} and b {}", a.dtype(),
                  b.dtype());
    ASYNCTP_CHECK(args.a_scale.defined() && args.b_scale.defined(),
                  "gemm: float8 operands need a_scale and b_scale");
    ASYNCTP_CHECK(!args.accumulate, "gemm: accumulate is not supported with scales");
    const Tensor& sa = args.a_scale;
    const Tensor& sb = args.b_scale;
    ASYNCTP_CHECK(sa.dtype() == DType::kF32 && sb.dtype() == DType::kF32,
                  "gemm: scales must be f32, got a_scale {} and b_scale {}", sa.dtype(),
                  sb.dtype());
    if (sa.numel() != 1) {
      Dims expected = a.shape();
      expected[expected.size() - 1] = 1;
      ASYNCTP_CHECK(sa.shape() == expected,
                    "gemm: row-wise a_scale must have shape {} (a is {}), got {}", expected,
                    a.describe(), sa.describe());
    }
    if (sb.numel() != 1) {
      ASYNCTP_CHECK(sb.shape() == Dims({1, b.size(-1)}),
                    "gemm: column-wise b_scale must have shape [1, {}], got {}", b.size(-1),
                    sb.describe());
    }
  } else {
    ASYNCTP_CHECK(a.dtype() == b.dtype(), "gemm: a is {} but b is {}", a.dtype(), b.dtype());
    ASYNCTP_CHECK(!args.a_scale.defined() && !args.b_scale.defined(),
                  "gemm: scales are only for float8 operands (a is {})", a.dtype());
  }
}

std::vector<Backend::DoneCounter> Backend::native_gemm_done_order(const ChunkedGemmArgs& args) {
  kernels::NativeGemmParams k;
  const std::string why = to_native_params(args, &k);
  ASYNCTP_CHECK(why.empty(), "native_gemm_done_order: {}", why);
  std::vector<DoneCounter> counters;
  for (const int index : kernels::done_order(k))
    counters.push_back({index, kernels::done_count(k, index)});
  return counters;
}

Backend::OwnEdgeRows Backend::native_gemm_own_edge_rows(const ChunkedGemmArgs& args) {
  kernels::NativeGemmParams k;
  const std::string why = to_native_params(args, &k);
  ASYNCTP_CHECK(why.empty(), "native_gemm_own_edge_rows: {}", why);
  const kernels::NativeGemmOwnEdges edges = kernels::own_edge_rows(k);
  return {edges.head, edges.tail};
}

void Backend::check_flag_wait(const FlagWait& wait) {
  ASYNCTP_CHECK(wait.count >= 0 && (wait.count == 0 || wait.flags != nullptr),
                "flag wait: {} flags at {}", wait.count, static_cast<const void*>(wait.flags));
  ASYNCTP_CHECK(wait.first >= 0 && wait.first <= wait.count,
                "flag wait: first flag {} is out of range [0, {}]", wait.first, wait.count);
}

void Backend::check_swiglu(const Tensor& out, const Tensor& gate_up, const char* op,
                           const char* out_name) {
  ASYNCTP_CHECK(out.defined() && gate_up.defined() && out.dim() >= 1 && gate_up.dim() == out.dim(),
                "{}: {} {} and gate_up {} must be defined and of the same rank >= 1", op, out_name,
                out.describe(), gate_up.describe());
  Dims expected = out.shape();
  expected[expected.size() - 1] = 2 * out.size(-1);
  ASYNCTP_CHECK(gate_up.shape() == expected, "{}: gate_up must be {} for {} {}, got {}", op,
                expected, out_name, out.describe(), gate_up.describe());
  for (const Tensor* t : {&out, &gate_up}) {
    const DType d = t->dtype();
    ASYNCTP_CHECK(d == DType::kF32 || d == DType::kBF16 || d == DType::kF16,
                  "{}: {} is not f32, bf16 or f16", op, t->describe());
  }
}

void Backend::check_swiglu_backward(const Tensor& grad_gate_up, const Tensor& grad_out,
                                    const Tensor& gate_up) {
  check_swiglu(grad_out, gate_up, "swiglu_backward", "grad_out");
  ASYNCTP_CHECK(grad_gate_up.defined() && grad_gate_up.shape() == gate_up.shape(),
                "swiglu_backward: grad_gate_up must be {} like gate_up, got {}", gate_up.shape(),
                grad_gate_up.describe());
  const DType d = grad_gate_up.dtype();
  ASYNCTP_CHECK(d == DType::kF32 || d == DType::kBF16 || d == DType::kF16,
                "swiglu_backward: grad_gate_up {} is not f32, bf16 or f16",
                grad_gate_up.describe());
}

std::unique_ptr<Backend> make_backend(std::string_view name, int local_rank, int device_index) {
  ASYNCTP_CHECK(device_index >= -1,
                "device_index must be -1 (by local rank) or a GPU's index, got {}", device_index);
  if (name == "auto") {
#ifdef ASYNCTP_WITH_CUDA
    name = cuda_device_count() > 0 ? "cuda" : "cpu";
#else
    name = "cpu";
#endif
  }
  if (name == "cpu") return make_cpu_backend(local_rank);
  if (name == "cuda") {
#ifdef ASYNCTP_WITH_CUDA
    return make_cuda_backend(local_rank, device_index);
#else
    ASYNCTP_FAIL("this build has no CUDA backend (configure with -DASYNCTP_WITH_CUDA=ON)");
#endif
  }
  ASYNCTP_FAIL("unknown backend '{}' (available: {}, or auto)", name,
               fmt::join(available_backends(), ", "));
}

std::vector<std::string> available_backends() {
#ifdef ASYNCTP_WITH_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

}  // namespace asynctp
