"""torch.ops.asynctp on GPUs: the op checks of test_ops.py on CUDA tensors (NCCL reference), a
CUDA-graph capture and replay, then timings against torch.ops.symm_mem on the anchor shapes of
shared/anchors/torch_asynctp_bench.py (CUDA events, median, slowest rank; eager and graph
replay) and the host time of one eager call.

    torchrun --nproc-per-node 2 tests/python/run_gpu.py [--skip-bench] [--iters 30]

Needs the package (pip install .) or PYTHONPATH=python ASYNCTP_LIBRARY=build/lib/libasynctp_c.so.
Prints one JSON line per result on rank 0 (and appends them to $OUT/asynctp_torch.jsonl); exits
non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import asynctp
import asynctp.torch as atp
from asynctp.bench import host as bench_host

OPS = torch.ops.asynctp
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
FAILURES: list[str] = []


def log(rec: dict) -> None:
    if dist.get_rank() == 0:
        line = json.dumps(rec)
        print(line, flush=True)
        out = os.environ.get("OUT")
        if out:
            with open(os.path.join(out, "asynctp_torch.jsonl"), "a") as f:
                f.write(line + "\n")


def check(cond: bool, what: str) -> None:
    if not cond:
        FAILURES.append(f"rank {dist.get_rank()}: {what}")
        print(f"[rank {dist.get_rank()}] FAIL {what}", file=sys.stderr, flush=True)


def close(out, ref, what) -> None:
    rtol, atol = TOL.get(out.dtype, (1e-4, 1e-4))
    ref = ref.float()
    err = (out.float() - ref).abs()
    bound = atol * max(ref.abs().max().item(), 1.0) + rtol * ref.abs()
    check(bool((err <= bound).all()), f"{what}: max error {err.max().item():.3g}")


def randn(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=g, device="cuda") / 4).to(dtype)


def all_gather(t, dim):
    ws = dist.get_world_size()
    moved = t.movedim(dim, 0).contiguous()
    src = moved.view(torch.uint8) if t.element_size() == 1 else moved
    out = src.new_empty((ws * moved.shape[0], *moved.shape[1:]))
    dist.all_gather_into_tensor(out, src)
    return out.view(t.dtype).movedim(0, dim)


def reduce_scatter(t, dim, op):
    ws = dist.get_world_size()
    moved = t.float().movedim(dim, 0).contiguous()
    out = moved.new_empty((moved.shape[0] // ws, *moved.shape[1:]))
    dist.reduce_scatter_tensor(out, moved)
    return (out / ws if op == "avg" else out).movedim(0, dim)


def correctness(name: str) -> None:
    rank, ws = dist.get_rank(), dist.get_world_size()
    for dtype, shape, num_bs, return_A in itertools.product(
        (torch.float32, torch.bfloat16, torch.float16), ((256, 128), (2 * ws, 64, 128)), (1, 2), (True, False)
    ):
        for g in range(len(shape)):
            what = f"ag_mm {dtype} {shape} dim {g} bs {num_bs} return_A {return_A}"
            A = randn(shape, dtype, 10 + rank)
            k = shape[-1] * (ws if g == len(shape) - 1 else 1)
            Bs = [randn((k, 96 + 32 * i), dtype, 20 + i) for i in range(num_bs)]
            A_out, outs = OPS.fused_all_gather_matmul(A, Bs, g, name, return_A=return_A)
            A_ref = all_gather(A, g)
            check(A_out is None if not return_A else torch.equal(A_out, A_ref), f"{what}: A")
            for i, (o, B) in enumerate(zip(outs, Bs)):
                close(o, A_ref.float() @ B.float(), f"{what}: out {i}")
    for dtype, shape, op in itertools.product(
        (torch.float32, torch.bfloat16, torch.float16), ((256, 128), (2 * ws, 64, 128)), ("sum", "avg")
    ):
        for g in range(len(shape)):
            what = f"mm_rs {dtype} {shape} dim {g} {op}"
            A = randn(shape, dtype, 30 + rank)
            B = randn((shape[-1], 64 * ws), dtype, 40 + rank)
            close(OPS.fused_matmul_reduce_scatter(A, B, op, g, name),
                  reduce_scatter(A.float() @ B.float(), g, op), what)
            A2, B2 = randn(shape, dtype, 50 + rank), randn((shape[-1], 64 * ws), dtype, 60 + rank)
            close(OPS.fused_matmuls_reduce_scatter([A, A2], [B, B2], op, g, name),
                  reduce_scatter(A.float() @ B.float() + A2.float() @ B2.float(), g, op),
                  f"{what} (two products)")
    # float8, tensor-wise and row-wise scales; exact, and with fast accumulation allowed (against
    # _scaled_mm with the same use_fast_accum).
    f8 = torch.float8_e4m3fn
    for rowwise, fast in itertools.product((False, True), (False, True)):
        A = randn((128, 128), torch.float32, 70 + rank).mul(4).to(f8)
        B = randn((96, 128), torch.float32, 80).mul(4).to(f8).t()
        sa = randn((128, 1), torch.float32, 90 + rank).abs() + 0.5 if rowwise else torch.tensor(0.5, device="cuda")
        sb = randn((1, 96), torch.float32, 91).abs() + 0.5 if rowwise else torch.tensor(0.25, device="cuda")
        A_out, (o,) = OPS.fused_all_gather_scaled_matmul(A, [B], sa, [sb], 0, name, [None], [None],
                                                         [torch.bfloat16], [fast])
        A_ref = all_gather(A, 0)
        sa_ref = all_gather(sa, 0) if rowwise else sa
        # Row-wise scaling in _scaled_mm wants a bf16 output on CUDA: the reference is bf16 too.
        close(o, torch._scaled_mm(A_ref, B, sa_ref, sb, out_dtype=torch.bfloat16,
                                  use_fast_accum=fast),
              f"ag_scaled_mm rowwise {rowwise} fast {fast}")
        Bs = randn((96 * ws, 128), torch.float32, 92 + rank).mul(4).to(f8).t()
        sbs = randn((1, 96 * ws), torch.float32, 93 + rank).abs() + 0.5 if rowwise else sb
        o = OPS.fused_scaled_matmul_reduce_scatter(A, Bs, sa, sbs, "sum", 0, 0, name, [128, 96 * ws],
                                                   out_dtype=torch.bfloat16, use_fast_accum=fast)
        close(o, reduce_scatter(torch._scaled_mm(A, Bs, sa, sbs, out_dtype=torch.bfloat16,
                                                 use_fast_accum=fast), 0, "sum"),
              f"scaled_mm_rs rowwise {rowwise} fast {fast}")
    # A wrong device is a named error.
    A = randn((64, 64), torch.bfloat16, 1)
    try:
        OPS.fused_all_gather_matmul(A, [A.cpu()], 0, name)
        check(False, "a CPU B with a CUDA A was accepted")
    except asynctp.InvalidArgumentError:
        pass
    log({"kind": "correctness", "failures": len(FAILURES)})


def capture(name: str) -> None:
    """reserve, capture each op into a CUDA graph, replay, compare with eager."""
    rank = dist.get_rank()
    A = randn((1024, 512), torch.bfloat16, 100 + rank)
    B = randn((512, 256), torch.bfloat16, 101)
    atp.reserve(OPS.fused_all_gather_matmul, A, [B], 0, name)
    atp.reserve(OPS.fused_matmul_reduce_scatter, A, B, "sum", 0, name)
    eager_ag = OPS.fused_all_gather_matmul(A, [B], 0, name)[1][0].clone()
    eager_ag_path = atp.last_path("all_gather_matmul", name)[0]
    eager_rs = OPS.fused_matmul_reduce_scatter(A, B, "sum", 0, name).clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ag = OPS.fused_all_gather_matmul(A, [B], 0, name)[1][0]
        graph_ag_path = atp.last_path("all_gather_matmul", name)[0]
        rs = OPS.fused_matmul_reduce_scatter(A, B, "sum", 0, name)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    # Under auto, the captured call may take another path than the eager one (a capture cannot
    # measure), and paths round differently: equal within bf16's tolerance, and bit equality
    # reported beside it.
    close(ag, eager_ag, "graph replay of all_gather_matmul against eager")
    close(rs, eager_rs, "graph replay of matmul_reduce_scatter against eager")
    # The native GEMM is deterministic, its tail split included (at ws 2 the gathered A is
    # [2048, 512] and B [512, 256]: 16 tiles, each split in two), also captured on
    # torch.cuda.graph's own stream, which never ran it eagerly: the same path eager and captured
    # gives the same bits ("ag_bits_checked" says whether both took native).
    ag_bits_checked = eager_ag_path == graph_ag_path == "native"
    if ag_bits_checked:
        check(torch.equal(ag, eager_ag),
              "graph replay of the native all_gather_matmul differs in bits from the eager call")
    log({"kind": "capture", "failures": len(FAILURES), "memory": atp.memory_stats(name),
         "ag_bit_equal": torch.equal(ag, eager_ag), "rs_bit_equal": torch.equal(rs, eager_rs),
         "ag_bits_checked": ag_bits_checked, "ag_eager_path": eager_ag_path,
         "paths": [atp.last_path("all_gather_matmul", name)[0],
                   atp.last_path("matmul_reduce_scatter", name)[0]]})


def as_graph(fn):
    """fn captured into a CUDA graph (after a warm-up on a side stream); returns its replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g.replay


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


# Device cycles each timed run's start waits behind its barrier (--hide-launch; 0: none): time
# for the host to enqueue the run before the GPU reaches it, so that the run's time holds no host
# time (the barrier's end to the run's first kernel), only the device's.
HIDE_LAUNCH_CYCLES = 0
# What lines the ranks up before each timed run (--align): "asynctp", asynctp.torch.barrier on the
# current stream (asynctp bench's own alignment), or "nccl", a one-element NCCL all-reduce.
ALIGN = "asynctp"


def bench(fns: dict, iters: int, pace: float, warmup_ms: float = 300.0) -> dict:
    """Median microseconds by CUDA events, the slowest rank's, of each of `fns`, timed the way
    `asynctp bench` times (src/tools/session.cpp): rounds of every variant in alternating orders
    (each variant follows the other about equally often), each run after a device barrier
    (asynctp.torch.barrier on the current stream, as the bench's; with --align nccl a one-element
    NCCL all-reduce), timed from an event recorded behind the barrier to one recorded behind the
    run, then an idle spin of `pace` times the run (1: paced, below the power cap; 0: sustained,
    back to back). Warmed up until warmup_ms have passed."""
    names = list(fns)
    token = torch.zeros(1, device="cuda")
    group_name = dist.group.WORLD.group_name
    began = time.perf_counter()
    for r in itertools.count():
        for n in names:
            fns[n]()
        # Every rank runs the same number of rounds (the ops are collective).
        more = torch.tensor([float(r < 2 or (time.perf_counter() - began) * 1e3 < warmup_ms)],
                            device="cuda")
        dist.all_reduce(more, op=dist.ReduceOp.MAX)
        if more.item() == 0.0:
            break
    times = {n: [] for n in names}
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(iters):
        for n in (names if i % 2 == 0 else names[::-1]):
            if ALIGN == "asynctp":
                atp.barrier(group_name)
            else:
                dist.all_reduce(token)
            if HIDE_LAUNCH_CYCLES:
                torch.cuda._sleep(HIDE_LAUNCH_CYCLES)
            start.record()
            fns[n]()
            stop.record()
            stop.synchronize()
            us = start.elapsed_time(stop) * 1000.0
            times[n].append(us)
            if pace > 0:
                spin(pace * us / 1e6)
    med = torch.tensor([sorted(times[n])[len(times[n]) // 2] for n in names], device="cuda")
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return dict(zip(names, med.tolist()))


def host_time(fn, calls: int = 200) -> float:
    """Median host microseconds of one eager call (asynctp.bench.host's measure)."""
    return bench_host.host_time(fn, torch.cuda.synchronize, calls)


def side_by_side(rec: dict, ours, ours_func, theirs, iters: int) -> None:
    """asynctp's op (torch.ops, and eager also asynctp.torch's function: "asynctp_func") and
    symm_mem's, eager and replayed from CUDA graphs, paced and sustained, into rec:
    "{eager|graph}_{paced|sustained}": {"asynctp": us, "symm_mem": us, "speedup": x}."""
    replays = {"asynctp": as_graph(ours), "symm_mem": as_graph(theirs)}
    eager = {"asynctp": ours, "asynctp_func": ours_func, "symm_mem": theirs}
    for mode, fns in (("eager", eager), ("graph", replays)):
        for pace_name, pace in (("paced", 1.0), ("sustained", 0.0)):
            t = bench(fns, iters, pace)
            t["speedup"] = t["symm_mem"] / t["asynctp"]
            if "asynctp_func" in t:
                t["speedup_func"] = t["symm_mem"] / t["asynctp_func"]
            rec[f"{mode}_{pace_name}"] = t


def uniform(shape, scale: float) -> torch.Tensor:
    """bf16 values uniform in (-scale, scale): the distribution `asynctp bench` times with (its
    fill_random), so that both time the same op on alike data."""
    return ((torch.rand(shape, device="cuda") * 2 - 1) * scale).to(torch.bfloat16)


def timings(name: str, iters: int) -> None:
    import torch.distributed._symmetric_memory as symm_mem

    rank, ws = dist.get_rank(), dist.get_world_size()
    try:
        symm_mem.enable_symm_mem_for_group(name)  # deprecated in newer releases, needed in older
    except Exception as exc:  # noqa: BLE001
        log({"kind": "note", "enable_symm_mem_for_group": repr(exc)})
    dt = torch.bfloat16
    # The anchor shapes: (label, M_total, K, N_local), A_shard [M/ws, K], B [K, N_local].
    ag_shapes = [("seed-4096x3584x8192", 4096, 8192, 3584), ("seed-2048x3584x8192", 2048, 8192, 3584),
                 ("l3-8b-ffn-up", 8192, 4096, 2 * 14336 // ws), ("l3-70b-ffn-up", 8192, 8192, 2 * 28672 // ws),
                 ("l3-70b-qkv", 8192, 8192, (8192 + 2 * 1024) // ws)]
    for label, M, K, N in ag_shapes:
        torch.manual_seed(rank)
        A, B = uniform((M // ws, K), 1.0), uniform((K, N), K**-0.5)
        ours = lambda: OPS.fused_all_gather_matmul(A, [B], 0, name, return_A=False)  # noqa: E731
        ours_func = lambda: atp.fused_all_gather_matmul(A, [B], 0, name, return_A=False)  # noqa: E731
        theirs = lambda: torch.ops.symm_mem.fused_all_gather_matmul(A, [B], 0, name, return_A=False)  # noqa: E731
        rec = {"kind": "ag_mm", "shape": label, "M": M, "K": K, "N": N}
        atp.reserve(OPS.fused_all_gather_matmul, A, [B], 0, name, return_A=False)
        side_by_side(rec, ours, ours_func, theirs, iters)
        rec["path"] = atp.last_path("all_gather_matmul", name)[0]
        log(rec)
    rs_shapes = [("seed-like-4096x8192x3584", 4096, 3584, 8192), ("l3-8b-ffn-down", 8192, 14336 // ws, 4096),
                 ("l3-70b-ffn-down", 8192, 28672 // ws, 8192), ("l3-70b-attn-out", 8192, 8192 // ws, 8192)]
    for label, M, K, N in rs_shapes:
        torch.manual_seed(rank)
        A, B = uniform((M, K), 1.0), uniform((K, N), K**-0.5)
        ours = lambda: OPS.fused_matmul_reduce_scatter(A, B, "sum", 0, name)  # noqa: E731
        ours_func = lambda: atp.fused_matmul_reduce_scatter(A, B, "sum", 0, name)  # noqa: E731
        theirs = lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 0, name)  # noqa: E731
        rec = {"kind": "mm_rs", "shape": label, "M": M, "K": K, "N": N}
        atp.reserve(OPS.fused_matmul_reduce_scatter, A, B, "sum", 0, name)
        side_by_side(rec, ours, ours_func, theirs, iters)
        rec["path"] = atp.last_path("matmul_reduce_scatter", name)[0]
        log(rec)
    # Host time of one eager call: on a small problem whose GPU time hides behind the host's, and
    # on seed-2048 (the native path), through torch.ops (torch's dispatcher) and through
    # asynctp.torch's functions (straight to the kernel where nothing needs the dispatcher).
    rec = {"kind": "host_us"}
    for label, M, K, N in (("small", 256, 256, 256), ("seed-2048", 2048, 8192, 3584)):
        A = torch.randn(M // ws, K, dtype=dt, device="cuda")
        B = torch.randn(K, N, dtype=dt, device="cuda") / K**0.5
        Brs = torch.randn(K, K, dtype=dt, device="cuda") / K**0.5
        Ars = torch.randn(M, K, dtype=dt, device="cuda")
        calls = {
            "ag_mm_ops": lambda: OPS.fused_all_gather_matmul(A, [B], 0, name, return_A=False),
            "ag_mm_func": lambda: atp.fused_all_gather_matmul(A, [B], 0, name, return_A=False),
            "mm_rs_ops": lambda: OPS.fused_matmul_reduce_scatter(Ars, Brs, "sum", 0, name),
            "mm_rs_func": lambda: atp.fused_matmul_reduce_scatter(Ars, Brs, "sum", 0, name),
            "symm_mem_ag_mm": lambda: torch.ops.symm_mem.fused_all_gather_matmul(A, [B], 0, name, return_A=False),
        }
        mine = [host_time(fn) for fn in calls.values()]
        t = torch.tensor(mine, device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        rec[label] = dict(zip(calls, [round(x, 1) for x in t.tolist()]))
        rec[label]["paths"] = [atp.last_path("all_gather_matmul", name)[0],
                               atp.last_path("matmul_reduce_scatter", name)[0]]
    rec["torch_mm"] = host_time(lambda: torch.mm(B, B.t()))
    log(rec)
    func = [rec[label][k] for label in ("small", "seed-2048") for k in ("ag_mm_func", "mm_rs_func")]
    check(max(func) <= 20.0, f"host time per eager call through asynctp.torch's functions {func} us "
          "is over 20 us")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--hide-launch", type=int, default=0, metavar="CYCLES",
                        help="each timed run starts this many device cycles behind its barrier "
                        "(torch.cuda._sleep), so that its time holds no host time, as "
                        "asynctp bench --hide-launch does; 0: off, the bench's default")
    parser.add_argument("--align", choices=("asynctp", "nccl"), default="asynctp",
                        help="the device barrier before each timed run: asynctp.torch.barrier "
                        "(what asynctp bench aligns with) or a one-element NCCL all-reduce")
    args = parser.parse_args()
    global HIDE_LAUNCH_CYCLES, ALIGN
    HIDE_LAUNCH_CYCLES = args.hide_launch
    ALIGN = args.align
    dist.init_process_group("nccl")
    local = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    torch.cuda.set_device(local % torch.cuda.device_count())
    name = dist.group.WORLD.group_name
    log({"kind": "env", "torch": torch.__version__, "asynctp": asynctp.version(),
         "python": sys.version.split()[0], "ws": dist.get_world_size(),
         "gpu": torch.cuda.get_device_name()})
    correctness(name)
    # One NCCL per process: with asynctp's library loaded and its contexts made (NCCL
    # communicators included), its libnccl.so.2 must be the one torch loaded.
    ncclibs = sorted({line.split()[-1] for line in open("/proc/self/maps")
                      if "libnccl" in line and line.split()[-1].startswith("/")})
    log({"kind": "nccl", "rank": dist.get_rank(), "mapped": ncclibs})
    check(len(ncclibs) == 1, f"{len(ncclibs)} NCCL libraries in the process: {ncclibs}")
    capture(name)
    if not args.skip_bench:
        timings(name, args.iters)
    failed = torch.tensor([len(FAILURES)], device="cuda")
    dist.all_reduce(failed)
    log({"kind": "done", "failures": int(failed.item())})
    dist.destroy_process_group()
    return 1 if failed.item() else 0


if __name__ == "__main__":
    sys.exit(main())
