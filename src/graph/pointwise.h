// What the elementwise kernels share: their operands (a tensor, or a number from the graph) and
// PyTorch's type promotion over them (torch.result_type), with the categories bool < integer <
// float:
//   - operands of one priority level promote among themselves (promote_types): equal dtypes stay;
//     f32 wins among floats, bf16 with f16 gives f32, float8 mixes with nothing; int64 with bool
//     gives int64; a float with an integer or bool gives the float;
//   - levels: tensors of rank >= 1, then 0-d tensors, then numbers (a float number counts as
//     f32, an int as int64, a bool as bool). A lower level changes the result only when it is of
//     a higher category: bf16 [4] * f32 0-d is bf16, int64 [4] * 0.5 is f32.
#pragma once

#include <span>
#include <vector>

#include "graph/kernel.h"

namespace asynctp::graph {

struct Operand {
  const HostTensor* tensor = nullptr;
  double scalar = 0;
  DType scalar_dtype = DType::kF32;  // a number's category: f32, int64 or bool
};

// Argument `index` / `key` as an operand: a tensor, or a number (int, float or bool).
Operand operand(const Call& call, size_t index, std::string_view key);

DType promote_types(DType a, DType b, const Call& call);
// torch.result_type over the operands (at least one).
DType result_type(std::span<const Operand> operands, const Call& call);
// The broadcast shape of the tensor operands (numbers broadcast to anything).
Dims broadcast_operands(std::span<const Operand> operands);
// The operand's values broadcast to `shape`, as f32.
std::vector<float> load_operand(const Operand& op, const Dims& shape);
// Every value as `dtype` holds it (rounded to bf16, f16, float8; truncated toward zero for
// integers; 0 or 1 for bool), in f32: what PyTorch compares after casting an operand to the
// common dtype.
void round_to(std::vector<float>& values, DType dtype);

}  // namespace asynctp::graph
