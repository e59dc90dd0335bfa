"""Regenerates the PyTorch graphs in this folder (needs PyTorch; CI does not run this).

    PYTHONPATH=python python3 tests/passes/graphs/generate.py tests/passes/graphs

Builds sequence-parallel transformer pieces the way torchtitan does (DTensor, parallelize_module
with SequenceParallel / ColwiseParallel / RowwiseParallel; Q/K/V and gate/up share one gather),
compiles forward and backward with a fake process group of world size 4 on the CPU, and writes
for every post-grad graph:
    NAME.{fwd,bwd}.pre.json   the graph Inductor's micro-pipeline-TP pass is given
    NAME.{fwd,bwd}.post.json  the same graph after PyTorch's own micro-pipeline-TP pass, the
                              yardstick the tests compare asynctp's pass with
The FSDP-style variant gathers each layer's parameter shard in forward (SimpleFSDP style, with
the differentiable functional all-gather, whose backward is a reduce-scatter of the gradient):
independent same-group collectives, the material of the bucketing pass.
The float8 variant builds the rowwise-scaled forward of an MLP with functional collectives
(torchao is not needed): fp8 data and its row-wise scales gathered on the sequence dim,
reshape -> _scaled_mm -> reshape, and a reduce-scatter of the second _scaled_mm.
"""

from __future__ import annotations

import copy
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
import torch.nn.functional as F

from asynctp.fx_export import graph_to_dict

WORLD = 4


class RMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
        return y.type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, heads)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x):
        return x + self.feed_forward(self.ffn_norm(x))


def tp_plan(attention: bool):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan = {
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        ),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": ColwiseParallel(),
    }
    if attention:
        plan.update(
            {
                "attention_norm": SequenceParallel(),
                "attention": PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                ),
                "attention.wq": ColwiseParallel(),
                "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            }
        )
    return plan


class Recorder:
    """post_grad_custom_post_pass: records each graph before and after PyTorch's own
    micro-pipeline-TP pass (run on a copy, in symmetric-memory test mode)."""

    def __init__(self):
        self.graphs: list[tuple[dict, dict]] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        from torch._inductor.fx_passes.micro_pipeline_tp import micro_pipeline_tp_pass
        from torch.distributed._symmetric_memory import _test_mode

        version = torch.__version__
        pre = graph_to_dict(
            graph, WORLD, f"PyTorch {version} post-grad FX graph (torch.compile), before "
            "Inductor's micro-pipeline TP pass")
        gm = torch.fx.GraphModule(graph.owning_module, copy.deepcopy(graph))
        with _test_mode():
            micro_pipeline_tp_pass(gm.graph)
        post = graph_to_dict(
            gm.graph, WORLD, f"PyTorch {version} post-grad FX graph (torch.compile), after "
            "Inductor's micro-pipeline TP pass")
        self.graphs.append((pre, post))

    def uuid(self):
        return None


def compile_and_record(fn, *inputs, backward: bool) -> list[tuple[dict, dict]]:
    import torch._inductor.config as cfg

    rec = Recorder()
    torch._dynamo.reset()
    with cfg.patch(post_grad_custom_post_pass=rec, fx_graph_cache=False):
        compiled = torch.compile(fn, dynamic=False)
        out = compiled(*inputs)
        if backward:
            out.float().sum().backward()
    return rec.graphs


def sequence_parallel(name: str, model: nn.Module, batch: int, seq: int, dim: int, attention: bool):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (WORLD,))
    model = model.to(torch.bfloat16)
    parallelize_module(model, mesh, tp_plan(attention))
    x = torch.randn(batch, seq // WORLD, dim, dtype=torch.bfloat16, requires_grad=True)
    return compile_and_record(model, x, backward=True)


class FsdpMlp(nn.Module):
    """Each layer's weight lives as a [out/ws, in] shard and is all-gathered when used."""

    def __init__(self, dim: int, layers: int):
        super().__init__()
        self.shards = nn.ParameterList(
            nn.Parameter(torch.randn(dim // WORLD, dim, dtype=torch.bfloat16) * 0.1) for _ in range(layers))

    def forward(self, x):
        for shard in self.shards:
            w = funcol.all_gather_tensor_autograd(shard, 0, dist.group.WORLD)  # [dim, dim]
            x = F.silu(x @ w.t())
        return x


def fsdp_mlp(batch: int, dim: int, layers: int):
    x = torch.randn(batch, dim, dtype=torch.bfloat16, requires_grad=True)
    return compile_and_record(FsdpMlp(dim, layers), x, backward=True)


def fp8_rowwise_mlp(batch: int, seq: int, dim: int, hidden: int):
    group = dist.group.WORLD
    f8 = torch.float8_e4m3fn

    def quantize_rows(t):
        amax = t.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
        scale = amax / 448.0
        return (t.float() / scale).to(f8), scale

    def mlp(x, w1, w1_scale, w2, w2_scale):
        # x [b, s/ws, d] bf16; w1 [h/ws, d] fp8 with row scales [h/ws, 1]; w2 [d, h/ws] likewise.
        b, s_shard, d = x.shape
        xq, xs = quantize_rows(x)
        xq = funcol.all_gather_tensor(xq, 1, group)  # [b, s, d]
        xs = funcol.all_gather_tensor(xs, 1, group)  # [b, s, 1]
        s = xq.shape[1]
        h = torch._scaled_mm(xq.reshape(b * s, d), w1.t(), xs.reshape(b * s, 1),
                             w1_scale.t(), out_dtype=torch.bfloat16).reshape(b, s, -1)
        h = F.silu(h)
        hq, hs = quantize_rows(h)
        y = torch._scaled_mm(hq.reshape(b * s, -1), w2.t(), hs.reshape(b * s, 1),
                             w2_scale.t(), out_dtype=torch.bfloat16).reshape(b, s, d)
        return funcol.reduce_scatter_tensor(y, "sum", 1, group)  # [b, s/ws, d]

    x = torch.randn(batch, seq // WORLD, dim, dtype=torch.bfloat16)
    w1 = torch.randn(hidden // WORLD, dim).to(f8)
    w2 = torch.randn(dim, hidden // WORLD).to(f8)
    s1 = torch.rand(hidden // WORLD, 1) + 0.5
    s2 = torch.rand(dim, 1) + 0.5
    try:
        return compile_and_record(mlp, x, w1, s1, w2, s2, backward=False)
    except Exception as e:  # the CPU may not run _scaled_mm; the graph is recorded before that
        print(f"note: fp8 graph recorded; running it failed: {type(e).__name__}", file=sys.stderr)
        return None


def save(out_dir: str, name: str, graphs) -> None:
    for suffix, (pre, post) in zip(("fwd", "bwd"), graphs):
        for kind, doc in (("pre", pre), ("post", post)):
            path = os.path.join(out_dir, f"{name}.{suffix}.{kind}.json")
            with open(path, "w") as f:
                json.dump(doc, f, indent=None, separators=(",", ":"))
                f.write("\n")
            print("wrote", path, len(doc["nodes"]), "nodes")


def main() -> None:
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(__file__)
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    torch.manual_seed(0)
    save(out_dir, "sp_block", sequence_parallel(
        "sp_block", Block(dim=64, heads=4, hidden=128), batch=2, seq=16, dim=64, attention=True))
    save(out_dir, "sp_mlp", sequence_parallel(
        "sp_mlp", Mlp(dim=64, hidden=128), batch=2, seq=16, dim=64, attention=False))
    save(out_dir, "fsdp_mlp", fsdp_mlp(batch=8, dim=32, layers=4))
    graphs = fp8_rowwise_mlp(batch=2, seq=16, dim=64, hidden=128)
    if graphs:
        save(out_dir, "fp8_rowwise_mlp", graphs)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
