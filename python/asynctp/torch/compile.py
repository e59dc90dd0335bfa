"""asynctp's graph passes as torch.compile's post-grad custom pass.

    import asynctp.torch
    asynctp.torch.enable(enable_last_dim=True)   # the options of `asynctp passes`
    y = torch.compile(model)(x)                   # every later compile is fused
    asynctp.torch.fusion_report()                 # one dict per collective: fused, or why not

The matching is written once, in C++ (src/passes): the pass exports Inductor's post-grad FX
graph as fx-graph-json (asynctp.fx_export), runs the pass pipeline over it through the C ABI
(asynctp_run_passes), and applies the rewritten graph back to the FX graph: nodes the passes kept
stay (their arguments rewired), nodes they made are created (targets resolved to torch ops, the
fused targets to torch.ops.asynctp's ops with torch.ops.symm_mem's schemas), nodes they dropped are
erased. With Inductor's own micro-pipeline-TP pass on (torch._inductor.config._micro_pipeline_tp),
the torch.ops.symm_mem fused nodes it made are retargeted to torch.ops.asynctp's.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import operator
from typing import Any

import torch
import torch.fx
from torch._inductor import config as inductor_config
from torch._inductor import custom_graph_pass
from torch._inductor.custom_graph_pass import CustomGraphPass

from .. import _capi
from .._capi import Error, InvalidArgumentError
from ..fx_export import encode, graph_to_dict

log = logging.getLogger("asynctp")

_COLLECTIVES = {
    "_c10d_functional.all_gather_into_tensor.default": "all_gather",
    "_c10d_functional.reduce_scatter_tensor.default": "reduce_scatter",
    "_c10d_functional.all_reduce.default": "all_reduce",
}
_SYMM_MEM_KINDS = {
    "fused_all_gather_matmul": "all_gather",
    "fused_all_gather_scaled_matmul": "all_gather",
    "fused_matmul_reduce_scatter": "reduce_scatter",
    "fused_scaled_matmul_reduce_scatter": "reduce_scatter",
}
_MISSING = object()


class FusionError(Error):
    """strict=True: a collective matched a fusion pattern but was left unfused."""


def run_passes(doc: dict | None, options: dict) -> dict:
    """asynctp_run_passes on an fx-graph-json document (None: only checks the options):
    {"options": ..., "report": [...], "graph": {...}} (docs/GRAPH.md)."""
    lib = _capi.lib()
    out = ctypes.c_void_p()
    try:
        options_text = json.dumps(options).encode()
    except TypeError as exc:
        raise InvalidArgumentError(f"asynctp: options {options!r} are not JSON values: {exc}")
    text = None if doc is None else json.dumps(doc).encode()
    _capi.check(lib.asynctp_run_passes(text, options_text, ctypes.byref(out)))
    try:
        return json.loads(ctypes.string_at(out.value).decode())
    finally:
        lib.asynctp_string_free(out)


# ---- applying the rewritten graph back to FX ----------------------------------------------------


def _resolve_target(name: str):
    """An fx-graph-json target name as a callable: aten.mm.default -> torch.ops.aten.mm.default."""
    if name == "_operator.getitem":
        return operator.getitem
    parts = name.split(".")
    if len(parts) != 3:
        raise InvalidArgumentError(f"asynctp: cannot resolve the target {name!r} of a rewritten node")
    return getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])


def _same_encoding(old: Any, value: Any) -> bool:
    try:
        return json.dumps(encode(old)) == json.dumps(value)
    except (TypeError, ValueError):
        return False


def _decode(value: Any, env: dict, old: Any = _MISSING) -> Any:
    """An encoded argument as an FX argument. Where the node had this argument before and it
    encodes to the same JSON, the old Python value is kept (values the format only carries as
    reprs survive); node references always resolve through env (the rewritten graph's names)."""
    if isinstance(value, dict):
        if "node" in value:
            return env[value["node"]]
        if old is not _MISSING and _same_encoding(old, value):
            return old
        if "dtype" in value:
            return getattr(torch, value["dtype"])
        if "device" in value:
            return torch.device(value["device"])
        if "layout" in value:
            return getattr(torch, value["layout"])
        if "memory_format" in value:
            return getattr(torch, value["memory_format"])
        if "repr" in value and value["repr"] in ("inf", "-inf", "nan"):
            return float(value["repr"])
        if "dict" in value:
            olds = old if isinstance(old, dict) else {}
            return {k: _decode(v, env, olds.get(k, _MISSING)) for k, v in value["dict"].items()}
        raise InvalidArgumentError(f"asynctp: cannot decode the argument {value!r}")
    if isinstance(value, list):
        olds = list(old) if isinstance(old, (list, tuple)) and len(old) == len(value) else None
        items = [_decode(v, env, olds[i] if olds else _MISSING) for i, v in enumerate(value)]
        return tuple(items) if isinstance(old, tuple) else items
    if old is not _MISSING and _same_encoding(old, value):
        return old
    return value


def _fused_call(target: str, args: list, kwargs: dict):
    """The torch.ops.asynctp call for one of the passes' fused targets (docs/GRAPH.md, "Fused
    targets"), with torch.ops.symm_mem's argument order."""
    ops = torch.ops.asynctp
    if target == "asynctp.fused_all_gather_matmul":
        a, bs, dim, group = args
        return ops.fused_all_gather_matmul.default, (a, bs, dim, group), dict(kwargs)
    if target == "asynctp.fused_all_gather_matmul_swiglu":
        a, b, dim, group = args
        return ops.fused_all_gather_matmul_swiglu.default, (a, b, dim, group), dict(kwargs)
    if target == "asynctp.fused_all_gather_scaled_matmul":
        a, a_scale, bs, b_scales, dim, group, out_dtypes = args
        n = len(bs)
        # The fused _scaled_mms' own use_fast_accum, one per B (absent: all False).
        fast = [bool(f) for f in (kwargs.get("use_fast_accum") or [False] * n)]
        # Always returns A (torch's schema has no return_A); an unused A is simply not read.
        return (ops.fused_all_gather_scaled_matmul.default,
                (a, bs, a_scale, b_scales, dim, group, [None] * n, [None] * n, out_dtypes, fast),
                {})
    if target == "asynctp.fused_matmul_reduce_scatter":
        As, Bs, reduce_op, dim, group = args
        if len(As) == 1:
            return ops.fused_matmul_reduce_scatter.default, (As[0], Bs[0], reduce_op, dim, group), {}
        return ops.fused_matmuls_reduce_scatter.default, (As, Bs, reduce_op, dim, group), {}
    if target == "asynctp.fused_scaled_matmul_reduce_scatter":
        a, a_scale, b, b_scale, reduce_op, dim, group, out_dtype = args
        # A arrives viewed with the product's leading dims, so no reshape is left to undo.
        return (ops.fused_scaled_matmul_reduce_scatter.default,
                (a, b, a_scale, b_scale, reduce_op, dim, dim, group, None),
                {"out_dtype": out_dtype,
                 "use_fast_accum": bool(kwargs.get("use_fast_accum") or False)})
    raise InvalidArgumentError(f"asynctp: unknown fused target {target!r}")


def _fake_mode(graph: torch.fx.Graph):
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode()
    if mode is None:
        mode = detect_fake_mode([n.meta.get("val") for n in graph.nodes])
    return mode


def _set_val(node: torch.fx.Node, fake_mode) -> None:
    """node.meta["val"] by running its target on its inputs' fake values."""
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
    if node.target is operator.getitem or fake_mode is None:
        if node.target is operator.getitem:
            node.meta["val"] = args[0][args[1]]
        return
    with fake_mode:
        node.meta["val"] = node.target(*args, **kwargs)


def apply_graph(graph: torch.fx.Graph, old_doc: dict, new_doc: dict) -> None:
    """Makes `graph` (exported as old_doc) the graph new_doc describes. A node whose name, op,
    target and val are unchanged is kept (its arguments decoded again, so that they follow
    renamed inputs); every other node of new_doc is created; nodes new_doc lacks are erased."""
    old = {n.name: n for n in graph.nodes}
    old_entries = {e["name"]: e for e in old_doc["nodes"]}
    fake_mode = _fake_mode(graph)
    env: dict[str, torch.fx.Node] = {}
    order: list[torch.fx.Node] = []
    kept: set[torch.fx.Node] = set()
    for entry in new_doc["nodes"]:
        name = entry["name"]
        before = old_entries.get(name)
        if before is not None and all(before[k] == entry[k] for k in ("op", "target", "val")):
            node = old[name]
            if entry["args"] != before["args"] or entry["kwargs"] != before["kwargs"] or any(
                env.get(i.name) is not i for i in node.all_input_nodes
            ):
                node.args = _decode(entry["args"], env, node.args)
                node.kwargs = {
                    k: _decode(v, env, node.kwargs.get(k, _MISSING))
                    for k, v in entry["kwargs"].items()
                }
            kept.add(node)
        else:
            if entry["op"] != "call_function":
                raise InvalidArgumentError(
                    f"asynctp: the passes made a {entry['op']} node {name}; only calls can be new")
            args = _decode(entry["args"], env)
            kwargs = {k: _decode(v, env) for k, v in entry["kwargs"].items()}
            if entry["target"].startswith("asynctp."):
                target, args, kwargs = _fused_call(entry["target"], args, kwargs)
            else:
                target = _resolve_target(entry["target"])
            node = graph.create_node("call_function", target, tuple(args), kwargs, name=name)
            _set_val(node, fake_mode)
        env[name] = node
        order.append(node)
    # Lay the nodes out in the rewritten order: each after the one before it.
    for prev, node in zip(order, order[1:]):
        if prev.next is not node:
            prev.append(node)
    for node in reversed(list(graph.nodes)):
        if node not in kept and node.name in old and old[node.name] is node:
            if node.users:
                raise Error(
                    f"asynctp: the passes dropped {node.name}, which "
                    f"{', '.join(u.name for u in node.users)} still read(s)")
            graph.erase_node(node)
    graph.lint()


# ---- the pass -----------------------------------------------------------------------------------


def _take_over_symm_mem(graph: torch.fx.Graph) -> list[dict]:
    """Retargets torch.ops.symm_mem's fused nodes (Inductor's own micro-pipeline-TP pass) to
    torch.ops.asynctp's, whose schemas are the same; one report entry each."""
    entries = []
    for node in graph.nodes:
        target = node.target
        if not isinstance(target, torch._ops.OpOverload) or target.namespace != "symm_mem":
            continue
        name = target._schema.name.split("::")[-1]
        if name not in _SYMM_MEM_KINDS:
            continue
        ours = getattr(torch.ops.asynctp, name).default
        same = [a.name for a in ours._schema.arguments] == [a.name for a in target._schema.arguments]
        entry = {"kind": _SYMM_MEM_KINDS[name], "node": node.name, "fused": same,
                 "outcome": "fused" if same else "blocked"}
        if same:
            node.target = ours
            entry["detail"] = f"into {node.name} (torch.ops.symm_mem.{name}, taken over)"
        else:
            entry["detail"] = (f"torch.ops.symm_mem.{name}'s schema {target._schema} differs from "
                               f"asynctp's {ours._schema}; left to torch")
        entries.append(entry)
    return entries


def _world_size(graph: torch.fx.Graph) -> int:
    """The group size of the graph's all-gathers and reduce-scatters (the passes fuse those whose
    group is that size); the job's world size when they differ (a 2-D mesh)."""
    sizes = set()
    for n in graph.nodes:
        kind = _COLLECTIVES.get(str(n.target))
        if kind == "all_gather":  # (input, group_size, group_name)
            sizes.add(int(n.args[1]))
        elif kind == "reduce_scatter":  # (input, reduce_op, group_size, group_name)
            sizes.add(int(n.args[2]))
    if len(sizes) == 1:
        return sizes.pop()
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else 1


def _as_tuple(installed) -> tuple:
    """What post_grad_custom_post_pass holds: None, one pass, or a list or tuple of them."""
    if installed is None:
        return ()
    return tuple(installed) if isinstance(installed, (list, tuple)) else (installed,)


class FusionPass(CustomGraphPass):
    """Inductor's post_grad_custom_post_pass: runs `previous` (the pass installed before, if
    any), then asynctp's passes."""

    def __init__(self, options: dict, strict: bool, previous=None):
        self.options = options  # normalized: every option of `asynctp passes`
        self.strict = strict
        self.previous = _as_tuple(previous)
        self.graphs = 0

    def uuid(self) -> str | None:
        before = []
        for p in self.previous:
            u = p.uuid() if isinstance(p, CustomGraphPass) else None
            if u is None:  # a previous pass cannot be cached, so neither can the chain
                return None
            before.append(repr(u))
        text = json.dumps([_capi.version(), self.options, self.strict, before], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def __call__(self, graph: torch.fx.Graph) -> None:
        for p in self.previous:
            p(graph)
        index = self.graphs
        self.graphs += 1
        entries = _take_over_symm_mem(graph)
        if any(str(n.target) in _COLLECTIVES for n in graph.nodes):
            entries += self._fuse(graph)
        for e in entries:
            e["graph"] = index
            level = logging.WARNING if e["outcome"] == "blocked" else logging.INFO
            log.log(level, "%s %s: %s: %s", e["kind"], e["node"],
                    "fused" if e["fused"] else e["outcome"], e["detail"])
        _REPORT.extend(entries)
        blocked = [e for e in entries if e["outcome"] == "blocked"]
        if self.strict and blocked:
            raise FusionError(
                "asynctp (strict): matched but not fused: " +
                "; ".join(f"{e['kind']} {e['node']}: {e['detail']}" for e in blocked))

    def _fuse(self, graph: torch.fx.Graph) -> list[dict]:
        def not_fused(why: str) -> list[dict]:
            return [{"kind": kind, "node": n.name, "fused": False, "outcome": "blocked",
                     "detail": why}
                    for n in graph.nodes if (kind := _COLLECTIVES.get(str(n.target)))]

        try:
            doc = graph_to_dict(graph, _world_size(graph), "asynctp.torch compile pass")
        except ValueError as exc:  # symbolic shapes, or an op the format cannot carry
            return not_fused(f"the graph cannot be exported: {exc}")
        for entry in doc["nodes"]:
            # Nested results ((A, [outs]) of a fused op already in the graph) have no val in
            # the format; the passes leave such nodes alone and need no shape of them.
            if isinstance(entry["val"], list) and any(isinstance(v, list) for v in entry["val"]):
                entry["val"] = None
        try:
            result = run_passes(doc, self.options)
        except Error as exc:  # the user's compile goes on, unfused; the report says why
            return not_fused(f"the passes failed on this graph: {exc}")
        entries = [{"kind": r["kind"], "node": r["collective"], "fused": r["outcome"] == "fused",
                    "outcome": r["outcome"], "detail": r["detail"]} for r in result["report"]]
        if self.strict and any(e["outcome"] == "blocked" for e in entries):
            return entries  # __call__ raises; the graph stays as it was
        apply_graph(graph, doc, result["graph"])
        return entries


_REPORT: list[dict] = []
_INSTALLED: list[tuple[FusionPass, Any]] = []  # (our pass, what was installed before it)


def enable(strict: bool = False, **options) -> FusionPass:
    """Installs asynctp's pass as Inductor's post_grad_custom_post_pass for every later
    torch.compile. `options` are those of `asynctp passes` (enable_last_dim,
    no_last_dim_scatter, enable_transpose, enable_swiglu, bucket_mb, no_fuse); an unknown one is
    an asynctp.InvalidArgumentError. A pass installed before runs first. strict=True: a
    collective that matched a pattern but stayed unfused raises FusionError (and fails the
    compile). Returns the installed pass (a callable on an FX graph, as Inductor calls it)."""
    if "strict" in options:
        raise InvalidArgumentError("asynctp: enable: pass strict as enable's own argument")
    normalized = run_passes(None, options)["options"]
    previous = inductor_config.post_grad_custom_post_pass
    aware = getattr(custom_graph_pass, "CustomInferenceAwareGraphPass", None)
    if aware is not None and any(isinstance(p, aware) for p in _as_tuple(previous)):
        raise InvalidArgumentError(
            f"asynctp: enable: the installed post_grad_custom_post_pass {previous!r} needs "
            "is_inference, which asynctp's pass cannot pass on to it")
    _REPORT.clear()
    fusion_pass = FusionPass(normalized, bool(strict), previous)
    inductor_config.post_grad_custom_post_pass = fusion_pass
    _INSTALLED.append((fusion_pass, previous))
    return fusion_pass


def disable() -> None:
    """Removes the pass enable() installed last, restoring what was installed before it."""
    if not _INSTALLED:
        raise InvalidArgumentError("asynctp: disable: the pass is not enabled")
    fusion_pass, previous = _INSTALLED.pop()
    if inductor_config.post_grad_custom_post_pass is not fusion_pass:
        raise InvalidArgumentError(
            "asynctp: disable: post_grad_custom_post_pass was replaced after enable(); "
            "restore it first")
    inductor_config.post_grad_custom_post_pass = previous


def fusion_report() -> list[dict]:
    """One dict per collective of the graphs compiled since enable() or reset_fusion_report():
    kind ("all_gather", "reduce_scatter", "all_reduce"), node, fused (bool), detail (what it was
    fused into, or why not), outcome ("fused", "bucketed", "unmatched", "blocked": matched but
    not fused) and graph (the index of the graph among those the pass saw). Graphs that
    Inductor serves from its cache are not compiled again, so they add no entries."""
    return [dict(e) for e in _REPORT]


def reset_fusion_report() -> None:
    _REPORT.clear()
