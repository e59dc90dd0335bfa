#include "device/gemm_plan_key.h"

#include "core/error.h"

namespace asynctp {

size_t GemmPlanKeyHash::operator()(const GemmPlanKey& key) const {
  size_t h = 1469598103934665603ull;  // FNV-1a over the fields
  for (int64_t x : key.fields)
    h = (h ^ static_cast<size_t>(x)) * 1099511628211ull;
  return h;
}

int pointer_alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  for (int a : {256, 128, 64, 32, 16, 8, 4, 2}) {
    if (v % a == 0) return a;
  }
  return 1;
}

GemmPlanKey gemm_plan_key(const Tensor& a, const Tensor& b, const Tensor& d, bool accumulate,
                          int scale_mode, bool fast_accum) {
  GemmPlanKey key;
  size_t i = 0;
  for (const Tensor* t : {&a, &b, &d}) {
    ASYNCTP_CHECK(t->dim() == 3, "gemm_plan_key: operands are [batch, rows, cols], got {}",
                  t->describe());
    key.fields[i++] = static_cast<int64_t>(t->dtype());
    for (int dim = 0; dim < 3; ++dim)
      key.fields[i++] = t->size(dim);
    for (int dim = 0; dim < 3; ++dim)
      key.fields[i++] = t->stride(dim);
    key.fields[i++] = pointer_alignment(t->data());
  }
  key.fields[i++] = accumulate;
  key.fields[i++] = scale_mode;
  key.fields[i++] = fast_accum;
  return key;
}

}  // namespace asynctp
