"""Sequence-parallel linear layers over the fused ops, eager, drop-in for nn.Linear.

A sequence-parallel MLP on a TP group of ws ranks (S = sequence, H = hidden, F = ffn):

    x [.., S/ws@seq, .., H]
      -> ColumnParallelLinear(H, F): all-gather on seq, then x @ W[F/ws rows of rank]^T
    h [.., S@seq, .., F/ws]
      -> activation (elementwise, local)
      -> RowParallelLinear(F, H): h @ W[:, F/ws cols of rank]^T, then reduce-scatter on seq
    y [.., S/ws@seq, .., H]

Each layer holds its shard of the full nn.Linear's weight ([out, in] as nn.Linear stores it):
column-parallel rows [rank*out/ws, (rank+1)*out/ws), row-parallel columns
[rank*in/ws, (rank+1)*in/ws). Gradients of the shards are the shards of the full layer's
gradients when every rank back-propagates its own part of the loss.

Bias, where it is exact:
- column-parallel: the bias shard (out/ws entries) is added to the rank's own output columns,
  which no other rank computes: exact, and its gradient is local.
- row-parallel: the full bias is added once after the reduce-scatter, to the rank's sequence
  shard, so every output element gets it once, as in nn.Linear. Its gradient is a partial sum
  over the rank's sequence shard; backward sums it over the group (one all-reduce of out
  entries, torch's), so every rank holds the full layer's bias gradient.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import distributed_c10d as c10d

from . import autograd as _autograd  # noqa: F401  (the ops' backward formulas)
from . import functional as _functional

__all__ = ["ColumnParallelLinear", "RowParallelLinear"]

def _resolve(group) -> tuple[dist.ProcessGroup, str]:
    if isinstance(group, str):
        return c10d._resolve_process_group(group), group
    if isinstance(group, dist.ProcessGroup):
        return group, group.group_name
    raise TypeError(
        f"asynctp: group must be a torch ProcessGroup or a group name, got {type(group).__name__}"
    )


def _shard_size(features: int, ws: int, what: str) -> int:
    if features % ws != 0:
        raise ValueError(
            f"asynctp: {what}={features} is not divisible by the group size {ws}"
        )
    return features // ws


class _AllReduceGrad(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the group (the replicated bias)."""

    @staticmethod
    def forward(ctx, x, group_name):
        ctx.group_name = group_name
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        # Summed in f32 and rounded once, as the fused reduce-scatter sums its partials.
        return _autograd.all_reduce_sum(grad.float(), ctx.group_name).to(grad.dtype), None


class _SequenceParallelLinear(nn.Module):
    def __init__(self, in_features, out_features, group, seq_dim, device, dtype):
        super().__init__()
        process_group, self.group_name = _resolve(group)
        self.world_size = process_group.size()
        self.rank = process_group.rank()
        self.in_features = in_features
        self.out_features = out_features
        self.seq_dim = seq_dim
        self._device_dtype = {"device": device, "dtype": dtype}

    @property
    def process_group(self) -> dist.ProcessGroup:
        """The group, looked up by its name: the layer holds the name only, so that deepcopy,
        pickling (torch.save of the module) and their copies (.to(dtype) of a deepcopy) work,
        and a copy shares the group, as a DTensor's copy shares its mesh."""
        return c10d._resolve_process_group(self.group_name)

    def _seq_dim_of(self, x: torch.Tensor) -> int:
        if x.dim() < 2:
            raise ValueError(
                f"asynctp: {type(self).__name__} needs an input of 2 or more dims, got {x.dim()}"
            )
        dim = self.seq_dim % x.dim() if -x.dim() <= self.seq_dim < x.dim() else None
        if dim is None or dim == x.dim() - 1:
            raise ValueError(
                f"asynctp: {type(self).__name__}: seq_dim={self.seq_dim} must be a leading dim"
                f" of the {x.dim()}-dim input (the last dim is the features)"
            )
        return dim

    # Whether every rank holds the whole bias (row-parallel) rather than its own shard of it.
    _replicated_bias = False

    def reset_parameters(self) -> None:
        """nn.Linear's init of the full layer: kaiming_uniform(a=sqrt(5)) on [out, in] is
        U(-1/sqrt(in), 1/sqrt(in)), and so is the bias, with in the full layer's in_features."""
        if self.weight.is_meta:  # deferred: from_linear or the user's to_empty fills it
            return
        bound = 1.0 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)
                # A replicated bias must be the same on every rank: rank 0's is broadcast.
                if self._replicated_bias and self.world_size > 1:
                    dist.broadcast(self.bias, group=self.process_group, group_src=0)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, seq_dim={self.seq_dim}, "
            f"group={self.group_name}, rank={self.rank}/{self.world_size}"
        )



def _unfilled_shard(cls, linear: nn.Linear, group, **options):
    """A layer of `cls` shaped as this rank's shard of `linear`, on linear's device and dtype,
    its parameters allocated but not initialised (from_linear copies them in)."""
    w = linear.weight
    return cls(
        linear.in_features,
        linear.out_features,
        group,
        bias=linear.bias is not None,
        device="meta",
        dtype=w.dtype,
        **options,
    ).to_empty(device=w.device)

class ColumnParallelLinear(_SequenceParallelLinear):
    """nn.Linear(in_features, out_features) with the output features split over the group.

    Input [.., S/ws@seq_dim, .., in_features] (sharded on the sequence);
    output [.., S@seq_dim, .., out_features/ws] (the full sequence, this rank's columns).
    One fused all-gather matmul forward; backward is a fused matmul reduce-scatter for the
    input's gradient and a local matmul for the weight's. keep_gathered_input=True keeps the
    gathered input from forward to backward (ws times the shard's memory) instead of gathering it
    again in backward.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        group,
        bias: bool = True,
        seq_dim: int = 1,
        keep_gathered_input: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__(in_features, out_features, group, seq_dim, device, dtype)
        self.out_per_rank = _shard_size(out_features, self.world_size, "out_features")
        self.keep_gathered_input = keep_gathered_input
        self.weight = nn.Parameter(
            torch.empty(self.out_per_rank, in_features, **self._device_dtype)
        )
        self.bias = (
            nn.Parameter(torch.empty(self.out_per_rank, **self._device_dtype)) if bias else None
        )
        self.reset_parameters()

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, group, seq_dim: int = 1, keep_gathered_input: bool = False
    ) -> "ColumnParallelLinear":
        """This rank's shard of a full nn.Linear (the same full weights on every rank)."""
        w = linear.weight
        layer = _unfilled_shard(cls, linear, group, seq_dim=seq_dim,
                                keep_gathered_input=keep_gathered_input)
        rows = slice(layer.rank * layer.out_per_rank, (layer.rank + 1) * layer.out_per_rank)
        with torch.no_grad():
            layer.weight.copy_(w[rows])
            if linear.bias is not None:
                layer.bias.copy_(linear.bias[rows])
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dim = self._seq_dim_of(x)
        _, (y,) = _functional.fused_all_gather_matmul(
            x, [self.weight.t()], dim, self.group_name, return_A=self.keep_gathered_input and torch.is_grad_enabled()
        )
        return y if self.bias is None else y + self.bias


class RowParallelLinear(_SequenceParallelLinear):
    """nn.Linear(in_features, out_features) with the input features split over the group.

    Input [.., S@seq_dim, .., in_features/ws] (this rank's features, the full sequence);
    output [.., S/ws@seq_dim, .., out_features] (summed over the group, sharded on the sequence).
    One fused matmul reduce-scatter forward; backward is a fused all-gather matmul for the
    input's gradient and a local matmul with the gathered gradient for the weight's.
    """

    _replicated_bias = True

    def __init__(
        self,
        in_features: int,
        out_features: int,
        group,
        bias: bool = True,
        seq_dim: int = 1,
        device=None,
        dtype=None,
    ):
        super().__init__(in_features, out_features, group, seq_dim, device, dtype)
        self.in_per_rank = _shard_size(in_features, self.world_size, "in_features")
        self.weight = nn.Parameter(
            torch.empty(out_features, self.in_per_rank, **self._device_dtype)
        )
        self.bias = nn.Parameter(torch.empty(out_features, **self._device_dtype)) if bias else None
        self.reset_parameters()


    @classmethod
    def from_linear(cls, linear: nn.Linear, group, seq_dim: int = 1) -> "RowParallelLinear":
        """This rank's shard of a full nn.Linear (the same full weights on every rank)."""
        w = linear.weight
        layer = _unfilled_shard(cls, linear, group, seq_dim=seq_dim)
        cols = slice(layer.rank * layer.in_per_rank, (layer.rank + 1) * layer.in_per_rank)
        with torch.no_grad():
            layer.weight.copy_(w[:, cols])
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dim = self._seq_dim_of(x)
        y = _functional.fused_matmul_reduce_scatter(
            x, self.weight.t(), "sum", dim, self.group_name
        )
        if self.bias is None:
            return y
        if not (torch.is_grad_enabled() and self.bias.requires_grad):
            return y + self.bias
        return y + _AllReduceGrad.apply(self.bias, self.group_name)
