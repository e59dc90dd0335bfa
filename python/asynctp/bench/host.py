"""The host time of one eager fused-op call from Python, and where it goes.

    torchrun --nproc-per-node 2 -m asynctp.bench.host --json host.json
    python -m asynctp.bench.host --device cpu     # one rank, no torchrun needed

For each shape (--shapes; the defaults are tests/python/run_gpu.py's host_us record: "small"
256 x 256 x 256 and "seed-2048" 2048 x 8192 x 3584 on CUDA) and each call of that record
(ag_mm_func / mm_rs_func: asynctp.torch's functions; ag_mm_ops / mm_rs_ops: torch.ops.asynctp
through torch's dispatcher; torch_mm: torch.mm alone, for the machine's speed), the median host
microseconds of one call, timed as run_gpu.py times it (perf_counter around the call, a device
sync every 10 calls; the slowest rank's median). Then the same calls once more with asynctp's
host profile on (src/ops/host_profile.h), which splits each call's time inside the library into
phases, from entering the C ABI ("entry") to returning ("return"); what the library does not see
is Python's: the route check, the output's allocation, the ctypes call ("python" in the table:
the call's median less the library's). On the CPU backend a call also waits for its result
(asynctp_synchronize), which the library's phases do not include.

A shape is label:MxKxN: all_gather_matmul gathers A [M/ws, K] and multiplies by B [K, N];
matmul_reduce_scatter multiplies A [M, K] by B [K, K] and scatters the rows, as run_gpu.py does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

CUDA_SHAPES = "small:256x256x256,seed-2048:2048x8192x3584"
CPU_SHAPES = "tiny:16x16x16"
CALLS = ("ag_mm_func", "mm_rs_func", "ag_mm_ops", "mm_rs_ops")
OP_OF = {"ag_mm": "all_gather_matmul", "mm_rs": "matmul_reduce_scatter"}


def parse_shapes(text: str) -> list[tuple[str, int, int, int]]:
    """"label:MxKxN,..." -> [(label, M, K, N)]; raises ValueError naming a bad entry."""
    out = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        label, sep, dims = item.partition(":")
        parts = dims.split("x")
        if not sep or not label or len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"shape {item!r} is not label:MxKxN")
        m, k, n = (int(p) for p in parts)
        if min(m, k, n) < 1:
            raise ValueError(f"shape {item!r} has an empty dim")
        out.append((label, m, k, n))
    if not out:
        raise ValueError("no shapes")
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="torchrun --nproc-per-node N -m asynctp.bench.host",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--shapes", default=None,
                   help=f"comma-separated label:MxKxN (default: {CUDA_SHAPES} on CUDA, "
                        f"{CPU_SHAPES} on the CPU)")
    p.add_argument("--calls", type=int, default=200, help="timed calls per measurement")
    p.add_argument("--dtype", choices=("bf16", "f16", "f32"), default="bf16")
    p.add_argument("--json", default=None, help="where rank 0 writes the results")
    args = p.parse_args(argv)
    if args.calls < 10:
        p.error(f"--calls {args.calls} is too small (at least 10)")
    if args.shapes is not None:
        try:
            parse_shapes(args.shapes)
        except ValueError as exc:
            p.error(f"--shapes: {exc}")
    return args


def host_time(fn, sync, calls: int) -> float:
    """Median host microseconds of one call (run_gpu.py's host_time): 10 warm-up calls, then
    `calls` timed ones, a device sync every 10 so that the launch queue never blocks the host."""
    for _ in range(10):
        fn()
    sync()
    times = []
    for i in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1000.0)
        if i % 10 == 9:
            sync()
    times.sort()
    return times[len(times) // 2]


def _max_over_ranks(values: list[float], device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def calls_of(A, B, Ars, Brs, group_name):
    import asynctp.torch as atp

    ops = torch.ops.asynctp
    return {
        "ag_mm_func": lambda: atp.fused_all_gather_matmul(A, [B], 0, group_name, return_A=False),
        "mm_rs_func": lambda: atp.fused_matmul_reduce_scatter(Ars, Brs, "sum", 0, group_name),
        "ag_mm_ops": lambda: ops.fused_all_gather_matmul(A, [B], 0, group_name, return_A=False),
        "mm_rs_ops": lambda: ops.fused_matmul_reduce_scatter(Ars, Brs, "sum", 0, group_name),
    }


def measure_shape(label, M, K, N, dtype, device, group_name, calls: int) -> dict:
    """One shape's record: per call, host_us (profile off), the path, and the library's profile
    of the same calls (profile on): {"ag_mm_func": {"host_us": ..., "path": ..., "profiled_us":
    ..., "library_us": ..., "python_us": ..., "phases": [...]}, ..., "torch_mm": us}."""
    import asynctp.torch as atp

    ws = dist.get_world_size()
    if M % ws != 0:
        raise ValueError(f"shape {label}: M {M} is not divisible by the world size {ws}")
    gen = torch.Generator(device="cpu").manual_seed(dist.get_rank())

    def randn(*shape, scale=1.0):
        return (torch.randn(shape, generator=gen) * scale).to(dtype=dtype, device=device)

    A, B = randn(M // ws, K), randn(K, N, scale=K**-0.5)
    Ars, Brs = randn(M, K), randn(K, K, scale=K**-0.5)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fns = calls_of(A, B, Ars, Brs, group_name)
    rec = {}
    for name, fn in fns.items():
        fn()  # the context, the path choice, the plans: before anything is timed
    for name, fn in fns.items():
        rec[name] = {"host_us": host_time(fn, sync, calls)}
    for name, fn in fns.items():
        op = OP_OF[name[:5]]
        atp.set_host_profile(group_name, True, device)
        rec[name]["profiled_us"] = host_time(fn, sync, calls)
        profile = atp.host_profile(group_name, device).get(op, {})
        atp.set_host_profile(group_name, False, device)
        path = atp.last_path(op, group_name, device)[0]
        rec[name]["path"] = path
        mine = profile.get(path, {})
        rec[name]["library_us"] = mine.get("median_us", 0.0)
        rec[name]["library_mean_us"] = mine.get("mean_us", 0.0)
        rec[name]["phases"] = mine.get("phases", [])
    rec["torch_mm"] = host_time(lambda: torch.mm(B, B.t()), sync, calls)
    # The slowest rank's medians (the ops are collective: every rank runs the same calls).
    keys = [(n, f) for n in fns for f in ("host_us", "profiled_us", "library_us")]
    worst = _max_over_ranks([rec[n][f] for n, f in keys] + [rec["torch_mm"]], device)
    for (n, f), v in zip(keys, worst):
        rec[n][f] = round(v, 2)
    rec["torch_mm"] = round(worst[-1], 2)
    for n in fns:
        rec[n]["python_us"] = round(rec[n]["profiled_us"] - rec[n]["library_us"], 2)
    return rec


def table(label: str, rec: dict) -> str:
    lines = [f"{label}: torch.mm alone {rec['torch_mm']:.1f} us host"]
    for name in CALLS:
        r = rec[name]
        lines.append(f"  {name:<11} {r['host_us']:7.1f} us host ({r['path']}); profiled "
                     f"{r['profiled_us']:.1f} us = library {r['library_us']:.1f} + python "
                     f"{r['python_us']:.1f}")
        for p in r["phases"]:
            lines.append(f"      {p['from']:>10} > {p['to']:<10} {p['median_us']:7.2f} us median, "
                         f"{p['per_call_us']:7.2f} us a call")
    return "\n".join(lines)


def run(args, device) -> dict:
    group_name = dist.group.WORLD.group_name
    shapes = parse_shapes(args.shapes or (CUDA_SHAPES if device.type == "cuda" else CPU_SHAPES))
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
    out = {"device": str(device), "ws": dist.get_world_size(), "torch": torch.__version__,
           "shapes": {}}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    for label, M, K, N in shapes:
        rec = measure_shape(label, M, K, N, dtype, device, group_name, args.calls)
        rec["M"], rec["K"], rec["N"] = M, K, N
        out["shapes"][label] = rec
        if dist.get_rank() == 0:
            print(table(label, rec), flush=True)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if "RANK" not in os.environ:  # one rank without torchrun
        os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"})
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    try:
        out = run(args, device)
        if args.json and dist.get_rank() == 0:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
    finally:
        dist.destroy_process_group()
    return 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
