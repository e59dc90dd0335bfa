"""A Python key-value store seen by the C library through asynctp_store_callbacks.

`StoreBridge(store)` adapts any object with torch.distributed.Store's methods (set, get, add,
check, delete_key, wait) so that asynctp_group_from_store rendezvouses through it. The callbacks
never raise into C: a Python exception becomes a non-zero status (2 when it was a timeout), and
the message is kept in `last_error` for the caller's diagnosis.
"""

from __future__ import annotations

import ctypes
from datetime import timedelta

from . import _capi


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError) or "timeout" in str(exc).lower() or "timed out" in str(exc).lower()


class StoreBridge:
    """Owns the ctypes callbacks; it must outlive every group made from `callbacks`."""

    def __init__(self, store):
        self.store = store
        self.last_error = ""
        # get() hands out a pointer into this buffer: valid until the next callback (the header's
        # contract), so the bridge keeps the last value alive.
        self._value = ctypes.create_string_buffer(0)
        cb = _capi.StoreCallbacks()
        cb.struct_size = ctypes.sizeof(_capi.StoreCallbacks)
        cb.user = None
        cb.set = _capi.STORE_SET(self._set)
        cb.get = _capi.STORE_GET(self._get)
        cb.add = _capi.STORE_ADD(self._add)
        cb.check = _capi.STORE_CHECK(self._check)
        cb.erase = _capi.STORE_ERASE(self._erase)
        self.callbacks = cb

    def _fail(self, exc: BaseException) -> int:
        self.last_error = f"{type(exc).__name__}: {exc}"
        return _capi.ERROR_TIMEOUT if _is_timeout(exc) else 1

    def _set(self, user, key, value, length):
        try:
            self.store.set(key.decode(), ctypes.string_at(value, length) if length else b"")
            return 0
        except BaseException as exc:  # noqa: BLE001 (nothing may unwind into C)
            return self._fail(exc)

    def _get(self, user, key, timeout_ms, value_out, len_out):
        try:
            name = key.decode()
            if timeout_ms > 0:
                self.store.wait([name], timedelta(milliseconds=timeout_ms))
            data = self.store.get(name)
            self._value = ctypes.create_string_buffer(data, len(data))
            value_out[0] = ctypes.cast(self._value, ctypes.c_void_p).value
            len_out[0] = len(data)
            return 0
        except BaseException as exc:  # noqa: BLE001
            return self._fail(exc)

    def _add(self, user, key, delta, result):
        try:
            result[0] = int(self.store.add(key.decode(), int(delta)))
            return 0
        except BaseException as exc:  # noqa: BLE001
            return self._fail(exc)

    def _check(self, user, key, is_set):
        try:
            is_set[0] = 1 if self.store.check([key.decode()]) else 0
            return 0
        except BaseException as exc:  # noqa: BLE001
            return self._fail(exc)

    def _erase(self, user, key):
        try:
            self.store.delete_key(key.decode())
            return 0
        except BaseException as exc:  # noqa: BLE001
            return self._fail(exc)
