"""The fused ops as Python functions, for eager code: the same arguments and results as
torch.ops.asynctp.* (and so as torch.ops.symm_mem.*), without torch's dispatcher where nothing
needs it.

A torch.ops call reaches asynctp's Python kernel through the dispatcher, which converts every
argument and result between Python and C++ on the way in and out: on the GPU machines that is
about as much host time as the op's own enqueueing. An eager call that records no autograd graph
and meets no mode, tensor subclass, functorch transform or torch.compile trace needs none of
that, so these functions call the kernel directly; every other call goes through torch.ops, which
handles it (autograd, fake tensors, tracing) as for any torch op.

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


def _plain(tensors) -> bool:
    """Whether a call with these tensor arguments can skip the dispatcher: plain tensors, none
    needing a gradient while grad mode is on or a negative view, no mode, transform, trace or
    profiler active."""
    # (is_compiling first: under torch.compile it is a constant, and the rest is not traced.)
    if (_compiling() or _profiler._is_profiler_enabled or _dispatch_modes() or _function_modes()
            or _functorch()):
        return False
    grad = _grad_enabled()
    for t in tensors:
        # A negative view (x.conj().imag) reads its storage negated: the kernel, which reads the
        # storage, would see the wrong sign; the dispatcher materializes it first.
        if type(t) is not _Tensor or (grad and t.requires_grad) or t.is_neg():
            return False
    return True


def fused_all_gather_matmul(A, Bs, gather_dim, group_name, *, return_A=True):
    """torch.ops.asynctp.fused_all_gather_matmul: (A gathered on gather_dim if return_A else
    None, [A_gathered @ B for B in Bs])."""
    if _plain((A, *Bs)):
        return _ops._all_gather_matmul(A, Bs, gather_dim, group_name, return_A=return_A)
    return _OPS.fused_all_gather_matmul(A, Bs, gather_dim, group_name, return_A=return_A)


def fused_all_gather_matmul_swiglu(A, B, gather_dim, group_name, *, return_A=False,
                                   return_pre=False):
    """torch.ops.asynctp.fused_all_gather_matmul_swiglu: (A gathered if return_A else None,
    P = A_gathered @ B if return_pre else None, silu(P[.., :N]) * P[.., N:])."""
    if _plain((A, B)):
        return _ops._all_gather_matmul_swiglu(A, B, gather_dim, group_name, return_A=return_A,
                                              return_pre=return_pre)
    return _OPS.fused_all_gather_matmul_swiglu(A, B, gather_dim, group_name, return_A=return_A,
                                               return_pre=return_pre)


def fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name):
    """torch.ops.asynctp.fused_matmul_reduce_scatter: A @ B reduce-scattered on scatter_dim."""
    if _plain((A, B)):
        return _ops._matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name)
    return _OPS.fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name)


def fused_matmuls_reduce_scatter(As, Bs, reduce_op, scatter_dim, group_name):
    """torch.ops.asynctp.fused_matmuls_reduce_scatter: sum_i As[i] @ Bs[i], reduce-scattered."""
    if _plain((*As, *Bs)):
        return _ops._matmuls_reduce_scatter(As, Bs, reduce_op, scatter_dim, group_name)
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
