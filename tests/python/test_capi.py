"""asynctp._capi without torch: the binding, the store bridge and the error mapping, at world
size 1 on the CPU backend with numpy arrays and a dict as the store."""

from __future__ import annotations

import ctypes
import threading
import time

import numpy as np
import pytest

import asynctp
from asynctp import _capi
from asynctp._store import StoreBridge


class DictStore:
    """torch.distributed.Store's methods over a dict (one process)."""

    def __init__(self):
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()

    def set(self, key, value):
        with self.cond:
            self.data[key] = value if isinstance(value, bytes) else str(value).encode()
            self.cond.notify_all()

    def get(self, key):
        return self.data[key]

    def wait(self, keys, timeout):
        deadline = time.monotonic() + timeout.total_seconds()
        with self.cond:
            while not all(k in self.data for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"wait for {keys} timed out")
                self.cond.wait(left)

    def add(self, key, delta):
        with self.cond:
            value = int(self.data.get(key, b"0")) + delta
            self.data[key] = str(value).encode()
            return value

    def check(self, keys):
        return all(k in self.data for k in keys)

    def delete_key(self, key):
        return self.data.pop(key, None) is not None


def _desc(a: np.ndarray) -> _capi.Tensor:
    tags = {np.dtype(np.float32): _capi.F32, np.dtype(np.float16): _capi.F16}
    return _capi.describe(a.ctypes.data, tags[a.dtype], a.shape,
                          [s // a.itemsize for s in a.strides])


@pytest.fixture(scope="module")
def ctx():
    lib = _capi.lib()
    bridge = StoreBridge(DictStore())
    group = ctypes.c_void_p()
    _capi.check(lib.asynctp_group_from_store(ctypes.byref(bridge.callbacks), 0, 1, 0, 10_000,
                                             ctypes.byref(group)))
    rank, ws = ctypes.c_int32(), ctypes.c_int32()
    _capi.check(lib.asynctp_group_rank(group, ctypes.byref(rank)))
    _capi.check(lib.asynctp_group_world_size(group, ctypes.byref(ws)))
    assert (rank.value, ws.value) == (0, 1)
    opts = _capi.ContextOptions()
    lib.asynctp_context_options_init(ctypes.byref(opts))
    assert opts.struct_size == ctypes.sizeof(_capi.ContextOptions) and opts.device_index == -1
    opts.backend = b"cpu"
    opts.dispatch_cache = b"off"
    handle = ctypes.c_void_p()
    _capi.check(lib.asynctp_context_create(group, ctypes.byref(opts), ctypes.byref(handle)))
    _capi.check(lib.asynctp_group_destroy(group))
    yield handle
    _capi.check(lib.asynctp_context_destroy(handle))


def test_library():
    assert _capi.lib().asynctp_api_version() == _capi.API_VERSION
    assert asynctp.version().count(".") == 2
    torch = pytest.importorskip("torch")  # only to ask whether a GPU is visible
    assert asynctp.cuda_available() == torch.cuda.is_available()


def test_all_gather_matmul_numpy(ctx):
    lib = _capi.lib()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((8, 16), dtype=np.float32)
    b = rng.standard_normal((16, 4), dtype=np.float32)
    out = np.empty((8, 4), np.float32)
    a_out = np.empty((8, 16), np.float32)
    _capi.check(lib.asynctp_all_gather_matmul(
        ctx, _desc(a), _desc(b), 1, _desc(out), _desc(a_out), 0, _capi.PATH_DEFAULT, None))
    _capi.check(lib.asynctp_synchronize(ctx))
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(a_out, a)
    path = ctypes.c_int32()
    reason = ctypes.create_string_buffer(256)
    _capi.check(lib.asynctp_last_path(ctx, b"all_gather_matmul", ctypes.byref(path), reason, 256))
    assert path.value in _capi.PATH_NAMES


def test_overlapping_output_is_an_invalid_argument(ctx):
    # The ctypes binding takes the caller's outputs (the torch ops allocate theirs): an output
    # over the input is refused with both operands named; an output right after it passes.
    lib = _capi.lib()
    buf = np.zeros(8 * 16 + 8 * 4, np.float32)
    a = buf[:128].reshape(8, 16)
    a[:] = np.arange(128).reshape(8, 16) % 5
    b = np.ones((16, 4), np.float32)
    overlapping = buf[124:156].reshape(8, 4)  # its first row is A's last
    status = lib.asynctp_all_gather_matmul(
        ctx, _desc(a), _desc(b), 1, _desc(overlapping), None, 0, _capi.PATH_DEFAULT, None)
    assert status == _capi.ERROR_INVALID_ARGUMENT
    with pytest.raises(asynctp.InvalidArgumentError, match=r"outs\[0\] \(f32\[8, 4\].* overlaps "
                       r"A_shard \(f32\[8, 16\]"):
        _capi.raise_status(status)
    after = buf[128:].reshape(8, 4)
    _capi.check(lib.asynctp_all_gather_matmul(
        ctx, _desc(a), _desc(b), 1, _desc(after), None, 0, _capi.PATH_DEFAULT, None))
    _capi.check(lib.asynctp_synchronize(ctx))
    np.testing.assert_array_equal(after, a @ b)


def test_errors_carry_the_library_message(ctx):
    lib = _capi.lib()
    a = np.zeros((8, 16), np.float32)
    b = np.zeros((8, 4), np.float32)  # K 16 against 8 rows
    out = np.empty((8, 4), np.float32)
    status = lib.asynctp_all_gather_matmul(
        ctx, _desc(a), _desc(b), 1, _desc(out), ctypes.byref(_capi.no_tensor()), 0,
        _capi.PATH_DEFAULT, None)
    assert status == _capi.ERROR_INVALID_ARGUMENT
    with pytest.raises(asynctp.InvalidArgumentError) as info:
        _capi.raise_status(status)
    assert str(info.value) and isinstance(info.value, ValueError)
    with pytest.raises(asynctp.InvalidArgumentError):
        _capi.check(lib.asynctp_all_gather_matmul(
            ctx, _desc(a), _desc(b), 0, _desc(out), None, 0, _capi.PATH_DEFAULT, None))
    for status, cls in ((2, asynctp.TimeoutError), (3, asynctp.UnsupportedError),
                        (4, asynctp.CaptureError), (5, asynctp.PeerError), (6, asynctp.InternalError)):
        with pytest.raises(cls):
            _capi.raise_status(status)
