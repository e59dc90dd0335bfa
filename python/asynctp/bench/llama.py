"""A Llama-3 decoder layer with sequence parallelism, its tensor-parallel linears swappable.

One sequence of S = T x ws tokens, T per rank, hidden H, on a TP group of ws ranks
(hq = heads/ws query heads, hkv = kv_heads/ws kv heads, d = head_dim, Fl = ffn/ws per rank):

    x [T, H] (this rank's tokens)
    -> RMSNorm                                   [T, H]
    -> wqkv, column-parallel: AG(seq) then mm    [S, (hq + 2 hkv) d]   (this rank's heads)
    -> RoPE on q, k; causal SDPA (GQA)           [S, hq d]
    -> wo, row-parallel: mm then RS(seq)         [T, H]
    -> + x
    -> RMSNorm                                   [T, H]
    -> w13, column-parallel: AG(seq) then mm     [S, 2 Fl]             (gate | up)
    -> SwiGLU: silu(gate) * up                   [S, Fl]
    -> w2, row-parallel: mm then RS(seq)         [T, H]
    -> + residual                                [T, H]

Every arm of the benchmark runs this same forward; only the four linears differ (plain
torch.distributed collectives around F.linear, functional collectives that torch.compile traces,
asynctp's fused modules, their float8 forms). Each rank holds its shards of the full layer's
weights, stored as nn.Linear stores them ([out, in]); the Q, K and V rows of a rank are one
matrix (one GEMM), and so are its gate and up rows.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

F8 = torch.float8_e4m3fn
F8_MAX = 448.0  # the largest finite float8_e4m3fn


@dataclass(frozen=True)
class Config:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5


# Llama-3 (and 3.1) 8B and 70B; "tiny" is for CI on the CPU (every dim divisible by ws <= 4).
CONFIGS = {
    "8b": Config(hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336),
    "70b": Config(hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672),
    "tiny": Config(hidden=64, heads=8, kv_heads=4, head_dim=16, ffn=256),
}


@dataclass(frozen=True)
class Local:
    """The shapes of one rank's shard of a Config at world size ws."""

    hidden: int
    q_heads: int  # hq
    kv_heads: int  # hkv
    head_dim: int
    ffn: int  # Fl

    @property
    def qkv(self) -> int:
        return (self.q_heads + 2 * self.kv_heads) * self.head_dim


def local_shapes(cfg: Config, ws: int) -> Local:
    for name in ("heads", "kv_heads", "ffn"):
        value = getattr(cfg, name)
        if value % ws != 0:
            raise ValueError(f"layer: {name}={value} is not divisible by the world size {ws}")
    return Local(cfg.hidden, cfg.heads // ws, cfg.kv_heads // ws, cfg.head_dim, cfg.ffn // ws)


def make_params(cfg: Config, ws: int, rank: int, dtype, device, seq_len: int,
                seed: int = 0) -> dict:
    """This rank's shards, seeded per rank (every rank's differ); the norm weights, replicated
    in the full layer, come from one seed on every rank. Weights ~ N(0, 1/in). Also RoPE's
    tables for a sequence of seq_len tokens."""
    lc = local_shapes(cfg, ws)
    shared = torch.Generator().manual_seed(seed)
    own = torch.Generator().manual_seed(seed * 1000 + 1 + rank)

    def weight(out_f, in_f):
        w = torch.randn(out_f, in_f, generator=own) / math.sqrt(in_f)
        return w.to(device=device, dtype=dtype)

    def norm():
        w = 1.0 + 0.1 * torch.randn(cfg.hidden, generator=shared)
        return w.to(device=device, dtype=dtype)

    return {
        # Not parameters: RoPE's angle tables, computed once for the whole sequence (as a model
        # keeps its freqs_cis), so that no arm recomputes them every step.
        "rope": rope_tables(seq_len, cfg.head_dim, cfg.rope_theta, device),
        "attn_norm.weight": norm(),
        "wqkv.weight": weight(lc.qkv, cfg.hidden),
        "wo.weight": weight(cfg.hidden, lc.q_heads * lc.head_dim),
        "ffn_norm.weight": norm(),
        "w13.weight": weight(2 * lc.ffn, cfg.hidden),
        "w2.weight": weight(cfg.hidden, lc.ffn),
    }


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight.clone())
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight


def rope_tables(seq_len: int, head_dim: int, theta: float, device):
    """cos, sin [S, 1, d/2] (f32) for the positions 0..S-1 of the whole sequence."""
    even = torch.arange(0, head_dim, 2, device=device, dtype=torch.float32)
    inv = 1.0 / theta ** (even / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv)
    return angles.cos()[:, None, :], angles.sin()[:, None, :]


def rope(x, cos, sin):
    """x [S, h, d]: rotates the pairs (x[i], x[i + d/2]) by the position's angles, in f32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class Layer(nn.Module):
    """The decoder layer over four linears: wqkv and w13 map [T, H] -> [S, n] (gather, then
    multiply), wo and w2 map [S, k] -> [T, H] (multiply, then reduce-scatter)."""

    def __init__(self, cfg: Config, lc: Local, params: dict, wqkv, wo, w13, w2):
        super().__init__()
        self.lc = lc
        self.attn_norm = RMSNorm(params["attn_norm.weight"], cfg.norm_eps)
        self.ffn_norm = RMSNorm(params["ffn_norm.weight"], cfg.norm_eps)
        self.wqkv, self.wo, self.w13, self.w2 = wqkv, wo, w13, w2
        cos, sin = params["rope"]
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x):
        lc = self.lc
        d = lc.head_dim
        qkv = self.wqkv(self.attn_norm(x))  # [S, (hq + 2 hkv) d]
        S = qkv.shape[0]
        q, k, v = qkv.split([lc.q_heads * d, lc.kv_heads * d, lc.kv_heads * d], dim=-1)
        cos, sin = self.rope_cos[:S], self.rope_sin[:S]
        q = rope(q.view(S, lc.q_heads, d), cos, sin)
        k = rope(k.view(S, lc.kv_heads, d), cos, sin)
        v = v.view(S, lc.kv_heads, d)
        # [1, h, S, d]: SDPA's layout; enable_gqa lets each kv head serve hq/hkv query heads.
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            is_causal=True, enable_gqa=lc.q_heads != lc.kv_heads,
        )
        o = o[0].transpose(0, 1).reshape(S, lc.q_heads * d)
        h = x + self.wo(o)
        if getattr(self.w13, "applies_swiglu", False):  # w13 returns silu(gate) * up itself
            return h + self.w2(self.w13(self.ffn_norm(h)))
        gate, up = self.w13(self.ffn_norm(h)).chunk(2, dim=-1)  # [S, Fl] each
        return h + self.w2(F.silu(gate) * up)


# ---- the collectives of the PyTorch arms -----------------------------------------------------


def _bytes_for(x: torch.Tensor, group, always: bool = False) -> torch.Tensor:
    """gloo moves no float8: its all-gathers move the bytes (uint8 has the same size). The eager
    arm always does (`always`): the same bytes, whatever the backend's float8 support; the
    compiled arms gather float8 itself where they can, as PyTorch's float8 pass matches it."""
    if x.dtype == F8 and (always or dist.get_backend(group) == "gloo"):
        return x.view(torch.uint8)
    return x


class _DistAllGather(torch.autograd.Function):
    """[T, ..] -> [ws T, ..] with dist.all_gather_into_tensor; backward reduce-scatters."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        ws = dist.get_world_size(group)
        src = _bytes_for(x.contiguous(), group, always=True)
        out = src.new_empty((ws * x.shape[0], *x.shape[1:]))
        dist.all_gather_into_tensor(out, src, group=group)
        return out.view(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        return _dist_reduce_scatter(grad, ctx.group), None


def _dist_reduce_scatter(y, group):
    ws = dist.get_world_size(group)
    out = y.new_empty((y.shape[0] // ws, *y.shape[1:]))
    dist.reduce_scatter_tensor(out, y.contiguous(), group=group)
    return out


class _DistReduceScatter(torch.autograd.Function):
    """[ws T, ..] -> [T, ..] summed, with dist.reduce_scatter_tensor; backward all-gathers."""

    @staticmethod
    def forward(ctx, y, group):
        ctx.group = group
        return _dist_reduce_scatter(y, group)

    @staticmethod
    def backward(ctx, grad):
        return _DistAllGather.apply(grad, ctx.group), None


class DistCollectives:
    """Eager PyTorch: torch.distributed's collectives, on dim 0."""

    def __init__(self, group):
        self.group = group

    def gather(self, x):
        return _DistAllGather.apply(x, self.group)

    def scatter(self, y):
        return _DistReduceScatter.apply(y, self.group)


def _funcol_gather(x, ws: int, group_name: str):
    c = torch.ops._c10d_functional
    return c.wait_tensor(c.all_gather_into_tensor(x.contiguous(), ws, group_name))


def _funcol_reduce_scatter(y, ws: int, group_name: str):
    c = torch.ops._c10d_functional
    return c.wait_tensor(c.reduce_scatter_tensor(y.contiguous(), "sum", ws, group_name))


class _FuncolAllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ws, group_name):
        ctx.ws, ctx.group_name = ws, group_name
        return _funcol_gather(x, ws, group_name)

    @staticmethod
    def backward(ctx, grad):
        return _funcol_reduce_scatter(grad, ctx.ws, ctx.group_name), None, None


class _FuncolReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, ws, group_name):
        ctx.ws, ctx.group_name = ws, group_name
        return _funcol_reduce_scatter(y, ws, group_name)

    @staticmethod
    def backward(ctx, grad):
        return _funcol_gather(grad, ctx.ws, ctx.group_name), None, None


class FuncolCollectives:
    """torch.compile: the functional collectives (torch.ops._c10d_functional), which Dynamo
    traces and PyTorch's async-TP pass matches (all_gather_into_tensor -> wait_tensor -> mm,
    mm -> reduce_scatter_tensor -> wait_tensor), each the other's adjoint."""

    def __init__(self, group):
        self.group = group
        self.group_name = group.group_name
        self.ws = dist.get_world_size(group)

    def gather(self, x):
        src = _bytes_for(x, self.group)
        if src.dtype == torch.uint8:  # float8 over gloo: forward only, no gradient
            return _funcol_gather(src, self.ws, self.group_name).view(x.dtype)
        return _FuncolAllGather.apply(x, self.ws, self.group_name)

    def scatter(self, y):
        return _FuncolReduceScatter.apply(y, self.ws, self.group_name)


class GatherLinear(nn.Module):
    """Column-parallel: x [T, K] -> AG -> [S, K] @ W^T -> [S, N/ws]."""

    def __init__(self, weight, coll):
        super().__init__()
        self.weight = nn.Parameter(weight.clone())
        self.coll = coll

    def forward(self, x):
        return F.linear(self.coll.gather(x), self.weight)


class LinearScatter(nn.Module):
    """Row-parallel: h [S, K/ws] @ W^T -> [S, N] -> RS -> [T, N]."""

    def __init__(self, weight, coll):
        super().__init__()
        self.weight = nn.Parameter(weight.clone())
        self.coll = coll

    def forward(self, h):
        return self.coll.scatter(F.linear(h, self.weight))


# ---- float8 row-wise (forward only) ----------------------------------------------------------


def quantize_rows(x: torch.Tensor):
    """x [M, K] -> (x_f8 [M, K], scale [M, 1] f32) with x ~ x_f8 * scale, each row's amax at
    the top of float8_e4m3fn's range."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / F8_MAX
    return (x.float() / scale).clamp(-F8_MAX, F8_MAX).to(F8), scale


class _F8Weight(nn.Module):
    """W [N, K] quantized per output row: w_f8 [N, K], and its scale laid out for _scaled_mm's
    right-hand side, [1, N]. fast_accum: _scaled_mm's use_fast_accum, for every product."""

    def __init__(self, weight, fast_accum: bool = False):
        super().__init__()
        w_f8, scale = quantize_rows(weight)
        self.register_buffer("w_f8", w_f8)
        self.register_buffer("w_scale", scale.t().contiguous())
        self.fast_accum = fast_accum

    def mm(self, a_f8, a_scale, out_dtype):
        # w_f8.t() is [K, N] column-major, as _scaled_mm wants its second operand.
        return torch._scaled_mm(a_f8, self.w_f8.t(), a_scale, self.w_scale, out_dtype=out_dtype,
                                use_fast_accum=self.fast_accum)


class F8GatherLinear(_F8Weight):
    """x [T, K] -> quantize rows -> AG (values and scales) -> _scaled_mm -> [S, N/ws]."""

    def __init__(self, weight, coll, fast_accum: bool = False):
        super().__init__(weight, fast_accum)
        self.coll = coll

    def forward(self, x):
        x_f8, scale = quantize_rows(x)
        return self.mm(self.coll.gather(x_f8), self.coll.gather(scale), x.dtype)


class F8LinearScatter(_F8Weight):
    """h [S, K/ws] -> quantize rows -> _scaled_mm -> RS -> [T, N]."""

    def __init__(self, weight, coll, fast_accum: bool = False):
        super().__init__(weight, fast_accum)
        self.coll = coll

    def forward(self, h):
        h_f8, scale = quantize_rows(h)
        return self.coll.scatter(self.mm(h_f8, scale, h.dtype))


class AsynctpF8GatherLinear(_F8Weight):
    """The same through torch.ops.asynctp.fused_all_gather_scaled_matmul (row-wise A_scale of
    the shard, gathered with it)."""

    def __init__(self, weight, group_name, fast_accum: bool = False):
        super().__init__(weight, fast_accum)
        self.group_name = group_name

    def forward(self, x):
        from ..torch import functional as atp

        x_f8, scale = quantize_rows(x)
        _, (y,) = atp.fused_all_gather_scaled_matmul(
            x_f8, [self.w_f8.t()], scale, [self.w_scale], 0, self.group_name, [None], [None],
            [x.dtype], [self.fast_accum])
        return y


class AsynctpF8LinearScatter(_F8Weight):
    """The same through torch.ops.asynctp.fused_scaled_matmul_reduce_scatter."""

    def __init__(self, weight, group_name, fast_accum: bool = False):
        super().__init__(weight, fast_accum)
        self.group_name = group_name

    def forward(self, h):
        from ..torch import functional as atp

        h_f8, scale = quantize_rows(h)
        return atp.fused_scaled_matmul_reduce_scatter(
            h_f8, self.w_f8.t(), scale, self.w_scale, "sum", 0, 0, self.group_name,
            [h.shape[0], self.w_f8.shape[0]], out_dtype=h.dtype, use_fast_accum=self.fast_accum)


class AsynctpSwigluGatherLinear(nn.Module):
    """w13 and the SwiGLU as one op, torch.ops.asynctp.fused_all_gather_matmul_swiglu: on the
    native path the SwiGLU runs in the GEMM's epilogue, so [S, 2 Fl] is not read back for it; the
    backward's SwiGLU gradient is one elementwise pass (torch.ops.asynctp.swiglu_backward). It
    keeps what the unfused layer keeps: the gathered input (as keep_gathered_input) and the
    products [S, 2 Fl] (return_pre), so that backward computes no GEMM again."""

    applies_swiglu = True

    def __init__(self, weight, group_name):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())  # [2 Fl, H]: gate rows, then up rows
        self.group_name = group_name

    def forward(self, x):
        from ..torch import functional as atp

        keep = torch.is_grad_enabled()
        _, _, out = atp.fused_all_gather_matmul_swiglu(
            x, self.weight.t(), 0, self.group_name, return_A=keep, return_pre=keep)
        return out


# ---- the layers of each arm ------------------------------------------------------------------


def torch_layer(cfg, lc, params, coll, float8: bool, fast_accum: bool = False) -> Layer:
    """The layer over PyTorch's collectives `coll` (DistCollectives or FuncolCollectives).
    fast_accum (float8): every _scaled_mm with use_fast_accum."""
    col, row = GatherLinear, LinearScatter
    if float8:
        col = functools.partial(F8GatherLinear, fast_accum=fast_accum)
        row = functools.partial(F8LinearScatter, fast_accum=fast_accum)
    return Layer(cfg, lc, params, col(params["wqkv.weight"], coll), row(params["wo.weight"], coll),
                 col(params["w13.weight"], coll), row(params["w2.weight"], coll))


def asynctp_layer(cfg, lc, params, group, float8: bool, swiglu_epilogue: bool = False,
                  fast_accum: bool = False) -> Layer:
    """The layer over asynctp's eager modules (bf16) or its float8 fused ops (forward).
    swiglu_epilogue (bf16): w13 and the SwiGLU as one fused op (AsynctpSwigluGatherLinear).
    fast_accum (float8): the fused ops' use_fast_accum (the native kernel needs it)."""
    from ..torch.modules import ColumnParallelLinear, RowParallelLinear

    name = group.group_name
    if float8:
        col = functools.partial(AsynctpF8GatherLinear, fast_accum=fast_accum)
        row = functools.partial(AsynctpF8LinearScatter, fast_accum=fast_accum)
        return Layer(cfg, lc, params, col(params["wqkv.weight"], name),
                     row(params["wo.weight"], name), col(params["w13.weight"], name),
                     row(params["w2.weight"], name))
    ws = dist.get_world_size(group)

    def col(w):
        # keep_gathered_input: the weight's gradient reuses the forward's gathered input, as
        # autograd keeps PyTorch's (the same memory), instead of gathering it again.
        m = ColumnParallelLinear(w.shape[1], w.shape[0] * ws, group, bias=False, seq_dim=0,
                                 keep_gathered_input=True, device="meta",
                                 dtype=w.dtype).to_empty(device=w.device)
        with torch.no_grad():
            m.weight.copy_(w)
        return m

    def row(w):
        m = RowParallelLinear(w.shape[1] * ws, w.shape[0], group, bias=False, seq_dim=0,
                              device="meta", dtype=w.dtype).to_empty(device=w.device)
        with torch.no_grad():
            m.weight.copy_(w)
        return m

    w13 = (AsynctpSwigluGatherLinear(params["w13.weight"], name) if swiglu_epilogue
           else col(params["w13.weight"]))
    return Layer(cfg, lc, params, col(params["wqkv.weight"]), row(params["wo.weight"]), w13,
                 row(params["w2.weight"]))
