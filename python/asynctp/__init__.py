"""asynctp: asynchronous tensor parallelism.

- `asynctp` (no torch needed): the C ABI's errors, version and CUDA check; `asynctp._capi` is
  the ctypes binding of include/asynctp/asynctp_c.h.
- `asynctp.torch`: torch.ops.asynctp.* (the fused ops with torch.ops.symm_mem's schemas).
- `asynctp.fx_export`: writes torch.compile's post-grad FX graphs as fx-graph-json.
"""

from ._capi import (
    CaptureError,
    Error,
    InternalError,
    InvalidArgumentError,
    PeerError,
    TimeoutError,
    UnsupportedError,
    cuda_available,
    version,
)

__all__ = [
    "CaptureError",
    "Error",
    "InternalError",
    "InvalidArgumentError",
    "PeerError",
    "TimeoutError",
    "UnsupportedError",
    "cuda_available",
    "version",
    "fx_export",
]
