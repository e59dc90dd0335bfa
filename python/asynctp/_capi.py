"""ctypes binding of the C ABI (include/asynctp/asynctp_c.h), version 3.

Every function's argtypes and restype are declared once, when the library is first loaded. A
call returns an asynctp_status; `check(status)` turns anything but ASYNCTP_OK into the matching
`asynctp.Error` subclass carrying the library's message (asynctp_last_error, this thread's).

The library is found in the package's own lib/ directory (where the wheel installs it), else at
$ASYNCTP_LIBRARY (a source checkout: build-cpu/lib/libasynctp_c.so, say). It is loaded on first
use, so `import asynctp` works without it (the FX exporter does not need it).

Nothing here needs torch: tensors are `Tensor` descriptors (data pointer, dtype tag, device,
shape and strides in elements).
"""

from __future__ import annotations

import builtins
import ctypes
import os
import threading
from pathlib import Path

API_VERSION = 6
MAX_DIMS = 8
CONTEXT_STREAM = ctypes.c_void_p(-1)  # ASYNCTP_CONTEXT_STREAM

# asynctp_status
OK = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_TIMEOUT = 2
ERROR_UNSUPPORTED = 3
ERROR_CAPTURE = 4
ERROR_PEER = 5
ERROR_INTERNAL = 6

# asynctp_dtype
F32, BF16, F16, F8E4M3, F8E5M2 = 0, 1, 2, 3, 4
# asynctp_device_type
DEVICE_CPU, DEVICE_CUDA = 0, 1
# asynctp_path
PATH_DEFAULT, PATH_AUTO, PATH_SPLIT, PATH_FALLBACK, PATH_NATIVE = -1, 0, 1, 2, 3
PATH_NAMES = {PATH_AUTO: "auto", PATH_SPLIT: "split", PATH_FALLBACK: "fallback", PATH_NATIVE: "native"}
PATHS_BY_NAME = {name: value for value, name in PATH_NAMES.items()}
# asynctp_reduce_op
REDUCE_SUM, REDUCE_AVG = 0, 1
REDUCE_OPS = {"sum": REDUCE_SUM, "avg": REDUCE_AVG}


class Error(RuntimeError):
    """A failed asynctp call. `status` is the C ABI's asynctp_status."""

    status = ERROR_INTERNAL

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        if status is not None:
            self.status = status


class InvalidArgumentError(Error, ValueError):
    """A bad shape, dtype, device, handle, group or option."""

    status = ERROR_INVALID_ARGUMENT


class TimeoutError(Error, builtins.TimeoutError):  # noqa: A001 (asynctp.TimeoutError)
    """A bounded wait gave up (the message names rank, peer and channel)."""

    status = ERROR_TIMEOUT


class UnsupportedError(Error, NotImplementedError):
    """Valid, but this build, backend or version cannot do it (a bias, a result scale...), or
    the path asked for (set_options(path=...)) cannot run the call."""

    status = ERROR_UNSUPPORTED


class CaptureError(Error):
    """Not allowed during CUDA-graph capture (a workspace that would have to grow)."""

    status = ERROR_CAPTURE


class PeerError(Error):
    """A peer failed or went away."""

    status = ERROR_PEER


class InternalError(Error):
    """Anything else: a CUDA, NCCL or system error."""

    status = ERROR_INTERNAL


_ERRORS = {
    ERROR_INVALID_ARGUMENT: InvalidArgumentError,
    ERROR_TIMEOUT: TimeoutError,
    ERROR_UNSUPPORTED: UnsupportedError,
    ERROR_CAPTURE: CaptureError,
    ERROR_PEER: PeerError,
    ERROR_INTERNAL: InternalError,
}


class Tensor(ctypes.Structure):
    """asynctp_tensor: a strided view (strides in elements); ndim -1 means no tensor."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("device_type", ctypes.c_int32),
        ("device_index", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("strides", ctypes.c_int64 * MAX_DIMS),
    ]


def no_tensor() -> Tensor:
    """The descriptor that stands for "no tensor" (data NULL, ndim -1)."""
    t = Tensor()
    t.ndim = -1
    return t


class ContextOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_int32),
        ("backend", ctypes.c_char_p),
        ("device_index", ctypes.c_int32),
        ("max_workspace_bytes", ctypes.c_int64),
        ("path", ctypes.c_int32),
        ("dispatch_cache", ctypes.c_char_p),
    ]


class MemoryStats(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_int32),
        ("symmetric_bytes", ctypes.c_int64),
        ("symmetric_limit", ctypes.c_int64),
        ("local_bytes", ctypes.c_int64),
    ]


STORE_SET = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t
)
STORE_GET = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.c_char_p,
    ctypes.c_int64,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.c_size_t),
)
STORE_ADD = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)
)
STORE_CHECK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32)
)
STORE_ERASE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)


class StoreCallbacks(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_int32),
        ("user", ctypes.c_void_p),
        ("set", STORE_SET),
        ("get", STORE_GET),
        ("add", STORE_ADD),
        ("check", STORE_CHECK),
        ("erase", STORE_ERASE),
    ]


_P = ctypes.POINTER
_ctx = ctypes.c_void_p  # asynctp_context
_grp = ctypes.c_void_p  # asynctp_group
_tp = _P(Tensor)
_i32 = ctypes.c_int32
_i64 = ctypes.c_int64
_vp = ctypes.c_void_p

# name: (restype, argtypes). The statuses are c_int: asynctp_status is a C enum.
_PROTOTYPES = {
    "asynctp_api_version": (_i32, []),
    "asynctp_version": (ctypes.c_char_p, []),
    "asynctp_last_error": (ctypes.c_char_p, []),
    "asynctp_cuda_available": (_i32, []),
    "asynctp_group_from_env": (ctypes.c_int, [_i64, _P(_grp)]),
    "asynctp_group_from_store": (
        ctypes.c_int,
        [_P(StoreCallbacks), _i32, _i32, _i32, _i64, _P(_grp)],
    ),
    "asynctp_group_split": (ctypes.c_int, [_grp, _P(_i32), _i32, _P(_grp)]),
    "asynctp_group_rank": (ctypes.c_int, [_grp, _P(_i32)]),
    "asynctp_group_world_size": (ctypes.c_int, [_grp, _P(_i32)]),
    "asynctp_group_destroy": (ctypes.c_int, [_grp]),
    "asynctp_context_options_init": (None, [_P(ContextOptions)]),
    "asynctp_context_create": (ctypes.c_int, [_grp, _P(ContextOptions), _P(_ctx)]),
    "asynctp_context_destroy": (ctypes.c_int, [_ctx]),
    "asynctp_context_set_stream": (ctypes.c_int, [_ctx, _vp]),
    "asynctp_reserve_all_gather_matmul": (
        ctypes.c_int,
        [_ctx, _tp, _tp, _i32, _i32, _i32, _vp],
    ),
    "asynctp_reserve_matmul_reduce_scatter": (ctypes.c_int, [_ctx, _tp, _tp, _i32, _i32, _vp]),
    "asynctp_synchronize": (ctypes.c_int, [_ctx]),
    "asynctp_all_gather_matmul": (
        ctypes.c_int,
        [_ctx, _tp, _tp, _i32, _tp, _tp, _i32, _i32, _vp],
    ),
    "asynctp_all_gather_scaled_matmul": (
        ctypes.c_int,
        [_ctx, _tp, _tp, _tp, _tp, _i32, _tp, _tp, _i32, _P(_i32), _i32, _vp],
    ),
    "asynctp_all_gather_matmul_swiglu": (
        ctypes.c_int,
        [_ctx, _tp, _tp, _tp, _tp, _tp, _i32, _i32, _vp],
    ),
    "asynctp_reserve_all_gather_matmul_swiglu": (ctypes.c_int, [_ctx, _tp, _tp, _i32, _i32, _vp]),
    "asynctp_swiglu_backward": (ctypes.c_int, [_ctx, _tp, _tp, _tp, _vp]),
    "asynctp_matmul_reduce_scatter": (
        ctypes.c_int,
        [_ctx, _tp, _tp, _i32, _tp, _i32, _i32, _i32, _vp],
    ),
    "asynctp_scaled_matmul_reduce_scatter": (
        ctypes.c_int,
        [_ctx, _tp, _tp, _tp, _tp, _tp, _i32, _i32, _i32, _i32, _vp],
    ),
    "asynctp_all_gather": (ctypes.c_int, [_ctx, _tp, _tp, _i32, _vp]),
    "asynctp_reduce_scatter": (ctypes.c_int, [_ctx, _tp, _tp, _i32, _i32, _vp]),
    "asynctp_all_reduce": (ctypes.c_int, [_ctx, _tp, _i32, _vp]),
    "asynctp_barrier": (ctypes.c_int, [_ctx, _vp]),
    "asynctp_last_path": (
        ctypes.c_int,
        [_ctx, ctypes.c_char_p, _P(_i32), ctypes.c_char_p, ctypes.c_size_t],
    ),
    "asynctp_usage_json": (
        ctypes.c_int,
        [_ctx, ctypes.c_char_p, ctypes.c_size_t, _P(ctypes.c_size_t)],
    ),
    "asynctp_host_profile_set": (ctypes.c_int, [_ctx, _i32]),
    "asynctp_host_profile_json": (
        ctypes.c_int,
        [_ctx, ctypes.c_char_p, ctypes.c_size_t, _P(ctypes.c_size_t)],
    ),
    "asynctp_memory_stats_get": (ctypes.c_int, [_ctx, _P(MemoryStats)]),
    "asynctp_run_passes": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, _P(_vp)]),
    "asynctp_string_free": (None, [_vp]),
}

_lib: ctypes.CDLL | None = None
_lock = threading.Lock()


def library_path() -> Path:
    """Where the library is loaded from: the package's lib/, else $ASYNCTP_LIBRARY."""
    bundled = Path(__file__).resolve().parent / "lib" / "libasynctp_c.so"
    if bundled.exists():
        return bundled
    env = os.environ.get("ASYNCTP_LIBRARY")
    if env:
        return Path(env)
    raise ImportError(
        f"asynctp: no C library: {bundled} does not exist and ASYNCTP_LIBRARY is not set "
        "(pip install . builds it; from a source tree, point ASYNCTP_LIBRARY at "
        "build-cpu/lib/libasynctp_c.so)"
    )


def lib() -> ctypes.CDLL:
    """The loaded library, every prototype declared (loaded on the first call)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            loaded = ctypes.CDLL(str(library_path()))
            # The version first: a library of another version may lack functions bound below.
            loaded.asynctp_api_version.restype = _i32
            loaded.asynctp_api_version.argtypes = []
            version = loaded.asynctp_api_version()
            if version != API_VERSION:
                raise ImportError(
                    f"asynctp: {library_path()} implements C API version {version}, this "
                    f"package binds version {API_VERSION}"
                )
            for name, (restype, argtypes) in _PROTOTYPES.items():
                fn = getattr(loaded, name)
                fn.restype = restype
                fn.argtypes = argtypes
            _lib = loaded
    return _lib


# The eager ops' calls (asynctp.torch) once more, with their descriptor arrays as void*: the
# caller passes the arrays' addresses (ints), which ctypes converts faster than arrays to typed
# pointers, on every call.
_ADDRESS_PROTOTYPES = {
    "asynctp_all_gather_matmul": (ctypes.c_int, [_ctx, _vp, _vp, _i32, _vp, _vp, _i32, _i32, _vp]),
    "asynctp_matmul_reduce_scatter": (
        ctypes.c_int,
        [_ctx, _vp, _vp, _i32, _vp, _i32, _i32, _i32, _vp],
    ),
}
_by_address: dict = {}


def by_address(name: str):
    """The library's function `name` taking its tensor descriptor arrays by address (ints)."""
    fn = _by_address.get(name)
    if fn is None:
        restype, argtypes = _ADDRESS_PROTOTYPES[name]
        fn = ctypes.CFUNCTYPE(restype, *argtypes)((name, lib()))
        _by_address[name] = fn
    return fn


def raise_status(status: int) -> None:
    """Raises the Error subclass of a failed status with this thread's library message."""
    message = lib().asynctp_last_error()
    text = message.decode(errors="replace") if message else ""
    cls = _ERRORS.get(status, InternalError)
    raise cls(text or f"asynctp call failed with status {status}", status)


def check(status: int) -> None:
    if status != OK:
        raise_status(status)


def version() -> str:
    return lib().asynctp_version().decode()


def cuda_available() -> bool:
    return bool(lib().asynctp_cuda_available())


def describe(
    data: int, dtype: int, shape, strides, device_type: int = DEVICE_CPU, device_index: int = 0
) -> Tensor:
    """A Tensor descriptor from a data pointer, an asynctp dtype tag, shape and strides."""
    ndim = len(shape)
    if ndim > MAX_DIMS or len(strides) != ndim:
        raise InvalidArgumentError(
            f"a tensor has {ndim} dims and {len(strides)} strides; at most {MAX_DIMS} dims, "
            "one stride each"
        )
    t = Tensor()
    t.data = data
    t.dtype = dtype
    t.device_type = device_type
    t.device_index = device_index
    t.ndim = ndim
    for i in range(ndim):
        t.shape[i] = shape[i]
        t.strides[i] = strides[i]
    return t
