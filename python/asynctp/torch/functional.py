"""The fused ops as Python functions, for eager code: the same arguments and results as
torch.ops.asynctp.* (and so as torch.ops.symm_mem.*), without torch's dispatcher where nothing
needs it.

A torch.ops call reaches asynctp's Python kernel through the dispatcher, which converts every
argument and result between Python and C++ on the way in and out: on the GPU machines that is
about as much host time as the op's own enqueueing. An eager call that meets no mode, tensor
subclass, functorch transform or torch.compile trace needs none of that: these functions call the
kernel directly where the call records no autograd graph, and through a torch.autograd.Function
with the ops' own backward formulas where it does (the bf16/f16/f32 ops: asynctp.torch.autograd,
"the direct route"). Every other call goes through torch.ops, which handles it (fake tensors,
modes, tracing) as for any torch op.

While torch's profiler records (torch.profiler.profile, or emit_nvtx for Nsight Systems) every
call goes through torch.ops too, so that it shows under its op's name
("asynctp::fused_all_gather_matmul") like any torch op: the dispatcher records the event, the
direct route would record none. The check is one module attribute that torch sets for this
purpose (torch.autograd.profiler._is_profiler_enabled).

    import asynctp.torch as atp
    A, (out,) = atp.fused_all_gather_matmul(a_shard, [w], 0, group.group_name)
"""

from __future__ import annotations

import torch

from . import _ops
from . import autograd as _autograd  # (imports this module back: used at call time only)

__all__ = [
    "fused_all_gather_matmul",
    "fused_all_gather_matmul_swiglu",
    "fused_all_gather_scaled_matmul",
    "fused_matmul_reduce_scatter",
    "fused_matmuls_reduce_scatter",
    "fused_scaled_matmul_reduce_scatter",
]

_OPS = torch.ops.asynctp
_profiler = torch.autograd.profiler  # its _is_profiler_enabled is read on every call
_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_functorch = torch._C._are_functorch_transforms_active
_grad_enabled = torch._C.is_grad_enabled
_Tensor = torch.Tensor


# How a call goes (_route): through torch.ops, to the kernel, or to the kernel through the
# autograd Function of the direct route.
_DISPATCHER, _KERNEL, _DIRECT = 0, 1, 2


def _route(tensors) -> int:
    """How a call with these tensor arguments goes: _DISPATCHER where a mode, transform, trace or
    the profiler is active, or a tensor is not a plain one, is a negative view or is on the meta
    device (the fake kernel's); else _DIRECT where grad mode is on and a tensor requires grad,
    _KERNEL otherwise."""
    # (is_compiling first: under torch.compile it is a constant, and the rest is not traced.)
    if (_compiling() or _profiler._is_profiler_enabled or _dispatch_modes() or _function_modes()
            or _functorch()):
        return _DISPATCHER
    grad = _grad_enabled()
    route = _KERNEL
    for t in tensors:
        # A negative view (x.conj().imag) reads its storage negated: the kernel, which reads the
        # storage, would see the wrong sign; the dispatcher materializes it first.
        if type(t) is not _Tensor or t.is_neg() or t.is_meta:
            return _DISPATCHER
        if grad and t.requires_grad:
            route = _DIRECT
    return route


def _plain(tensors) -> bool:
    """Whether a call of an op without the direct route (float8) can go to the kernel."""
    return _route(tensors) == _KERNEL


def fused_all_gather_matmul(A, Bs, gather_dim, group_name, *, return_A=True):
    """torch.ops.asynctp.fused_all_gather_matmul: (A gathered on gather_dim if return_A else
    None, [A_gathered @ B for B in Bs])."""
    route = _route((A, *Bs))
    if route == _KERNEL:
        return _ops._all_gather_matmul(A, Bs, gather_dim, group_name, return_A=return_A)
    if route == _DIRECT:
        A_out, *outs = _autograd.direct("fused_all_gather_matmul", (None, len(Bs)),
                                        (gather_dim, group_name), {"return_A": return_A}, A, *Bs)
        return A_out, outs
    return _OPS.fused_all_gather_matmul(A, Bs, gather_dim, group_name, return_A=return_A)


def fused_all_gather_matmul_swiglu(A, B, gather_dim, group_name, *, return_A=False,
                                   return_pre=False):
    """torch.ops.asynctp.fused_all_gather_matmul_swiglu: (A gathered if return_A else None,
    P = A_gathered @ B if return_pre else None, silu(P[.., :N]) * P[.., N:])."""
    route = _route((A, B))
    if route == _KERNEL:
        return _ops._all_gather_matmul_swiglu(A, B, gather_dim, group_name, return_A=return_A,
                                              return_pre=return_pre)
    if route == _DIRECT:
        return _autograd.direct("fused_all_gather_matmul_swiglu", (None, None),
                                (gather_dim, group_name),
                                {"return_A": return_A, "return_pre": return_pre}, A, B)
    return _OPS.fused_all_gather_matmul_swiglu(A, B, gather_dim, group_name, return_A=return_A,
                                               return_pre=return_pre)


def fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name):
    """torch.ops.asynctp.fused_matmul_reduce_scatter: A @ B reduce-scattered on scatter_dim."""
    route = _route((A, B))
    if route == _KERNEL:
        return _ops._matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name)
    if route == _DIRECT:
        return _autograd.direct("fused_matmul_reduce_scatter", (None, None),
                                (reduce_op, scatter_dim, group_name), {}, A, B)
    return _OPS.fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name)


def fused_matmuls_reduce_scatter(As, Bs, reduce_op, scatter_dim, group_name):
    """torch.ops.asynctp.fused_matmuls_reduce_scatter: sum_i As[i] @ Bs[i], reduce-scattered."""
    route = _route((*As, *Bs))
    if route == _KERNEL:
        return _ops._matmuls_reduce_scatter(As, Bs, reduce_op, scatter_dim, group_name)
    if route == _DIRECT:
        return _autograd.direct("fused_matmuls_reduce_scatter", (len(As), len(Bs)),
                                (reduce_op, scatter_dim, group_name), {}, *As, *Bs)
    return _OPS.fused_matmuls_reduce_scatter(As, Bs, reduce_op, scatter_dim, group_name)


def fused_all_gather_scaled_matmul(A, Bs, A_scale, B_scales, gather_dim, group_name, biases,
                                   result_scales, out_dtypes, use_fast_accum):
    """torch.ops.asynctp.fused_all_gather_scaled_matmul (float8)."""
    args = (A, Bs, A_scale, B_scales, gather_dim, group_name, biases, result_scales, out_dtypes,
            use_fast_accum)
    if _plain((A, *Bs, A_scale, *B_scales)):
        return _ops._all_gather_scaled_matmul(*args)
    return _OPS.fused_all_gather_scaled_matmul(*args)


def fused_scaled_matmul_reduce_scatter(A, B, A_scale, B_scale, reduce_op, orig_scatter_dim,
                                       scatter_dim_after_maybe_reshape, group_name, output_shape,
                                       bias=None, result_scale=None, out_dtype=None,
                                       use_fast_accum=False):
    """torch.ops.asynctp.fused_scaled_matmul_reduce_scatter (float8)."""
    args = (A, B, A_scale, B_scale, reduce_op, orig_scatter_dim, scatter_dim_after_maybe_reshape,
            group_name, output_shape)
    kwargs = {"bias": bias, "result_scale": result_scale, "out_dtype": out_dtype,
              "use_fast_accum": use_fast_accum}
    if _plain((A, B, A_scale, B_scale)):
        return _ops._scaled_matmul_reduce_scatter(*args, **kwargs)
    return _OPS.fused_scaled_matmul_reduce_scatter(*args, **kwargs)
