"""The sequence-parallel modules against the unfused model they shard.

A small MLP (column-parallel up, GELU, row-parallel down) trains for a few SGD steps on every
rank's sequence shard, beside the full nn.Linear model built from the same seed on every rank;
after each step the loss (summed over the group), every gradient and every parameter must equal
the full model's shard.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import asynctp.torch  # noqa: F401
from asynctp.torch.modules import ColumnParallelLinear, RowParallelLinear
TOL = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-6},
    torch.bfloat16: {"rtol": 3e-2, "atol": 3e-2},
}


def close(actual, expected, dtype, what):
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    torch.testing.assert_close(actual.double(), expected.double(), **TOL[dtype], msg=what)


def one_mlp_training(group, dtype_name, seq_dim, bias, keep_gathered_input, seed, steps=3):
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    ws, rank, name = group.size(), group.rank(), group.group_name
    torch.manual_seed(seed)  # the same full model and data on every rank of the group
    H, F, S, B = 8, 4 * ws, 4 * ws, 2  # F and S divisible by ws
    up = nn.Linear(H, F, bias=bias, dtype=dtype)
    down = nn.Linear(F, H, bias=bias, dtype=dtype)
    col = ColumnParallelLinear.from_linear(
        up, group, seq_dim=seq_dim, keep_gathered_input=keep_gathered_input
    )
    row = RowParallelLinear.from_linear(down, name, seq_dim=seq_dim)  # a group name works too
    full_params = list(up.parameters()) + list(down.parameters())
    full_opt = torch.optim.SGD(full_params, lr=0.5)
    opt = torch.optim.SGD(list(col.parameters()) + list(row.parameters()), lr=0.5)

    shape = [S, B, H] if seq_dim == 0 else [B, S, H]
    rows = slice(rank * F // ws, (rank + 1) * F // ws)  # col's weight rows, row's weight cols

    def shards(full):
        return full.chunk(ws, dim=seq_dim)[rank]

    for step in range(steps):
        x = torch.randn(shape, dtype=dtype)
        target = torch.randn(shape, dtype=dtype)
        what = (
            f"ws={ws} rank={rank} {dtype_name} seq_dim={seq_dim} bias={bias} "
            f"keep={keep_gathered_input} step={step}"
        )

        x_full = x.clone().requires_grad_()
        y_full = down(nn.functional.gelu(up(x_full)))
        loss_full = (y_full.float() - target.float()).square().sum() / target.numel()
        full_opt.zero_grad()
        loss_full.backward()

        x_shard = shards(x).clone().requires_grad_()
        y = row(nn.functional.gelu(col(x_shard)))
        assert y.shape == shards(y_full).shape, f"output shape {what}"
        close(y, shards(y_full), dtype, f"output {what}")
        loss = (y.float() - shards(target).float()).square().sum() / target.numel()
        opt.zero_grad()
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total, group=group)
        close(total, loss_full.detach(), dtype, f"loss {what}")

        close(x_shard.grad, shards(x_full.grad), dtype, f"input grad {what}")
        close(col.weight.grad, up.weight.grad[rows], dtype, f"up.weight grad {what}")
        close(row.weight.grad, down.weight.grad[:, rows], dtype, f"down.weight grad {what}")
        if bias:
            close(col.bias.grad, up.bias.grad[rows], dtype, f"up.bias grad {what}")
            close(row.bias.grad, down.bias.grad, dtype, f"down.bias grad {what}")
        full_opt.step()
        opt.step()
        close(col.weight, up.weight[rows], dtype, f"up.weight after {what}")
        close(row.weight, down.weight[:, rows], dtype, f"down.weight after {what}")
        if bias:
            close(col.bias, up.bias[rows], dtype, f"up.bias after {what}")
            close(row.bias, down.bias, dtype, f"down.bias after {what}")


def case_construction():
    """The constructor's shards, nn.Linear's init bound, a replicated row bias, named errors."""
    group = dist.group.WORLD
    ws, rank = group.size(), group.rank()
    torch.manual_seed(100 + rank)  # different on every rank: the row bias must still agree
    col = ColumnParallelLinear(16, 8 * ws, group)
    row = RowParallelLinear(8 * ws, 16, group.group_name, bias=True)
    assert col.weight.shape == (8, 16) and col.bias.shape == (8,)
    assert row.weight.shape == (16, 8) and row.bias.shape == (16,)
    assert col.weight.abs().max() <= 1 / 16**0.5
    assert row.weight.abs().max() <= 1 / (8 * ws) ** 0.5
    biases = [torch.empty(16) for _ in range(ws)]
    dist.all_gather(biases, row.bias.detach(), group=group)
    for b in biases:
        assert torch.equal(b, biases[0]), "the row-parallel bias differs between ranks"

    if ws > 1:
        with pytest.raises(ValueError, match="out_features=5 is not divisible"):
            ColumnParallelLinear(16, 5, group)
        with pytest.raises(ValueError, match="in_features=5 is not divisible"):
            RowParallelLinear(5, 16, group)
    with pytest.raises(TypeError, match="group must be a torch ProcessGroup or a group name"):
        ColumnParallelLinear(16, 8 * ws, 3)
    with pytest.raises(ValueError, match="seq_dim=1 must be a leading dim"):
        col(torch.randn(2, 16))
    with pytest.raises(ValueError, match="seq_dim=5 must be a leading dim"):
        ColumnParallelLinear(16, 8 * ws, group, seq_dim=5)(torch.randn(2, 2, 16))


def case_gradient_penalty():
    """A loss on the input's gradient (a gradient penalty: backward with create_graph=True,
    then backward again) gives the full model's shard of every parameter's gradient, the
    replicated row bias's included (its all-reduce is recorded too)."""
    group = dist.group.WORLD
    ws, rank = group.size(), group.rank()
    torch.manual_seed(3)
    H, F, S = 8, 4 * ws, 2 * ws
    up, down = nn.Linear(H, F), nn.Linear(F, H)
    col = ColumnParallelLinear.from_linear(up, group)
    row = RowParallelLinear.from_linear(down, group)
    rows = slice(rank * F // ws, (rank + 1) * F // ws)
    x = torch.randn(2, S, H)

    x_full = x.clone().requires_grad_()
    y_full = down(torch.tanh(up(x_full)))
    (g_full,) = torch.autograd.grad(y_full.square().sum(), x_full, create_graph=True)
    (y_full.sum() + g_full.square().sum()).backward()

    x_shard = x.chunk(ws, dim=1)[rank].clone().requires_grad_()
    y = row(torch.tanh(col(x_shard)))
    (g,) = torch.autograd.grad(y.square().sum(), x_shard, create_graph=True)
    close(g, g_full.chunk(ws, dim=1)[rank], torch.float32, "the input's gradient")
    (y.sum() + g.square().sum()).backward()
    close(col.weight.grad, up.weight.grad[rows], torch.float32, "up.weight grad")
    close(col.bias.grad, up.bias.grad[rows], torch.float32, "up.bias grad")
    close(row.weight.grad, down.weight.grad[:, rows], torch.float32, "down.weight grad")
    close(row.bias.grad, down.bias.grad, torch.float32, "down.bias grad")


def case_activation_checkpointing():
    """The modules under torch.utils.checkpoint (both of its implementations), whose backward runs
    the forward again (the fused ops' autograd recorded twice): the same output and gradients as
    without it, bit for bit."""
    group = dist.group.WORLD
    ws = group.size()
    torch.manual_seed(5)
    H, F, S = 8, 4 * ws, 2 * ws
    up, down = nn.Linear(H, F), nn.Linear(F, H)
    col = ColumnParallelLinear.from_linear(up, group, keep_gathered_input=False)
    row = RowParallelLinear.from_linear(down, group)
    x = torch.randn(2, S // ws, H)

    def block(t):
        return row(torch.tanh(col(t)))

    def grads(run):
        for p in (*col.parameters(), *row.parameters()):
            p.grad = None
        t = x.clone().requires_grad_()
        y = run(t)
        y.square().sum().backward()
        return [y.detach(), t.grad, *(p.grad for p in (*col.parameters(), *row.parameters()))]

    plain = grads(block)
    for reentrant in (False, True):
        got = grads(lambda t: torch.utils.checkpoint.checkpoint(block, t,
                                                                use_reentrant=reentrant))
        for i, (g, e) in enumerate(zip(got, plain)):
            assert torch.equal(g, e), f"tensor {i} differs under checkpoint (reentrant={reentrant})"


def case_copies():
    """deepcopy, a pickled module, .to(dtype) of a copy and a state_dict round trip: the copies
    share the group (it is named, not copied) and compute what the original computes."""
    import copy
    import io

    group = dist.group.WORLD
    ws = group.size()
    torch.manual_seed(7)
    x, h = torch.randn(2, 3, 16), torch.randn(2, 3 * ws, 8)
    for bias in (True, False):
        col = ColumnParallelLinear(16, 8 * ws, group, bias=bias)
        row = RowParallelLinear(8 * ws, 16, group, bias=bias)
        for layer, inp in ((col, x), (row, h)):
            what = f"{type(layer).__name__} bias={bias}"
            twin = copy.deepcopy(layer)
            assert twin.group_name == layer.group_name and twin.process_group is layer.process_group
            assert twin.weight.data_ptr() != layer.weight.data_ptr(), what
            assert torch.equal(twin(inp), layer(inp)), f"deepcopy of {what}"
            buf = io.BytesIO()
            torch.save(layer, buf)
            buf.seek(0)
            loaded = torch.load(buf, weights_only=False)
            assert torch.equal(loaded(inp), layer(inp)), f"pickled {what}"
            low = copy.deepcopy(layer).to(torch.bfloat16)
            close(low(inp.bfloat16()), layer(inp), torch.bfloat16, f".to(bf16) of {what}")
            buf = io.BytesIO()
            torch.save(layer.state_dict(), buf)
            buf.seek(0)
            fresh = type(layer)(layer.in_features, layer.out_features, group.group_name, bias=bias)
            fresh.load_state_dict(torch.load(buf))
            assert torch.equal(fresh(inp), layer(inp)), f"state_dict round trip of {what}"


def case_mlp_training(dtype_name, combos):
    for seq_dim, bias, keep in combos:
        one_mlp_training(dist.group.WORLD, dtype_name, seq_dim, bias, keep, seed=1234)


def case_mlp_training_tp_subgroups():
    """A 2 x 2 mesh: TP groups {0, 1} and {2, 3}, each training on its own data (DP)."""
    rank = dist.get_rank()
    tp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates both
    tp = tp_groups[rank // 2]
    one_mlp_training(tp, "f32", 0, True, False, seed=50 + rank // 2)


# (seq_dim, bias, keep_gathered_input): every pair of values once.
ALL_COMBOS = [(0, True, True), (0, False, False), (1, True, False), (1, False, True)]


def test_mlp_training_f32(pool):
    pool.run(case_mlp_training, "f32", ALL_COMBOS)


def test_mlp_training_bf16(pool):
    pool.run(case_mlp_training, "bf16", [(1, True, False)])


def test_mlp_training_tp_subgroups(pool4):
    pool4.run(case_mlp_training_tp_subgroups)


def test_gradient_penalty(pool):
    pool.run(case_gradient_penalty)


def test_activation_checkpointing(pool):
    pool.run(case_activation_checkpointing)


def test_copies(pool2):
    pool2.run(case_copies)


def test_construction(pool):
    pool.run(case_construction)
