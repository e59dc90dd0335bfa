"""One asynctp context per (torch process group, device), made on first use and cached.

A group is named by torch's group_name (any process group, subgroups included). Its asynctp
group rendezvouses through that process group's own store (c10d._get_process_group_store), under
a prefix of ours, through the C store callbacks: no second port, no extra environment. The local
GPU is the tensor's device.

`release(group_name)` destroys the contexts of one group (all of them for None);
torch.distributed.destroy_process_group is wrapped so that it releases them first, and c10d's
unregistering of a group's name so that no context outlives its group however it was destroyed.
"""

from __future__ import annotations

import ctypes
import json
import math
import threading
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .. import _capi
from .._capi import InvalidArgumentError
from .._store import StoreBridge

DTYPES = {
    torch.float32: _capi.F32,
    torch.bfloat16: _capi.BF16,
    torch.float16: _capi.F16,
    torch.float8_e4m3fn: _capi.F8E4M3,
    torch.float8_e5m2: _capi.F8E5M2,
}


def fill(desc: _capi.Tensor, t: torch.Tensor) -> None:
    """Writes tensor t's view into desc: data pointer, dtype tag, device, shape, strides.

    float8 travels as its data pointer plus the dtype tag (no DLPack float8 code needed)."""
    tag = DTYPES.get(t.dtype)
    if tag is None:
        raise InvalidArgumentError(
            f"asynctp: dtype {t.dtype} is not supported (float32, bfloat16, float16, "
            "float8_e4m3fn, float8_e5m2)"
        )
    n = t.dim()
    if n > _capi.MAX_DIMS:
        raise InvalidArgumentError(f"asynctp: a tensor of {n} dims; at most {_capi.MAX_DIMS}")
    desc.data = t.data_ptr()
    desc.dtype = tag
    if t.is_cuda:
        desc.device_type = _capi.DEVICE_CUDA
        desc.device_index = t.get_device()
    elif t.is_cpu:
        desc.device_type = _capi.DEVICE_CPU
        desc.device_index = 0
    else:
        raise InvalidArgumentError(f"asynctp: tensors on {t.device} are not supported (cpu, cuda)")
    desc.ndim = n
    desc.shape[:n] = t.shape
    desc.strides[:n] = t.stride()


def fill_meta(desc: _capi.Tensor, dtype, device, shape, strides) -> None:
    """A descriptor without data (an output's, filled before torch allocates it)."""
    tag = DTYPES.get(dtype)
    if tag is None:
        raise InvalidArgumentError(f"asynctp: dtype {dtype} is not supported")
    desc.data = None
    desc.dtype = tag
    desc.device_type = _capi.DEVICE_CUDA if device.type == "cuda" else _capi.DEVICE_CPU
    desc.device_index = device.index or 0
    desc.ndim = len(shape)
    desc.shape[: len(shape)] = [int(s) for s in shape]
    desc.strides[: len(shape)] = [int(s) for s in strides]


@dataclass
class Options:
    """Options of the contexts made from now on (asynctp.torch.set_options)."""

    timeout_s: float | None = None  # None: ASYNCTP_TIMEOUT or its default
    path: str | None = None  # None: ASYNCTP_PATH or auto
    max_workspace_mb: int | None = None  # None: ASYNCTP_MAX_WORKSPACE_MB or its default
    dispatch_cache: str | None = None  # None: default location; "off": in memory


OPTIONS = Options()


def timeout_ms() -> int:
    """OPTIONS.timeout_s in whole milliseconds, rounded up (0, the library's default, for None):
    a positive timeout is never 0 ms."""
    return math.ceil(OPTIONS.timeout_s * 1000) if OPTIONS.timeout_s is not None else 0


@dataclass
class Entry:
    """A context and what must outlive it; `descs` holds reusable descriptors per call site."""

    group_name: str
    device: torch.device
    rank: int
    world_size: int
    handle: ctypes.c_void_p
    bridge: StoreBridge
    descs: dict = field(default_factory=dict)

    def tensors(self, key, n: int):
        """A reusable array of n descriptors (one host thread per context: the header's rule)."""
        arr = self.descs.get((key, n))
        if arr is None:
            arr = (_capi.Tensor * n)()
            self.descs[(key, n)] = arr
        return arr


_entries: dict[tuple[str, int], Entry] = {}
_generation: dict[str, int] = {}
_lock = threading.Lock()


def entry(group_name: str, t: torch.Tensor) -> Entry:
    """The context of (group_name, t's device), made (collectively) on first use."""
    e = _entries.get((group_name, t.get_device()))
    return e if e is not None else _create(group_name, t.device)


def existing(group_name: str, t: torch.Tensor, op: str) -> Entry:
    """The context of (group_name, t's device) that an earlier (collective) op made. For an op
    that runs on one rank alone: making the context is collective, and one rank making it alone
    would wait for the others, or take a store prefix they would not."""
    e = _entries.get((group_name, t.get_device()))
    if e is None:
        _resolve(group_name)  # a bad group name is named as such
        raise InvalidArgumentError(
            f"asynctp: {op}: group {group_name!r} has no asynctp context on {t.device} yet; "
            f"{op} runs on one rank alone and cannot make one (every rank making it together): "
            f"call a fused op of the group on this device first")
    return e


def entry_on(group_name: str, device: torch.device) -> Entry:
    """The context of (group_name, device), made (collectively) on first use."""
    e = _entries.get((group_name, device.index if device.type == "cuda" else -1))
    return e if e is not None else _create(group_name, device)


def _resolve(group_name: str):
    if not isinstance(group_name, str):
        raise InvalidArgumentError(f"asynctp: group_name must be a str, got {group_name!r}")
    if not dist.is_initialized():
        raise InvalidArgumentError(
            f"asynctp: group_name {group_name!r}: torch.distributed is not initialized"
        )
    try:
        pg = c10d._resolve_process_group(group_name)
    except Exception as exc:  # torch raises ValueError or RuntimeError, by version
        raise InvalidArgumentError(
            f"asynctp: group_name {group_name!r} names no process group of this rank ({exc})"
        ) from None
    if pg is None or pg == c10d.GroupMember.NON_GROUP_MEMBER:
        raise InvalidArgumentError(f"asynctp: this rank is not in group {group_name!r}")
    return pg


def _create(group_name: str, device: torch.device) -> Entry:
    if device.type not in ("cpu", "cuda"):
        raise InvalidArgumentError(f"asynctp: tensors on {device} are not supported (cpu, cuda)")
    pg = _resolve(group_name)
    lib = _capi.lib()
    with _lock:
        key = (group_name, -1 if device.type == "cpu" else device.index)
        if key in _entries:
            return _entries[key]
        # Every rank of the group makes its contexts in the same order (the ops are collective),
        # so the generation, and with it the store prefix, agree across ranks.
        gen = _generation.get(group_name, 0)
        _generation[group_name] = gen + 1
        prefix = f"asynctp/{device.type}/{gen}/"
        store = c10d.PrefixStore(prefix, c10d._get_process_group_store(pg))
        bridge = StoreBridge(store)
        rank, world_size = pg.rank(), pg.size()
        local = device.index if device.type == "cuda" else rank
        wait_ms = timeout_ms()
        group = ctypes.c_void_p()
        status = lib.asynctp_group_from_store(
            ctypes.byref(bridge.callbacks), rank, world_size, local, wait_ms, ctypes.byref(group)
        )
        if status != _capi.OK:
            _raise_with_store(status, bridge)
        try:
            opts = _capi.ContextOptions()
            lib.asynctp_context_options_init(ctypes.byref(opts))
            opts.backend = device.type.encode()
            opts.device_index = device.index if device.type == "cuda" else -1
            if OPTIONS.max_workspace_mb is not None:
                opts.max_workspace_bytes = int(OPTIONS.max_workspace_mb) << 20
            if OPTIONS.path is not None:
                opts.path = path_value(OPTIONS.path)
            if OPTIONS.dispatch_cache is not None:
                opts.dispatch_cache = OPTIONS.dispatch_cache.encode()
            handle = ctypes.c_void_p()
            status = lib.asynctp_context_create(group, ctypes.byref(opts), ctypes.byref(handle))
            if status != _capi.OK:
                _raise_with_store(status, bridge)
        finally:
            # The context keeps what it needs of the group alive; the bridge stays in the entry.
            lib.asynctp_group_destroy(group)
        e = Entry(group_name, device, rank, world_size, handle, bridge)
        _entries[key] = e
        return e


def _raise_with_store(status: int, bridge: StoreBridge) -> None:
    try:
        _capi.raise_status(status)
    except _capi.Error as exc:
        if bridge.last_error:
            raise type(exc)(f"{exc} (store: {bridge.last_error})", status) from None
        raise


def path_value(name: str) -> int:
    value = _capi.PATHS_BY_NAME.get(name)
    if value is None:
        raise InvalidArgumentError(
            f"asynctp: path {name!r} is not one of {sorted(_capi.PATHS_BY_NAME)}"
        )
    return value


def entries(group_name: str | None = None) -> list[Entry]:
    return [e for e in list(_entries.values()) if group_name is None or e.group_name == group_name]


def release(group_name: str | None = None) -> None:
    """Destroys the contexts of group_name (every context for None): waits for their work,
    then frees their memory, symmetric workspaces included."""
    lib = _capi.lib() if _entries else None
    first_error = None
    with _lock:
        for key, e in list(_entries.items()):
            if group_name is None or e.group_name == group_name:
                del _entries[key]
                try:
                    _capi.check(lib.asynctp_context_destroy(e.handle))
                except _capi.Error as exc:  # the others are released all the same
                    first_error = first_error or exc
    if first_error is not None:
        raise first_error


def _read_json(fn, e: Entry) -> dict:
    """The JSON text a C ABI function writes like asynctp_usage_json, parsed."""
    needed = ctypes.c_size_t()
    _capi.check(fn(e.handle, None, 0, ctypes.byref(needed)))
    buf = ctypes.create_string_buffer(needed.value)
    _capi.check(fn(e.handle, buf, needed.value, ctypes.byref(needed)))
    return json.loads(buf.value.decode() or "{}")


def usage(e: Entry) -> dict:
    return _read_json(_capi.lib().asynctp_usage_json, e)


def set_host_profile(e: Entry, enabled: bool) -> None:
    _capi.check(_capi.lib().asynctp_host_profile_set(e.handle, 1 if enabled else 0))


def host_profile(e: Entry) -> dict:
    return _read_json(_capi.lib().asynctp_host_profile_json, e)


def last_path(e: Entry, op: str) -> tuple[str | None, str]:
    lib = _capi.lib()
    path = ctypes.c_int32()
    reason = ctypes.create_string_buffer(512)
    _capi.check(lib.asynctp_last_path(e.handle, op.encode(), ctypes.byref(path), reason, 512))
    return _capi.PATH_NAMES.get(path.value), reason.value.decode()


def memory(e: Entry) -> _capi.MemoryStats:
    stats = _capi.MemoryStats()
    stats.struct_size = ctypes.sizeof(_capi.MemoryStats)
    _capi.check(_capi.lib().asynctp_memory_stats_get(e.handle, ctypes.byref(stats)))
    return stats


def _group_name_of(group) -> str | None:
    """The group_name of destroy_process_group's argument (None: every group)."""
    if group is None or group is c10d.GroupMember.WORLD:
        return None
    return getattr(group, "group_name", None)


def _wrap_destroy_process_group() -> None:
    """torch has no hook on a group's destruction, so destroy_process_group is wrapped: it
    releases the asynctp contexts of that group (all of them for the default group) first."""
    original = c10d.destroy_process_group
    if getattr(original, "_asynctp_wrapped", False):
        return

    def destroy_process_group(group=None):
        try:
            release(_group_name_of(group))
        finally:
            original(group)

    destroy_process_group._asynctp_wrapped = True
    destroy_process_group.__doc__ = original.__doc__
    destroy_process_group.__wrapped__ = original
    c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group


def _wrap_unregister() -> None:
    """torch's destroy_process_group and _abort_process_group end by unregistering the group's
    name (every name for the default group), through these two c10d module functions: wrapped,
    they release the name's contexts even where destroy_process_group was bound before this
    module wrapped it (`from torch.distributed import destroy_process_group` first). A name
    torch has unregistered may name a later group of other ranks: no context outlives it."""
    one, every = c10d._unregister_process_group, c10d._unregister_all_process_groups
    if getattr(one, "_asynctp_wrapped", False):
        return

    def _unregister_process_group(group_name):
        try:
            release(group_name)
        finally:
            one(group_name)

    def _unregister_all_process_groups():
        try:
            release(None)
        finally:
            every()

    for wrapper, original in ((_unregister_process_group, one),
                              (_unregister_all_process_groups, every)):
        wrapper._asynctp_wrapped = True
        wrapper.__wrapped__ = original
        setattr(c10d, original.__name__, wrapper)


_wrap_destroy_process_group()
_wrap_unregister()
