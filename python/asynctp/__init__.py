"""asynctp: asynchronous tensor parallelism. Python side: the FX exporter (fx_export)."""

__all__ = ["fx_export"]
