"""torch.ops.asynctp.*: the fused ops with exactly torch.ops.symm_mem's schemas (PyTorch 2.11 to
2.15 define the same four), plus fused_matmuls_reduce_scatter, the sum of several products before
one reduce-scatter (the backward pass of an all-gather matmul needs it), and
fused_all_gather_matmul_swiglu, the gate/up projection of a SwiGLU MLP with the activation in the
GEMM's epilogue:

    A = AG(gather_dim)(A_shard);  P = A @ B  (B [K, 2N]: the gate's columns, then the up's)
    out = silu(P[.., :N]) * P[.., N:]        -> (A if return_A, P if return_pre, out)

and swiglu_backward, that activation's gradient in one elementwise pass on this rank (the group
names the context, whose device and stream it runs on, made by an earlier fused op of the group;
nothing is exchanged):

    swiglu_backward(dOut [.., N], P [.., 2N]) = [dOut * U * s * (1 + G * (1 - s)) | dOut * silu(G)]
    with P = [G | U], s = sigmoid(G), computed in f32, in P's dtype

Each op: a fake kernel (shapes only, SymInts welcome), one kernel for CPU and CUDA that
allocates the outputs with torch (torch.empty on the input's device: the caching allocator, or
a CUDA graph's pool) and enqueues the op on torch's current stream through the C ABI. On CPU
the kernel waits for the op (asynctp_synchronize) before handing the outputs to torch.

Arguments asynctp cannot honour raise a named error: a bias or a result scale
(UnsupportedError). use_fast_accum is passed through, per B for the all-gather form: a
permission to accumulate the float8 products fast, as torch._scaled_mm's. On CUDA the GEMMs
then use cuBLASLt's fast accumulation; the CPU backend accumulates in f32 whatever it says.
"""

from __future__ import annotations

import ctypes
import math

import torch
import torch.distributed.distributed_c10d as c10d

from .. import _capi
from .._capi import InvalidArgumentError, UnsupportedError
from . import _contexts
from ._contexts import fill

lib = torch.library.Library("asynctp", "DEF")
_TAGS = [torch._C.Tag.needs_fixed_stride_order]

SCHEMAS = {
    "fused_all_gather_matmul": (
        "fused_all_gather_matmul(Tensor A, Tensor[] Bs, int gather_dim, str group_name, *, "
        "bool return_A = True) -> (Tensor?, Tensor[])"
    ),
    "fused_all_gather_scaled_matmul": (
        "fused_all_gather_scaled_matmul(Tensor A, Tensor[] Bs, Tensor A_scale, Tensor[] B_scales, "
        "int gather_dim, str group_name, Tensor?[] biases, Tensor?[] result_scales, "
        "ScalarType?[] out_dtypes, bool[] use_fast_accum) -> (Tensor, Tensor[])"
    ),
    "fused_matmul_reduce_scatter": (
        "fused_matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, int scatter_dim, "
        "str group_name) -> Tensor"
    ),
    "fused_scaled_matmul_reduce_scatter": (
        "fused_scaled_matmul_reduce_scatter(Tensor A, Tensor B, Tensor A_scale, Tensor B_scale, "
        "str reduce_op, int orig_scatter_dim, int scatter_dim_after_maybe_reshape, "
        "str group_name, SymInt[]? output_shape, Tensor? bias = None, "
        "Tensor? result_scale = None, ScalarType? out_dtype = None, "
        "bool use_fast_accum = False) -> Tensor"
    ),
    "fused_matmuls_reduce_scatter": (
        "fused_matmuls_reduce_scatter(Tensor[] As, Tensor[] Bs, str reduce_op, int scatter_dim, "
        "str group_name) -> Tensor"
    ),
    "fused_all_gather_matmul_swiglu": (
        "fused_all_gather_matmul_swiglu(Tensor A, Tensor B, int gather_dim, str group_name, *, "
        "bool return_A = False, bool return_pre = False) -> (Tensor?, Tensor?, Tensor)"
    ),
    "swiglu_backward": "swiglu_backward(Tensor grad_out, Tensor pre, str group_name) -> Tensor",
}
for _schema in SCHEMAS.values():
    lib.define(_schema, tags=_TAGS)

# ScalarType codes, for ScalarType?[] that reach us as ints through the dispatcher (c10's order).
_SCALAR_TYPES = {
    5: torch.float16,
    6: torch.float32,
    15: torch.bfloat16,
    23: torch.float8_e5m2,
    24: torch.float8_e4m3fn,
}


def _dtype(value) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    if isinstance(value, int) and value in _SCALAR_TYPES:
        return _SCALAR_TYPES[value]
    raise InvalidArgumentError(f"asynctp: out_dtype {value!r} is not supported")


# ---- shapes (shared by the fake kernels and the real ones; SymInts pass through) -------------


def _dim(d: int, ndim: int, what: str) -> int:
    if not -ndim <= d < ndim:
        raise InvalidArgumentError(f"asynctp: {what} {d} is out of range for a {ndim}-dim A")
    return d % ndim


def _divisible(n, ws: int, what: str) -> None:
    if isinstance(n, int):
        if n % ws != 0:
            raise InvalidArgumentError(f"asynctp: {what} ({n}) is not divisible by the world size {ws}")
    else:
        torch._check(n % ws == 0, lambda: f"asynctp: {what} ({n}) is not divisible by {ws}")


def _matrix(B: torch.Tensor, what: str) -> None:
    if B.dim() != 2:
        raise InvalidArgumentError(f"asynctp: {what} must be a matrix, got shape {tuple(B.shape)}")


def _same_device(A: torch.Tensor, tensors, what: str) -> None:
    """Every tensor on A's device. The dispatcher runs the fake kernel for a call with one meta
    tensor among CPU ones; without this it would answer with meta outputs."""
    for i, t in enumerate(tensors):
        if t.device != A.device:
            raise InvalidArgumentError(
                f"asynctp: {what}[{i}] is on {t.device}, A on {A.device} (they must match)")


def _ag_shapes(A: torch.Tensor, Bs, gather_dim: int, ws: int):
    """A_shard [.., s@g, .., K] -> A [.., ws*s@g, .., K]; outs[i] [.., ws*s@g, .., N_i]."""
    if A.dim() < 2:
        raise InvalidArgumentError(f"asynctp: A must have 2 dims or more, got {tuple(A.shape)}")
    if len(Bs) == 0:
        raise InvalidArgumentError("asynctp: Bs is empty")
    g = _dim(gather_dim, A.dim(), "gather_dim")
    full = list(A.shape)
    full[g] = full[g] * ws
    for i, B in enumerate(Bs):
        _matrix(B, f"Bs[{i}]")
    _same_device(A, Bs, "Bs")
    return g, full, [full[:-1] + [B.shape[1]] for B in Bs]


def _rs_shape(A_shape, N, scatter_dim: int, ws: int):
    """A [.., M@g, .., K] @ B [K, N] -> RS(g) -> out [.., M/ws@g, .., N]."""
    product = list(A_shape[:-1]) + [N]
    g = _dim(scatter_dim, len(product), "scatter_dim")
    _divisible(product[g], ws, f"dim {g} of the product {tuple(product)}")
    out = list(product)
    out[g] = out[g] // ws
    return g, out


def _reduce_op(reduce_op: str) -> int:
    op = _capi.REDUCE_OPS.get(reduce_op)
    if op is None:
        raise InvalidArgumentError(f"asynctp: reduce_op {reduce_op!r} is not 'sum' or 'avg'")
    return op


def _same_dtype(A: torch.Tensor, Bs, what: str) -> None:
    for i, B in enumerate(Bs):
        if B.dtype != A.dtype:
            raise InvalidArgumentError(
                f"asynctp: {what}[{i}] is {B.dtype}, A is {A.dtype} (they must match)"
            )


def _group_size(group_name: str) -> int:
    _contexts._resolve(group_name)
    return c10d._get_group_size_by_name(group_name)


def _unsupported_extras(biases, result_scales, op: str) -> None:
    for i, bias in enumerate(biases):
        if bias is not None:
            raise UnsupportedError(f"asynctp: {op}: a bias (biases[{i}]) is not supported yet")
    for i, scale in enumerate(result_scales):
        if scale is not None:
            raise UnsupportedError(
                f"asynctp: {op}: a result scale (result_scales[{i}]) is not supported yet"
            )


# ---- calling the library ---------------------------------------------------------------------


# torch's current CUDA stream (a CPU-only torch has none: its tensors never take that branch).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
# The eager calls' C functions (_capi.by_address), bound on first use (the library is loaded on
# first use, not on import): one list each, so that a call reads a module global rather than
# looking the function up by name.
_AG: list = []
_RS: list = []


def _bind(which: list) -> list:
    """Binds _AG and _RS; returns `which`."""
    if not _AG:
        _AG.append(_capi.by_address("asynctp_all_gather_matmul"))
        _RS.append(_capi.by_address("asynctp_matmul_reduce_scatter"))
    return which


def _stream_on(cuda: bool, index: int):
    """torch's current stream of CUDA device `index` (a cudaStream_t; NULL is the legacy default
    stream, as the C ABI takes it), None (ignored) on the CPU backend."""
    return (torch._C._cuda_getCurrentRawStream(index) or None) if cuda else None


def _complete(e, status: int, cuda: bool) -> None:
    """Raises a failed call's error; on the CPU backend, whose stream runs asynchronously,
    waits for the op, since torch reads the outputs right away."""
    if status != _capi.OK:
        _capi.raise_status(status)
    if not cuda:
        _capi.check(_capi.lib().asynctp_synchronize(e.handle))


def _descs(e, key: str, tensors):
    arr = e.tensors(key, len(tensors))
    for i, t in enumerate(tensors):
        fill(arr[i], t)
    return arr


_NO_TENSOR = _capi.no_tensor()
_entries = _contexts._entries


def _contiguous_strides(shape) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(int(size), 1)
    return strides[::-1]


def _tensor_key(t) -> tuple:
    """What a call plan depends on of one tensor: shape, dtype, device, strides."""
    return (t.shape, t.dtype, t.get_device(), t.stride())


class _Plan:
    """A call's descriptors, filled once per (shapes, strides, dtypes, devices, dims): a call
    then only writes data pointers and allocates its outputs (the host time of an eager call
    is the acceptance's measure). The descriptors' element views and the arrays' addresses are
    kept too: making a view of an array element, and converting an array into a pointer
    argument, cost more than the write or the call itself."""

    __slots__ = ("out_shapes", "out_dtype", "a_shape", "dim", "inputs", "outs", "a_out", "op",
                 "cuda", "device", "index", "input_views", "out_views", "a_out_view", "addrs",
                 "a_out_addr", "same_dtype")

    def __init__(self, inputs, out_shapes, out_dtype, a_shape, dim, device, op=0):
        self.inputs = []
        for ts in inputs:
            arr = (_capi.Tensor * len(ts))()
            for i, t in enumerate(ts):
                fill(arr[i], t)
            self.inputs.append(arr)
        self.input_views = [[arr[i] for i in range(len(arr))] for arr in self.inputs]
        self.out_shapes = out_shapes
        self.out_dtype = out_dtype
        self.same_dtype = out_dtype == inputs[0][0].dtype
        self.outs = (_capi.Tensor * len(out_shapes))()
        for i, shape in enumerate(out_shapes):
            _contexts.fill_meta(self.outs[i], out_dtype, device, shape, _contiguous_strides(shape))
        self.out_views = [self.outs[i] for i in range(len(out_shapes))]
        self.a_shape = a_shape
        self.a_out = None
        self.a_out_view = None
        self.a_out_addr = ctypes.addressof(_NO_TENSOR)
        if a_shape is not None:
            self.a_out = (_capi.Tensor * 1)()
            _contexts.fill_meta(self.a_out[0], out_dtype, device, a_shape, _contiguous_strides(a_shape))
            self.a_out_view = self.a_out[0]
            self.a_out_addr = ctypes.addressof(self.a_out)
        self.addrs = [ctypes.addressof(arr) for arr in self.inputs] + [ctypes.addressof(self.outs)]
        self.dim = dim
        self.device = device
        self.cuda = device.type == "cuda"
        self.index = device.index if self.cuda else -1
        self.op = op


_MAX_PLANS = 512


def _remember(e, key, plan: _Plan) -> None:
    """Keeps a plan; a context that has seen many shapes (dynamic shapes) starts over."""
    if len(e.descs) >= _MAX_PLANS:
        e.descs.clear()
    e.descs[key] = plan


def _empty(plan: _Plan, like, shape):
    """An output of the plan's dtype on its device (new_empty where the dtype is the input's:
    fewer arguments to parse)."""
    if plan.same_dtype:
        return like.new_empty(shape)
    return torch.empty(shape, dtype=plan.out_dtype, device=plan.device)


def _all_gather_matmul(A, Bs, gather_dim, group_name, *, return_A=True):
    # The host time of this function is most of an eager call's (see _Plan): one B, the common
    # case, takes no loop, comprehension or helper call.
    e = _entries.get((group_name, A.get_device())) or _contexts.entry(group_name, A)
    if len(Bs) == 1:
        B = Bs[0]
        key = ("ag", gather_dim, return_A, A.shape, A.dtype, A.stride(), B.shape, B.dtype,
               B.get_device(), B.stride())
    else:
        key = ("ag", gather_dim, return_A, A.shape, A.dtype, A.stride(),
               *[_tensor_key(B) for B in Bs])
    plan = e.descs.get(key)
    if plan is None:
        g, full, out_shapes = _ag_shapes(A, Bs, gather_dim, e.world_size)
        _same_dtype(A, Bs, "Bs")
        plan = _Plan([[A], Bs], out_shapes, A.dtype, full if return_A else None, g, A.device)
        _remember(e, key, plan)
    (a_view,), b_views = plan.input_views
    a_view.data = A.data_ptr()
    if len(Bs) == 1:
        b_views[0].data = B.data_ptr()
        out = A.new_empty(plan.out_shapes[0]) if plan.same_dtype else _empty(
            plan, A, plan.out_shapes[0])
        plan.out_views[0].data = out.data_ptr()
        outs = [out]
    else:
        for view, B in zip(b_views, Bs):
            view.data = B.data_ptr()
        outs = [_empty(plan, A, s) for s in plan.out_shapes]
        for view, out in zip(plan.out_views, outs):
            view.data = out.data_ptr()
    a_out = None
    if plan.a_out_view is not None:
        a_out = _empty(plan, A, plan.a_shape)
        plan.a_out_view.data = a_out.data_ptr()
    cuda = plan.cuda
    addrs = plan.addrs
    status = (_AG or _bind(_AG))[0](
        e.handle, addrs[0], addrs[1], len(Bs), addrs[2], plan.a_out_addr, plan.dim,
        _capi.PATH_DEFAULT, (_raw_stream(plan.index) or None) if cuda else None)
    if status or not cuda:
        _complete(e, status, cuda)
    return a_out, outs


def _all_gather_matmul_fake(A, Bs, gather_dim, group_name, *, return_A=True):
    ws = _group_size(group_name)
    _, full, out_shapes = _ag_shapes(A, Bs, gather_dim, ws)
    _same_dtype(A, Bs, "Bs")
    outs = [A.new_empty(s) for s in out_shapes]
    return (A.new_empty(full) if return_A else None), outs


def _matmuls_reduce_scatter(As, Bs, reduce_op, scatter_dim, group_name):
    if len(As) == 0 or len(As) != len(Bs):
        raise InvalidArgumentError(
            f"asynctp: As and Bs must be non-empty and of one length, got {len(As)} and {len(Bs)}"
        )
    if len(As) == 1:
        return _matmul_reduce_scatter(As[0], Bs[0], reduce_op, scatter_dim, group_name)
    A0 = As[0]
    e = _entries.get((group_name, A0.get_device())) or _contexts.entry(group_name, A0)
    key = ("rs", reduce_op, scatter_dim, *[_tensor_key(t) for t in (*As, *Bs)])
    plan = e.descs.get(key)
    if plan is None:
        plan = _rs_plan(e, key, As, Bs, reduce_op, scatter_dim)
    a_views, b_views = plan.input_views
    for view, A in zip(a_views, As):
        view.data = A.data_ptr()
    for view, B in zip(b_views, Bs):
        view.data = B.data_ptr()
    return _call_rs(e, plan, A0, len(As))


def _matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name):
    # One product, the common case, without the lists' loops (see _all_gather_matmul).
    e = _entries.get((group_name, A.get_device())) or _contexts.entry(group_name, A)
    key = ("rs", reduce_op, scatter_dim, A.shape, A.dtype, A.stride(), B.shape, B.dtype,
           B.get_device(), B.stride())
    plan = e.descs.get(key)
    if plan is None:
        plan = _rs_plan(e, key, [A], [B], reduce_op, scatter_dim)
    a_views, b_views = plan.input_views
    a_views[0].data = A.data_ptr()
    b_views[0].data = B.data_ptr()
    return _call_rs(e, plan, A, 1)


def _rs_plan(e, key, As, Bs, reduce_op, scatter_dim) -> _Plan:
    op = _reduce_op(reduce_op)
    g, out_shape = _rs_check(As, Bs, scatter_dim, e.world_size)
    plan = _Plan([As, Bs], [out_shape], As[0].dtype, None, g, As[0].device, op)
    _remember(e, key, plan)
    return plan


def _call_rs(e, plan: _Plan, A0, products: int):
    """Allocates the output and enqueues the op of a plan whose input pointers are written."""
    shape = plan.out_shapes[0]
    out = A0.new_empty(shape) if plan.same_dtype else _empty(plan, A0, shape)
    plan.out_views[0].data = out.data_ptr()
    cuda = plan.cuda
    addrs = plan.addrs
    status = (_RS or _bind(_RS))[0](
        e.handle, addrs[0], addrs[1], products, addrs[2], plan.op, plan.dim, _capi.PATH_DEFAULT,
        (_raw_stream(plan.index) or None) if cuda else None)
    if status or not cuda:
        _complete(e, status, cuda)
    return out


def _rs_check(As, Bs, scatter_dim, ws):
    A0 = As[0]
    if A0.dim() < 2:
        raise InvalidArgumentError(f"asynctp: A must have 2 dims or more, got {tuple(A0.shape)}")
    _same_device(A0, As, "As")
    _same_device(A0, Bs, "Bs")
    for i, (A, B) in enumerate(zip(As, Bs)):
        _matrix(B, f"Bs[{i}]")
        if A.dtype != A0.dtype or B.dtype != A0.dtype:
            raise InvalidArgumentError(
                f"asynctp: As[{i}] is {A.dtype} and Bs[{i}] {B.dtype}; every A and B must be "
                f"{A0.dtype}"
            )
        product = list(A.shape[:-1]) + [B.shape[1]]
        if i and product != list(As[0].shape[:-1]) + [Bs[0].shape[1]]:
            raise InvalidArgumentError(
                f"asynctp: product {i} has shape {tuple(product)}, product 0 "
                f"{tuple(list(A0.shape[:-1]) + [Bs[0].shape[1]])}: the summed products must agree"
            )
    return _rs_shape(A0.shape, Bs[0].shape[1], scatter_dim, ws)


def _matmuls_reduce_scatter_fake(As, Bs, reduce_op, scatter_dim, group_name):
    if len(As) == 0 or len(As) != len(Bs):
        raise InvalidArgumentError(
            f"asynctp: As and Bs must be non-empty and of one length, got {len(As)} and {len(Bs)}"
        )
    _reduce_op(reduce_op)
    _, out_shape = _rs_check(As, Bs, scatter_dim, _group_size(group_name))
    return As[0].new_empty(out_shape)


def _matmul_reduce_scatter_fake(A, B, reduce_op, scatter_dim, group_name):
    return _matmuls_reduce_scatter_fake([A], [B], reduce_op, scatter_dim, group_name)


# ---- the SwiGLU gate/up projection -------------------------------------------------------------


def _swiglu_shapes(A, B, gather_dim, ws):
    """A_shard [.., s@g, .., K], B [K, 2N] -> A [.., ws*s@g, .., K], P [.., 2N], out [.., N]."""
    g, full, (pre_shape,) = _ag_shapes(A, [B], gather_dim, ws)
    _same_dtype(A, [B], "B")
    two_n = B.shape[1]
    if isinstance(two_n, int) and two_n % 2 != 0:
        raise InvalidArgumentError(
            f"asynctp: B must hold 2N columns (the gate's, then the up projection's), got "
            f"{tuple(B.shape)}")
    return g, full, pre_shape, pre_shape[:-1] + [two_n // 2]


def _all_gather_matmul_swiglu(A, B, gather_dim, group_name, *, return_A=False, return_pre=False):
    e = _contexts.entry(group_name, A)
    g, full, pre_shape, out_shape = _swiglu_shapes(A, B, gather_dim, e.world_size)
    out = A.new_empty(out_shape)
    pre = A.new_empty(pre_shape) if return_pre else None
    a_out = A.new_empty(full) if return_A else None
    d = e.tensors("agsw", 5)
    args = []
    for i, t in enumerate((A, B, out, pre, a_out)):
        if t is None:
            args.append(ctypes.byref(_NO_TENSOR))
        else:
            fill(d[i], t)
            args.append(ctypes.byref(d[i]))
    status = _capi.lib().asynctp_all_gather_matmul_swiglu(
        e.handle, *args, g, _capi.PATH_DEFAULT, _stream_on(A.is_cuda, A.get_device()))
    _complete(e, status, A.is_cuda)
    return a_out, pre, out


def _all_gather_matmul_swiglu_fake(A, B, gather_dim, group_name, *, return_A=False,
                                   return_pre=False):
    _, full, pre_shape, out_shape = _swiglu_shapes(A, B, gather_dim, _group_size(group_name))
    return (A.new_empty(full) if return_A else None,
            A.new_empty(pre_shape) if return_pre else None, A.new_empty(out_shape))


def _swiglu_backward_shape(grad_out, pre):
    """grad_out [.., N] and pre [.., 2N] of the same leading dims, on one device -> pre's shape."""
    if grad_out.device != pre.device:
        raise InvalidArgumentError(
            f"asynctp: grad_out is on {grad_out.device}, pre on {pre.device} (they must match)")
    def wrong():
        return (f"asynctp: swiglu_backward: pre {tuple(pre.shape)} must be grad_out's shape "
                f"{tuple(grad_out.shape)} with the last dim doubled")

    def require(ok):
        """ok: a bool (plain ints: a named error now) or a SymBool (a guard for the tracer)."""
        if not isinstance(ok, bool):
            torch._check(ok, wrong)
        elif not ok:
            raise InvalidArgumentError(wrong())

    require(grad_out.dim() >= 1 and pre.dim() == grad_out.dim())
    for a, b in zip(pre.shape[:-1], grad_out.shape[:-1]):
        require(a == b)
    require(pre.shape[-1] == 2 * grad_out.shape[-1])
    for t, what in ((grad_out, "grad_out"), (pre, "pre")):
        if t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise InvalidArgumentError(
                f"asynctp: swiglu_backward: {what} is {t.dtype}; f32, bf16 or f16 expected")
    return list(pre.shape)


def _swiglu_backward(grad_out, pre, group_name):
    shape = _swiglu_backward_shape(grad_out, pre)
    e = _contexts.existing(group_name, pre, "swiglu_backward")
    grad_pre = pre.new_empty(shape)
    d = e.tensors("swbw", 3)
    for i, t in enumerate((grad_out, pre, grad_pre)):
        fill(d[i], t)
    status = _capi.lib().asynctp_swiglu_backward(
        e.handle, ctypes.byref(d[0]), ctypes.byref(d[1]), ctypes.byref(d[2]),
        _stream_on(pre.is_cuda, pre.get_device()))
    _complete(e, status, pre.is_cuda)
    return grad_pre


def _swiglu_backward_fake(grad_out, pre, group_name):
    return pre.new_empty(_swiglu_backward_shape(grad_out, pre))


# ---- float8 ------------------------------------------------------------------------------------


def _ag_scaled_check(A, Bs, A_scale, B_scales, gather_dim, ws, rank, biases, result_scales,
                     out_dtypes, use_fast_accum):
    n = len(Bs)
    for name, seq in (("B_scales", B_scales), ("biases", biases),
                      ("result_scales", result_scales), ("out_dtypes", out_dtypes),
                      ("use_fast_accum", use_fast_accum)):
        if len(seq) != n:
            raise InvalidArgumentError(f"asynctp: len({name}) is {len(seq)}, len(Bs) is {n}")
    _unsupported_extras(biases, result_scales, "fused_all_gather_scaled_matmul")
    g, full, out_shapes = _ag_shapes(A, Bs, gather_dim, ws)
    dtypes = [_dtype(d) or B.dtype for d, B in zip(out_dtypes, Bs)]
    # The scale of A: tensor-wise (one element), row-wise of the shard (the shard's shape with
    # the last dim 1: gathered with A), or row-wise of the gathered A (this rank's rows are
    # passed: the gathered scale is the same tensor).
    if A_scale.numel() != 1 and list(A_scale.shape[:-1]) == full[:-1] and A_scale.shape[-1] == 1 \
            and list(A_scale.shape[:-1]) != list(A.shape[:-1]):
        s = A.shape[g]
        A_scale = A_scale.narrow(g, rank * s, s)
    return g, full, out_shapes, dtypes, A_scale


def _all_gather_scaled_matmul(A, Bs, A_scale, B_scales, gather_dim, group_name, biases,
                              result_scales, out_dtypes, use_fast_accum):
    e = _contexts.entry(group_name, A)
    g, full, out_shapes, dtypes, A_scale = _ag_scaled_check(
        A, Bs, A_scale, B_scales, gather_dim, e.world_size, e.rank, biases, result_scales,
        out_dtypes, use_fast_accum)
    outs = [torch.empty(s, dtype=d, device=A.device) for s, d in zip(out_shapes, dtypes)]
    a_out = torch.empty(full, dtype=A.dtype, device=A.device)
    d_a = e.tensors("ags.a", 1)
    fill(d_a[0], A)
    d_as = e.tensors("ags.a_scale", 1)
    fill(d_as[0], A_scale)
    d_bs = _descs(e, "ags.bs", Bs)
    d_bss = _descs(e, "ags.b_scales", B_scales)
    d_outs = _descs(e, "ags.outs", outs)
    d_a_out = e.tensors("ags.a_out", 1)
    fill(d_a_out[0], a_out)
    # One flag per B; NULL where every B is exact.
    fast = None
    if any(use_fast_accum):
        fast = (ctypes.c_int32 * len(Bs))(*(1 if f else 0 for f in use_fast_accum))
    status = _capi.lib().asynctp_all_gather_scaled_matmul(
        e.handle, d_a, d_as, d_bs, d_bss, len(Bs), d_outs, d_a_out, g, fast, _capi.PATH_DEFAULT,
        _stream_on(A.is_cuda, A.get_device()))
    _complete(e, status, A.is_cuda)
    return a_out, outs


def _all_gather_scaled_matmul_fake(A, Bs, A_scale, B_scales, gather_dim, group_name, biases,
                                   result_scales, out_dtypes, use_fast_accum):
    ws = _group_size(group_name)
    _, full, out_shapes, dtypes, _ = _ag_scaled_check(
        A, Bs, A_scale, B_scales, gather_dim, ws, 0, biases, result_scales, out_dtypes,
        use_fast_accum)
    return A.new_empty(full), [A.new_empty(s, dtype=d) for s, d in zip(out_shapes, dtypes)]


def _rs_scaled_check(A, B, A_scale, orig_scatter_dim, scatter_dim_after_maybe_reshape,
                     output_shape, bias, result_scale, ws):
    """The op's result is torch's definition: RS(orig_scatter_dim) of
    _scaled_mm(A.flatten(0, -2), B).view(output_shape). A (and a row-wise A_scale) are viewed
    with output_shape's leading dims, and that is reduce-scattered on orig_scatter_dim.
    scatter_dim_after_maybe_reshape (the dim of A that torch's pipeline splits) must agree."""
    if bias is not None:
        raise UnsupportedError("asynctp: fused_scaled_matmul_reduce_scatter: a bias is not supported yet")
    if result_scale is not None:
        raise UnsupportedError(
            "asynctp: fused_scaled_matmul_reduce_scatter: a result scale is not supported yet")
    if A.dim() < 2:
        raise InvalidArgumentError(f"asynctp: A must have 2 dims or more, got {tuple(A.shape)}")
    _matrix(B, "B")
    _same_device(A, [B, A_scale], "[B, A_scale]")
    _dim(scatter_dim_after_maybe_reshape, A.dim(), "scatter_dim_after_maybe_reshape")
    if output_shape is None:
        output_shape = list(A.shape[:-1]) + [B.shape[1]]
    output_shape = list(output_shape)
    if output_shape[-1] != B.shape[1]:
        raise InvalidArgumentError(
            f"asynctp: output_shape {output_shape} does not end in B's N ({B.shape[1]})")
    lead = output_shape[:-1]
    if len(lead) == A.dim() - 1:
        if list(A.shape[:-1]) != lead:
            raise InvalidArgumentError(
                f"asynctp: output_shape {output_shape} does not match A {tuple(A.shape)}")
        if scatter_dim_after_maybe_reshape % A.dim() != orig_scatter_dim % len(output_shape):
            raise InvalidArgumentError(
                f"asynctp: scatter_dim_after_maybe_reshape {scatter_dim_after_maybe_reshape} and "
                f"orig_scatter_dim {orig_scatter_dim} differ, but A is not reshaped")
    rows, a_rows = math.prod(lead), math.prod(A.shape[:-1])
    if isinstance(rows, int) and isinstance(a_rows, int):
        if rows != a_rows:
            raise InvalidArgumentError(
                f"asynctp: output_shape {output_shape} holds {rows} rows, A {tuple(A.shape)} "
                f"{a_rows}")
    else:
        torch._check(rows == a_rows, lambda: f"asynctp: output_shape {output_shape} does not "
                     f"hold A {tuple(A.shape)}'s rows")
    A_view = A.reshape(lead + [A.shape[-1]])
    if A_scale.numel() != 1:
        if list(A_scale.shape[:-1]) != list(A.shape[:-1]) or A_scale.shape[-1] != 1:
            raise InvalidArgumentError(
                f"asynctp: A_scale {tuple(A_scale.shape)} is neither tensor-wise nor row-wise "
                f"for A {tuple(A.shape)}")
        A_scale = A_scale.reshape(lead + [1])
    g, out = _rs_shape(A_view.shape, B.shape[1], orig_scatter_dim, ws)
    return A_view, A_scale, g, out


def _scaled_matmul_reduce_scatter(A, B, A_scale, B_scale, reduce_op, orig_scatter_dim,
                                  scatter_dim_after_maybe_reshape, group_name, output_shape,
                                  bias=None, result_scale=None, out_dtype=None,
                                  use_fast_accum=False):
    e = _contexts.entry(group_name, A)
    op = _reduce_op(reduce_op)
    A_view, A_scale, g, out_shape = _rs_scaled_check(
        A, B, A_scale, orig_scatter_dim, scatter_dim_after_maybe_reshape, output_shape, bias,
        result_scale, e.world_size)
    out = torch.empty(out_shape, dtype=_dtype(out_dtype) or A.dtype, device=A.device)
    d = e.tensors("rss", 5)
    fill(d[0], A_view)
    fill(d[1], A_scale)
    fill(d[2], B)
    fill(d[3], B_scale)
    fill(d[4], out)
    p = ctypes.addressof(d)
    size = ctypes.sizeof(_capi.Tensor)
    T = ctypes.POINTER(_capi.Tensor)
    status = _capi.lib().asynctp_scaled_matmul_reduce_scatter(
        e.handle, ctypes.cast(p, T), ctypes.cast(p + size, T), ctypes.cast(p + 2 * size, T),
        ctypes.cast(p + 3 * size, T), ctypes.cast(p + 4 * size, T), op, g,
        1 if use_fast_accum else 0, _capi.PATH_DEFAULT, _stream_on(A.is_cuda, A.get_device()))
    _complete(e, status, A.is_cuda)
    return out


def _scaled_matmul_reduce_scatter_fake(A, B, A_scale, B_scale, reduce_op, orig_scatter_dim,
                                       scatter_dim_after_maybe_reshape, group_name, output_shape,
                                       bias=None, result_scale=None, out_dtype=None,
                                       use_fast_accum=False):
    _reduce_op(reduce_op)
    _, _, _, out_shape = _rs_scaled_check(
        A, B, A_scale, orig_scatter_dim, scatter_dim_after_maybe_reshape, output_shape, bias,
        result_scale, _group_size(group_name))
    return A.new_empty(out_shape, dtype=_dtype(out_dtype) or A.dtype)


_KERNELS = {
    "fused_all_gather_matmul": (_all_gather_matmul, _all_gather_matmul_fake),
    "fused_all_gather_scaled_matmul": (_all_gather_scaled_matmul, _all_gather_scaled_matmul_fake),
    "fused_matmul_reduce_scatter": (_matmul_reduce_scatter, _matmul_reduce_scatter_fake),
    "fused_scaled_matmul_reduce_scatter": (
        _scaled_matmul_reduce_scatter, _scaled_matmul_reduce_scatter_fake),
    "fused_matmuls_reduce_scatter": (_matmuls_reduce_scatter, _matmuls_reduce_scatter_fake),
    "fused_all_gather_matmul_swiglu": (
        _all_gather_matmul_swiglu, _all_gather_matmul_swiglu_fake),
    "swiglu_backward": (_swiglu_backward, _swiglu_backward_fake),
}
for _name, (_kernel, _fake) in _KERNELS.items():
    lib.impl(_name, _kernel, "CPU")
    lib.impl(_name, _kernel, "CUDA")
    torch.library.register_fake(f"asynctp::{_name}", _fake, lib=lib)
