"""Export the forward and backward graphs of four sequence-parallel models as PyTorch makes them.

The models, tensor-parallel over ws ranks with sequence parallelism (torchtitan's plan: DTensor,
parallelize_module with SequenceParallel / ColwiseParallel / RowwiseParallel; the projections
that read one normalized activation share its all-gather):
    relu_mlp     x + down(relu(up(norm(x))))
    gelu_mlp     x + down(gelu(up(norm(x))))
    swiglu_mlp   x + down(silu(gate(norm(x))) * up(norm(x)))
    llama_layer  a Llama-3 decoder layer: RMSNorm, Q/K/V (column-parallel, grouped K/V heads
                 repeated as torchtitan's repeat_kv does), RoPE (rotate-half form, cos/sin
                 tables as buffers), causal SDPA, O (row-parallel), residual; RMSNorm, gate/up
                 (column-parallel), SwiGLU, down (row-parallel), residual
Each rank holds x [batch, seq/ws, dim] in bf16 (batch 1 by default: one sequence per rank, for
which PyTorch gathers the sequence as dim 0 and views the result). Every model runs under torch.compile (dynamic=False)
with the FX exporter (python/asynctp/fx_export.py) hooked into Inductor, on ws CPU processes
(gloo): one forward and one backward (of out.float().sum()). Rank 0 writes NAME.fwd.json and
NAME.bwd.json in fx-graph-json, one node per line.

To regenerate the graphs in tests/graph/data/, which tests/tools/model_graphs_test.cpp runs and
fuses (needs PyTorch; compiling takes about a minute, which is why CI runs the checked-in graphs
instead of exporting them):

    PYTHONPATH=python python3 scripts/export_model_graphs.py tests/graph/data

The graphs hold the PyTorch version that made them in their "source" field.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

MODELS = ("relu_mlp", "gelu_mlp", "swiglu_mlp", "llama_layer")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


class Mlp(nn.Module):
    """x + w2(act(w1(norm(x)))), or with act "swiglu": x + w2(silu(w1(h)) * w3(h))."""

    def __init__(self, dim: int, hidden: int, act: str):
        super().__init__()
        self.act = act
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden, act)

    def forward(self, x):
        return x + self.feed_forward(self.ffn_norm(x))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str):
        super().__init__()
        self.act = act
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        if act == "swiglu":
            self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        if self.act == "relu":
            return self.w2(F.relu(self.w1(x)))
        if self.act == "gelu":
            return self.w2(F.gelu(self.w1(x)))
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    """Llama-3 attention: n_heads query heads, n_kv_heads key/value heads (grouped), RoPE."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x, cos, sin):
        # x [b, s, dim] (gathered); cos, sin [s, head_dim]. Under TP the projections are local:
        # -1 heads is n_heads / ws (n_kv_heads / ws).
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        c, sn = cos[None, :, None, :], sin[None, :, None, :]
        q = (q * c + rotate_half(q) * sn).type_as(v)
        k = (k * c + rotate_half(k) * sn).type_as(v)
        rep = q.shape[2] // k.shape[2]
        # repeat_kv: [b, s, kv, d] -> [b, s, kv * rep, d]
        k = k[:, :, :, None, :].expand(b, s, k.shape[2], rep, self.head_dim).reshape(b, s, -1, self.head_dim)
        v = v[:, :, :, None, :].expand(b, s, v.shape[2], rep, self.head_dim).reshape(b, s, -1, self.head_dim)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class LlamaLayer(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, hidden: int, seq: int):
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, n_heads, n_kv_heads)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden, "swiglu")
        head_dim = dim // n_heads
        inv_freq = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(seq).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)  # [seq, head_dim]
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x), self.cos.to(x.dtype), self.sin.to(x.dtype))
        return h + self.feed_forward(self.ffn_norm(h))


def tp_plan(attention: bool, swiglu: bool) -> dict:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan = {
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }
    if swiglu:
        plan["feed_forward.w3"] = ColwiseParallel()
    if attention:
        plan.update(
            {
                "attention_norm": SequenceParallel(),
                "attention": PrepareModuleInput(
                    input_layouts=(Shard(1), None, None),
                    desired_input_layouts=(Replicate(), None, None),
                ),
                "attention.wq": ColwiseParallel(),
                "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            }
        )
    return plan


def build(name: str, args) -> nn.Module:
    if name == "llama_layer":
        return LlamaLayer(args.dim, args.heads, args.kv_heads, args.hidden, args.seq)
    return Mlp(args.dim, args.hidden, name.removesuffix("_mlp"))


def compact(doc: dict) -> str:
    """fx-graph-json with one node per line (small files, readable diffs)."""
    head = {k: v for k, v in doc.items() if k != "nodes"}
    lines = [json.dumps(head, separators=(",", ":"))[:-1] + ',"nodes":[']
    nodes = [json.dumps(n, separators=(",", ":")) for n in doc["nodes"]]
    lines.append(",\n".join(nodes))
    lines.append("]}")
    return "\n".join(lines) + "\n"


def export(rank: int, ws: int, port: int, args) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    from asynctp.fx_export import capture_post_grad_graphs

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (ws,))
    for name in args.models:
        torch.manual_seed(0)
        model = build(name, args).to(torch.bfloat16)
        parallelize_module(model, mesh, tp_plan(name == "llama_layer", name in ("swiglu_mlp", "llama_layer")))
        torch.manual_seed(1 + rank)
        x = torch.randn(args.batch, args.seq // ws, args.dim, dtype=torch.bfloat16, requires_grad=True)
        torch._dynamo.reset()
        source = f"PyTorch {torch.__version__} post-grad FX graph (torch.compile, CPU, gloo), {name} at ws {ws}"
        with capture_post_grad_graphs(world_size=ws, source=source) as graphs:
            out = torch.compile(model, dynamic=False)(x)
            out.float().sum().backward()
        if len(graphs) != 2:
            raise RuntimeError(f"{name}: expected a forward and a backward graph, got {len(graphs)}")
        if rank == 0:
            for suffix, doc in zip(("fwd", "bwd"), graphs):
                path = os.path.join(args.out_dir, f"{name}.{suffix}.json")
                with open(path, "w") as f:
                    f.write(compact(doc))
                print(f"wrote {path}: {len(doc['nodes'])} nodes, {os.path.getsize(path)} bytes")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", help="folder for NAME.fwd.json and NAME.bwd.json")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--ws", type=int, default=2, help="world size: CPU processes (gloo)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=16, help="tokens of the whole sequence (seq/ws per rank)")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128, help="the MLP's hidden size")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    args = parser.parse_args()
    for what, value in (("seq", args.seq), ("hidden", args.hidden), ("heads", args.heads), ("kv-heads", args.kv_heads)):
        if value % args.ws:
            parser.error(f"--{what} {value} is not a multiple of --ws {args.ws}")
    os.makedirs(args.out_dir, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(export, args=(args.ws, port, args), nprocs=args.ws, join=True)


if __name__ == "__main__":
    main()
