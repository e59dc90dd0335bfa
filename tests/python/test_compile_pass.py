"""asynctp.torch.enable(): the torch.compile pass (python/asynctp/torch/compile.py).

One compile at ws 2 does most of the work (each compile costs seconds of CPU): a tiny tensor-
parallel MLP with sequence parallelism (all-gather of the sequence -> column-parallel matmul,
ReLU, row-parallel matmul -> reduce-scatter of the sequence), forward and backward, compiled with
the FX exporter installed first and asynctp's pass chained after it. The report must say every
collective of both graphs fused, the compiled step must run asynctp's fused ops (its usage
counters), and the output and every gradient must match the same function run eagerly. The rest
(options, uuid, strict, taking over torch.ops.symm_mem's nodes) runs the pass on small traced
graphs, with no compile.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.distributed as dist

import asynctp.torch as atp
from asynctp.torch import compile as atp_compile


def _mlp(x_shard, w1, w2, group_name):
    """[b, s/ws, h] -> all-gather(seq) -> @ w1 [h, f/ws] -> relu -> @ w2 [f/ws, h] -> RS(seq)."""
    import torch.distributed._functional_collectives as funcol

    # torch 2.15 names them *_single_autograd (the *_tensor_autograd names are deprecated).
    gather = getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd
    scatter = (getattr(funcol, "reduce_scatter_single_autograd", None)
               or funcol.reduce_scatter_tensor_autograd)
    x = gather(x_shard, 1, group_name)
    h = torch.relu(x @ w1)
    return scatter(h @ w2, "sum", 1, group_name)


def compiled_mlp_step():
    group = dist.group.WORLD
    import torch._inductor.config as inductor_config

    from asynctp.fx_export import capture_post_grad_graphs

    ws, rank, name = group.size(), group.rank(), group.group_name
    torch.manual_seed(0)
    b, s, h, f = 2, 4 * ws, 16, 8 * ws
    x = torch.randn(b, s, h).chunk(ws, dim=1)[rank].contiguous()
    w1 = torch.randn(h, f).chunk(ws, dim=1)[rank].contiguous() / 4
    w2 = torch.randn(f, h).chunk(ws, dim=0)[rank].contiguous() / 4
    target = torch.randn(b, s // ws, h)

    def step(fn, x, w1, w2):
        params = [t.clone().requires_grad_() for t in (x, w1, w2)]
        y = fn(*params, name)
        ((y - target) ** 2).sum().backward()
        return [y.detach()] + [p.grad for p in params]

    eager = step(_mlp, x, w1, w2)
    torch._dynamo.reset()
    # A chain: the exporter's pass is installed first, asynctp's runs after it. The caches are
    # off so that both graphs really compile.
    with inductor_config.patch(force_disable_caches=True), capture_post_grad_graphs(ws) as seen:
        atp.enable()
        try:
            compiled = step(torch.compile(_mlp, dynamic=False), x, w1, w2)
        finally:
            atp.disable()
        restored = type(inductor_config.post_grad_custom_post_pass).__name__
    for want, got, what in zip(eager, compiled, ("y", "dx", "dw1", "dw2")):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=what)
    exported_targets = [{n["target"] for n in doc["nodes"]} for doc in seen]
    return {
        "report": atp.fusion_report(),
        "exported": [sorted(t for t in targets if "c10d" in t) for targets in exported_targets],
        "usage": atp.usage(name),
        "restored": restored,
    }


def test_compiled_mlp_fuses_every_collective(pool2):
    for rank, result in enumerate(pool2.run(compiled_mlp_step)):
        report = result["report"]
        graphs = sorted({e["graph"] for e in report})
        assert graphs == [0, 1], f"rank {rank}: the pass saw graphs {graphs}, not fwd and bwd"
        for g in graphs:
            kinds = sorted(e["kind"] for e in report if e["graph"] == g)
            assert kinds == ["all_gather", "reduce_scatter"], f"rank {rank} graph {g}: {report}"
        lines = "\n".join(f"{e['graph']} {e['kind']} {e['node']}: {e['detail']}" for e in report)
        assert all(e["fused"] and e["outcome"] == "fused" for e in report), lines
        assert all(e["detail"].startswith("into fused_") for e in report), lines
        # The exporter (chained first) saw the graphs before the fusion: both ran.
        assert result["exported"] == [
            ["_c10d_functional.all_gather_into_tensor.default",
             "_c10d_functional.reduce_scatter_tensor.default",
             "_c10d_functional.wait_tensor.default"]] * 2, result["exported"]
        usage = result["usage"]
        assert sum(usage.get("all_gather_matmul", {}).values()) >= 2, usage
        assert sum(usage.get("matmul_reduce_scatter", {}).values()) >= 2, usage
        assert result["restored"] == "_ExportPass"  # disable() put the exporter's pass back


def _collective_graph(group_name: str, fusable_rs: bool):
    """A traced graph (fake values): x -> all-gather -> mm; P -> reduce-scatter, where P is a
    matmul (fusable) or a matmul whose result is also returned (matched, not fusable)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    ws = dist.get_world_size()

    def fn(x, w, a, b):
        g = torch.ops._c10d_functional.all_gather_into_tensor(x, ws, group_name)
        g = torch.ops._c10d_functional.wait_tensor(g)
        p = a @ b
        r = torch.ops._c10d_functional.reduce_scatter_tensor(p, "sum", ws, group_name)
        r = torch.ops._c10d_functional.wait_tensor(r)
        return (g @ w, r) if fusable_rs else (g @ w, r, p)

    with FakeTensorMode():
        args = (torch.empty(4, 8), torch.empty(8, 6), torch.empty(4 * ws, 5), torch.empty(5, 6))
        return make_fx(fn)(*args).graph


def strict_and_report():
    group = dist.group.WORLD
    name = group.group_name
    fusion_pass = atp.enable(strict=True)
    try:
        graph = _collective_graph(name, fusable_rs=True)
        fusion_pass(graph)
        targets = {str(n.target) for n in graph.nodes}
        assert "asynctp.fused_all_gather_matmul.default" in targets, targets
        assert "asynctp.fused_matmul_reduce_scatter.default" in targets, targets
        assert not any("c10d" in t for t in targets), targets
        assert [e["fused"] for e in atp.fusion_report()] == [True, True]
        atp.reset_fusion_report()
        graph = _collective_graph(name, fusable_rs=False)
        before = [str(n.target) for n in graph.nodes]
        with pytest.raises(atp.FusionError, match="reduce_scatter_tensor.*other users"):
            fusion_pass(graph)
        assert [str(n.target) for n in graph.nodes] == before  # left as it was
        report = {e["kind"]: e for e in atp.fusion_report()}
        assert report["reduce_scatter"]["outcome"] == "blocked"
        assert not report["reduce_scatter"]["fused"]
        assert report["all_gather"]["fused"]
    finally:
        atp.disable()
    return True


def test_strict_raises_on_a_matched_unfused_collective(pool2):
    pool2.run(strict_and_report)


def test_the_pass_logs_one_line_per_collective(caplog):
    dist.init_process_group("fake", store=_fake_store(), rank=0, world_size=2)
    try:
        fusion_pass = atp.enable()
        try:
            with caplog.at_level(logging.INFO, logger="asynctp"):
                fusion_pass(_collective_graph(dist.group.WORLD.group_name, fusable_rs=False))
        finally:
            atp.disable()
    finally:
        dist.destroy_process_group()
    lines = [r.getMessage() for r in caplog.records if r.name == "asynctp"]
    assert len(lines) == 2, lines
    assert any(line.startswith("all_gather") and ": fused: into fused_" in line for line in lines)
    assert any(line.startswith("reduce_scatter") and "blocked" in line for line in lines)


def _fake_store():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore()


def test_options_and_uuid():
    import torch._inductor.config as inductor_config

    assert inductor_config.post_grad_custom_post_pass is None
    with pytest.raises(asynctp_error(), match="unknown option enable_everything"):
        atp.enable(enable_everything=True)
    with pytest.raises(asynctp_error(), match="option enable_last_dim is 1"):
        atp.enable(enable_last_dim=1)
    assert inductor_config.post_grad_custom_post_pass is None  # nothing installed by a failure

    uuids = {}
    for key, options in {"default": {}, "last_dim": {"enable_last_dim": True},
                         "bucket": {"bucket_mb": [4]}, "swiglu": {"enable_swiglu": True}}.items():
        p = atp.enable(**options)
        try:
            assert inductor_config.post_grad_custom_post_pass is p
            uuids[key] = p.uuid()
            assert p.options["enable_last_dim"] == (key == "last_dim")
            assert p.options["enable_swiglu"] == (key == "swiglu")
        finally:
            atp.disable()
        assert inductor_config.post_grad_custom_post_pass is None
    assert len(set(uuids.values())) == 4, uuids
    assert atp.enable().uuid() == uuids["default"]  # deterministic
    atp.disable()
    assert atp.enable(strict=True).uuid() != uuids["default"]
    atp.disable()

    # Chained after a cacheable pass: the uuid follows that pass's; after an uncacheable one
    # (a plain callable, or uuid() None), the chain is uncacheable too.
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class Previous(CustomGraphPass):
        def __init__(self, tag):
            self.tag, self.calls = tag, 0

        def __call__(self, graph):
            self.calls += 1

        def uuid(self):
            return self.tag

    with inductor_config.patch(post_grad_custom_post_pass=Previous("a")):
        a = atp.enable().uuid()
        atp.disable()
    with inductor_config.patch(post_grad_custom_post_pass=Previous("b")):
        b = atp.enable().uuid()
        atp.disable()
    assert len({a, b, uuids["default"]}) == 3
    with inductor_config.patch(post_grad_custom_post_pass=lambda graph: None):
        assert atp.enable().uuid() is None
        atp.disable()

    # A list of passes (torch >= 2.10 takes one) chains as a whole.
    with inductor_config.patch(post_grad_custom_post_pass=[Previous("a"), Previous("b")]):
        ab = atp.enable().uuid()
        atp.disable()
    assert ab is not None and ab not in (a, b)

    # A pass that needs is_inference cannot be chained: a named error, nothing installed.
    from torch._inductor.custom_graph_pass import CustomInferenceAwareGraphPass

    class Aware(CustomInferenceAwareGraphPass):
        def __call__(self, graph, is_inference):
            pass

        def uuid(self):
            return "aware"

    aware = Aware()
    with inductor_config.patch(post_grad_custom_post_pass=aware):
        with pytest.raises(asynctp_error(), match="needs is_inference"):
            atp.enable()
        assert inductor_config.post_grad_custom_post_pass is aware

    # The chain runs the previous pass on graphs without collectives too.
    previous = Previous("c")
    with inductor_config.patch(post_grad_custom_post_pass=previous):
        p = atp.enable()
        p(torch.fx.symbolic_trace(lambda x: x + 1).graph)
        atp.disable()
        assert inductor_config.post_grad_custom_post_pass is previous
    assert previous.calls == 1


def asynctp_error():
    import asynctp

    return asynctp.InvalidArgumentError


def symm_mem_take_over():
    """Inductor's own pass (torch._inductor.config._micro_pipeline_tp) leaves
    torch.ops.symm_mem fused nodes; asynctp's pass retargets them to torch.ops.asynctp."""
    group = dist.group.WORLD
    import torch.distributed._symmetric_memory  # noqa: F401 (defines torch.ops.symm_mem)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    name = group.group_name

    ws = group.size()

    def fn(a, w, h, w2, x, w3):
        _, outs = torch.ops.symm_mem.fused_all_gather_matmul(a, [w], 0, name)
        rs = torch.ops.symm_mem.fused_matmul_reduce_scatter(h, w2, "sum", 0, name)
        return outs[0], rs, _ag(x, 0, name, ws) @ w3  # a gather torch's pass left to asynctp

    with FakeTensorMode():
        args = (torch.empty(4, 8), torch.empty(8, 6), torch.empty(4 * ws, 5), torch.empty(5, 6),
                torch.empty(3, 4), torch.empty(4, 2))
        graph = make_fx(fn)(*args).graph
    p = atp.enable()
    try:
        p(graph)
    finally:
        atp.disable()
    targets = sorted(str(n.target) for n in graph.nodes if "fused" in str(n.target))
    assert targets == ["asynctp.fused_all_gather_matmul.default",
                       "asynctp.fused_all_gather_matmul.default",
                       "asynctp.fused_matmul_reduce_scatter.default"], targets
    report = atp.fusion_report()
    kinds = sorted(e["kind"] for e in report)
    assert kinds == ["all_gather", "all_gather", "reduce_scatter"], report
    assert all(e["fused"] for e in report), report
    assert sum("taken over" in e["detail"] for e in report) == 2, report
    return True


def test_takes_over_symm_mem_fused_nodes(pool2):
    pool2.run(symm_mem_take_over)


# ---- every pattern of `asynctp passes`, applied back to FX and run ------------------------------
# Each case is traced (fake values, as Inductor's graphs carry), run as traced on real tensors,
# rewritten by the pass, and run again: the outputs must agree, and the rewritten graph must hold
# the expected torch.ops.asynctp ops and no collective.


def _ag(x, dim, name, ws):
    """PyTorch's gather on `dim`: all-gather on dim 0, then the chunk-cat."""
    g = torch.ops._c10d_functional.wait_tensor(
        torch.ops._c10d_functional.all_gather_into_tensor(x, ws, name))
    return g if dim == 0 else torch.cat(torch.split(g, x.shape[0]), dim)


def _rs(p, dim, name, ws):
    """PyTorch's reduce-scatter on `dim`: the chunk-cat to dim 0, then the reduce-scatter."""
    if dim != 0:
        p = torch.cat(torch.split(p, p.shape[dim] // ws, dim))
    return torch.ops._c10d_functional.wait_tensor(
        torch.ops._c10d_functional.reduce_scatter_tensor(p, "sum", ws, name))


def _f8(*shape):
    return torch.randn(*shape).to(torch.float8_e4m3fn)


def _cases(ws, name):
    """name: (fn, inputs, the fused ops the rewritten graph must hold[, an eager reference])."""
    cases = {}
    # Several Bs share one gather (Q/K/V, gate/up); the gathered tensor is also an output.
    cases["several_bs_return_a"] = (
        lambda x, wa, wb: (lambda g: (g @ wa, g @ wb, g))(_ag(x, 0, name, ws)),
        (torch.randn(4, 8), torch.randn(8, 6), torch.randn(8, 5)),
        ["fused_all_gather_matmul"])
    # The sequence dim of [b, s, h] (chunk-cat), through reshape -> mm -> reshape, both ways.
    cases["sequence_dim"] = (
        lambda x, w, w2: _rs(
            (torch.relu((_ag(x, 1, name, ws).reshape(4 * ws, 8) @ w)) @ w2).reshape(2, 2 * ws, 8),
            1, name, ws),
        (torch.randn(2, 2, 8), torch.randn(8, 6), torch.randn(6, 8)),
        ["fused_all_gather_matmul", "fused_matmul_reduce_scatter"])
    # The input gradient of projections that shared a gather: a sum of matmuls.
    cases["sum_of_matmuls"] = (
        lambda a1, b1, a2, b2, a3, b3: _rs(a1 @ b1 + a2 @ b2 + a3 @ b3, 0, name, ws),
        (torch.randn(2 * ws, 3), torch.randn(3, 4), torch.randn(2 * ws, 5), torch.randn(5, 4),
         torch.randn(2 * ws, 2), torch.randn(2, 4)),
        ["fused_matmuls_reduce_scatter"])
    # The gathered tensor as transposed right-hand operand: mm(X, G^T).
    cases["transposed_rhs"] = (
        lambda x, big: big @ _ag(x, 0, name, ws).t(),
        (torch.randn(3, 8), torch.randn(5, 8)),
        ["fused_all_gather_matmul"])
    # The gate/up projection of a SwiGLU MLP: silu(g) * u goes into the fused gather's
    # epilogue; the products also leave the graph (a forward saves them for the backward), so
    # the op returns them too. bf16, the dtype the op rounds once into (torch rounds silu(g)
    # first).
    def swiglu(save_pre):
        def fn(x, w13):
            p = _ag(x, 0, name, ws) @ w13
            g, u = p.chunk(2, dim=-1)
            out = torch.nn.functional.silu(g) * u
            return (out, p) if save_pre else (out,)

        return fn

    for save_pre in (True, False):
        cases[f"swiglu_save_pre_{save_pre}"] = (
            swiglu(save_pre),
            (torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(8, 12, dtype=torch.bfloat16)),
            ["fused_all_gather_matmul_swiglu"])
    # The contraction dim gathered, the output dim scattered.
    cases["last_dims"] = (
        lambda x, w, a, b: (_ag(x, 1, name, ws) @ w, _rs(a @ b, 1, name, ws)),
        (torch.randn(4, 3), torch.randn(3 * ws, 5), torch.randn(4, 6), torch.randn(6, 2 * ws)),
        ["fused_all_gather_matmul", "fused_matmul_reduce_scatter"])

    # float8 row-wise: reshape -> _scaled_mm -> reshape, the row scale gathered with its tensor;
    # then a tensor-wise scaled matmul reduce-scattered. gloo cannot gather float8, so the
    # reference gathers its bytes. fast: both _scaled_mms with use_fast_accum=True.
    def float8(gather, fast=False):
        def fn(x, x_scale, w, w_scale, h, h_scale, w2, w2_scale):
            g = gather(x, 0, name, ws).reshape(4 * ws, 8)
            gs = _ag(x_scale, 0, name, ws).reshape(4 * ws, 1)
            y = torch._scaled_mm(g, w.t(), gs, w_scale.t(), out_dtype=torch.bfloat16,
                                 use_fast_accum=fast)
            z = torch._scaled_mm(h, w2.t(), h_scale, w2_scale, out_dtype=torch.bfloat16,
                                 use_fast_accum=fast)
            return y.reshape(2 * ws, 2, 6), _rs(z, 0, name, ws)

        return fn

    def gather_bytes(x, dim, name, ws):
        return _ag(x.view(torch.uint8), dim, name, ws).view(x.dtype)

    cases["float8"] = (
        float8(_ag),
        (_f8(2, 2, 8), torch.rand(2, 2, 1) + 0.5, _f8(6, 8), torch.rand(6, 1) + 0.5,
         _f8(2 * ws, 8), torch.tensor(0.75), _f8(4, 8), torch.tensor(1.25)),
        ["fused_all_gather_scaled_matmul", "fused_scaled_matmul_reduce_scatter"],
        float8(gather_bytes))
    cases["float8_fast_accum"] = (
        float8(_ag, True),
        (_f8(2, 2, 8), torch.rand(2, 2, 1) + 0.5, _f8(6, 8), torch.rand(6, 1) + 0.5,
         _f8(2 * ws, 8), torch.tensor(0.75), _f8(4, 8), torch.tensor(1.25)),
        ["fused_all_gather_scaled_matmul", "fused_scaled_matmul_reduce_scatter"],
        float8(gather_bytes, True))
    return cases


def _fast_accum_flags(graph):
    """The use_fast_accum of the rewritten graph's scaled fused ops: (each all-gather's list, each
    reduce-scatter's bool)."""
    ops = torch.ops.asynctp
    ag = [list(n.args[9]) for n in graph.nodes
          if n.target is ops.fused_all_gather_scaled_matmul.default]
    rs = [n.kwargs.get("use_fast_accum", False) for n in graph.nodes
          if n.target is ops.fused_scaled_matmul_reduce_scatter.default]
    return ag, rs


def _check_rewrite(fusion_pass, case, fn, inputs, reference=None):
    """Traces fn, runs it (or reference) and the graph the pass rewrote on real inputs, compares
    the outputs; returns the report and the rewritten graph's targets."""
    from torch.fx.experimental.proxy_tensor import make_fx

    atp.reset_fusion_report()
    gm = make_fx(fn, tracing_mode="fake")(*inputs)
    want = (reference or gm)(*inputs)
    fusion_pass(gm.graph)
    gm.recompile()
    got = gm(*inputs)
    for i, (a, b) in enumerate(zip(got, want)):
        tol = {"rtol": 1.6e-2, "atol": 1e-2} if b.dtype == torch.bfloat16 else {}
        torch.testing.assert_close(a, b, **tol, msg=f"{case}: output {i}")
    return atp.fusion_report(), [str(n.target) for n in gm.graph.nodes], gm.graph


def every_pattern():
    group = dist.group.WORLD
    ws, name = group.size(), group.group_name
    torch.manual_seed(group.rank() + 1)
    fusion_pass = atp.enable(enable_last_dim=True, enable_transpose=True, enable_swiglu=True)
    try:
        for case, (fn, inputs, fused, *reference) in _cases(ws, name).items():
            report, targets, graph = _check_rewrite(fusion_pass, case, fn, inputs, *reference)
            assert report and all(e["fused"] for e in report), f"{case}: {report}"
            assert not any("c10d" in t for t in targets), f"{case}: {targets}"
            got_ops = sorted({t.split(".")[1] for t in targets if t.startswith("asynctp.")})
            assert got_ops == sorted(fused), f"{case}: {got_ops}"
            if case.startswith("swiglu"):
                swiglu_op = torch.ops.asynctp.fused_all_gather_matmul_swiglu.default
                swiglu_ops = [n for n in graph.nodes if n.target is swiglu_op]
                assert [n.kwargs.get("return_pre") for n in swiglu_ops] == [
                    case.endswith("True")], (case, graph)
                assert all("SwiGLU" in e["detail"] for e in report), (case, report)
            if case.startswith("float8"):
                # Each _scaled_mm's use_fast_accum is carried into the op that replaced it.
                fast = case == "float8_fast_accum"
                assert _fast_accum_flags(graph) == ([[fast]], [fast]), (case, graph)
    finally:
        atp.disable()

    # Bucketing alone: two small gathers that feed no matmul become one gather of a flat buffer.
    fusion_pass = atp.enable(no_fuse=True, bucket_mb=[1])
    try:
        report, targets, _ = _check_rewrite(
            fusion_pass, "bucketing",
            lambda a, b: (_ag(a, 0, name, ws).exp(), _ag(b, 0, name, ws).exp()),
            (torch.randn(2, 4), torch.randn(3, 4)))
    finally:
        atp.disable()
    assert [e["outcome"] for e in report] == ["bucketed", "bucketed"], report
    assert not any(e["fused"] for e in report), report
    assert targets.count("_c10d_functional.all_gather_into_tensor.default") == 1, targets
    return True


def test_every_pattern_is_applied_back_and_runs_equal(pool2):
    pool2.run(every_pattern)
