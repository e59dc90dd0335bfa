"""The layer benchmark: a sequence-parallel Llama-3 decoder layer (asynctp.bench.llama), one
training step (forward and backward; forward only in float8) per arm, under sustained load.

    torchrun --nproc-per-node 2 -m asynctp.bench.layer --config 8b,70b --tokens 4096,8192 \
        --json layer.json

Arms (--arms):
  eager             PyTorch eager: dist.all_gather_into_tensor / reduce_scatter_tensor around
                    F.linear (the reference every other arm is validated against)
  compile           torch.compile of the same layer over the functional collectives
  compile_async_tp  the same with PyTorch's async TP (_micro_pipeline_tp, symm_mem enabled for
                    the group); its post-grad graphs must hold symm_mem fused nodes (CUDA only)
  asynctp           asynctp's eager modules (ColumnParallelLinear / RowParallelLinear); float8:
                    asynctp's fused scaled ops. bf16 runs two variants: "eager" (the SwiGLU
                    between w13 and w2 as torch ops) and "swiglu_epilogue" (w13 and the SwiGLU
                    as one fused_all_gather_matmul_swiglu, its gradient one swiglu_backward)
  compile_asynctp   torch.compile with asynctp's pass (asynctp.torch.enable)
The compiled arms also run with CUDA graphs (mode="reduce-overhead") on CUDA; the faster variant
counts. Every arm is validated (output and every gradient) against eager PyTorch before it is
timed; one that disagrees is not timed, and the run, having written its JSON, exits with status 1
(so it does when PyTorch's async TP fuses nothing, or no variant of an arm runs). Per step: CUDA
events (time.perf_counter on the CPU) around --iters back-to-back steps, the median of --loops
such loops, the slowest rank. The arms are timed side by side, one loop of each variant in turn,
so that a drift of the clocks during the run reaches them alike; only the CUDA-graph variants are
timed one at a time, after the others. The JSON's fields: docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import llama, plot, profile

ARMS = ("eager", "compile", "compile_async_tp", "asynctp", "compile_asynctp")
COMPILED = ("compile", "compile_async_tp", "compile_asynctp")
DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32, "fp8": torch.bfloat16}
# Normwise relative error ||arm - eager|| / ||eager|| allowed per dtype: bf16 rounds at 2^-8, and
# float8 (3 mantissa bits) requantizes inputs that differ by bf16 roundings between arms.
TOLERANCE = {"bf16": 3e-2, "f32": 1e-4, "fp8": 8e-2}


class ArmUnavailable(RuntimeError):
    """An arm this PyTorch or asynctp cannot run (named on the command line: the run fails)."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="torchrun --nproc-per-node N -m asynctp.bench.layer",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Arms:\n" + __doc__.split("Arms (--arms):\n")[1].split("The compiled")[0])
    p.add_argument("--config", default="8b,70b",
                   help=f"comma-separated, of {sorted(llama.CONFIGS)} (default 8b,70b)")
    p.add_argument("--tokens", default="512,1024,2048,4096,8192,16384",
                   help="tokens per rank T, comma-separated; the sequence is T x ws")
    p.add_argument("--dtype", default="bf16,fp8",
                   help="comma-separated: bf16 (forward and backward), f32 (the same, for "
                        "tight checks), fp8 (float8 row-wise GEMMs, forward only)")
    p.add_argument("--fast-accum", action="store_true",
                   help="fp8: every float8 GEMM, of every arm, its reference and the floor, may "
                        "accumulate fast (torch._scaled_mm's use_fast_accum=True, the fused ops' "
                        "too: asynctp's native kernel takes only these); the JSON's meta says "
                        "which ran")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {ARMS}")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before the loops")
    p.add_argument("--warmup-ms", type=float, default=3000.0, metavar="MS",
                   help="on a GPU, then whole loops of untimed steps until this many ms have "
                        "passed (default 3000: the clocks of sustained load; 0: off)")
    p.add_argument("--iters", type=int, default=10, help="back-to-back steps per timed loop")
    p.add_argument("--loops", type=int, default=5, help="timed loops; the median counts")
    p.add_argument("--no-cuda-graphs", action="store_true",
                   help="skip the compiled arms' mode=\"reduce-overhead\" variant")
    p.add_argument("--no-floor", action="store_true", help="skip timing the GEMMs and SDPA alone")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after timing, run N more steps of each arm under torch.profiler and "
                   "report where the GPU time went (asynctp.bench.profile; CUDA only)")
    p.add_argument("--pass-options", default="{}", metavar="JSON",
                   help="compile_asynctp: asynctp.torch.enable's options (those of `asynctp "
                        "passes`), a JSON object, e.g. '{\"enable_last_dim\": true}'")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="layer_bench.json", help="where rank 0 writes the results")
    p.add_argument("--plot", default=None,
                   help="where rank 0 writes the SVG plot (default: the JSON's path, .svg)")
    args = p.parse_args(argv)

    def split(text):
        return [s.strip() for s in text.split(",") if s.strip()]

    args.configs = split(args.config)
    for c in args.configs:
        if c not in llama.CONFIGS:
            p.error(f"--config {c!r} is not one of {sorted(llama.CONFIGS)}")
    try:
        args.token_list = [int(t) for t in split(args.tokens)]
    except ValueError:
        p.error(f"--tokens {args.tokens!r}: integers expected")
    if not args.token_list or min(args.token_list) < 1:
        p.error(f"--tokens {args.tokens!r}: positive integers expected")
    args.dtypes = split(args.dtype)
    for d in args.dtypes:
        if d not in DTYPES:
            p.error(f"--dtype {d!r} is not one of {sorted(DTYPES)}")
    args.arm_list = split(args.arms)
    for a in args.arm_list:
        if a not in ARMS:
            p.error(f"--arms {a!r} is not one of {ARMS}")
    if not args.warmup_ms >= 0:  # (NaN too)
        p.error(f"--warmup-ms must be >= 0, got {args.warmup_ms}")
    for name in ("warmup", "iters", "loops"):
        if getattr(args, name) < (0 if name == "warmup" else 1):
            p.error(f"--{name} {getattr(args, name)} is too small")
    try:
        args.pass_options = json.loads(args.pass_options)
    except json.JSONDecodeError as exc:
        p.error(f"--pass-options {args.pass_options!r} is not JSON: {exc}")
    if not isinstance(args.pass_options, dict):
        p.error(f"--pass-options {args.pass_options!r} is not a JSON object")
    if args.plot is None:
        args.plot = os.path.splitext(args.json)[0] + ".svg"
    return args


# ---- timing ----------------------------------------------------------------------------------


def _max_over_ranks(value: float, group) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    if dist.get_backend(group) == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _all_ranks_true(flag: bool, group) -> bool:
    return _max_over_ranks(0.0 if flag else 1.0, group) == 0.0


def time_steps(step, args, device, group) -> dict:
    """ms per step of one step function (time_round_robin of one)."""
    return time_round_robin([step], args, device, group)[0]


def time_round_robin(steps, args, device, group, segment=None) -> list[dict]:
    """ms per step of each of `steps`, timed in turn: `iters` steps back to back per loop, loop
    i running the steps in the order rotated by i (over a multiple of len(steps) loops, each
    step first as often as the others), the median of `loops` loops each, the slowest rank.
    Side by side, a drift of the clocks during the run reaches every step alike instead of
    whichever is timed last (docs/PERFORMANCE.md). On a GPU, after the `warmup` steps of each,
    rounds of `iters` steps of each go on until every rank has spent `warmup_ms` in them: back
    to back, the GPUs reach their power-capped clocks within a few hundred ms and go on
    drifting for longer, and a step timed from GPUs its compile left idle runs above a training
    step's clocks. segment(i, begin) is called before (begin True) and after each uninterrupted
    run of step i's steps, outside the timed region (usage counters). "steps": how many steps
    of each ran, warm-up included."""
    cuda = device.type == "cuda"
    counts = [0] * len(steps)
    segment = segment or (lambda i, begin: None)

    def run(i, n):
        for _ in range(n):
            steps[i]()
        counts[i] += n

    def timed(i) -> float:
        """One loop of step i: ms per step."""
        if cuda:
            torch.cuda.synchronize()
        _max_over_ranks(0.0, group)  # the ranks start each loop together
        if not cuda:
            t0 = time.perf_counter()
            run(i, args.iters)
            return (time.perf_counter() - t0) * 1e3 / args.iters
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run(i, args.iters)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / args.iters

    def in_segment(i, body):
        segment(i, True)
        out = body()
        segment(i, False)
        return out

    for i in range(len(steps)):
        in_segment(i, lambda: run(i, args.warmup))
    if cuda and args.warmup_ms > 0:
        torch.cuda.synchronize()
        began = time.perf_counter()
        while _max_over_ranks(float((time.perf_counter() - began) * 1e3 < args.warmup_ms),
                              group) > 0:
            for i in range(len(steps)):
                in_segment(i, lambda: run(i, args.iters))
            torch.cuda.synchronize()
    loops = [[] for _ in steps]
    for loop in range(args.loops):
        for k in range(len(steps)):
            i = (loop + k) % len(steps)
            loops[i].append(in_segment(i, lambda: timed(i)))
    return [{"ms": _max_over_ranks(statistics.median(mine), group), "rank_loops_ms": mine,
             "steps": n} for mine, n in zip(loops, counts)]


# ---- one arm ---------------------------------------------------------------------------------


def run_once(model, x, dy, backward: bool):
    """The output and, with backward, the gradients of x and of every parameter."""
    xr = x.detach().clone().requires_grad_(backward)
    for p in model.parameters():
        p.grad = None
    if not backward:
        with torch.no_grad():
            return {"out": model(xr).detach()}
    y = model(xr)
    y.backward(dy)
    got = {"out": y.detach(), "grad.x": xr.grad}
    for name, p in model.named_parameters():
        got[f"grad.{name.removeprefix('_orig_mod.')}"] = p.grad
    return got


def make_step(model, x, dy, backward: bool, cuda_graphs: bool):
    params = list(model.parameters())
    xr = x.detach().clone().requires_grad_(backward)

    def release():
        """Drops the last step's gradients (before a step, and while other arms run)."""
        for p in params:
            p.grad = None
        xr.grad = None

    def step():
        if cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        if not backward:
            with torch.no_grad():
                model(xr)
            return
        release()
        model(xr).backward(dy)

    step.release = release
    return step


def compare(got: dict, ref: dict, dtype_name: str, group) -> dict:
    """Normwise relative errors against the reference; agreed over the ranks (the worst)."""
    errors = {}
    for name, r in ref.items():
        g = got.get(name)
        if g is None or g.shape != r.shape:
            errors[name] = float("inf")
            continue
        diff = (g.double() - r.double()).norm().item()
        errors[name] = diff / max(r.double().norm().item(), 1e-30)
    names = list(errors)
    # The worst rank's error per tensor (NaN counts as inf).
    t = torch.tensor([errors[n] if errors[n] == errors[n] else float("inf") for n in names],
                     dtype=torch.float64)
    if dist.get_backend(group) == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    worst = dict(zip(names, t.tolist()))
    return {"max_rel_error": max(worst.values()), "tolerance": TOLERANCE[dtype_name],
            "rel_error": {k: float(f"{v:.3g}") for k, v in worst.items()}}


class SymmMemNodeCounter:
    """A post-grad custom pass (after PyTorch's async-TP pass) that counts the symm_mem fused
    nodes and the collectives left unfused in each graph it sees. A uuid of its own every run:
    Inductor's cache never serves a graph this pass did not see."""

    def __init__(self):
        from torch._inductor.custom_graph_pass import CustomGraphPass

        counter = self

        class _Pass(CustomGraphPass):
            def __call__(self, graph):
                fused, unfused = [], 0
                for n in graph.nodes:
                    target = str(n.target) if n.op == "call_function" else ""
                    if target.startswith("symm_mem.fused_"):
                        fused.append(target.split(".")[1])
                    elif target.startswith("_c10d_functional.") and (
                            "all_gather" in target or "reduce_scatter" in target):
                        unfused += 1
                counter.graphs.append({"symm_mem_fused": fused, "unfused_collectives": unfused})

            def uuid(self):
                return counter.key

        self.key = uuid.uuid4().hex
        self.graphs = []
        self.graph_pass = _Pass()

    def fused(self) -> int:
        return sum(len(g["symm_mem_fused"]) for g in self.graphs)


class _ArmContext:
    """What an arm installs around its compiles: PyTorch's async TP and the counter, or asynctp's
    pass; entered around each of its compiles and exited after. compile_options() gives the
    same settings to torch.compile, so that they hold for any later recompile of the arm too,
    and so that no two arms compare equal as Dynamo backends (Dynamo serves a compiled frame to
    every torch.compile of an equal backend: the arms, one model class, would share graphs).
    summary() is what goes into the JSON, over every compile of the arm."""

    def __init__(self, arm, group, pass_options: dict):
        self.arm, self.group, self.pass_options = arm, group, pass_options
        self.patch = None
        self.counter = SymmMemNodeCounter() if arm == "compile_async_tp" else None
        self.options = {}
        self.report = []
        self.enabled = False  # asynctp's pass installed by enter()

    def enter(self):
        """Installs the arm's settings; exit() undoes whatever this installed, also after a
        failure half way (call it in a finally)."""
        import torch._inductor.config as inductor_config

        # Both passes report what they see: a graph served from Inductor's caches would not pass
        # through them, so the caches are off for these arms.
        settings = {"force_disable_caches": True}
        if self.arm == "compile_async_tp":
            from torch.distributed import _symmetric_memory

            enable = getattr(_symmetric_memory, "enable_symm_mem_for_group", None)
            if enable is not None:
                enable(self.group.group_name)
            settings.update(_micro_pipeline_tp=True,
                            post_grad_custom_post_pass=self.counter.graph_pass)
        if self.arm in ("compile_async_tp", "compile_asynctp"):
            self.patch = inductor_config.patch(settings)
            self.patch.__enter__()
            self.options = dict(settings)
        if self.arm == "compile_asynctp":
            import asynctp.torch as atp

            # Installed by enable() (and removed by disable()), not by the patch, which would
            # put it back on exit.
            self.options["post_grad_custom_post_pass"] = atp.enable(strict=False,
                                                                    **self.pass_options)
            self.enabled = True

    def compile_options(self, mode) -> dict:
        """torch.compile's options for this arm in `mode` (None or "reduce-overhead"): the
        settings that torch.compile takes as options (some releases refuse some, such as
        force_disable_caches: those hold around the arm's compiles only)."""
        import torch._inductor
        import torch._inductor.config as inductor_config

        known = inductor_config.get_config_copy()
        return {**{k: v for k, v in self.options.items() if k in known},
                **(torch._inductor.list_mode_options(mode) if mode else {})}

    def exit(self):
        """Undoes enter(), in reverse order."""
        try:
            if self.enabled:
                import asynctp.torch as atp

                self.enabled = False
                try:
                    self.report += [
                        {k: (v if isinstance(v, (bool, int, float)) or v is None else str(v))
                         for k, v in entry.items()} for entry in atp.fusion_report()]
                finally:
                    atp.disable()
        finally:
            if self.patch is not None:
                patch, self.patch = self.patch, None
                patch.__exit__(None, None, None)

    def summary(self) -> dict:
        if self.arm == "compile_async_tp":
            return {"symm_mem_fused_nodes": self.counter.fused(), "graphs": self.counter.graphs}
        if self.arm == "compile_asynctp":
            return {"fused_collectives": sum(1 for e in self.report if e.get("fused")),
                    "unfused_collectives": sum(1 for e in self.report if not e.get("fused")),
                    "fusion_report": self.report}
        return {}


def check_available(arm: str, device: torch.device) -> str | None:
    """None if the arm can run here; else why not (a skip on the CPU, where PyTorch's async TP
    has no symmetric memory). A missing asynctp pass raises: it is asked for by name."""
    if arm == "compile_async_tp" and device.type != "cuda":
        return "PyTorch's async TP needs CUDA symmetric memory (torch.ops.symm_mem)"
    if arm == "compile_asynctp":
        import asynctp.torch as atp

        if not callable(getattr(atp, "enable", None)):
            raise ArmUnavailable(
                "layer: arm compile_asynctp is not available: this asynctp has no "
                "asynctp.torch.enable (the torch.compile pass); drop it from --arms")
    return None


def _usage(group, device) -> dict:
    import asynctp.torch as atp
    from asynctp._capi import InvalidArgumentError

    try:
        return atp.usage(group.group_name, device)
    except InvalidArgumentError:  # no asynctp op ran on this group yet
        return {}


def _last_paths(usage: dict, group, device) -> dict:
    """Per op that ran: the path its last call took and why (a fallback's reason)."""
    import asynctp.torch as atp

    out = {}
    for op in usage:
        path, reason = atp.last_path(op, group.group_name, device)
        out[op] = {"path": path, "reason": reason}
    return out


def _usage_delta(before: dict, after: dict) -> dict:
    out = {}
    for op, paths in after.items():
        for path, n in paths.items():
            d = n - before.get(op, {}).get(path, 0)
            if d:
                out.setdefault(op, {})[path] = d
    return out


def build_model(arm, cfg, lc, params, group, float8, variant=None, fast_accum=False):
    if arm == "eager":
        return llama.torch_layer(cfg, lc, params, llama.DistCollectives(group), float8,
                                 fast_accum)
    if arm == "asynctp":
        return llama.asynctp_layer(cfg, lc, params, group, float8,
                                   swiglu_epilogue=variant == "swiglu_epilogue",
                                   fast_accum=fast_accum)
    return llama.torch_layer(cfg, lc, params, llama.FuncolCollectives(group), float8, fast_accum)


class _Variant:
    """A validated variant of an arm, waiting to be timed: its JSON entry and its step."""

    __slots__ = ("label", "entry", "step", "counted")

    def __init__(self, label, entry, step, counted):
        self.label, self.entry, self.step, self.counted = label, entry, step, counted


def arm_modes(arm, device, args, float8: bool) -> list:
    """The variants of an arm: None (the arm as it is), "reduce-overhead" (a compiled arm in
    CUDA graphs), "swiglu_epilogue" (asynctp's bf16 modules with w13 and the SwiGLU as one op)."""
    modes = [None]
    if arm in COMPILED and device.type == "cuda" and not args.no_cuda_graphs:
        modes.append("reduce-overhead")
    if arm == "asynctp" and not float8:
        modes.append("swiglu_epilogue")
    return modes


def validate_variants(arm, case, ref, args, group, ctx, modes, result, on_valid) -> None:
    """Builds and validates each of `modes` of `arm` against eager PyTorch (inside the arm's
    context, entered), into `result`: on_valid(_Variant) for each variant that agrees, right
    after its validation."""
    cfg, lc, params, x, dy = case["cfg"], case["lc"], case["params"], case["x"], case["dy"]
    dtype_name, backward = case["dtype_name"], case["backward"]
    float8 = dtype_name == "fp8"
    for mode in modes:
        if arm in COMPILED:
            variant = mode or "default"
        else:
            variant = mode or "eager"
        entry = result["variants"][variant] = {}
        model = build_model(arm, cfg, lc, params, group, float8, variant, args.fast_accum)
        try:
            if arm in COMPILED:
                model = torch.compile(model, fullgraph=True, options=ctx.compile_options(mode))
            # CUDA graphs: the first call warms up, the second records, the third replays;
            # the replay is what is validated (and timed).
            for _ in range(3 if mode == "reduce-overhead" else 1):
                if mode == "reduce-overhead":
                    torch.compiler.cudagraph_mark_step_begin()
                got = run_once(model, x, dy, backward)
            error = None
        except Exception as exc:  # noqa: BLE001 (a variant that cannot run is reported)
            error = f"{type(exc).__name__}: {exc}"
        if not _all_ranks_true(error is None, group):
            entry["error"] = error or "failed on another rank"
            continue
        entry["validation"] = compare(got, ref, dtype_name, group)
        del got
        if not entry["validation"]["max_rel_error"] <= TOLERANCE[dtype_name]:
            # Wrong results are never timed; the run goes on and fails at its end.
            entry["error"] = (
                f"{case['name']} {arm} ({variant}): relative error "
                f"{entry['validation']['max_rel_error']:.3g} > {TOLERANCE[dtype_name]} "
                f"against eager PyTorch: {entry['validation']['rel_error']}")
            result["failures"].append(entry["error"])
            del model
            continue
        step = make_step(model, x, dy, backward, cuda_graphs=mode == "reduce-overhead")
        step()
        on_valid(_Variant(f"{case['name']} {arm} ({variant})", entry, step, "asynctp" in arm))
        del model, step


def _compiled_graphs() -> int:
    """How many graphs Dynamo has compiled in this process."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def time_variants(variants, args, device, group) -> None:
    """Times `variants` side by side (time_round_robin) into their entries; for asynctp's arms
    also the fused ops' usage over exactly their own steps, and with --profile, each profiled.
    "recompiles": graphs Dynamo compiled during a variant's steps (a steady step compiles none:
    the step after validation has already run)."""
    before, usage = {}, [{} for _ in variants]
    recompiles, last_paths = [0] * len(variants), [{} for _ in variants]

    def segment(i, begin):
        if begin:
            before[i] = (_compiled_graphs(),
                         _usage(group, device) if variants[i].counted else None)
            return
        variants[i].step.release()  # its gradients wait for the next segment: not kept meanwhile
        graphs, counted = before[i]
        recompiles[i] += _compiled_graphs() - graphs
        if counted is None:
            return
        for op, paths in _usage_delta(counted, _usage(group, device)).items():
            for path, n in paths.items():
                usage[i].setdefault(op, {})
                usage[i][op][path] = usage[i][op].get(path, 0) + n
        # (Here: the context's last call is this variant's only until another variant runs.)
        last_paths[i] = _last_paths(usage[i], group, device)

    timings = time_round_robin([v.step for v in variants], args, device, group, segment)
    for i, (v, timing) in enumerate(zip(variants, timings)):
        v.entry.update(timing)
        v.entry["recompiles"] = recompiles[i]
        if v.counted:
            v.entry["usage"] = usage[i]
            v.entry["usage_steps"] = timing["steps"]
            v.entry["last_path"] = last_paths[i]
        if args.profile > 0:
            v.entry["profile"] = profile.profile_steps(v.step, args.profile, device)
            if dist.get_rank(group) == 0:
                print(profile.format_summary(f"{v.label} profile", v.entry["profile"]),
                      flush=True)


def finish_arm(arm, case, result, ctx) -> dict:
    """The arm's status, fastest variant and, for the compiled arms, what their passes saw."""
    result.update(ctx.summary())
    timed = {v: e for v, e in result["variants"].items() if "ms" in e}
    for v, e in timed.items():
        if e.get("recompiles"):
            result["failures"].append(
                f"{case['name']} {arm} ({v}): Dynamo compiled {e['recompiles']} graph(s) during "
                "its warm-up or timed steps: its time may hold compiles")
    if arm == "compile_async_tp" and timed and result["symm_mem_fused_nodes"] == 0:
        result["failures"].append(
            f"{case['name']} compile_async_tp: PyTorch's async TP left no symm_mem fused node in "
            f"its graphs ({result['graphs']}): it is not the arm it claims to be")
        return result
    if not timed and not result["failures"]:
        result["failures"].append(f"{case['name']} {arm}: no variant ran: " + "; ".join(
            f"{v}: {e.get('error')}" for v, e in result["variants"].items()))
    if timed and not result["failures"]:
        best = min(timed, key=lambda v: timed[v]["ms"])
        result.update(status="ok", variant=best, ms=timed[best]["ms"],
                      us_per_token=timed[best]["ms"] * 1e3 / case["seq_len"])
        if "usage" in timed[best]:
            result["usage"] = timed[best]["usage"]
            result["last_path"] = timed[best]["last_path"]
    return result


def run_arms(arms, case, ref, args, group) -> dict:
    """Validates and times every arm of one case; {arm: result}. First every variant but the
    CUDA-graph ones is validated, each compiled inside its own arm's settings, then all of them
    are timed side by side, loop by loop (time_round_robin); then each CUDA-graph variant, from
    a reset Dynamo (its graphs' memory pool would stay with the others), is validated and timed
    on its own."""
    device = case["x"].device
    float8 = case["dtype_name"] == "fp8"
    results, contexts, pending = {}, {}, []
    for arm in arms:
        reason = check_available(arm, device)
        if reason is not None:
            results[arm] = {"status": "skipped", "reason": reason}
            continue
        ctx = contexts[arm] = _ArmContext(arm, group, args.pass_options)
        results[arm] = {"status": "failed", "variants": {}, "failures": []}
        try:
            ctx.enter()
            validate_variants(arm, case, ref, args, group, ctx,
                              [m for m in arm_modes(arm, device, args, float8)
                               if m != "reduce-overhead"], results[arm], pending.append)
        finally:
            ctx.exit()
    if pending:
        time_variants(pending, args, device, group)
    del pending
    for arm, ctx in contexts.items():
        if "reduce-overhead" not in arm_modes(arm, device, args, float8):
            continue
        torch._dynamo.reset()
        try:
            ctx.enter()
            validate_variants(arm, case, ref, args, group, ctx, ["reduce-overhead"], results[arm],
                              lambda v: time_variants([v], args, device, group))
        finally:
            ctx.exit()
    return {arm: (finish_arm(arm, case, results[arm], contexts[arm]) if arm in contexts
                  else results[arm]) for arm in arms}


# ---- the floor -------------------------------------------------------------------------------


def floor_steps(lc, S: int, dtype_name: str, backward: bool, device, fast_accum: bool = False):
    """The layer's GEMMs and its attention alone, at the layer's shapes: (gemms, attention)
    steps. Training: per linear (x [S, K], W [N, K]) the forward x W^T and the backward
    dY W and dY^T x; SDPA forward and backward. float8: the four _scaled_mm of the forward
    (use_fast_accum = fast_accum) and the SDPA forward."""
    dtype = torch.bfloat16 if dtype_name == "fp8" else DTYPES[dtype_name]
    g = torch.Generator(device=device).manual_seed(1)

    def rand(*shape):
        return torch.randn(*shape, device=device, dtype=dtype, generator=g)

    H, d = lc.hidden, lc.head_dim
    linears = [(H, lc.qkv), (lc.q_heads * d, H), (H, 2 * lc.ffn), (lc.ffn, H)]  # (K, N)
    if dtype_name == "fp8":
        ops = []
        for K, N in linears:
            a, a_s = llama.quantize_rows(rand(S, K))
            w, w_s = llama.quantize_rows(rand(N, K))
            ops.append((a, w.t(), a_s, w_s.t().contiguous()))

        def gemms():
            for a, b, a_s, b_s in ops:
                torch._scaled_mm(a, b, a_s, b_s, out_dtype=torch.bfloat16,
                                 use_fast_accum=fast_accum)
    else:
        mats = [(rand(S, K), rand(N, K), rand(S, N)) for K, N in linears]

        def gemms():
            for x, w, dy in mats:
                F.linear(x, w)
                if backward:
                    dy @ w
                    dy.t() @ x

    q = rand(lc.q_heads, S, d).requires_grad_(backward)
    k = rand(lc.kv_heads, S, d).requires_grad_(backward)
    v = rand(lc.kv_heads, S, d).requires_grad_(backward)
    do = rand(1, lc.q_heads, S, d)

    def attention():
        with torch.set_grad_enabled(backward):
            o = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True,
                                               enable_gqa=lc.q_heads != lc.kv_heads)
            if backward:
                torch.autograd.grad(o, (q, k, v), do)

    return gemms, attention


def time_floor(lc, S, dtype_name, backward, args, device, group) -> dict:
    gemms, attention = floor_steps(lc, S, dtype_name, backward, device, args.fast_accum)

    def both():
        gemms()
        attention()

    out = {"ms": time_steps(both, args, device, group)["ms"],
           "gemm_ms": time_steps(gemms, args, device, group)["ms"],
           "attention_ms": time_steps(attention, args, device, group)["ms"]}
    if args.profile > 0:
        out["profile"] = profile.profile_steps(both, args.profile, device)
        if dist.get_rank(group) == 0:
            print(profile.format_summary("floor profile", out["profile"]), flush=True)
    return out


# ---- the run ---------------------------------------------------------------------------------


def scaled_mm_supported(device, fast_accum: bool = False) -> str | None:
    """None if row-wise _scaled_mm runs on this device (with use_fast_accum as the run calls
    it), else why not."""
    try:
        a = torch.ones(16, 16, device=device).to(llama.F8)
        torch._scaled_mm(a, a.t(), torch.ones(16, 1, device=device),
                         torch.ones(1, 16, device=device), out_dtype=torch.bfloat16,
                         use_fast_accum=fast_accum)
        return None
    except Exception as exc:  # noqa: BLE001 (whatever this torch raises for its absence)
        return (f"row-wise torch._scaled_mm does not run on {device.type}: "
                f"{type(exc).__name__}: {exc}")


def run(args, group, device, on_row=None) -> dict:
    """Every config x dtype x T; on_row(out so far) after each (rank 0 writes it: a run cut
    short keeps the sizes it finished)."""
    ws, rank = dist.get_world_size(group), dist.get_rank(group)
    for arm in args.arm_list:  # an arm asked for that cannot exist fails before any timing
        check_available(arm, device)
    meta = _meta(args, group, device)
    results, failures = [], []
    for config_name in args.configs:
        cfg = llama.CONFIGS[config_name]
        lc = llama.local_shapes(cfg, ws)
        for dtype_name in args.dtypes:
            fp8_missing = (scaled_mm_supported(device, args.fast_accum) if dtype_name == "fp8"
                           else None)
            for T in args.token_list:
                S = T * ws
                backward = dtype_name != "fp8"
                name = f"{config_name} {dtype_name} T={T}"
                row = {"config": config_name, "dtype": dtype_name, "world_size": ws,
                       "pass": "fwd+bwd" if backward else "fwd", "tokens_per_rank": T,
                       "seq_len": S, "arms": {}}
                results.append(row)
                if fp8_missing is not None:
                    row["skipped"] = fp8_missing
                    continue
                dtype = DTYPES[dtype_name]
                params = llama.make_params(cfg, ws, rank, dtype, device, S, args.seed)
                gen = torch.Generator().manual_seed(args.seed * 7919 + 17 + rank)
                x = torch.randn(T, cfg.hidden, generator=gen).to(device=device, dtype=dtype)
                dy = torch.randn(T, cfg.hidden, generator=gen).to(device=device, dtype=dtype)
                case = {"cfg": cfg, "lc": lc, "params": params, "x": x, "dy": dy, "name": name,
                        "dtype_name": dtype_name, "backward": backward, "seq_len": S}
                reference = build_model("eager", cfg, lc, params, group, dtype_name == "fp8",
                                        fast_accum=args.fast_accum)
                ref = run_once(reference, x, dy, backward)
                del reference
                torch._dynamo.reset()  # the arms of one case share nothing with another's
                row["arms"] = run_arms(args.arm_list, case, ref, args, group)
                for arm, res in row["arms"].items():
                    failures += res.get("failures", [])
                    if rank == 0:
                        _print_arm(name, arm, res)
                del ref
                if not args.no_floor:
                    row["floor"] = time_floor(lc, S, dtype_name, backward, args, device, group)
                    row["floor"]["us_per_token"] = row["floor"]["ms"] * 1e3 / S
                    if rank == 0:
                        print(f"{name:>22}  floor: {row['floor']['ms']:.3f} ms "
                              f"(GEMMs {row['floor']['gemm_ms']:.3f}, attention "
                              f"{row['floor']['attention_ms']:.3f})", flush=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                if on_row is not None:
                    on_row({"meta": meta, "failures": failures, "results": results})
    return {"meta": meta, "failures": failures, "results": results}


def _print_arm(name, arm, res):
    if res.get("failures"):
        print(f"{name:>22}  {arm:>16}: FAILED {res['failures']}", flush=True)
    elif res["status"] == "ok":
        extra = f" [{res['variant']}]" if res["variant"] not in ("eager", "default") else ""
        print(f"{name:>22}  {arm:>16}: {res['ms']:.3f} ms/step{extra}", flush=True)
    else:
        errors = {v: e.get("error") for v, e in res.get("variants", {}).items()}
        print(f"{name:>22}  {arm:>16}: {res['status']} {res.get('reason', '')}{errors or ''}",
              flush=True)


def _meta(args, group, device) -> dict:
    import asynctp

    return {
        "world_size": dist.get_world_size(group),
        "backend": dist.get_backend(group),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "asynctp": asynctp.version(),
        "warmup": args.warmup, "warmup_ms": args.warmup_ms if device.type == "cuda" else 0.0,
        "iters": args.iters, "loops": args.loops,
        "cuda_graphs": device.type == "cuda" and not args.no_cuda_graphs,
        "pass_options": args.pass_options,
        "fast_accum": args.fast_accum,
        "tolerance": TOLERANCE,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    def write(out):
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        with open(args.plot, "w") as f:
            f.write(plot.svg(out["results"]))

    try:
        out = run(args, dist.group.WORLD, device, on_row=write if dist.get_rank() == 0 else None)
        if dist.get_rank() == 0:
            print(f"layer: wrote {args.json} and {args.plot}", flush=True)
            for failure in out["failures"]:
                print(f"layer: FAILED: {failure}", file=sys.stderr, flush=True)
    finally:
        dist.destroy_process_group()
    return 1 if out["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
