"""Sequence-parallel ParallelStyles for torch.distributed.tensor.parallel.parallelize_module.

A DTensor (torchtitan) model switches its tensor-parallel linears to asynctp's fused ops by
changing the styles of its plan, and dropping the PrepareModuleInput that gathers the sequence
before them (the gather is now inside each column-parallel linear):

    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module
    import asynctp.torch.parallel as atp_tp

    parallelize_module(block, tp_mesh, {
        "attention_norm": SequenceParallel(),       # output: Shard(1) on the sequence
        "attention.wq": atp_tp.ColwiseParallel(),   # AG(seq) + x W^T, one fused op
        "attention.wk": atp_tp.ColwiseParallel(),
        "attention.wv": atp_tp.ColwiseParallel(),
        "attention.wo": atp_tp.RowwiseParallel(),   # x W^T + RS(seq), one fused op
        "ffn_norm": SequenceParallel(),
        "feed_forward.w1": atp_tp.ColwiseParallel(),
        "feed_forward.w2": atp_tp.RowwiseParallel(),
        "feed_forward.w3": atp_tp.ColwiseParallel(),
    })

in place of PyTorch's plan (PrepareModuleInput(desired_input_layouts=Replicate()) on attention
and feed_forward, ColwiseParallel(), RowwiseParallel(output_layouts=Shard(1))). Shapes, on a
1-D TP mesh of ws ranks, seq = the sequence dim (1 by default), S the whole sequence:

    ColwiseParallel:  x [.., S/ws@seq, .., in]  -> fused AG(seq) matmul -> [.., S@seq, .., out/ws]
    RowwiseParallel:  h [.., S@seq, .., in/ws]  -> fused matmul RS(seq) -> [.., S/ws@seq, .., out]

Parameters are distributed exactly as PyTorch's styles distribute them (column-parallel weight
and bias Shard(0); row-parallel weight Shard(1), bias Replicate), so state dicts, optimizers and
checkpoints see the same DTensors. Inputs may be local tensors (read as input_layouts) or
DTensors (redistributed to input_layouts first, a no-op when they already are). torch.compile
traces the styled modules whole (fullgraph): the fused ops enter the graph as torch.ops.asynctp.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle

from . import functional as _functional
from .modules import _AllReduceGrad

__all__ = ["ColwiseParallel", "RowwiseParallel"]


def _shard_dim(placement, what: str) -> int:
    if not isinstance(placement, Shard):
        raise ValueError(
            f"asynctp: {what} must be Shard(seq_dim), the sequence dim the fused op gathers or "
            f"scatters, got {placement}; for a replicated sequence use PyTorch's own style")
    return placement.dim


def _seq_dim(dim: int, ndim: int, style: str) -> int:
    if not -ndim <= dim < ndim or dim % ndim == ndim - 1:
        raise ValueError(
            f"asynctp: {style}: the sequence dim {dim} must be a leading dim of the {ndim}-dim "
            "input (the last is the features)")
    return dim % ndim


def _local(x, mesh, placement):
    """x as this rank's local tensor under `placement` (a DTensor is redistributed first)."""
    if isinstance(x, DTensor):
        if tuple(x.placements) != (placement,):
            x = x.redistribute(mesh, [placement])
        return x.to_local()
    return x


def _output(y, mesh, produced, wanted, use_local_output: bool):
    if use_local_output and produced == wanted:
        return y
    out = DTensor.from_local(y, mesh, [produced], run_check=False)
    if wanted != produced:
        out = out.redistribute(mesh, [wanted])
    return out.to_local() if use_local_output else out


def _install(module, mesh, style, placements: dict, forward):
    """Distributes the nn.Linear's parameters as `placements` say and makes its forward
    `forward(module, x)`, one fused op."""
    name = type(style).__name__
    # Exactly nn.Linear: the style replaces the forward, which a subclass (a float8 linear, say)
    # has made its own.
    if type(module) is not nn.Linear:
        raise NotImplementedError(
            f"asynctp: {name} shards nn.Linear only (not its subclasses), got {type(module)}")
    if mesh.ndim != 1:
        raise ValueError(f"asynctp: {name} needs a 1-D (TP) mesh, got {mesh.ndim} dims")
    for pname, param in list(module.named_parameters(recurse=False)):
        dist_param = nn.Parameter(
            distribute_tensor(param, mesh, [placements[pname]], src_data_rank=style.src_data_rank),
            requires_grad=param.requires_grad)
        module.register_parameter(pname, dist_param)
    module.__class__ = _AsynctpLinear
    module._atp_style = style
    module._atp_mesh = mesh
    module._atp_group_name = mesh.get_group().group_name
    module._atp_forward = forward
    return module


class _AsynctpLinear(nn.Linear):
    """What an nn.Linear becomes under an asynctp style: the same parameters (now DTensors),
    its forward one fused op. The style's settings are the _atp_* attributes."""

    def forward(self, x):
        return self._atp_forward(self, x)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self._atp_style!r}"


class ColwiseParallel(ParallelStyle):
    """nn.Linear, output features sharded, the input sharded on the sequence: one fused
    all-gather matmul (torch.ops.asynctp.fused_all_gather_matmul) forward; its backward a fused
    matmul reduce-scatter.

    input_layouts: Shard(seq_dim) (default Shard(1)); output_layouts: default Shard(-1) (this
    rank's output features, as the fused op makes them; any other layout is redistributed to);
    use_local_output: return the local tensor (default) rather than a DTensor;
    keep_gathered_input: keep the gathered input from forward to backward for the weight's
    gradient (default, what PyTorch's ColwiseParallel keeps: its replicated input), or keep the
    shard and gather it again in backward (ws times less memory, one more all-gather).
    """

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output=True,
                 keep_gathered_input=True):
        super().__init__()
        self.input_layouts = input_layouts or Shard(1)
        self.output_layouts = output_layouts or Shard(-1)
        _shard_dim(self.input_layouts, "ColwiseParallel input_layouts")
        self.use_local_output = use_local_output
        self.keep_gathered_input = keep_gathered_input

    def __repr__(self) -> str:
        return (f"asynctp.ColwiseParallel(input_layouts={self.input_layouts}, "
                f"output_layouts={self.output_layouts}, use_local_output={self.use_local_output}"
                f", keep_gathered_input={self.keep_gathered_input})")

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        return _install(module, device_mesh, self, {"weight": Shard(0), "bias": Shard(0)},
                        _colwise_forward)


def _colwise_forward(module, x):
    style, mesh = module._atp_style, module._atp_mesh
    x = _local(x, mesh, style.input_layouts)
    dim = _seq_dim(style.input_layouts.dim, x.dim(), "ColwiseParallel")
    w = module.weight.to_local()  # [out/ws, in]
    keep = style.keep_gathered_input and torch.is_grad_enabled()
    _, (y,) = _functional.fused_all_gather_matmul(x, [w.t()], dim, module._atp_group_name,
                                                  return_A=keep)
    if module.bias is not None:
        y = y + module.bias.to_local()  # this rank's out/ws entries: exact, local gradient
    produced = Shard(y.dim() - 1)
    wanted = style.output_layouts
    if isinstance(wanted, Shard) and wanted.dim % y.dim() == y.dim() - 1:
        wanted = produced
    return _output(y, mesh, produced, wanted, style.use_local_output)


class RowwiseParallel(ParallelStyle):
    """nn.Linear, input features sharded, the output reduce-scattered on the sequence: one fused
    matmul reduce-scatter (torch.ops.asynctp.fused_matmul_reduce_scatter) forward; its backward a
    fused all-gather matmul.

    input_layouts: Shard(-1) (this rank's input features, as ColwiseParallel makes them; the
    default and the only layout); output_layouts: Shard(seq_dim) (default Shard(1));
    use_local_output as above.
    """

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output=True):
        super().__init__()
        self.input_layouts = input_layouts or Shard(-1)
        self.output_layouts = output_layouts or Shard(1)
        _shard_dim(self.input_layouts, "RowwiseParallel input_layouts")
        _shard_dim(self.output_layouts, "RowwiseParallel output_layouts")
        self.use_local_output = use_local_output

    def __repr__(self) -> str:
        return (f"asynctp.RowwiseParallel(input_layouts={self.input_layouts}, "
                f"output_layouts={self.output_layouts}, use_local_output={self.use_local_output})")

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        return _install(module, device_mesh, self, {"weight": Shard(1), "bias": Replicate()},
                        _rowwise_forward)


def _rowwise_forward(module, x):
    style, mesh = module._atp_style, module._atp_mesh
    features = _shard_dim(style.input_layouts, "RowwiseParallel input_layouts")
    if features % x.dim() != x.dim() - 1:
        raise ValueError(f"asynctp: RowwiseParallel needs the input sharded on its features (the "
                         f"last dim), got input_layouts {style.input_layouts} for {x.dim()} dims")
    x = _local(x, mesh, Shard(x.dim() - 1))
    dim = _seq_dim(style.output_layouts.dim, x.dim(), "RowwiseParallel")
    w = module.weight.to_local()  # [out, in/ws]
    y = _functional.fused_matmul_reduce_scatter(x, w.t(), "sum", dim, module._atp_group_name)
    if module.bias is not None:
        # The replicated bias is added once per output element (to this rank's tokens); its
        # gradient, a partial sum over this rank's tokens, is summed over the group.
        y = y + _AllReduceGrad.apply(module.bias.to_local(), module._atp_group_name)
    return _output(y, mesh, Shard(dim), Shard(dim), style.use_local_output)
