// swiglu_backward: the SwiGLU's gradients in one elementwise pass on the context's device and
// stream (Backend::swiglu_backward), for the backward of all_gather_matmul_swiglu. Nothing is
// exchanged between ranks.
#include "device/nvtx.h"
#include "ops/fused_matmul.h"
#include "ops/operand_overlap.h"

namespace asynctp {

void swiglu_backward(OpContext& ctx, const Tensor& grad_out, const Tensor& gate_up,
                     const Tensor& grad_gate_up, std::optional<void*> stream) {
  const nvtx::Range range(nvtx::kCollectiveColor, [&] {
    return fmt::format("swiglu_backward {} {}", grad_out.describe(), gate_up.describe());
  });
  const OpContext::StreamScope scope(ctx, stream);
  const Device device = ctx.backend().device();
  for (const auto& [t, name] : {std::pair{&grad_out, "grad_out"}, std::pair{&gate_up, "gate_up"},
                                std::pair{&grad_gate_up, "grad_gate_up"}}) {
    ASYNCTP_CHECK(t->defined(), "swiglu_backward: {} is undefined", name);
    ASYNCTP_CHECK(t->device() == device, "swiglu_backward: {} is on {} but the context runs on {}",
                  name, t->device().to_string(), device.to_string());
  }
  // Each thread reads its elements before writing their gradients, but the threads of one launch
  // run in no order: a grad_gate_up partly over an input gives wrong numbers, not an error. Exact
  // in-place is refused as well, as by every op (operand_overlap.h).
  detail::check_no_overlap("swiglu_backward", {{"grad_out", grad_out}, {"gate_up", gate_up}},
                           {{"grad_gate_up", grad_gate_up}});
  ctx.backend().swiglu_backward(grad_gate_up, grad_out, gate_up, ctx.stream());
}

}  // namespace asynctp
