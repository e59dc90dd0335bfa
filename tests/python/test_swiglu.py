"""torch.ops.asynctp.fused_all_gather_matmul_swiglu against PyTorch's unfused ops.

    A = cat(A_shards, gather_dim);  P = A @ B  (B [K, 2N]: gate | up)
    out = silu(P[.., :N]) * P[.., N:]

The forward against the composition in f32 (f64 for f32 inputs); the gradients of A_shard and B
against autograd through that composition, with the group emulated in one process (every rank's
leaves, the gather as a cat, a loss summed over every rank's outputs with per-rank upstream
gradients), for each combination of return_A and return_pre (the backward's products saved, or
computed again) and the gradients reaching the returned A and products. And opcheck.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import asynctp.torch as atp

from test_autograd import DTYPES, assert_close, randn


def reference_dtype(dtype):
    return torch.float64 if dtype == torch.float32 else torch.float32


def swiglu(P, n):
    return F.silu(P[..., :n]) * P[..., n:]


def case_forward(dtype_name):
    group = dist.group.WORLD
    ws, rank, name = group.size(), group.rank(), group.group_name
    dtype = DTYPES[dtype_name]
    # (shard shape, gather dim, N): row gathers, a 3-D sequence gather, the contraction dim.
    for seed, (shape, g, n) in enumerate(
        [([4, 8], 0, 6), ([2, 3, 8], 1, 4), ([3, 4], 1, 5), ([1, 8], 0, 3)]
    ):
        gen = torch.Generator().manual_seed(100 + seed)
        shards = [randn(gen, shape, dtype) for _ in range(ws)]
        K = shape[-1] * (ws if g == len(shape) - 1 else 1)
        B = randn(gen, [K, 2 * n], dtype)
        A = torch.cat(shards, dim=g)
        P = A.to(reference_dtype(dtype)) @ B.to(reference_dtype(dtype))
        what = f"ws={ws} {dtype_name} shard={shape} g={g} N={n}"
        for fn in (atp.fused_all_gather_matmul_swiglu,
                   torch.ops.asynctp.fused_all_gather_matmul_swiglu):
            A_out, pre, out = fn(shards[rank], B, g, name, return_A=True, return_pre=True)
            assert out.dtype == dtype and out.shape == A.shape[:-1] + (n,), what
            assert torch.equal(A_out, A), f"A_out {what}"
            assert_close(pre, P.to(dtype).to(reference_dtype(dtype)), dtype, f"pre {what}")
            assert_close(out, swiglu(P, n), dtype, f"out {what}")
            none_A, none_pre, out2 = fn(shards[rank], B, g, name)
            assert none_A is None and none_pre is None, what
            assert torch.equal(out, out2), f"out without the products {what}"
    # The transposed right-hand side (a column-major B, as torch.cat([W_gate, W_up]).t()).
    gen = torch.Generator().manual_seed(7)
    shards = [randn(gen, [4, 8], dtype) for _ in range(ws)]
    W = randn(gen, [2 * 4, 8], dtype)
    _, _, out = atp.fused_all_gather_matmul_swiglu(shards[rank], W.t(), 0, name)
    P = torch.cat(shards).to(reference_dtype(dtype)) @ W.t().to(reference_dtype(dtype))
    assert_close(out, swiglu(P, 4), dtype, f"ws={ws} {dtype_name} column-major B")


def case_grads(dtype_name):
    group = dist.group.WORLD
    ws, rank, name = group.size(), group.rank(), group.group_name
    dtype = DTYPES[dtype_name]
    ref = reference_dtype(dtype)
    cases = [(shape, g, ra, rp) for shape, g in (([4, 8], 0), ([2, 3, 8], 1), ([3, 4], 1))
             for ra in (False, True) for rp in (False, True)]
    for seed, (shape, g, return_A, return_pre) in enumerate(cases):
        gen = torch.Generator().manual_seed(200 + seed)
        n = 5
        K = shape[-1] * (ws if g == len(shape) - 1 else 1)
        shards = [randn(gen, shape, dtype) for _ in range(ws)]
        Bs = [randn(gen, [K, 2 * n], dtype) for _ in range(ws)]  # rank r's B
        full = list(shape)
        full[g] *= ws
        full[-1] = K
        dOs = [randn(gen, full[:-1] + [n], dtype) for _ in range(ws)]
        dAs = [randn(gen, full, dtype) for _ in range(ws)]
        dPs = [randn(gen, full[:-1] + [2 * n], dtype) for _ in range(ws)]

        ref_shards = [s.to(ref).requires_grad_() for s in shards]
        ref_Bs = [B.to(ref).requires_grad_() for B in Bs]
        A = torch.cat(ref_shards, dim=g)
        loss = 0
        for r in range(ws):
            P = A @ ref_Bs[r]
            loss = loss + (swiglu(P, n) * dOs[r].to(ref)).sum()
            if return_A:
                loss = loss + (A * dAs[r].to(ref)).sum()
            if return_pre:
                loss = loss + (P * dPs[r].to(ref)).sum()
        loss.backward()

        A_shard = shards[rank].clone().requires_grad_()
        B = Bs[rank].clone().requires_grad_()
        A_out, pre, out = torch.ops.asynctp.fused_all_gather_matmul_swiglu(
            A_shard, B, g, name, return_A=return_A, return_pre=return_pre)
        tensors, grads = [out], [dOs[rank]]
        if return_A:
            tensors.append(A_out)
            grads.append(dAs[rank])
        if return_pre:
            tensors.append(pre)
            grads.append(dPs[rank])
        torch.autograd.backward(tensors, grads)
        what = (f"ws={ws} rank={rank} {dtype_name} shard={shape} g={g} return_A={return_A} "
                f"return_pre={return_pre}")
        assert_close(A_shard.grad, ref_shards[rank].grad, dtype, f"dA_shard {what}")
        assert_close(B.grad, ref_Bs[rank].grad, dtype, f"dB {what}")


def case_opcheck():
    from torch.library import opcheck

    name = dist.group.WORLD.group_name
    gen = torch.Generator().manual_seed(5)

    def leaf(*shape):
        return randn(gen, list(shape), torch.float32).requires_grad_()

    op = torch.ops.asynctp.fused_all_gather_matmul_swiglu
    opcheck(op, (leaf(2, 8), leaf(8, 6), 0, name), {"return_A": True, "return_pre": True})
    opcheck(op, (leaf(2, 3, 8), leaf(8, 4), 1, name), {"return_A": False, "return_pre": False})


def case_reserve():
    # A group of its own: a fresh context, whose buffers only this case grows.
    group = dist.new_group(list(range(dist.get_world_size())))
    name = group.group_name
    gen = torch.Generator().manual_seed(9)
    A, B = randn(gen, [64, 16], torch.float32), randn(gen, [16, 48], torch.float32)
    atp.reserve(torch.ops.asynctp.fused_all_gather_matmul_swiglu, A, B, 0, name)
    reserved = atp.memory_stats(name)
    _, _, out = atp.fused_all_gather_matmul_swiglu(A, B, 0, name)
    assert out.shape == (64 * group.size(), 24)
    # The call (the split path of f32 inputs, with its f32 products) found everything reserved.
    assert atp.memory_stats(name) == reserved, (atp.memory_stats(name), reserved)
    dist.destroy_process_group(group)


def case_swiglu_backward(dtype_name):
    # torch.ops.asynctp.swiglu_backward against autograd through silu(G) * U in f64 (f32) or f32:
    # 2-D and 3-D, a column-major P and a strided dOut, the gradient in P's dtype.
    name = dist.group.WORLD.group_name
    dtype = DTYPES[dtype_name]
    ref = reference_dtype(dtype)
    gen = torch.Generator().manual_seed(300 + dist.get_rank())
    atp.fused_all_gather_matmul_swiglu(torch.ones(2, 4), torch.ones(4, 2), 0, name)  # the context
    for shape, n, strided in (([6], 5, False), ([2, 3], 8, False), ([7], 4, True)):
        if strided:
            P = randn(gen, [2 * n] + shape, dtype).t()          # [rows, 2n], column-major
            dO = randn(gen, shape + [2 * n], dtype)[..., ::2]   # [rows, n], every other column
        else:
            P = randn(gen, shape + [2 * n], dtype)
            dO = randn(gen, shape + [n], dtype)
        leaf = P.to(ref).requires_grad_()
        (swiglu(leaf, n) * dO.to(ref)).sum().backward()
        got = torch.ops.asynctp.swiglu_backward(dO, P, name)
        what = f"{dtype_name} P {tuple(P.shape)} strided={strided}"
        assert got.dtype == dtype and got.shape == P.shape, what
        assert_close(got, leaf.grad, dtype, what)


def case_swiglu_backward_checks():
    from torch.library import opcheck

    name = dist.group.WORLD.group_name
    # A group with no context yet: this rank alone cannot make one, and says so.
    fresh = dist.new_group([0])
    with pytest.raises(Exception, match="has no asynctp context on cpu yet"):
        torch.ops.asynctp.swiglu_backward(torch.ones(3, 4), torch.ones(3, 8), fresh.group_name)
    dist.destroy_process_group(fresh)
    atp.fused_all_gather_matmul_swiglu(torch.ones(2, 4), torch.ones(4, 2), 0, name)  # the context
    gen = torch.Generator().manual_seed(6)
    opcheck(torch.ops.asynctp.swiglu_backward,
            (randn(gen, [3, 4], torch.float32), randn(gen, [3, 8], torch.float32), name))
    with pytest.raises(Exception, match="with the last dim doubled"):
        torch.ops.asynctp.swiglu_backward(torch.ones(3, 4), torch.ones(3, 6), name)
    with pytest.raises(Exception, match="with the last dim doubled"):
        torch.ops.asynctp.swiglu_backward(torch.ones(3, 4), torch.ones(2, 8), name)
    with pytest.raises(Exception, match="pre is torch.int64; f32, bf16 or f16 expected"):
        torch.ops.asynctp.swiglu_backward(torch.ones(3, 4), torch.ones(3, 8, dtype=torch.int64),
                                          name)


def case_odd_b_is_rejected():
    name = dist.group.WORLD.group_name
    with pytest.raises(Exception, match="2N columns"):
        atp.fused_all_gather_matmul_swiglu(torch.ones(2, 4), torch.ones(4, 3), 0, name)


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_forward_matches_the_unfused_ops(pool, dtype_name):
    pool.run(case_forward, dtype_name)


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_grads_match_autograd_through_the_unfused_ops(pool, dtype_name):
    pool.run(case_grads, dtype_name)


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_swiglu_backward_matches_autograd(pool, dtype_name):
    pool.run(case_swiglu_backward, dtype_name)


def test_swiglu_backward_checks(pool):
    if pool.world_size > 1:
        pytest.skip("per op, not per world size: one rank covers it")
    pool.run(case_swiglu_backward_checks)


def test_opcheck(pool):
    if pool.world_size > 2:
        pytest.skip("opcheck's cases are per op, not per world size: ws 1 and 2 cover them")
    pool.run(case_opcheck)


def test_reserve(pool):
    pool.run(case_reserve)


def test_odd_b_is_rejected(pool):
    if pool.world_size > 1:
        pytest.skip("an argument check: one rank covers it")
    pool.run(case_odd_b_is_rejected)
