#include "device/native_params.h"

#include <algorithm>
#include <chrono>

#include "kernels/native/schedule.h"

namespace asynctp {

std::string to_native_params(const ChunkedGemmArgs& args, kernels::NativeGemmParams* k) {
  const Tensor& a = args.a;
  const Tensor& b = args.b;
  const Tensor& d = args.d;
  if (a.dim() != 2 || b.dim() != 2 || d.dim() != 2) return "a, b and d must be 2-D";
  // With the SwiGLU epilogue b holds the gate's and the up projection's columns: 2N for d's N.
  const int64_t b_cols = args.swiglu ? 2 * d.size(1) : d.size(1);
  if (a.size(1) != b.size(0) || d.size(0) != a.size(0) || b.size(1) != b_cols) {
    return fmt::format("shapes do not chain: a {}, b {}, d {}{}", a.describe(), b.describe(),
                       d.describe(), args.swiglu ? " (SwiGLU: b has 2N columns)" : "");
  }
  if (args.pre_out.defined() && !args.swiglu) return "pre_out needs the SwiGLU epilogue";
  if (a.dtype() != b.dtype()) return fmt::format("a is {} but b is {}", a.dtype(), b.dtype());
  if (a.stride(1) != 1 && a.size(1) != 1)
    return fmt::format("a {} has no unit column stride", a.describe());
  if (d.stride(1) != 1 && d.size(1) != 1)
    return fmt::format("d {} has no unit column stride", d.describe());
  *k = {};
  static_cast<kernels::NativeGemmSchedule&>(*k) = args;
  k->a = a.data();
  k->lda = a.stride(0);
  k->b = b.data();
  if (b.stride(1) == 1 || b.size(1) == 1) {
    k->b_k_major = false;
    k->ldb = b.stride(0);
  } else if (b.stride(0) == 1 || b.size(0) == 1) {
    k->b_k_major = true;
    k->ldb = b.stride(1);
  } else {
    return fmt::format("b {} is neither row- nor column-major", b.describe());
  }
  k->c = d.data();
  k->ldc = d.stride(0);
  k->in_dtype = a.dtype();
  k->c_dtype = d.dtype();
  k->m = a.size(0);
  k->n = d.size(1);
  k->k = a.size(1);
  k->timeout_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(args.timeout).count());
  if (args.own_a.defined()) {
    const Tensor& o = args.own_a;
    if (o.dim() != 2 || o.size(1) != a.size(1) || o.dtype() != a.dtype() ||
        (o.stride(1) != 1 && o.size(1) != 1)) {
      return fmt::format("own_a {} is not a [rows, {}] {} matrix with unit column stride",
                         o.describe(), a.size(1), a.dtype());
    }
    // The GEMM reads every row of the own chunk from it (and its scale from own_a_scale).
    const int64_t rows = kernels::chunk_rows_of(*k);
    const int64_t own_rows =
        std::min(rows, std::max<int64_t>(0, a.size(0) - int64_t{args.own_chunk} * rows));
    if (args.own_chunk >= 0 && o.size(0) < own_rows) {
      return fmt::format("own_a {} holds fewer rows than own chunk {} ({} rows)", o.describe(),
                         args.own_chunk, own_rows);
    }
    k->own_a = o.data();
    k->own_lda = o.stride(0);
  } else {
    k->own_chunk = -1;
  }
  if (args.a_out.defined()) {
    const Tensor& o = args.a_out;
    if (o.dim() != 2 || o.size(0) != a.size(0) || o.size(1) != a.size(1) ||
        o.dtype() != a.dtype() || (o.stride(1) != 1 && o.size(1) != 1)) {
      return fmt::format("a_out {} is not a [{}, {}] {} matrix with unit column stride",
                         o.describe(), a.size(0), a.size(1), a.dtype());
    }
    k->a_out = o.data();
    k->a_out_ld = o.stride(0);
  }
  if (args.pre_out.defined()) {
    const Tensor& pre = args.pre_out;
    if (pre.dim() != 2 || pre.size(0) != d.size(0) || pre.size(1) != b_cols ||
        (pre.stride(1) != 1 && pre.size(1) != 1)) {
      return fmt::format("pre_out {} is not a [{}, {}] matrix with unit column stride",
                         pre.describe(), d.size(0), b_cols);
    }
    k->pre = pre.data();
    k->pre_ld = pre.stride(0);
    k->pre_dtype = pre.dtype();
  }
  // The float8 scales: one f32 value (stride 0) or one per row / column (stride 1, contiguous).
  auto scale_of = [](const Tensor& t, int64_t count, const char* name, const float** ptr,
                     int64_t* stride) -> std::string {
    if (!t.defined()) return "";
    if (t.dtype() != DType::kF32 || (t.numel() != 1 && (t.numel() != count || !t.is_contiguous())))
      return fmt::format("{} {} is not one f32 value or {} contiguous f32 values", name,
                         t.describe(), count);
    *ptr = static_cast<const float*>(t.data());
    *stride = t.numel() == 1 ? 0 : 1;
    return "";
  };
  std::string why = scale_of(args.a_scale, a.size(0), "a_scale", &k->a_scale, &k->a_scale_stride);
  if (why.empty())
    why = scale_of(args.b_scale, d.size(1), "b_scale", &k->b_scale, &k->b_scale_stride);
  if (why.empty() && args.own_a_scale.defined()) {
    if (!args.own_a.defined() || !args.a_scale.defined())
      return "own_a_scale needs own_a and a_scale";
    int64_t own_stride = 0;
    const int64_t own_rows = args.own_a.size(0);
    why = scale_of(args.own_a_scale, own_rows, "own_a_scale", &k->own_a_scale, &own_stride);
    if (why.empty() && own_stride != k->a_scale_stride && own_rows != 1)
      why = fmt::format("own_a_scale {} and a_scale {} are not both tensor-wise or both row-wise",
                        args.own_a_scale.describe(), args.a_scale.describe());
  }
  if (!why.empty()) return why;
  if (args.sum_chunk >= 0) {
    const Tensor& parts = args.sum_parts;
    const Tensor& out = args.sum_out;
    const int64_t rows = kernels::chunk_rows_of(*k);
    if (out.dim() != 2 || out.size(0) != rows || out.size(1) != d.size(1) ||
        out.dtype() != d.dtype() || (out.stride(1) != 1 && out.size(1) != 1)) {
      return fmt::format("sum_out {} is not a [{}, {}] {} matrix with unit column stride",
                         out.describe(), rows, d.size(1), d.dtype());
    }
    if (parts.defined() &&
        (parts.dim() != 3 || parts.size(1) != rows || parts.size(2) != d.size(1) ||
         parts.dtype() != d.dtype() || (parts.stride(2) != 1 && parts.size(2) != 1))) {
      return fmt::format("sum_parts {} is not [parts, {}, {}] {} with unit column stride",
                         parts.describe(), rows, d.size(1), d.dtype());
    }
    k->sum_out = out.data();
    k->sum_ldo = out.stride(0);
    k->sum_count = parts.defined() ? static_cast<int>(parts.size(0)) : 1;
    if (parts.defined()) {
      k->sum_parts = parts.data();
      k->sum_part_stride = parts.stride(0);
      k->sum_ld = parts.stride(1);
    }
  }
  return "";
}

}  // namespace asynctp
