#include "ops/operand_overlap.h"

#include <string>

#include "core/error.h"

namespace asynctp::detail {

namespace {

std::string operand_name(const Operands& o, size_t i) {
  return o.list ? fmt::format("{}[{}]", o.name, i) : std::string(o.name);
}

[[noreturn]] void fail_overlap(const char* op, const Operands& w, size_t wi, const Operands& o,
                               size_t oi) {
  const Tensor& a = w.tensors[wi];
  const Tensor& b = o.tensors[oi];
  const ByteSpan sa = byte_span(a), sb = byte_span(b);
  ASYNCTP_FAIL(
      "{}: {} ({}, bytes [{:#x}, {:#x})) overlaps {} ({}, bytes [{:#x}, {:#x})): an output may "
      "share no memory with an input or another output (the op reads and writes them on several "
      "streams at once)",
      op, operand_name(w, wi), a.describe(), sa.begin, sa.end, operand_name(o, oi), b.describe(),
      sb.begin, sb.end);
}

}  // namespace

ByteSpan byte_span(const Tensor& t) {
  if (!t.defined()) return {};
  const auto begin = reinterpret_cast<uintptr_t>(t.data());
  return {begin, begin + t.extent_bytes()};
}

void check_no_overlap(const char* op, std::initializer_list<Operands> reads,
                      std::initializer_list<Operands> writes) {
  for (auto w = writes.begin(); w != writes.end(); ++w) {
    for (size_t wi = 0; wi < w->tensors.size(); ++wi) {
      const ByteSpan ws = byte_span(w->tensors[wi]);
      if (ws.empty()) continue;
      for (const Operands& r : reads) {
        for (size_t ri = 0; ri < r.tensors.size(); ++ri) {
          if (ws.overlaps(byte_span(r.tensors[ri]))) fail_overlap(op, *w, wi, r, ri);
        }
      }
      // The outputs after this one (each pair once).
      for (auto o = w; o != writes.end(); ++o) {
        for (size_t oi = (o == w ? wi + 1 : 0); oi < o->tensors.size(); ++oi) {
          if (ws.overlaps(byte_span(o->tensors[oi]))) fail_overlap(op, *w, wi, *o, oi);
        }
      }
    }
  }
}

}  // namespace asynctp::detail
