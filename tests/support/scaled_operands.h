// The float8 GEMM tests' cases and operands, shared by the CPU backend's tests and the CUDA
// backend's (which compare against the CPU backend on the same operands).
#pragma once

#include <ostream>

#include <fmt/format.h>

#include "device/backend.h"
#include "support/tensor_testing.h"

namespace asynctp::testing {

struct Float8Case {
  DType a_dtype, b_dtype, out;
  bool rowwise, colwise, batched;
};

inline void PrintTo(const Float8Case& c, std::ostream* os) {
  *os << fmt::format("{} x {} -> {}, a_scale {}, b_scale {}{}", c.a_dtype, c.b_dtype, c.out,
                     c.rowwise ? "row-wise" : "tensor-wise",
                     c.colwise ? "column-wise" : "tensor-wise", c.batched ? ", batched" : "");
}

// A case's host operands: a [batch, m, k] or [m, k] and b [k, n] column-major (as cuBLASLt wants)
// of `values`, the scales (row-/column-wise or one element) positive.
struct ScaledOperands {
  OwnedTensor a, b, sa, sb;
  Dims d_shape;

  ScaledOperands(const Float8Case& c, int64_t batch, int64_t m, int64_t k, int64_t n, Values values,
                 uint64_t seed) {
    const Dims a_shape = c.batched ? Dims{batch, m, k} : Dims{m, k};
    d_shape = c.batched ? Dims{batch, m, n} : Dims{m, n};
    a = empty_host(a_shape, c.a_dtype);
    b = empty_transposed({k, n}, c.b_dtype);
    fill_seeded(a, seed_of({seed}), values);
    fill_seeded(b, seed_of({seed + 1}), values);
    Dims sa_shape = a_shape;
    sa_shape[sa_shape.size() - 1] = 1;
    sa = empty_host(c.rowwise ? sa_shape : Dims{1}, DType::kF32);
    sb = empty_host(c.colwise ? Dims{1, n} : Dims{}, DType::kF32);
    fill_seeded(sa, seed_of({seed + 2}), Values::kPositive);
    fill_seeded(sb, seed_of({seed + 3}), Values::kPositive);
  }
  GemmArgs args(const Tensor& d) const {
    GemmArgs args{a, b, d};
    args.a_scale = sa;
    args.b_scale = sb;
    return args;
  }
};

}  // namespace asynctp::testing
