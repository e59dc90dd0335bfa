// The ops' check that what they write shares no memory with what they read or with another of
// their outputs. The overlapped paths read the inputs and write the outputs on several streams at
// once (pushes on the copy streams while the GEMMs run on the compute stream), so an output over
// an input, or two outputs over each other, gives wrong numbers rather than a clean failure.
// Exact in-place (an output at the same bytes as an input) is refused as well: no fused op's
// output has its input's shape, and the collectives' in-place form is all_reduce's one tensor.
//
// The check reads data pointers, which the call memos (ops/call_memo.h) leave out of their keys,
// so it runs on every call, memo hit or miss: a few comparisons, no allocation.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>

#include <asynctp/tensor.h>

namespace asynctp::detail {

// The bytes a tensor's elements occupy: [begin, end), from its data pointer to one past its
// furthest element (shape and strides; a stride of 0, a broadcast input, adds nothing). Empty for
// an undefined or zero-size tensor, which overlaps nothing.
struct ByteSpan {
  uintptr_t begin = 0;
  uintptr_t end = 0;

  bool empty() const { return begin == end; }
  bool overlaps(const ByteSpan& other) const {
    return !empty() && !other.empty() && begin < other.end && other.begin < end;
  }
};
ByteSpan byte_span(const Tensor& t);

// Operands of one role in a call: a single tensor named `name` ("A_shard"), or a list whose
// elements are named name[i] ("Bs[1]"). Undefined tensors are skipped.
struct Operands {
  Operands(const char* name, const Tensor& t) : name(name), tensors(&t, 1) {}
  Operands(const char* name, std::span<const Tensor> ts) : name(name), tensors(ts), list(true) {}

  const char* name;
  std::span<const Tensor> tensors;
  bool list = false;
};

// Throws (an argument error naming `op`, both operands, their descriptions and byte spans) when a
// tensor of `writes` overlaps a tensor of `reads` or another tensor of `writes`. Inputs may
// overlap each other.
void check_no_overlap(const char* op, std::initializer_list<Operands> reads,
                      std::initializer_list<Operands> writes);

}  // namespace asynctp::detail
