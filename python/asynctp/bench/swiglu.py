"""The gate/up projection of a sequence-parallel SwiGLU MLP, op by op: the SwiGLU in asynctp's
GEMM epilogue against the same projection followed by a separate SwiGLU.

    torchrun --nproc-per-node 2 -m asynctp.bench.swiglu --tokens 8192 --json swiglu.json
    torchrun --nproc-per-node 2 -m asynctp.bench.swiglu --device cpu --tokens 64 --hidden 32 \\
        --ffn 64 --no-compile                      # CPU backend, gloo: correctness only

Per rank: A_shard [T, H], W13 [2F/ws, H] (the gate's F/ws rows, then the up projection's), B =
W13.t() (K-major, as nn.Linear keeps it); out [ws T, F/ws] = silu(P[:, :F/ws]) * P[:, F/ws:] with
P = all_gather(A_shard) @ B. Variants (every one validated against `unfused` first):

  mm            torch.mm of the gathered A (gathered once, before the timing) by B: the GEMM
                alone, the floor
  gemm          asynctp.torch.fused_all_gather_matmul alone (P, no SwiGLU)
  unfused       fused_all_gather_matmul, then the SwiGLU as eager torch ops
  compiled      fused_all_gather_matmul, then the SwiGLU as one torch.compile'd kernel (what
                Inductor makes of it in a compiled model); not with --no-compile
  epilogue_pre  fused_all_gather_matmul_swiglu(return_pre=True): the SwiGLU in the GEMM's
                epilogue, P stored too (what training keeps for the backward)
  epilogue      fused_all_gather_matmul_swiglu: out only (inference)

Timed side by side (asynctp.bench.layer's round robin: warm-up to sustained clocks, then `loops`
loops of `iters` calls of each variant in turn), microseconds per call, median loop, slowest rank.
The JSON holds the arguments and, per variant, `us`, `error` (relative to `unfused`; for
epilogue_pre also `pre_error`, its products against the fused GEMM's) and `path` (the path its
fused op took when validated: `auto` may take split for the plain fused GEMM, native for the
epilogue). The fused variants take the paths `auto` chooses; ASYNCTP_PATH=native (or split,
fallback) in the environment pins every one of them, so that the plain fused GEMM and the
epilogue run the same kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from asynctp.bench.layer import _all_ranks_true, _max_over_ranks, time_round_robin

VARIANTS = ("mm", "gemm", "unfused", "compiled", "epilogue_pre", "epilogue")
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="torchrun --nproc-per-node N -m asynctp.bench.swiglu",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--tokens", type=int, default=8192, help="T, tokens per rank")
    p.add_argument("--hidden", type=int, default=4096, help="H (the 8B layer's: 4096)")
    p.add_argument("--ffn", type=int, default=14336, help="F, over all ranks (8B: 14336)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--no-compile", action="store_true", help="leave out the compiled variant")
    p.add_argument("--warmup", type=int, default=3, help="calls of each variant before timing")
    p.add_argument("--warmup-ms", type=float, default=2000.0, metavar="MS",
                   help="CUDA: time every rank spends in warm-up rounds first (sustained clocks)")
    p.add_argument("--iters", type=int, default=10, help="calls per timed loop")
    p.add_argument("--loops", type=int, default=9, help="timed loops per variant (median)")
    p.add_argument("--json", default=None, help="where rank 0 writes the results")
    args = p.parse_args(argv)
    for name in ("tokens", "hidden", "ffn", "iters", "loops"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0 or not args.warmup_ms >= 0:  # (NaN fails the second)
        p.error(f"--warmup and --warmup-ms must be >= 0, got {args.warmup}, {args.warmup_ms}")
    if args.json:
        try:  # before the timing, not after it: a bad path loses no results
            with open(args.json, "a"):
                pass
        except OSError as exc:
            p.error(f"--json {args.json!r} cannot be written: {exc}")
    return args


def _device(args) -> torch.device:
    if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise SystemExit("asynctp.bench.swiglu: --device cuda, but torch sees no GPU")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def variants(A, B, n: int, group_name: str, compile_swiglu: bool) -> dict:
    """The variants' calls, each returning out [ws T, n]."""
    import asynctp.torch as atp

    def swiglu(p):
        return F.silu(p[:, :n]) * p[:, n:]

    A_full = torch.empty(A.shape[0] * dist.get_world_size(), A.shape[1], dtype=A.dtype,
                         device=A.device)
    dist.all_gather_into_tensor(A_full, A)

    def gathered():
        return atp.fused_all_gather_matmul(A, [B], 0, group_name, return_A=False)[1][0]

    calls = {
        "mm": lambda: torch.mm(A_full, B),
        "gemm": gathered,
        "unfused": lambda: swiglu(gathered()),
    }
    if compile_swiglu:
        compiled = torch.compile(swiglu, fullgraph=True)
        calls["compiled"] = lambda: compiled(gathered())
    calls["epilogue_pre"] = lambda: atp.fused_all_gather_matmul_swiglu(
        A, B, 0, group_name, return_pre=True)[2]
    calls["epilogue"] = lambda: atp.fused_all_gather_matmul_swiglu(A, B, 0, group_name)[2]
    return calls


def _relative_error(got, ref) -> float:
    return ((got.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def run(args, device) -> dict:
    import asynctp.torch as atp

    rank, ws = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    if args.ffn % ws != 0:
        raise SystemExit(f"asynctp.bench.swiglu: --ffn {args.ffn} does not split over {ws} ranks")
    n = args.ffn // ws
    dtype = DTYPES[args.dtype]
    gen = torch.Generator(device=device).manual_seed(1 + rank)
    A = torch.randn(args.tokens, args.hidden, generator=gen, device=device).to(dtype)
    gen.manual_seed(1000)  # one W13 on every rank (only its shard matters)
    W13 = (torch.randn(2 * n, args.hidden, generator=gen, device=device) /
           args.hidden ** 0.5).to(dtype)
    B = W13.t()
    calls = variants(A, B, n, group.group_name, not args.no_compile)
    ref = calls["unfused"]().float()
    tolerance = {"bf16": 2e-2, "f16": 5e-3, "f32": 1e-4}[args.dtype]
    result = {"variants": {}}
    for name, fn in calls.items():
        if name in ("mm", "gemm"):
            out = F.silu((p := fn().float())[:, :n]) * p[:, n:]
        else:
            out = fn().float()
        err = _relative_error(out, ref)
        if not _all_ranks_true(err <= tolerance, group):  # (a NaN error fails here)
            raise SystemExit(f"asynctp.bench.swiglu: {name} differs from unfused by "
                             f"{err:.3g} on rank {rank} (relative; at most {tolerance} on every "
                             f"rank): not timed")
        entry = result["variants"][name] = {"error": _max_over_ranks(err, group)}
        if name in ("gemm", "unfused", "compiled"):  # the path of the call just validated
            entry["path"] = atp.last_path("all_gather_matmul", group.group_name, device)[0]
        elif name.startswith("epilogue"):
            entry["path"] = atp.last_path("all_gather_matmul_swiglu", group.group_name,
                                          device)[0]
    # The products the epilogue stores beside its output, against the plain fused GEMM's.
    pre = atp.fused_all_gather_matmul_swiglu(A, B, 0, group.group_name, return_pre=True)[1]
    products = calls["gemm"]().float()
    err = _relative_error(pre, products)
    if not _all_ranks_true(err <= tolerance, group):
        raise SystemExit(f"asynctp.bench.swiglu: epilogue_pre's products differ from the fused "
                         f"GEMM's by {err:.3g} on rank {rank} (relative; at most {tolerance}): "
                         f"not timed")
    result["variants"]["epilogue_pre"]["pre_error"] = _max_over_ranks(err, group)
    names = list(calls)
    times = time_round_robin([calls[k] for k in names], args, device, group)
    for name, t in zip(names, times):
        result["variants"][name].update(
            us=t["ms"] * 1e3, rank_loops_us=[x * 1e3 for x in t["rank_loops_ms"]])
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    device = _device(args)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        result = run(args, device)
        ws = dist.get_world_size()
        if dist.get_rank() == 0:
            print(f"gate/up of a SwiGLU MLP, ws {ws}, {args.dtype}: A_shard [{args.tokens}, "
                  f"{args.hidden}], B [{args.hidden}, {2 * (args.ffn // ws)}]")
            for name, v in result["variants"].items():
                path = f"   ({v['path']})" if "path" in v else ""
                print(f"  {name:<13} {v['us']:10.1f} us   error {v['error']:.2e}{path}")
            if args.json:
                meta = {"ws": ws, "device": str(device), "torch": torch.__version__,
                        "args": vars(args)}
                if device.type == "cuda":
                    meta["gpu"] = torch.cuda.get_device_name(device)
                with open(args.json, "w") as f:
                    json.dump({**meta, **result}, f, indent=1)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
