"""asynctp.torch.functional: the fused ops as Python functions. An eager call that needs no
dispatcher goes straight to asynctp's kernel, or through the direct route's autograd Function
where it records a graph; every other call goes through torch.ops. All give torch.ops's results
(the gradients: test_autograd.py), and the right route is taken in each case."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from asynctp.torch import _ops, functional

OPS = torch.ops.asynctp


def _group_name():
    return dist.group.WORLD.group_name


def _randn(shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) / 4).to(dtype)


def case_same_results():
    """Each function against its torch.ops op, bit for bit, eager and no-grad."""
    name = _group_name()
    rank, ws = dist.get_rank(), dist.get_world_size()
    for dtype in (torch.float32, torch.bfloat16):
        a = _randn((2 * ws, 8), 10 + rank, dtype)
        bs = [_randn((8, 6), 20, dtype), _randn((8, 4), 21, dtype)]
        for return_A in (True, False):
            got = functional.fused_all_gather_matmul(a, bs, 0, name, return_A=return_A)
            ref = OPS.fused_all_gather_matmul(a, bs, 0, name, return_A=return_A)
            assert (got[0] is None) == (ref[0] is None)
            if ref[0] is not None:
                assert torch.equal(got[0], ref[0])
            assert all(torch.equal(g, r) for g, r in zip(got[1], ref[1]))
        h = _randn((2 * ws, 8), 30 + rank, dtype)
        w = _randn((8, 4), 31, dtype)
        for op in ("sum", "avg"):
            assert torch.equal(functional.fused_matmul_reduce_scatter(h, w, op, 0, name),
                               OPS.fused_matmul_reduce_scatter(h, w, op, 0, name))
        assert torch.equal(
            functional.fused_matmuls_reduce_scatter([h, h], [w, w], "sum", 0, name),
            OPS.fused_matmuls_reduce_scatter([h, h], [w, w], "sum", 0, name))
    return True


def test_same_results(pool):
    if pool.world_size > 2:
        pytest.skip("the routes do not depend on the world size")
    pool.run(case_same_results)


def case_negative_views():
    """A real view with torch's negative bit (the imaginary part of a conjugate, which reads its
    storage negated) gives torch.ops's results: its storage holds the values' negatives, which
    asynctp's kernel cannot know, so such a call takes the dispatcher (which materializes it)."""
    name = _group_name()
    rank, ws = dist.get_rank(), dist.get_world_size()
    z = torch.complex(_randn((2 * ws, 8), 40 + rank), _randn((2 * ws, 8), 41 + rank))
    a = z.conj().imag  # f32 [2 ws, 8], strides (16, 2), is_neg()
    w = _randn((8, 6), 42)
    assert a.is_neg()
    _, (out,) = functional.fused_all_gather_matmul(a, [w], 0, name)
    assert torch.equal(out, OPS.fused_all_gather_matmul(a.clone(), [w], 0, name)[1][0])
    # Negative views with a unit stride (torch._neg_view makes them) as GEMM operands.
    h, v = _randn((2 * ws, 8), 43 + rank), _randn((8, 6), 44)
    got = functional.fused_matmul_reduce_scatter(h, torch._neg_view(v), "sum", 0, name)
    assert torch.equal(got, OPS.fused_matmul_reduce_scatter(h, -v, "sum", 0, name))
    assert torch.equal(
        functional.fused_matmuls_reduce_scatter([torch._neg_view(h), h], [v, v], "sum", 0, name),
        OPS.fused_matmuls_reduce_scatter([-h, h], [v, v], "sum", 0, name))
    return True


def test_negative_views(pool2):
    pool2.run(case_negative_views)


def case_routes():
    """Which calls skip the dispatcher: the eager ones on plain tensors, to the kernel without a
    gradient to record and through the direct route with one."""
    name = _group_name()
    ws = dist.get_world_size()
    a, b = _randn((2 * ws, 8), 1), _randn((8, 6), 2)
    assert functional._route((a, b)) == functional._KERNEL
    with torch.no_grad():
        assert functional._route((a, b.requires_grad_())) == functional._KERNEL
    assert functional._route((a, b)) == functional._DIRECT  # b requires grad, grad mode on
    assert not functional._plain((a, b))  # (float8 has no direct route: torch.ops)
    b.requires_grad_(False)
    with FakeTensorMode():
        assert not functional._plain((a, b))
    fake = FakeTensorMode().from_tensor(a)
    assert not functional._plain((fake, b))
    # Meta tensors (shapes only) go to the ops' fake kernels, through torch.ops.
    meta_a, meta_b = a.to("meta"), b.to("meta")
    for grad in (False, True):
        assert functional._route((meta_a, meta_b.requires_grad_(grad))) == functional._DISPATCHER
        A_out, (out,) = functional.fused_all_gather_matmul(meta_a, [meta_b], 0, name)
        assert A_out.is_meta and out.is_meta and out.shape == (2 * ws * ws, 6)
        assert out.requires_grad == grad

    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passing():
        assert not functional._plain((a, b))
    assert not torch.func.vmap(lambda x: torch.tensor(functional._plain((x, b))))(a[None])
    # While torch's profiler records, through torch.ops (so that the call shows by its name).
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert not functional._plain((a, b))
    assert functional._plain((a, b))
    # Through torch.compile the function is traced into the graph as the torch.ops op.
    compiled = torch.compile(
        lambda x, y: functional.fused_all_gather_matmul(x, [y], 0, name, return_A=False)[1][0],
        backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(a, b), OPS.fused_all_gather_matmul(a, [b], 0, name, return_A=False)[1][0])
    # With a gradient to record, the call goes through the direct route's autograd Function, and
    # under a mode through torch.ops's autograd.
    x = a.clone().requires_grad_()
    _, (y,) = functional.fused_all_gather_matmul(x, [b], 0, name, return_A=False)
    assert type(y.grad_fn).__name__ == "_DirectBackward"
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    with Passing():
        _, (y,) = functional.fused_all_gather_matmul(x, [b], 0, name, return_A=False)
    assert y.grad_fn is not None and type(y.grad_fn).__name__ != "_DirectBackward"
    return True


def test_routes(pool2):
    pool2.run(case_routes)


def test_direct_calls_skip_the_dispatcher(monkeypatch):
    """On plain tensors with no gradient to record the function calls the kernel itself, with
    one through the direct route; under the profiler it calls torch.ops."""
    seen = []
    monkeypatch.setattr(functional, "_OPS", type("Ops", (), {
        "fused_all_gather_matmul": staticmethod(lambda *a, **k: seen.append("ops") or (None, [])),
    }))
    monkeypatch.setattr(_ops, "_all_gather_matmul",
                        lambda *a, **k: seen.append("kernel") or (None, []))
    monkeypatch.setattr(functional._autograd, "direct",
                        lambda *a, **k: seen.append("direct") or (None,))
    a, b = torch.zeros(2, 4), torch.zeros(4, 3)
    functional.fused_all_gather_matmul(a, [b], 0, "g", return_A=False)
    functional.fused_all_gather_matmul(a, [b.requires_grad_()], 0, "g", return_A=False)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        functional.fused_all_gather_matmul(a, [b], 0, "g", return_A=False)
    with torch.no_grad():
        functional.fused_all_gather_matmul(a, [b], 0, "g", return_A=False)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            functional.fused_all_gather_matmul(a, [b], 0, "g", return_A=False)
        functional.fused_all_gather_matmul(a, [b], 0, "g", return_A=False)
    assert seen == ["kernel", "direct", "ops", "kernel", "ops", "kernel"]


def case_profiled_calls_show_by_name():
    """Under torch.profiler every function's call is an event named after its op, with the input
    shapes; the results are those of the direct route."""
    name = _group_name()
    rank, ws = dist.get_rank(), dist.get_world_size()
    a = _randn((2 * ws, 8), 40 + rank)
    b = _randn((8, 6), 41)
    h = _randn((2 * ws, 8), 42 + rank)
    w = _randn((8, 4), 43)
    direct_ag = functional.fused_all_gather_matmul(a, [b], 0, name, return_A=False)[1][0]
    direct_rs = functional.fused_matmul_reduce_scatter(h, w, "sum", 0, name)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                record_shapes=True) as prof:
        profiled_ag = functional.fused_all_gather_matmul(a, [b], 0, name, return_A=False)[1][0]
        profiled_rs = functional.fused_matmul_reduce_scatter(h, w, "sum", 0, name)
        functional.fused_matmuls_reduce_scatter([h, h], [w, w], "sum", 0, name)
    assert torch.equal(profiled_ag, direct_ag) and torch.equal(profiled_rs, direct_rs)
    events = {e.key: e for e in prof.key_averages(group_by_input_shape=True)}
    for op in ("fused_all_gather_matmul", "fused_matmul_reduce_scatter",
               "fused_matmuls_reduce_scatter"):
        assert f"asynctp::{op}" in events, sorted(events)
        assert events[f"asynctp::{op}"].count == 1
    assert [2 * ws, 8] in events["asynctp::fused_all_gather_matmul"].input_shapes
    return True


def test_profiled_calls_show_by_name(pool2):
    pool2.run(case_profiled_calls_show_by_name)
