"""asynctp for PyTorch: importing it registers torch.ops.asynctp.*.

    import asynctp.torch  # noqa: F401
    A, (out,) = torch.ops.asynctp.fused_all_gather_matmul(a_shard, [w], 0, group.group_name)
    y = torch.ops.asynctp.fused_matmul_reduce_scatter(h, w2, "sum", 0, group.group_name)

asynctp.torch.fused_all_gather_matmul etc. (asynctp.torch.functional) take the same arguments
and skip torch's dispatcher on eager calls that record no autograd graph: the lowest host time
per call.

asynctp.torch.parallel holds sequence-parallel ColwiseParallel / RowwiseParallel styles for
torch.distributed.tensor.parallel.parallelize_module over the same fused ops (DTensor models).

The four fused ops have exactly torch.ops.symm_mem's schemas (swap one for the other);
fused_matmuls_reduce_scatter(As, Bs, reduce_op, scatter_dim, group_name) reduce-scatters the sum
of several products. Groups are torch process groups named by group_name (subgroups too); CPU
tensors run on asynctp's CPU backend (with a gloo group), CUDA tensors on its CUDA backend, on
torch's current stream.

asynctp.torch.enable(**options) makes every later torch.compile fuse the user's own collectives
and matmuls into these ops (asynctp.torch.compile); fusion_report() says what became of each.
"""

from __future__ import annotations

import ctypes
import numbers

import torch

from .. import _capi
from .._capi import InvalidArgumentError
from . import _contexts, _ops
from ._contexts import OPTIONS, release
from .functional import (
    fused_all_gather_matmul,
    fused_all_gather_matmul_swiglu,
    fused_all_gather_scaled_matmul,
    fused_matmul_reduce_scatter,
    fused_matmuls_reduce_scatter,
    fused_scaled_matmul_reduce_scatter,
)
from .modules import ColumnParallelLinear, RowParallelLinear  # registers autograd too

__all__ = [
    "ColumnParallelLinear",
    "FusionError",
    "RowParallelLinear",
    "barrier",
    "disable",
    "enable",
    "fusion_report",
    "fused_all_gather_matmul",
    "fused_all_gather_matmul_swiglu",
    "fused_all_gather_scaled_matmul",
    "fused_matmul_reduce_scatter",
    "fused_matmuls_reduce_scatter",
    "fused_scaled_matmul_reduce_scatter",
    "host_profile",
    "last_path",
    "memory_stats",
    "release",
    "reserve",
    "reset_fusion_report",
    "set_host_profile",
    "set_options",
    "usage",
]


# The torch.compile pass (asynctp.torch.compile) imports Inductor, which takes seconds: it is
# loaded on first use of one of these names.
_COMPILE_NAMES = ("FusionError", "disable", "enable", "fusion_report", "reset_fusion_report")


def __getattr__(name: str):
    if name in _COMPILE_NAMES:
        from . import compile as _compile

        return getattr(_compile, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def set_options(*, timeout_s=None, path=None, max_workspace_mb=None, dispatch_cache=None) -> None:
    """Options of the contexts made from now on (a context is made on a group's first op):
    timeout_s bounds every wait (default: ASYNCTP_TIMEOUT or 300 s); path is "auto", "split",
    "native" or "fallback" (a split or native path that cannot run a call raises
    asynctp.UnsupportedError saying why); max_workspace_mb limits each symmetric workspace;
    dispatch_cache is where measured path choices are kept ("off": in memory). None keeps the
    library's default."""
    if path is not None:
        _contexts.path_value(path)
    if timeout_s is not None and (
            isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real)
            or not 0 < timeout_s < float("inf")):
        raise InvalidArgumentError(
            f"asynctp: set_options: timeout_s must be a positive number of seconds or None, got "
            f"{timeout_s!r}")
    if max_workspace_mb is not None and (
            isinstance(max_workspace_mb, bool) or not isinstance(max_workspace_mb, numbers.Integral)
            or max_workspace_mb < 0):
        raise InvalidArgumentError(
            f"asynctp: set_options: max_workspace_mb must be an int >= 0 or None, got "
            f"{max_workspace_mb!r}")
    if dispatch_cache is not None and not isinstance(dispatch_cache, str):
        raise InvalidArgumentError(
            f"asynctp: set_options: dispatch_cache must be a path, \"off\" or None, got "
            f"{dispatch_cache!r}")
    OPTIONS.timeout_s = timeout_s
    OPTIONS.path = path
    OPTIONS.max_workspace_mb = max_workspace_mb
    OPTIONS.dispatch_cache = dispatch_cache


def _op_name(op) -> str:
    name = op if isinstance(op, str) else getattr(op, "__name__", str(op))
    name = name.split("::")[-1].split(".")[0]
    reservable = sorted(n for n in _ops.SCHEMAS if n != "swiglu_backward")  # it needs no workspace
    if name not in reservable:
        raise InvalidArgumentError(f"asynctp: reserve: {op!r} is not one of {reservable}")
    return name


def reserve(op, *args, **kwargs) -> None:
    """Sizes the symmetric workspaces for `op` called with these arguments, before CUDA-graph
    capture (collective over the group): reserve(torch.ops.asynctp.fused_all_gather_matmul,
    A_shard, [W], 0, group_name). A workspace that would have to grow during capture is an
    asynctp.CaptureError, never a reallocation."""
    name = _op_name(op)
    schema = torch._C.parse_schema(_ops.SCHEMAS[name])
    bound = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(args):
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
        else:
            raise InvalidArgumentError(f"asynctp: reserve: {name} needs {arg.name}")
    lib = _capi.lib()
    if name in ("fused_all_gather_matmul", "fused_all_gather_scaled_matmul"):
        A, Bs = bound["A"], list(bound["Bs"])
        e = _contexts.entry(bound["group_name"], A)
        g, _, _ = _ops._ag_shapes(A, Bs, bound["gather_dim"], e.world_size)
        if name == "fused_all_gather_matmul":
            _ops._same_dtype(A, Bs, "Bs")
        d_a = (_capi.Tensor * 1)()
        _contexts.fill(d_a[0], A)
        d_bs = (_capi.Tensor * len(Bs))()
        for i, B in enumerate(Bs):
            _contexts.fill(d_bs[i], B)
        return_a = 1 if bound.get("return_A", True) else 0
        status = lib.asynctp_reserve_all_gather_matmul(
            e.handle, d_a, d_bs, len(Bs), g, return_a, _ops._stream_on(A.is_cuda, A.get_device()))
    elif name == "fused_all_gather_matmul_swiglu":
        A, B = bound["A"], bound["B"]
        e = _contexts.entry(bound["group_name"], A)
        g, _, _, _ = _ops._swiglu_shapes(A, B, bound["gather_dim"], e.world_size)
        d = (_capi.Tensor * 2)()
        _contexts.fill(d[0], A)
        _contexts.fill(d[1], B)
        status = lib.asynctp_reserve_all_gather_matmul_swiglu(
            e.handle, ctypes.byref(d[0]), ctypes.byref(d[1]), g, 1 if bound["return_A"] else 0,
            _ops._stream_on(A.is_cuda, A.get_device()))
    else:
        _ops._reduce_op(bound["reduce_op"])
        if name == "fused_matmuls_reduce_scatter":
            As, Bs, scatter_dim = list(bound["As"]), list(bound["Bs"]), bound["scatter_dim"]
        elif name == "fused_matmul_reduce_scatter":
            As, Bs, scatter_dim = [bound["A"]], [bound["B"]], bound["scatter_dim"]
        else:
            e = _contexts.entry(bound["group_name"], bound["A"])
            A_view, _, scatter_dim, _ = _ops._rs_scaled_check(
                bound["A"], bound["B"], bound["A_scale"], bound["orig_scatter_dim"],
                bound["scatter_dim_after_maybe_reshape"], bound["output_shape"], bound["bias"],
                bound["result_scale"], e.world_size)
            As, Bs = [A_view], [bound["B"]]
        e = _contexts.entry(bound["group_name"], As[0])
        g, _ = _ops._rs_check(As, Bs, scatter_dim, e.world_size)
        d_as = (_capi.Tensor * len(As))()
        d_bs = (_capi.Tensor * len(Bs))()
        for i, (A, B) in enumerate(zip(As, Bs)):
            _contexts.fill(d_as[i], A)
            _contexts.fill(d_bs[i], B)
        status = lib.asynctp_reserve_matmul_reduce_scatter(
            e.handle, d_as, d_bs, len(As), g, _ops._stream_on(As[0].is_cuda, As[0].get_device()))
    _capi.check(status)


def memory_stats(group_name: str | None = None) -> dict:
    """The memory asynctp holds outside torch's allocator (torch's statistics cannot see it),
    summed over the contexts of group_name (every group for None): symmetric_bytes (this rank's
    share of the symmetric workspaces), symmetric_limit (per workspace), local_bytes (scratch
    and flags), contexts (how many)."""
    out = {"symmetric_bytes": 0, "symmetric_limit": 0, "local_bytes": 0, "contexts": 0}
    for e in _contexts.entries(group_name):
        s = _contexts.memory(e)
        out["symmetric_bytes"] += s.symmetric_bytes
        out["symmetric_limit"] = max(out["symmetric_limit"], s.symmetric_limit)
        out["local_bytes"] += s.local_bytes
        out["contexts"] += 1
    return out


def _device(device) -> torch.device:
    """A device argument as a torch.device, "cuda" as the current CUDA device."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _entry(group_name: str, device) -> "_contexts.Entry":
    if device is not None:
        device = _device(device)
    for e in _contexts.entries(group_name):
        if device is None or e.device == device:
            return e
    raise InvalidArgumentError(f"asynctp: no context of group {group_name!r} on {device} yet")


def last_path(op: str, group_name: str, device=None) -> tuple[str | None, str]:
    """The path the last call of op ("all_gather_matmul", "matmul_reduce_scatter", ...) took in
    group_name's context ("split", "native", "fallback"; None if it never ran), and why it fell
    back ("" otherwise)."""
    return _contexts.last_path(_entry(group_name, device), op)


def usage(group_name: str, device=None) -> dict:
    """Every (op, path) call count of group_name's context: {"all_gather_matmul": {"split": 3}}."""
    return _contexts.usage(_entry(group_name, device))


def barrier(group_name: str, device=None) -> None:
    """A device barrier over group_name, on torch's current stream (collective): what follows it
    on any rank's stream runs after every rank's stream has reached it. On CUDA the host does
    not wait, except in a context's first call, which may allocate (collectively); on the CPU
    backend the call returns once the barrier is passed. device: the context's device (default:
    the group's one context, else the current CUDA device where torch sees one, else the CPU).
    What `asynctp bench` lines the ranks up with before each timed run."""
    if device is not None:
        device = _device(device)
    else:
        made = _contexts.entries(group_name)
        device = made[0].device if len(made) == 1 else _device(
            "cuda" if torch.cuda.is_available() else "cpu")
    e = _contexts.entry_on(group_name, device)
    cuda = device.type == "cuda"
    _ops._complete(e, _capi.lib().asynctp_barrier(e.handle, _ops._stream_on(cuda, device.index)),
                   cuda)


def set_host_profile(group_name: str, enabled: bool, device=None) -> None:
    """Turns the host profile of group_name's context on or off (on from the start where
    ASYNCTP_HOST_PROFILE is set); either way what it gathered so far is dropped."""
    _contexts.set_host_profile(_entry(group_name, device), enabled)


def host_profile(group_name: str, device=None) -> dict:
    """Where the host time of each fused op call of group_name's context went, per op and path,
    from entering the C ABI to returning: {"all_gather_matmul": {"native": {"calls": n,
    "median_us": ..., "mean_us": ..., "phases": [{"from": "entry", "to": "run", "count": n,
    "median_us": ..., "mean_us": ..., "per_call_us": ...}, ...]}}} (src/ops/host_profile.h names
    the phases). Empty unless the profile is on (set_host_profile, ASYNCTP_HOST_PROFILE)."""
    return _contexts.host_profile(_entry(group_name, device))
