"""Write torch.compile post-grad FX graphs as fx-graph-json (see docs/GRAPH.md).

Usage, in the process that compiles the model (one process per rank, or a fake process group):

    from asynctp.fx_export import capture_post_grad_graphs

    with capture_post_grad_graphs(world_size=4) as graphs:
        out = torch.compile(model)(x)
        out.sum().backward()
    graphs.write("block")   # block.fwd.json, block.bwd.json

The hook is Inductor's ``post_grad_custom_post_pass``: it sees the graph after Inductor's own
post-grad passes (pattern matching, no-op removal), which is what its micro-pipeline-TP pass sees
when ``torch._inductor.config._micro_pipeline_tp`` is off, and the graph that pass produced when
it is on. The graph is only read, never changed. Needs PyTorch >= 2.6.
"""

from __future__ import annotations

import contextlib
import json
import math
import operator
from typing import Any, Iterator

import torch
import torch.fx

FORMAT = "fx-graph-json"
VERSION = 1


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensor_meta(value: Any) -> Any:
    """The `val` entry: a dict for a tensor, a list for a tuple/list, null otherwise."""
    if isinstance(value, torch.Tensor):
        return {
            "shape": [int(s) for s in value.shape],
            "stride": [int(s) for s in value.stride()],
            "dtype": _dtype_name(value.dtype),
            "device": value.device.type,
        }
    if isinstance(value, (list, tuple)):
        return [_tensor_meta(v) for v in value]
    return None


def target_name(node: torch.fx.Node) -> str:
    """Qualified target names as FX prints them: aten.mm.default, _operator.getitem."""
    if node.op in ("placeholder", "output"):
        return node.name
    target = node.target
    if isinstance(target, str):
        return target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)
    if target is operator.getitem:
        return "_operator.getitem"
    module = getattr(target, "__module__", None) or "builtins"
    return f"{module}.{getattr(target, '__name__', repr(target))}"


def encode(value: Any) -> Any:
    """One argument value in the format's encoding (FORMAT.md, 'Encoded values')."""
    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        # JSON has no inf/nan; the reader maps these reprs back to doubles.
        return value if math.isfinite(value) else {"repr": repr(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": _dtype_name(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {"dict": {str(k): encode(v) for k, v in value.items()}}
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise ValueError(f"symbolic value {value!r}: export with dynamic=False")
    return {"repr": repr(value)}


def graph_to_dict(graph: torch.fx.Graph, world_size: int, source: str) -> dict:
    nodes = []
    for node in graph.nodes:
        if node.op not in ("placeholder", "call_function", "output"):
            raise ValueError(
                f"node {node.name}: op '{node.op}' is not in fx-graph-json "
                "(only placeholder, call_function and output)"
            )
        nodes.append(
            {
                "name": node.name,
                "op": node.op,
                "target": target_name(node),
                "args": encode(list(node.args)),
                "kwargs": {k: encode(v) for k, v in node.kwargs.items()},
                "val": _tensor_meta(node.meta.get("val")),
            }
        )
    return {
        "format": FORMAT,
        "version": VERSION,
        "source": source,
        "world_size": world_size,
        "nodes": nodes,
    }


def write_graph(graph: torch.fx.Graph, path: str, world_size: int, source: str = "") -> None:
    with open(path, "w") as f:
        json.dump(graph_to_dict(graph, world_size, source), f, indent=1)
        f.write("\n")


class CapturedGraphs(list):
    """The graphs seen by the hook, in compile order (forward first, then backward)."""

    def write(self, stem: str) -> list[str]:
        paths = []
        for i, doc in enumerate(self):
            suffix = {0: "fwd", 1: "bwd"}.get(i, f"g{i}") if len(self) <= 2 else f"g{i}"
            path = f"{stem}.{suffix}.json"
            with open(path, "w") as f:
                json.dump(doc, f, indent=1)
                f.write("\n")
            paths.append(path)
        return paths


class _ExportPass:
    """A CustomGraphPass-compatible callable that records every graph it is shown."""

    def __init__(self, sink: CapturedGraphs, world_size: int, source: str):
        self.sink = sink
        self.world_size = world_size
        self.source = source

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.sink.append(graph_to_dict(graph, self.world_size, self.source))

    def uuid(self) -> None:  # None: never serve this compile from Inductor's cache
        return None


@contextlib.contextmanager
def capture_post_grad_graphs(world_size: int, source: str | None = None) -> Iterator[CapturedGraphs]:
    """Records every post-grad graph compiled inside the block (and disables the FX graph cache,
    so that every graph really goes through the passes)."""
    import torch._inductor.config as inductor_config

    sink = CapturedGraphs()
    text = source or f"PyTorch {torch.__version__} post-grad FX graph (torch.compile)"
    hook = _ExportPass(sink, world_size, text)
    with inductor_config.patch(
        post_grad_custom_post_pass=hook, fx_graph_cache=False, fx_graph_remote_cache=False
    ):
        yield sink
