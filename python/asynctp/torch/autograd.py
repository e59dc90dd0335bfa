"""Backward formulas of the bf16/f16/f32 fused ops (torch.library.register_autograd's kernel).

Shapes (ws = the group's size, g = gather/scatter dim, d = any other leading dims):

fused_all_gather_matmul(A_shard, Bs, g, group, return_A):
    A_shard [.., s@g, .., K] -AG(g)-> A [.., ws*s@g, .., K];  outs[i] = A @ Bs[i]  ([K, N_i])
    (g = last: A_shard [.., k] -AG(last)-> A [.., ws*k = K], the gather is on the contraction)
  backward, with dA = the gradient reaching the returned A (return_A) and dO_i the outs':
    dA_shard = RS_sum(g)(dA + sum_i dO_i @ Bs[i]^T)     one fused matmuls-reduce-scatter, plus
                                                       an f32 reduce-scatter of dA when it is not
                                                       None, added in f32 and rounded once
    dBs[i]   = A_flat^T @ dO_i_flat                    ([K, N_i], A's leading dims flattened)
  The all-gather's adjoint is a sum reduce-scatter: every rank's outputs depend on every shard.

fused_all_gather_matmul_swiglu(A_shard, B, g, group, return_A, return_pre):
    A = AG(g)(A_shard);  P = [G | U] = A @ B  (B [K, 2N]);  out = silu(G) * U
  backward, with dO the gradient of out (and dA, dP those reaching the returned A and P):
    dG = dO * U * silu'(G),  silu'(x) = s (1 + x (1 - s)),  s = sigmoid(x)
    dU = dO * silu(G)
    in f32, one elementwise pass over P and dO into P's dtype (torch.ops.asynctp.swiglu_backward;
    torch ops where the backward records a graph of its own, create_graph=True)
    then fused_all_gather_matmul's backward with the one product P and its gradient
    [dG | dU] (+ dP)
  P is the forward's returned products when return_pre, else it is computed again in backward
  (one fused all-gather matmul, which also gathers A): the caller who does not keep P trades a
  GEMM for [T, 2N] of memory held from forward to backward.

fused_matmul_reduce_scatter(A, B, op, g, group):
    A [.., M@g, .., K] @ B [K, N] -RS_op(g)-> out [.., M/ws@g, .., N]
    (g = last: out [.., N/ws], the scatter is on the output dim)
  backward, with dO the gradient of out and c = 1 (sum) or 1/ws (avg):
    G        = AG(g)(c * dO)                            [.., M@g, .., N]
    dA       = G @ B^T                                  one fused all-gather matmul, returning G
    dB       = A_flat^T @ G_flat                        [K, N]
  The reduce-scatter's adjoint is the all-gather (scaled by 1/ws for avg).

The weight gradients need the gathered input A. When the forward returned it (return_A=True) it
is kept: it exists as an output anyway, so keeping a reference costs no memory. When it did not
(return_A=False), A_shard is kept and gathered again in backward with torch's all-gather: the
caller chose not to hold A, and keeping it for backward would hold ws times the shard's memory
from forward to backward, which is what sequence parallelism exists to avoid (Megatron-LM makes
the same choice).

Reductions run through asynctp's ops where the product is fused, through torch's functional
collectives (one NCCL or gloo, the one torch loaded) where a lone gather or reduce-scatter of an
existing tensor is needed. The formulas call asynctp's ops through asynctp.torch.functional
(torch.ops.asynctp.* wherever a trace or a mode needs the dispatcher, the kernel itself or the
direct route below otherwise), torch.ops._c10d_functional.* and matmul, never a process-group
object's methods.

Two routes lead to these formulas. torch.ops.asynctp.* (and so torch.compile, fake tensors, modes,
subclasses) take register_autograd's kernel. An eager call of asynctp.torch.functional that
records a graph and meets nothing else that needs the dispatcher (the modules' calls in a
training step) takes a torch.autograd.Function over the same kernel, setup_context and backward
instead (direct): the same graph without the dispatcher's trips between C++ and Python, which
cost more host time than the op's own enqueueing (a forward and backward of one AG+MM and one
MM+RS on tiny CPU tensors, the CPU backend's work included: 443 µs through torch.ops, 327 µs
direct).
"""

from __future__ import annotations

import torch
from torch.distributed import distributed_c10d as c10d

from . import functional as _functional

__all__: list[str] = []

_ATEN_FUNCOL = torch.ops._c10d_functional


def _group_size(group_name: str) -> int:
    return c10d._get_group_size_by_name(group_name)


def _all_gather(x: torch.Tensor, dim: int, group_name: str) -> torch.Tensor:
    """[.., s@dim, ..] -> [.., ws*s@dim, ..], rank-major along dim; differentiable where a graph
    is recorded (a backward run with create_graph=True: see _Recorded)."""
    ws = _group_size(group_name)
    if ws == 1:
        return x
    if x.requires_grad and torch.is_grad_enabled():
        return _Recorded.apply(x, _all_gather, _reduce_scatter_sum, dim, group_name)
    x0 = x.movedim(dim, 0).contiguous()
    out = _ATEN_FUNCOL.wait_tensor(_ATEN_FUNCOL.all_gather_into_tensor(x0, ws, group_name))
    return out.movedim(0, dim)


def _reduce_scatter_sum(x: torch.Tensor, dim: int, group_name: str) -> torch.Tensor:
    """[.., ws*s@dim, ..] -> [.., s@dim, ..], summed over the group; differentiable where a
    graph is recorded (see _Recorded)."""
    ws = _group_size(group_name)
    if ws == 1:
        return x
    if x.requires_grad and torch.is_grad_enabled():
        return _Recorded.apply(x, _reduce_scatter_sum, _all_gather, dim, group_name)
    x0 = x.movedim(dim, 0).contiguous()
    out = _ATEN_FUNCOL.reduce_scatter_tensor(x0, "sum", ws, group_name)
    return _ATEN_FUNCOL.wait_tensor(out).movedim(0, dim)


def all_reduce_sum(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """x summed over the group; differentiable where a graph is recorded (see _Recorded)."""
    if _group_size(group_name) == 1:
        return x
    if x.requires_grad and torch.is_grad_enabled():
        return _Recorded.apply(x, all_reduce_sum, all_reduce_sum, group_name)
    return _ATEN_FUNCOL.wait_tensor(_ATEN_FUNCOL.all_reduce(x, "sum", group_name))


# The backward formulas call the collectives above on gradients. Under create_graph=True (a
# double backward) those gradients require grad, and torch's functional collectives cannot be
# recorded in eager mode (wait_tensor on their output raises, or not, depending on whether the
# collective has completed). _Recorded records them instead, each with its adjoint:
# AG(dim) <-> RS_sum(dim), all-reduce sum <-> itself. Its forward runs with grad mode off, so
# the collective takes the plain path.


class _Recorded(torch.autograd.Function):
    """collective(x, *args) forward, adjoint(grad, *args) backward."""

    @staticmethod
    def forward(ctx, x, collective, adjoint, *args):
        ctx.adjoint, ctx.args = adjoint, args
        return collective(x, *args)

    @staticmethod
    def backward(ctx, grad):
        return (ctx.adjoint(grad, *ctx.args), None, None) + (None,) * len(ctx.args)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """[d.., X] -> [prod(d), X]."""
    return t.reshape(-1, t.shape[-1])


def _weight_grad(A: torch.Tensor, G: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """dB = A_flat^T @ G_flat ([K, N]), in B's dtype and laid out as B is.

    A linear layer's B is its weight transposed (weight.t(), [K, N] with strides (1, K)): its
    gradient is then computed as (G_flat^T @ A_flat).t(), whose transpose (the weight's gradient)
    is contiguous, so autograd accumulates it without a transposing copy of the whole weight.
    """
    if B.dim() == 2 and B.stride(0) == 1 and B.stride(1) == B.shape[0] and B.shape[1] > 1:
        return (_flat(G).t() @ _flat(A)).to(B.dtype).t()
    return (_flat(A).t() @ _flat(G)).to(B.dtype)


# ---- fused_all_gather_matmul --------------------------------------------------------------


def _ag_mm_setup_context(ctx, inputs, keyword_only_inputs, output):
    A_shard, Bs, gather_dim, group_name = inputs
    return_A = keyword_only_inputs["return_A"]
    A_out, _ = output
    ctx.gather_dim = gather_dim % A_shard.dim()
    ctx.group_name = group_name
    ctx.kept_A = return_A
    # Outputs without a gradient arrive as None, not zeros: no reduce-scatter of zeros.
    ctx.set_materialize_grads(False)
    # Saved: A (the gathered input) when returned, else A_shard; then every B.
    ctx.save_for_backward(A_out if return_A else A_shard, *Bs)


def _ag_mm_backward(ctx, grad_A, grad_outs):
    saved = ctx.saved_tensors
    grad_A_shard, grad_Bs = _ag_mm_grads(saved[0], ctx.kept_A, saved[1:], ctx.gather_dim,
                                         ctx.group_name, ctx.needs_input_grad[0],
                                         ctx.needs_input_grad[1], grad_A, grad_outs)
    return grad_A_shard, grad_Bs, None, None


def _ag_mm_grads(A_or_shard, kept_A, Bs, dim, group_name, needs_A, needs_Bs, grad_A, grad_outs):
    """The gradients of A_shard and of every B (see the module's formulas), from the gathered A
    (kept_A) or A_shard, and the gradients reaching the returned A and the outputs."""
    grad_A_shard = None
    if needs_A:
        pairs = [(g.contiguous(), B.t()) for g, B in zip(grad_outs, Bs) if g is not None]
        if pairs:
            grad_A_shard = _functional.fused_matmuls_reduce_scatter(
                [g for g, _ in pairs], [Bt for _, Bt in pairs], "sum", dim, group_name
            )
        if grad_A is not None:
            # Summed in f32 and rounded once, as the fused op sums its partials.
            extra = _reduce_scatter_sum(grad_A.float(), dim, group_name)
            if grad_A_shard is not None:
                extra = extra + grad_A_shard.float()
            grad_A_shard = extra.to(grad_A.dtype)

    grad_Bs = [None] * len(Bs)
    if any(needs_Bs) and any(g is not None for g in grad_outs):
        # A's rows are in the same order as every output's.
        A = A_or_shard if kept_A else _all_gather(A_or_shard, dim, group_name)
        for i, g in enumerate(grad_outs):
            if g is not None and needs_Bs[i]:
                grad_Bs[i] = _weight_grad(A, g, Bs[i])
    return grad_A_shard, grad_Bs


# ---- fused_all_gather_matmul_swiglu -------------------------------------------------------


def _ag_swiglu_setup_context(ctx, inputs, keyword_only_inputs, output):
    A_shard, B, gather_dim, group_name = inputs
    A_out, pre, _ = output
    ctx.gather_dim = gather_dim % A_shard.dim()
    ctx.group_name = group_name
    ctx.kept_A = keyword_only_inputs["return_A"]
    ctx.kept_pre = keyword_only_inputs["return_pre"]
    ctx.set_materialize_grads(False)
    # Saved: A (returned) or A_shard, B, and the products when returned (else recomputed).
    ctx.save_for_backward(A_out if ctx.kept_A else A_shard, B,
                          pre if ctx.kept_pre else None)


def _swiglu_backward_recorded(grad_out: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """swiglu_backward's formula in torch ops, for a backward that records its own graph
    (create_graph=True): asynctp's one-pass kernel has no derivative of its own."""
    n = grad_out.shape[-1]
    gate, up = pre[..., :n].float(), pre[..., n:].float()
    d = grad_out.float()
    s = torch.sigmoid(gate)
    return torch.cat([d * up * (s * (1 + gate * (1 - s))), d * (gate * s)], dim=-1).to(pre.dtype)


def _ag_swiglu_backward(ctx, grad_A, grad_pre, grad_out):
    A_or_shard, B, pre = ctx.saved_tensors
    dim, group_name = ctx.gather_dim, ctx.group_name
    kept_A = ctx.kept_A
    if grad_out is not None and pre is None:
        # The products again: from the gathered A where it was kept, else by one fused
        # all-gather matmul, which also returns the gathered A (for dB).
        if kept_A:
            pre = A_or_shard @ B
        else:
            A_or_shard, (pre,) = _functional.fused_all_gather_matmul(
                A_or_shard, [B], dim, group_name, return_A=True)
            kept_A = True
    grad_P = None
    if grad_out is not None:
        if torch.is_grad_enabled() and (grad_out.requires_grad or pre.requires_grad):
            grad_P = _swiglu_backward_recorded(grad_out, pre)
        else:  # [dG | dU] in one pass over P and dOut
            grad_P = torch.ops.asynctp.swiglu_backward(grad_out, pre, group_name)
    if grad_pre is not None:
        grad_P = grad_pre if grad_P is None else (grad_P.float() + grad_pre.float()).to(pre.dtype)
    grad_A_shard, (grad_B,) = _ag_mm_grads(A_or_shard, kept_A, [B], dim, group_name,
                                           ctx.needs_input_grad[0], [ctx.needs_input_grad[1]],
                                           grad_A, [grad_P])
    return grad_A_shard, grad_B, None, None


# ---- fused_matmul_reduce_scatter ----------------------------------------------------------


def _mm_rs_setup_context(ctx, inputs, output):
    A, B, reduce_op, scatter_dim, group_name = inputs
    ctx.scatter_dim = scatter_dim % A.dim()
    ctx.reduce_op = reduce_op
    ctx.group_name = group_name
    ctx.save_for_backward(A, B)


def _mm_rs_backward(ctx, grad_out):
    A, B = ctx.saved_tensors
    dim, group_name = ctx.scatter_dim, ctx.group_name
    needs_A, needs_B = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    g = grad_out.contiguous()
    if ctx.reduce_op == "avg":
        g = g / _group_size(group_name)
    grad_A = grad_B = None
    if needs_A:
        G, (grad_A,) = _functional.fused_all_gather_matmul(
            g, [B.t()], dim, group_name, return_A=needs_B
        )
    else:
        G = _all_gather(g, dim, group_name)
    if needs_B:
        grad_B = _weight_grad(A, G, B)
    return grad_A, grad_B, None, None, None


# ---- fused_matmuls_reduce_scatter (the sum of products) -----------------------------------


def _mms_rs_setup_context(ctx, inputs, output):
    As, Bs, reduce_op, scatter_dim, group_name = inputs
    ctx.scatter_dim = scatter_dim % As[0].dim()
    ctx.reduce_op = reduce_op
    ctx.group_name = group_name
    ctx.num = len(As)
    ctx.save_for_backward(*As, *Bs)


def _mms_rs_backward(ctx, grad_out):
    saved = ctx.saved_tensors
    As, Bs = saved[: ctx.num], saved[ctx.num :]
    dim, group_name = ctx.scatter_dim, ctx.group_name
    needs_As, needs_Bs = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    g = grad_out.contiguous()
    if ctx.reduce_op == "avg":
        g = g / _group_size(group_name)
    grad_As = [None] * ctx.num
    grad_Bs = [None] * ctx.num
    # One gather of the gradient serves every product: dA_i = G @ B_i^T, dB_i = A_i^T @ G.
    want_A = [i for i in range(ctx.num) if needs_As[i]]
    if want_A:
        G, outs = _functional.fused_all_gather_matmul(
            g, [Bs[i].t() for i in want_A], dim, group_name, return_A=any(needs_Bs)
        )
        for i, o in zip(want_A, outs):
            grad_As[i] = o
    elif any(needs_Bs):
        G = _all_gather(g, dim, group_name)
    for i in range(ctx.num):
        if needs_Bs[i]:
            grad_Bs[i] = _weight_grad(As[i], G, Bs[i])
    return grad_As, grad_Bs, None, None, None


# The dispatch keys whose kernel is asynctp's own (_ops._KERNELS): where the highest key left
# below autograd is one of these, nothing (no mode, subclass or functionalization) sits between
# autograd and the kernel.
_PLAIN_KEYS = (torch._C.DispatchKey.CPU, torch._C.DispatchKey.CUDA)


def _register_one(name: str, backward, setup_context) -> None:
    """register_autograd's kernel, plus a shortcut for calls that record nothing.

    torch.library.register_autograd's Autograd kernel sends a call that needs no graph (grad
    mode off, or no input requiring grad) back through the dispatcher below autograd, a second
    trip of a few microseconds on every eager call. Here such a call goes straight to asynctp's
    kernel when the next key down is CPU or CUDA: the kernel the dispatcher would pick. Every
    other call (one that records a graph, or a fake tensor, a mode, a subclass below autograd)
    takes register_autograd's own kernel unchanged.
    """
    from . import _ops

    qualname = f"asynctp::{name}"
    try:
        from torch._library.autograd import Info, make_autograd_impl

        op = getattr(torch.ops.asynctp, name).default
        generated = make_autograd_impl(op, Info(backward, setup_context))
    except (ImportError, AttributeError, TypeError):  # a torch without these internals
        torch.library.register_autograd(qualname, backward, setup_context=setup_context)
        return
    direct = _ops._KERNELS[name][0]
    after_autograd = torch._C._after_autograd_keyset
    grad_enabled, any_requires_grad = torch._C.is_grad_enabled, torch._C._any_requires_grad

    def kernel(keyset, *args, **kwargs):
        if not (grad_enabled() and any_requires_grad(*args)) and (
            (keyset & after_autograd).highestPriorityTypeId() in _PLAIN_KEYS
        ):
            return direct(*args, **kwargs)
        return generated(keyset, *args, **kwargs)

    _ops.lib.impl(name, kernel, "Autograd", with_keyset=True)


# ---- the direct route (see the module's docstring) -----------------------------------------


def _unflatten(flat, sizes) -> list:
    """Flat values -> the op's structure: one value where sizes[i] is None, else a list of
    sizes[i] values (a Tensor[] argument or result)."""
    out, i = [], 0
    for n in sizes:
        if n is None:
            out.append(flat[i])
            i += 1
        else:
            out.append(list(flat[i:i + n]))
            i += n
    return out


class _BackwardView:
    """The Function's ctx as register_autograd's backward sees it: needs_input_grad in the op's
    argument structure (a list of bools for a Tensor[] argument, False for the others); every
    other attribute is the ctx's."""

    __slots__ = ("_ctx", "needs_input_grad")

    def __init__(self, ctx, needs_input_grad):
        self._ctx = ctx
        self.needs_input_grad = needs_input_grad

    def __getattr__(self, name):
        return getattr(self._ctx, name)


class _Direct(torch.autograd.Function):
    """One op's call as autograd records it: forward, the op's kernel then its setup_context
    (on this ctx); backward, its backward formula. Arguments: the op's name, the sizes of its
    leading tensor arguments (None: a tensor, n: a Tensor[] of n), its other positional
    arguments and its keyword arguments, then those tensors flattened; the result is the op's,
    its Tensor[] flattened (functional.py puts it back together)."""

    @staticmethod
    def forward(ctx, name, sizes, rest, kwargs, *flat):
        kernel, setup, setup_takes_kwargs, _ = _DIRECT[name]
        args = (*_unflatten(flat, sizes), *rest)
        out = kernel(*args, **kwargs)
        if setup_takes_kwargs:
            setup(ctx, args, kwargs, out)
        else:
            setup(ctx, args, out)
        ctx.op_name, ctx.sizes, ctx.n_rest = name, sizes, len(rest)
        if isinstance(out, torch.Tensor):
            ctx.out_sizes = None
            return out
        ctx.out_sizes = tuple(len(o) if isinstance(o, list) else None for o in out)
        flat_out = []
        for o in out:
            if isinstance(o, list):
                flat_out.extend(o)
            else:
                flat_out.append(o)
        return tuple(flat_out)

    @staticmethod
    def backward(ctx, *grads):
        backward = _DIRECT[ctx.op_name][3]
        structured = grads if ctx.out_sizes is None else _unflatten(grads, ctx.out_sizes)
        needs = _unflatten(ctx.needs_input_grad[4:], ctx.sizes) + [False] * ctx.n_rest
        result = backward(_BackwardView(ctx, tuple(needs)), *structured)
        flat = []
        for g, n in zip(result, ctx.sizes):
            if n is None:
                flat.append(g)
            else:
                flat.extend(g if g is not None else [None] * n)
        return (None, None, None, None, *flat)


# name -> (kernel, setup_context, whether setup_context takes the keyword-only inputs, backward)
_DIRECT: dict = {}


def direct(name: str, sizes: tuple, rest: tuple, kwargs: dict, *flat):
    """The op's eager call, recorded for autograd without the dispatcher (functional.py calls
    this where nothing else needs the dispatcher). See _Direct for the arguments."""
    return _Direct.apply(name, sizes, rest, kwargs, *flat)


def _register() -> None:
    """Runs once, on import, after asynctp.torch has defined the ops."""
    from . import _ops

    for name, backward, setup, setup_takes_kwargs in (
        ("fused_all_gather_matmul", _ag_mm_backward, _ag_mm_setup_context, True),
        ("fused_matmul_reduce_scatter", _mm_rs_backward, _mm_rs_setup_context, False),
        ("fused_matmuls_reduce_scatter", _mms_rs_backward, _mms_rs_setup_context, False),
        ("fused_all_gather_matmul_swiglu", _ag_swiglu_backward, _ag_swiglu_setup_context, True),
    ):
        _register_one(name, backward, setup)
        _DIRECT[name] = (_ops._KERNELS[name][0], setup, setup_takes_kwargs, backward)


_register()
