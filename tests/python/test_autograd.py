"""Gradients of torch.ops.asynctp's fused ops against the unfused composition.

The reference emulates the whole group in one process with plain torch autograd: every rank's
leaf tensors, the all-gather as a torch.cat, the reduce-scatter as a sum then a chunk, and a loss
sum_r <dO_r, out_r> whose upstream gradients dO_r are drawn per rank. Every rank rebuilds all of
it from one seed and compares its own gradients with the reference's for its rank. f32 is
compared tightly (the reference runs in f64), bf16 against an f32 reference with a bf16 tolerance.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import asynctp.torch  # noqa: F401  (registers the ops and their backward formulas)
from asynctp.torch import functional

# The two routes to the backward formulas: torch.ops.asynctp (register_autograd's kernel) and the
# direct route of asynctp.torch.functional's eager calls (a torch.autograd.Function over the same
# kernel and formulas). Every gradient case runs through both.
ROUTES = {"ops": torch.ops.asynctp, "direct": functional}


def check_route(out, route):
    """The graph node that produced `out` is the route's own."""
    direct = type(out.grad_fn).__name__ == "_DirectBackward"
    assert direct == (route == "direct"), f"{route}: recorded by {type(out.grad_fn).__name__}"


DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


# (rtol, atol as a fraction of the reference's largest magnitude). f32: the reduction order only.
# bf16 (8-bit mantissa) and f16 (11-bit): the roundings of the output and of a gradient that
# backward gathers or sums in its dtype before the weight-gradient matmul: a few ulps.
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (4e-3, 4e-3)}


def assert_close(actual, expected, dtype, what):
    assert actual is not None, f"{what}: no gradient"
    assert actual.dtype == dtype, f"{what}: dtype {actual.dtype}, expected {dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    rtol, atol = TOL[dtype]
    scale = max(expected.abs().max().item(), 1.0)
    torch.testing.assert_close(
        actual.double(),
        expected.double(),
        rtol=rtol,
        atol=atol * scale,
        msg=lambda m: f"{what}: {m}",
    )


def randn(gen, shape, dtype):
    # Values rounded to the test dtype first, so the reference starts from the same numbers.
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def shard_shape(ndim: int, dim: int, ws: int) -> tuple[list[int], int]:
    """A shard's shape with `dim` gathered/scattered, and the full contraction size K."""
    shape = [3, 2, 5][-ndim:]  # [.., K]; K = 5 unless the gather is on it
    if dim == ndim - 1:
        shape[-1] = 3  # per-rank slice of K
        return shape, 3 * ws
    shape[dim] = 2
    return shape, shape[-1]


# ---- fused_all_gather_matmul ----------------------------------------------------------------


def one_all_gather_matmul(dtype_name, ndim, gather_dim, num_bs, return_A, seed, route):
    group = dist.group.WORLD

    dtype = DTYPES[dtype_name]
    ref_dtype = torch.float64 if dtype == torch.float32 else torch.float32
    ws, rank, name = group.size(), group.rank(), group.group_name
    gen = torch.Generator().manual_seed(seed)
    shape, K = shard_shape(ndim, gather_dim, ws)
    Ns = [4, 6, 2][:num_bs]
    shards = [randn(gen, shape, dtype) for _ in range(ws)]
    Bs = [[randn(gen, [K, n], dtype) for n in Ns] for _ in range(ws)]  # rank r's Bs
    full_shape = list(shape)
    full_shape[gather_dim] *= ws
    full_shape[-1] = K
    out_shape = lambda n: full_shape[:-1] + [n]  # noqa: E731
    dOs = [[randn(gen, out_shape(n), dtype) for n in Ns] for _ in range(ws)]
    dAs = [randn(gen, full_shape, dtype) for _ in range(ws)]

    # Reference: every rank's forward in one process.
    ref_shards = [s.to(ref_dtype).requires_grad_() for s in shards]
    ref_Bs = [[B.to(ref_dtype).requires_grad_() for B in Bs_r] for Bs_r in Bs]
    A_full = torch.cat(ref_shards, dim=gather_dim)
    loss = 0
    for r in range(ws):
        for B, dO in zip(ref_Bs[r], dOs[r]):
            loss = loss + ((A_full @ B) * dO.to(ref_dtype)).sum()
        if return_A:
            loss = loss + (A_full * dAs[r].to(ref_dtype)).sum()
    loss.backward()

    # asynctp, this rank.
    A_shard = shards[rank].clone().requires_grad_()
    my_Bs = [B.clone().requires_grad_() for B in Bs[rank]]
    A_out, outs = ROUTES[route].fused_all_gather_matmul(
        A_shard, my_Bs, gather_dim, name, return_A=return_A
    )
    assert (A_out is not None) == return_A
    check_route(outs[0], route)
    grads_out = list(dOs[rank])
    tensors = list(outs)
    if return_A:
        tensors.append(A_out)
        grads_out.append(dAs[rank])
    torch.autograd.backward(tensors, grads_out)

    what = (
        f"ws={ws} rank={rank} {dtype_name} shape={shape} gather_dim={gather_dim} "
        f"Bs={num_bs} return_A={return_A} route={route}"
    )
    assert_close(A_shard.grad, ref_shards[rank].grad, dtype, f"dA_shard {what}")
    for i, B in enumerate(my_Bs):
        assert_close(B.grad, ref_Bs[rank][i].grad, dtype, f"dBs[{i}] {what}")


def case_all_gather_matmul_unused_outputs(seed):
    """Only some outputs reach the loss: their gradients are None in backward, not zeros."""
    group = dist.group.WORLD
    ws, rank, name = group.size(), group.rank(), group.group_name
    gen = torch.Generator().manual_seed(seed)
    shards = [randn(gen, [2, 5], torch.float32) for _ in range(ws)]
    Bs = [[randn(gen, [5, n], torch.float32) for n in (3, 4)] for _ in range(ws)]
    ref_shards = [s.double().requires_grad_() for s in shards]
    ref_B1 = [Bs_r[1].double().requires_grad_() for Bs_r in Bs]
    A_full = torch.cat(ref_shards)
    sum((A_full @ ref_B1[r]).square().sum() for r in range(ws)).backward()

    for route, api in ROUTES.items():
        A_shard = shards[rank].clone().requires_grad_()
        my_Bs = [B.clone().requires_grad_() for B in Bs[rank]]
        _, outs = api.fused_all_gather_matmul(A_shard, my_Bs, 0, name, return_A=True)
        check_route(outs[1], route)
        outs[1].square().sum().backward()
        what = f"ws={ws} route={route}"
        assert_close(A_shard.grad, ref_shards[rank].grad, torch.float32, f"dA_shard {what}")
        assert my_Bs[0].grad is None, f"a B whose output is unused has no gradient: {what}"
        assert_close(my_Bs[1].grad, ref_B1[rank].grad, torch.float32, f"dBs[1] {what}")


def case_one_side_grads(seed):
    """Only the activations or only the weights require grad: the other side gets none, and the
    backward skips its work (the weight-only matmul reduce-scatter gathers without the matmul)."""
    group = dist.group.WORLD
    ws, rank, name = group.size(), group.rank(), group.group_name
    gen = torch.Generator().manual_seed(seed)
    shards = [randn(gen, [2, 5], torch.float32) for _ in range(ws)]
    Bs = [randn(gen, [5, 3], torch.float32) for _ in range(ws)]
    As = [randn(gen, [2 * ws, 5], torch.float32) for _ in range(ws)]
    dO_ag = [randn(gen, [2 * ws, 3], torch.float32) for _ in range(ws)]
    dO_rs = [randn(gen, [2, 3], torch.float32) for _ in range(ws)]

    ref_shards = [s.double().requires_grad_() for s in shards]
    ref_Bs = [b.double().requires_grad_() for b in Bs]
    ref_As = [a.double().requires_grad_() for a in As]
    A_full = torch.cat(ref_shards)
    loss = sum(((A_full @ ref_Bs[r]) * dO_ag[r].double()).sum() for r in range(ws))
    chunks = sum(ref_As[r] @ ref_Bs[r] for r in range(ws)).chunk(ws)
    loss = loss + sum((chunks[r] * dO_rs[r].double()).sum() for r in range(ws))
    loss.backward()
    # ref_Bs' gradients mix both ops (one B serves both): the weight gradients by hand instead.
    dB_ag = A_full.detach().t() @ dO_ag[rank].double()
    dB_rs = ref_As[rank].detach().t() @ torch.cat([d.double() for d in dO_rs])

    for route, side in [(route, side) for route in ROUTES for side in ("A", "B")]:
        api = ROUTES[route]
        A_shard = shards[rank].clone().requires_grad_(side == "A")
        B = Bs[rank].clone().requires_grad_(side == "B")
        _, (out,) = api.fused_all_gather_matmul(A_shard, [B], 0, name, return_A=False)
        check_route(out, route)
        out.backward(dO_ag[rank])
        A = As[rank].clone().requires_grad_(side == "A")
        B2 = Bs[rank].clone().requires_grad_(side == "B")
        api.fused_matmul_reduce_scatter(A, B2, "sum", 0, name).backward(dO_rs[rank])
        what = f"ws={ws} rank={rank} grads of {side} only, route={route}"
        if side == "A":
            assert B.grad is None and B2.grad is None, what
            assert_close(A_shard.grad, ref_shards[rank].grad, torch.float32, f"dA_shard {what}")
            assert_close(A.grad, ref_As[rank].grad, torch.float32, f"dA {what}")
        else:
            assert A_shard.grad is None and A.grad is None, what
            assert_close(B.grad, dB_ag, torch.float32, f"dB (all-gather matmul) {what}")
            assert_close(B2.grad, dB_rs, torch.float32, f"dB (matmul reduce-scatter) {what}")


def case_double_backward(seed, route):
    """Gradients of gradients (torch.autograd.grad(..., create_graph=True), then a second grad)
    of every op and every subset of leaves, against the one-process emulation: the backward
    formulas' own gathers and reduce-scatters are differentiable where a graph is recorded."""
    group = dist.group.WORLD
    ws, rank, name = group.size(), group.rank(), group.group_name
    gen = torch.Generator().manual_seed(seed)
    api = ROUTES[route]
    shards = [randn(gen, [2, 5], torch.float32) for _ in range(ws)]
    As = [randn(gen, [2 * ws, 5], torch.float32) for _ in range(ws)]
    Bs = [randn(gen, [5, 3], torch.float32) for _ in range(ws)]
    ops = {
        # op: (rank r's inputs, the fused op on them, the emulation on every rank's inputs)
        "all_gather_matmul": (shards, lambda a, b: api.fused_all_gather_matmul(
            a, [b], 0, name, return_A=False)[1][0],
            lambda a, b: [torch.cat(a) @ b[r] for r in range(ws)]),
        "all_gather_matmul returning A": (shards, lambda a, b: sum(
            (o * o).sum() for o in api.fused_all_gather_matmul(
                a, [b], 0, name, return_A=True)[1]) + api.fused_all_gather_matmul(
                a, [b], 0, name, return_A=True)[0].pow(3).sum(),
            lambda a, b: [((torch.cat(a) @ b[r]) ** 2).sum() + torch.cat(a).pow(3).sum()
                          for r in range(ws)]),
        "matmul_reduce_scatter": (As, lambda a, b: api.fused_matmul_reduce_scatter(
            a, b, "sum", 0, name),
            lambda a, b: list(sum(a[r] @ b[r] for r in range(ws)).chunk(ws))),
        # B's first 2 columns: gate | up of N = 1; the products computed again in backward.
        "all_gather_matmul_swiglu": (shards, lambda a, b: api.
                                     fused_all_gather_matmul_swiglu(a, b[:, :2], 0, name)[2],
            lambda a, b: [F.silu(torch.cat(a) @ b[r][:, :1]) * (torch.cat(a) @ b[r][:, 1:2])
                          for r in range(ws)]),
    }
    for (op, (inputs, fused, emulated)), sides in zip(
            [(k, v) for k, v in ops.items() for _ in range(3)], ["A", "B", "AB"] * len(ops)):
        what = f"ws={ws} rank={rank} {op}, grads of {sides}, route={route}"
        ref_a = [x.double().requires_grad_("A" in sides) for x in inputs]
        ref_b = [b.double().requires_grad_("B" in sides) for b in Bs]
        leaves = [t for t in (*ref_a, *ref_b) if t.requires_grad]
        loss = sum(torch.tanh(o).mul(o).sum() for o in emulated(ref_a, ref_b))
        first = torch.autograd.grad(loss, leaves, create_graph=True)
        second = torch.autograd.grad(sum(g.pow(2).sum() for g in first), leaves)
        mine = dict(zip([id(t) for t in leaves], second))
        expected = [mine[id(t)] for t in (ref_a[rank], ref_b[rank]) if t.requires_grad]

        a = inputs[rank].clone().requires_grad_("A" in sides)
        b = Bs[rank].clone().requires_grad_("B" in sides)
        my_leaves = [t for t in (a, b) if t.requires_grad]
        out = fused(a, b)
        if op != "all_gather_matmul returning A":  # (a sum of the outputs: a loss, not the op's)
            check_route(out, route)
        first = torch.autograd.grad(torch.tanh(out).mul(out).sum(), my_leaves, create_graph=True)
        got = torch.autograd.grad(sum(g.pow(2).sum() for g in first), my_leaves)
        for g, e, leaf in zip(got, expected, "AB" if sides == "AB" else sides):
            assert_close(g, e.float(), torch.float32, f"d(|grad|^2)/d{leaf}: {what}")


# ---- fused_matmul_reduce_scatter and the sum of products ------------------------------------


def one_matmul_reduce_scatter(dtype_name, ndim, scatter_dim, num_products, reduce_op, seed,
                              route):
    group = dist.group.WORLD

    dtype = DTYPES[dtype_name]
    ref_dtype = torch.float64 if dtype == torch.float32 else torch.float32
    ws, rank, name = group.size(), group.rank(), group.group_name
    gen = torch.Generator().manual_seed(seed)
    a_shape = [3, 2, 5][-ndim:]  # [.., K]
    N = 4
    if scatter_dim == ndim - 1:
        N = 2 * ws
    else:
        a_shape[scatter_dim] = 2 * ws
    Ks = [a_shape[-1], 3, 6][:num_products]  # each product its own K
    As = [[randn(gen, a_shape[:-1] + [k], dtype) for k in Ks] for _ in range(ws)]
    Bs = [[randn(gen, [k, N], dtype) for k in Ks] for _ in range(ws)]
    out_shape = a_shape[:-1] + [N]
    out_shape[scatter_dim] //= ws
    dOs = [randn(gen, out_shape, dtype) for _ in range(ws)]

    ref_As = [[a.to(ref_dtype).requires_grad_() for a in As_r] for As_r in As]
    ref_Bs = [[b.to(ref_dtype).requires_grad_() for b in Bs_r] for Bs_r in Bs]
    total = sum(a @ b for r in range(ws) for a, b in zip(ref_As[r], ref_Bs[r]))
    if reduce_op == "avg":
        total = total / ws
    chunks = total.chunk(ws, dim=scatter_dim)
    sum((chunks[r] * dOs[r].to(ref_dtype)).sum() for r in range(ws)).backward()

    my_As = [a.clone().requires_grad_() for a in As[rank]]
    my_Bs = [b.clone().requires_grad_() for b in Bs[rank]]
    if num_products == 1:
        out = ROUTES[route].fused_matmul_reduce_scatter(
            my_As[0], my_Bs[0], reduce_op, scatter_dim, name
        )
    else:
        out = ROUTES[route].fused_matmuls_reduce_scatter(
            my_As, my_Bs, reduce_op, scatter_dim, name
        )
    check_route(out, route)
    out.backward(dOs[rank])

    what = (
        f"ws={ws} rank={rank} {dtype_name} A={a_shape} scatter_dim={scatter_dim} "
        f"products={num_products} {reduce_op} route={route}"
    )
    for i in range(num_products):
        assert_close(my_As[i].grad, ref_As[rank][i].grad, dtype, f"dAs[{i}] {what}")
        assert_close(my_Bs[i].grad, ref_Bs[rank][i].grad, dtype, f"dBs[{i}] {what}")


def case_backward_runs_the_fused_ops():
    """The input gradient of an all-gather matmul is asynctp's matmul reduce-scatter, and that of
    a matmul reduce-scatter asynctp's all-gather matmul (counted by the context's usage)."""
    import asynctp.torch as atp

    name = dist.group.WORLD.group_name
    ws = dist.get_world_size()

    def calls(op):
        return sum(atp.usage(name).get(op, {}).values())

    for route, api in ROUTES.items():
        A = torch.randn(2, 8).requires_grad_()
        B = torch.randn(8, 4)
        _, (out,) = api.fused_all_gather_matmul(A, [B], 0, name, return_A=False)
        before = (calls("all_gather_matmul"), calls("matmul_reduce_scatter"))
        out.sum().backward()
        assert (calls("all_gather_matmul"), calls("matmul_reduce_scatter")) == (
            before[0],
            before[1] + 1,
        ), f"{route}: the all-gather matmul's backward ran {atp.usage(name)}"

        A2 = torch.randn(2 * ws, 8).requires_grad_()
        y = api.fused_matmul_reduce_scatter(A2, B, "sum", 0, name)
        before = (calls("all_gather_matmul"), calls("matmul_reduce_scatter"))
        y.sum().backward()
        assert (calls("all_gather_matmul"), calls("matmul_reduce_scatter")) == (
            before[0] + 1,
            before[1],
        ), f"{route}: the matmul reduce-scatter's backward ran {atp.usage(name)}"


def case_opcheck_with_grads():
    """torch.library.opcheck with inputs that require grad: the autograd registration, and the
    backward formulas traced by AOTAutograd over the fake kernels (dynamic shapes too)."""
    from torch.library import opcheck

    name = dist.group.WORLD.group_name
    ws = dist.get_world_size()
    gen = torch.Generator().manual_seed(3)

    def leaf(*shape):
        return randn(gen, list(shape), torch.float32).requires_grad_()

    ops = torch.ops.asynctp
    opcheck(
        ops.fused_all_gather_matmul,
        (leaf(2, 8), [leaf(8, 4), leaf(8, 3)], 0, name),
        {"return_A": True},
    )
    opcheck(
        ops.fused_all_gather_matmul, (leaf(2, 3, 8), [leaf(8, 4)], 1, name), {"return_A": False}
    )
    opcheck(ops.fused_matmul_reduce_scatter, (leaf(2 * ws, 8), leaf(8, 4), "avg", 0, name))
    opcheck(
        ops.fused_matmuls_reduce_scatter,
        ([leaf(2, 8), leaf(2, 5)], [leaf(8, 2 * ws), leaf(5, 2 * ws)], "sum", 1, name),
    )


# ---- the matrix (every case runs on every rank of conftest.py's pools, ws 1 to 4) ------------

DIMS = [(2, 0), (2, 1), (3, 0), (3, 1), (3, 2)]  # (ndim, gather/scatter dim); the last is K or N


def case_all_gather_matmul_grads(dtype_name):
    cases = [(nd, d, nb, ra) for nd, d in DIMS for nb in (1, 3) for ra in (True, False)]
    for route in ROUTES:
        for seed, (nd, d, nb, ra) in enumerate(cases):
            one_all_gather_matmul(dtype_name, nd, d, nb, ra, seed, route)


def case_matmul_reduce_scatter_grads(dtype_name):
    cases = [(nd, d, n, op) for nd, d in DIMS for n in (1, 3) for op in ("sum", "avg")]
    for route in ROUTES:
        for seed, (nd, d, n, op) in enumerate(cases):
            one_matmul_reduce_scatter(dtype_name, nd, d, n, op, seed, route)


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_all_gather_matmul_grads(pool, dtype_name):
    pool.run(case_all_gather_matmul_grads, dtype_name)


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_matmul_reduce_scatter_grads(pool, dtype_name):
    pool.run(case_matmul_reduce_scatter_grads, dtype_name)


def test_all_gather_matmul_unused_outputs(pool):
    pool.run(case_all_gather_matmul_unused_outputs, 7)


def test_one_side_grads(pool):
    pool.run(case_one_side_grads, 11)


@pytest.mark.parametrize("route", ROUTES)
def test_double_backward(pool, route):
    pool.run(case_double_backward, 13, route)


def test_backward_runs_the_fused_ops(pool):
    pool.run(case_backward_runs_the_fused_ops)


def test_opcheck_with_grads(pool):
    if pool.world_size > 2:
        pytest.skip("opcheck's cases are per op, not per world size: ws 1 and 2 cover them")
    pool.run(case_opcheck_with_grads)


def test_weight_grad_is_laid_out_as_the_weight():
    """A linear's B is weight.t(): its gradient comes out as the transpose of a contiguous
    [N, K], so that the weight's gradient needs no transposing copy; any other B gets a
    contiguous [K, N]. Both equal A_flat^T @ G_flat."""
    from asynctp.torch import autograd as ag

    torch.manual_seed(0)
    A, G = torch.randn(2, 3, 8), torch.randn(2, 3, 5)
    expected = A.reshape(-1, 8).t() @ G.reshape(-1, 5)
    weight = torch.randn(5, 8)
    got = ag._weight_grad(A, G, weight.t())
    assert got.shape == (8, 5) and got.t().is_contiguous()
    torch.testing.assert_close(got, expected)
    got = ag._weight_grad(A, G, torch.randn(8, 5))
    assert got.is_contiguous()
    torch.testing.assert_close(got, expected)
    got = ag._weight_grad(A, G, torch.randn(8, 5, dtype=torch.float64))
    assert got.dtype == torch.float64
