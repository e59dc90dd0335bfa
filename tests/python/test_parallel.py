"""asynctp's ParallelStyles against PyTorch's own, through parallelize_module on a CPU mesh.

The same block (RMSNorm, SwiGLU MLP, residual) is parallelized twice from one seed: with
PyTorch's sequence-parallel plan (SequenceParallel, PrepareModuleInput gathering the sequence,
ColwiseParallel, RowwiseParallel(output_layouts=Shard(seq))) and with asynctp's styles in place
of the gather and the two linear styles. Each trains a few SGD steps on every rank's sequence
shard; outputs, every gradient (DTensors, compared whole) and every parameter must agree.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

import asynctp.torch as atp
import asynctp.torch.parallel as atp_tp
from asynctp import InvalidArgumentError

TOL = {torch.float32: {"rtol": 1e-5, "atol": 1e-6}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}


class FeedForward(nn.Module):
    def __init__(self, H, F, bias, dtype):
        super().__init__()
        self.w1 = nn.Linear(H, F, bias=bias, dtype=dtype)
        self.w3 = nn.Linear(H, F, bias=bias, dtype=dtype)
        self.w2 = nn.Linear(F, H, bias=bias, dtype=dtype)

    def forward(self, x):
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, H, F, bias, dtype):
        super().__init__()
        self.norm = nn.RMSNorm(H, dtype=dtype)
        self.feed_forward = FeedForward(H, F, bias, dtype)

    def forward(self, x):
        return x + self.feed_forward(self.norm(x))


def _plans(seq_dim, keep):
    s = Shard(seq_dim)
    torch_plan = {
        "norm": SequenceParallel(sequence_dim=seq_dim),
        "feed_forward": PrepareModuleInput(input_layouts=(s,),
                                           desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=s),
    }
    asynctp_plan = {
        "norm": SequenceParallel(sequence_dim=seq_dim),
        "feed_forward.w1": atp_tp.ColwiseParallel(input_layouts=s, keep_gathered_input=keep),
        "feed_forward.w3": atp_tp.ColwiseParallel(input_layouts=s, keep_gathered_input=keep),
        "feed_forward.w2": atp_tp.RowwiseParallel(output_layouts=s),
    }
    return torch_plan, asynctp_plan


def _calls(mesh) -> dict:
    """asynctp's calls per op in the mesh's group, over every path."""
    try:
        usage = atp.usage(mesh.get_group().group_name, "cpu")
    except InvalidArgumentError:  # no asynctp context yet
        usage = {}
    return {op: sum(usage.get(op, {}).values())
            for op in ("all_gather_matmul", "matmul_reduce_scatter")}


def _full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def case_styles_match_torch(dtype_name, seq_dim, bias, keep=True, compiled=False, steps=3):
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    ws, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (ws,))
    H, F, B, S = 16, 8 * ws, 2, 4 * ws
    torch.manual_seed(7)  # the same full block on every rank
    ref = Block(H, F, bias, dtype)
    model = Block(H, F, bias, dtype)
    model.load_state_dict(ref.state_dict())
    torch_plan, asynctp_plan = _plans(seq_dim, keep)
    parallelize_module(ref, mesh, torch_plan)
    parallelize_module(model, mesh, asynctp_plan)
    for name, m in model.named_modules():
        if name.startswith("feed_forward.w"):
            assert "asynctp" in repr(m), f"{name} is not asynctp's: {m!r}"
    # The parameters are distributed as PyTorch's styles distribute them.
    ref_params, params = dict(ref.named_parameters()), dict(model.named_parameters())
    assert list(ref_params) == list(params)
    for name, p in params.items():
        assert isinstance(p, DTensor) and p.placements == ref_params[name].placements, name
        torch.testing.assert_close(p.to_local(), ref_params[name].to_local(), rtol=0, atol=0)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = _calls(mesh)
    # torch.compile traces the styles' forward (DTensor.to_local, the fused ops) in one graph.
    run = torch.compile(model, fullgraph=True) if compiled else model
    for step in range(steps):
        what = (f"ws={ws} rank={rank} {dtype_name} seq_dim={seq_dim} bias={bias} keep={keep} "
                f"compiled={compiled} step={step}")
        x = torch.randn([B, S, H] if seq_dim == 1 else [S, B, H], dtype=dtype)
        x_shard = x.chunk(ws, dim=seq_dim)[rank]
        outs, grads = [], []
        for m, o in ((ref, ref_opt), (run, opt)):
            xs = x_shard.clone().requires_grad_()
            y = m(xs)
            y = _full(y) if isinstance(y, DTensor) else y
            o.zero_grad()
            (y.float().square().sum() / x.numel()).backward()
            outs.append(y.detach())
            grads.append([xs.grad] + [_full(p.grad) for p in m.parameters()])
            o.step()
        torch.testing.assert_close(outs[1], outs[0], **TOL[dtype], msg=f"output {what}")
        for i, (g, g_ref) in enumerate(zip(grads[1], grads[0])):
            torch.testing.assert_close(g, g_ref, **TOL[dtype], msg=f"grad {i} {what}")
        for (name, p), p_ref in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(_full(p), _full(p_ref), **TOL[dtype],
                                       msg=f"{name} after {what}")
    # Each step: w1 and w3 forward and w2's backward gather; w2 forward and the backward of w1
    # and w3 scatter. Every one of them ran through asynctp.
    after = _calls(mesh)
    for op in ("all_gather_matmul", "matmul_reduce_scatter"):
        assert after[op] - before[op] == 3 * steps, (op, before, after)


def case_dtensor_input_and_output():
    """A DTensor input in another layout is redistributed first; use_local_output=False returns
    a DTensor in output_layouts."""
    ws, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (ws,))
    torch.manual_seed(3)
    H, F, S = 8, 4 * ws, 2 * ws
    col_ref, row_ref = nn.Linear(H, F), nn.Linear(F, H)
    col, row = nn.Linear(H, F), nn.Linear(F, H)
    col.load_state_dict(col_ref.state_dict())
    row.load_state_dict(row_ref.state_dict())
    parallelize_module(col, mesh, atp_tp.ColwiseParallel(input_layouts=Shard(0),
                                                         use_local_output=False))
    parallelize_module(row, mesh, atp_tp.RowwiseParallel(output_layouts=Shard(0),
                                                         use_local_output=False))
    x = torch.randn(S, H)
    h = col(DTensor.from_local(x, mesh, [Replicate()]))  # redistributed to Shard(0) first
    assert isinstance(h, DTensor) and h.placements == (Shard(1),)
    y = row(h)
    assert isinstance(y, DTensor) and y.placements == (Shard(0),)
    torch.testing.assert_close(y.full_tensor(), row_ref(col_ref(x)), rtol=1e-5, atol=1e-6)


def case_named_errors():
    ws = dist.get_world_size()
    mesh = init_device_mesh("cpu", (ws,))
    with pytest.raises(ValueError, match="input_layouts must be Shard"):
        atp_tp.ColwiseParallel(input_layouts=Replicate())
    with pytest.raises(ValueError, match="output_layouts must be Shard"):
        atp_tp.RowwiseParallel(output_layouts=Replicate())
    with pytest.raises(NotImplementedError, match="shards nn.Linear only"):
        parallelize_module(nn.Embedding(4, 4), mesh, atp_tp.ColwiseParallel())
    col = parallelize_module(nn.Linear(4, 2 * ws), mesh, atp_tp.ColwiseParallel())
    with pytest.raises(ValueError, match="sequence dim 1 must be a leading dim of the 2-dim"):
        col(torch.randn(3, 4))


@pytest.mark.parametrize("dtype_name,seq_dim,bias,keep,compiled", [
    ("f32", 1, True, True, False), ("f32", 0, False, False, False), ("bf16", 1, True, True, False),
    ("f32", 1, True, True, True)])
def test_styles_match_torch(pool2, dtype_name, seq_dim, bias, keep, compiled):
    pool2.run(case_styles_match_torch, dtype_name, seq_dim, bias, keep, compiled)


def test_dtensor_input_and_output(pool2):
    pool2.run(case_dtensor_input_and_output)


def test_named_errors(pool2):
    pool2.run(case_named_errors)
