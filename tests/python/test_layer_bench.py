"""The layer benchmark (asynctp.bench.layer) on the CPU: torchrun, ws 2, gloo, the tiny config.

One run (two compiles: the bf16 training step and the float8 forward) validates every arm that
runs on the CPU against eager PyTorch (the benchmark itself fails on a mismatch) and writes the
JSON and the plot; the test then checks the JSON's fields, the usage counters of the asynctp
arms (every fused call of a step counted, on a path that ran) and that the arms CPU lacks say so.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import asynctp.torch as atp
from asynctp.bench import layer, llama
from conftest import package_env

TOKENS = (32,)  # one size: each size is one more compile per compiled arm and dtype


def _env():
    env = package_env()
    env["ASYNCTP_DISPATCH_CACHE"] = "off"
    return env


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("layer")
    arms = ["eager", "compile", "compile_async_tp", "asynctp"]
    if callable(getattr(atp, "enable", None)):  # the torch.compile pass, where this asynctp has it
        arms.append("compile_asynctp")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "asynctp.bench.layer", "--config", "tiny",
           "--tokens", ",".join(map(str, TOKENS)), "--dtype", "bf16,fp8", "--arms", ",".join(arms),
           "--warmup", "1", "--iters", "2", "--loops", "2", "--json", str(out / "layer.json"),
           # The compiled arm with the SwiGLU epilogue on: the pass on Inductor's real graphs.
           "--pass-options", '{"enable_swiglu": true}']
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return arms, json.loads((out / "layer.json").read_text()), (out / "layer.svg").read_text()


def test_every_arm_validated_and_timed(bench):
    arms, data, _ = bench
    meta = data["meta"]
    assert meta["world_size"] == 2 and meta["backend"] == "gloo" and meta["device"] == "cpu"
    assert data["failures"] == []
    rows = data["results"]
    assert [(r["dtype"], r["tokens_per_rank"]) for r in rows] == [
        (d, t) for d in ("bf16", "fp8") for t in TOKENS]
    for r in rows:
        assert r["config"] == "tiny" and r["seq_len"] == 2 * r["tokens_per_rank"]
        assert r["pass"] == ("fwd+bwd" if r["dtype"] == "bf16" else "fwd")
        assert list(r["arms"]) == arms
        for name, arm in r["arms"].items():
            if name == "compile_async_tp":
                assert arm["status"] == "skipped" and "CUDA" in arm["reason"]
                continue
            assert arm["status"] == "ok", (name, arm)
            assert arm["ms"] > 0 and arm["us_per_token"] == pytest.approx(
                arm["ms"] * 1e3 / r["seq_len"])
            assert arm["variant"] in arm["variants"]
            # CPU: no CUDA graphs, one variant per arm; asynctp's bf16 layer also runs w13 and
            # the SwiGLU as one op.
            if name == "asynctp" and r["dtype"] == "bf16":
                assert list(arm["variants"]) == ["eager", "swiglu_epilogue"]
            else:
                assert list(arm["variants"]) == (["eager"] if name in ("eager", "asynctp")
                                                  else ["default"])
            assert arm["variants"][arm["variant"]]["ms"] == arm["ms"]
            for v in arm["variants"].values():
                assert v["ms"] >= arm["ms"] and len(v["rank_loops_ms"]) == 2
                val = v["validation"]
                assert val["max_rel_error"] <= val["tolerance"] == layer.TOLERANCE[r["dtype"]]
                expected = {"out"} if r["dtype"] == "fp8" else {
                    "out", "grad.x", "grad.attn_norm.weight", "grad.ffn_norm.weight",
                    "grad.wqkv.weight", "grad.wo.weight", "grad.w13.weight", "grad.w2.weight"}
                assert set(val["rel_error"]) == expected
            if name == "eager":
                assert arm["variants"]["eager"]["validation"]["max_rel_error"] == 0.0
        floor = r["floor"]
        assert floor["ms"] > 0 and floor["gemm_ms"] > 0 and floor["attention_ms"] > 0


def test_asynctp_usage_counts_every_fused_call(bench):
    _, data, _ = bench
    for r in data["results"]:
        arm = r["arms"]["asynctp"]
        assert arm["usage"] == arm["variants"][arm["variant"]]["usage"]
        for variant, v in arm["variants"].items():
            steps = v["usage_steps"]
            assert steps == 1 + 2 * 2  # --warmup 1, --loops 2 x --iters 2
            usage = v["usage"]
            if r["dtype"] == "fp8":
                ops = {"all_gather_scaled_matmul": 2, "scaled_matmul_reduce_scatter": 2}
            elif variant == "eager":
                # Forward: wqkv and w13 gather, wo and w2 scatter; backward: their adjoints.
                ops = {"all_gather_matmul": 4, "matmul_reduce_scatter": 4}
            else:
                # w13's gather with its SwiGLU is one op; its adjoint is still a reduce-scatter.
                ops = {"all_gather_matmul": 3, "all_gather_matmul_swiglu": 1,
                       "matmul_reduce_scatter": 4}
            assert set(usage) == set(ops), (variant, usage)
            for op, per_step in ops.items():
                assert sum(usage[op].values()) == per_step * steps, (variant, op, usage)
                assert set(usage[op]) <= {"split", "native", "fallback"}, usage
                assert v["last_path"][op]["path"] in usage[op], v["last_path"]


def test_compile_pass_fuses_every_collective(bench):
    arms, data, _ = bench
    if "compile_asynctp" not in arms:
        pytest.skip("this asynctp has no torch.compile pass (asynctp.torch.enable)")
    for r in data["results"]:
        if r["dtype"] != "bf16":  # gloo moves float8 as bytes: no float8 gather to fuse on CPU
            continue
        arm = r["arms"]["compile_asynctp"]
        # Forward: wqkv, w13 gathers, wo, w2 scatters; backward: their adjoints. With
        # enable_swiglu, the forward's SwiGLU goes into w13's epilogue (the report says so).
        assert (arm["fused_collectives"], arm["unfused_collectives"]) == (8, 0), arm
        assert sum("SwiGLU" in e["detail"] for e in arm["fusion_report"]) == 1, arm
        steps = arm["variants"]["default"]["usage_steps"]
        assert {op: sum(p.values()) for op, p in arm["usage"].items()} == {
            "all_gather_matmul": 3 * steps, "all_gather_matmul_swiglu": steps,
            "matmul_reduce_scatter": 4 * steps}


def test_plot_has_a_line_per_arm(bench):
    arms, _, svg = bench
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    for title in ("tiny bf16 fwd+bwd, ws 2", "tiny fp8 fwd, ws 2"):
        assert title in svg
    for name in [a for a in arms if a != "compile_async_tp"] + ["floor"]:
        assert f">{name}</text>" in svg
    assert ">compile_async_tp</text>" not in svg  # skipped: no line


def test_missing_compile_pass_is_named(monkeypatch):
    import torch

    monkeypatch.setattr(atp, "enable", None, raising=False)  # an asynctp without the pass
    with pytest.raises(layer.ArmUnavailable, match="compile_asynctp is not available"):
        layer.check_available("compile_asynctp", torch.device("cpu"))
    assert "CUDA" in layer.check_available("compile_async_tp", torch.device("cpu"))
    assert layer.check_available("asynctp", torch.device("cpu")) is None


def test_shards_must_divide():
    with pytest.raises(ValueError, match="kv_heads=8 is not divisible by the world size 16"):
        llama.local_shapes(llama.CONFIGS["8b"], 16)
    lc = llama.local_shapes(llama.CONFIGS["70b"], 8)
    assert (lc.q_heads, lc.kv_heads, lc.ffn, lc.qkv) == (8, 1, 3584, 10 * 128)


def test_help_names_the_arms():
    proc = subprocess.run([sys.executable, "-m", "asynctp.bench.layer", "--help"], env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for arm in layer.ARMS:
        assert arm in proc.stdout


def test_symm_mem_counter_counts_fused_and_unfused_nodes():
    """The counter of the PyTorch async-TP arm (that arm itself needs CUDA) on a hand-made
    post-grad graph: one symm_mem fused all-gather matmul, one collective left as it was."""
    import torch
    import torch.distributed._symmetric_memory  # noqa: F401  (defines torch.ops.symm_mem)
    import torch.fx

    g = torch.fx.Graph()
    a, b, c = g.placeholder("a"), g.placeholder("b"), g.placeholder("c")
    fused = g.call_function(torch.ops.symm_mem.fused_all_gather_matmul.default,
                            (a, [b], 0, "0"))
    rs = g.call_function(torch.ops._c10d_functional.reduce_scatter_tensor.default,
                         (c, "sum", 2, "0"))
    g.output((fused, rs))
    counter = layer.SymmMemNodeCounter()
    assert counter.fused() == 0
    counter.graph_pass(g)
    assert counter.graphs == [{"symm_mem_fused": ["fused_all_gather_matmul"],
                               "unfused_collectives": 1}]
    assert counter.fused() == 1
    other = layer.SymmMemNodeCounter()
    assert other.graph_pass.uuid() != counter.graph_pass.uuid()  # never a cache hit across runs


def case_disagreeing_arm_is_not_timed(tolerance):
    import torch
    import torch.distributed as dist

    args = layer.parse_args(["--config", "tiny", "--tokens", "16", "--dtype", "bf16", "--arms",
                             "eager,asynctp", "--warmup", "0", "--iters", "1", "--loops", "1",
                             "--no-floor"])
    saved = layer.TOLERANCE["bf16"]
    layer.TOLERANCE["bf16"] = tolerance  # in this rank's process, for this run
    try:
        out = layer.run(args, dist.group.WORLD, torch.device("cpu"))
    finally:
        layer.TOLERANCE["bf16"] = saved
    arms = out["results"][0]["arms"]
    return out["failures"], {a: (r["status"], "ms" in r, list(r["variants"]["eager"]))
                             for a, r in arms.items()}


def case_round_robin():
    import torch
    import torch.distributed as dist

    args = layer.parse_args(["--warmup", "1", "--iters", "2", "--loops", "3"])
    calls, events = [], []

    def make(name):
        return lambda: calls.append(name)

    out = layer.time_round_robin([make("a"), make("b"), make("c")], args, torch.device("cpu"),
                                 dist.group.WORLD, lambda i, begin: events.append((i, begin)))
    return calls, events, out


def test_round_robin_times_each_step_in_turn(pool2):
    """Warm-up one step of each, then loop k runs the steps rotated by k (each first once), each
    loop's steps inside one segment call pair; counts and loops per step."""
    for calls, events, out in pool2.run(case_round_robin):
        assert calls == (["a", "b", "c"] + ["a", "a", "b", "b", "c", "c"]
                         + ["b", "b", "c", "c", "a", "a"] + ["c", "c", "a", "a", "b", "b"])
        order = [0, 1, 2, 0, 1, 2, 1, 2, 0, 2, 0, 1]
        assert events == [e for i in order for e in ((i, True), (i, False))]
        assert [r["steps"] for r in out] == [7, 7, 7]
        for r in out:
            assert len(r["rank_loops_ms"]) == 3 and r["ms"] >= 0


def test_disagreeing_arm_is_not_timed(pool2):
    """With a tolerance no result meets (below the eager reference's own 0.0), every arm fails
    validation: none is timed, each is named in the failures."""
    for failures, arms in pool2.run(case_disagreeing_arm_is_not_timed, -1.0):
        assert len(failures) == 3, failures
        assert "tiny bf16 T=16 eager (eager): relative error 0 > -1.0" in failures[0]
        assert "tiny bf16 T=16 asynctp (eager)" in failures[1]
        assert "tiny bf16 T=16 asynctp (swiglu_epilogue)" in failures[2]
        for status, timed, fields in arms.values():
            assert status == "failed" and not timed and "ms" not in fields
            assert set(fields) == {"validation", "error"}


def case_fast_accum_reaches_every_float8_gemm(fast: bool):
    import torch
    import torch.distributed as dist

    from asynctp.torch import functional as atpf

    argv = ["--config", "tiny", "--tokens", "16", "--dtype", "fp8", "--arms", "eager,asynctp",
            "--warmup", "0", "--iters", "1", "--loops", "1", "--no-floor"]
    args = layer.parse_args(argv + (["--fast-accum"] if fast else []))
    seen = []  # (who, use_fast_accum) per float8 GEMM called
    saved = torch._scaled_mm, atpf.fused_all_gather_scaled_matmul, \
        atpf.fused_scaled_matmul_reduce_scatter

    def scaled_mm(*a, **kw):
        seen.append(("_scaled_mm", kw.get("use_fast_accum", False)))
        return saved[0](*a, **kw)

    def ag(*a, **kw):
        seen.extend(("ag", f) for f in a[9])
        return saved[1](*a, **kw)

    def rs(*a, **kw):
        seen.append(("rs", kw.get("use_fast_accum", False)))
        return saved[2](*a, **kw)

    torch._scaled_mm = scaled_mm
    atpf.fused_all_gather_scaled_matmul, atpf.fused_scaled_matmul_reduce_scatter = ag, rs
    try:
        out = layer.run(args, dist.group.WORLD, torch.device("cpu"))
    finally:
        torch._scaled_mm, atpf.fused_all_gather_scaled_matmul, \
            atpf.fused_scaled_matmul_reduce_scatter = saved
    return out["meta"]["fast_accum"], out["failures"], sorted(set(seen))


@pytest.mark.parametrize("fast", [False, True])
def test_fast_accum_reaches_every_float8_gemm(pool2, fast):
    """--fast-accum: every _scaled_mm of the PyTorch arm and its reference, and both fused scaled
    ops of the asynctp arm, are called with use_fast_accum; without it none is."""
    for meta_fast, failures, seen in pool2.run(case_fast_accum_reaches_every_float8_gemm, fast):
        assert meta_fast is fast and failures == []
        assert seen == [("_scaled_mm", fast), ("ag", fast), ("rs", fast)]


@pytest.mark.parametrize("argv,message", [
    (["--config", "13b"], "--config '13b' is not one of"),
    (["--arms", "eager,fast"], "--arms 'fast' is not one of"),
    (["--tokens", "512,x"], "integers expected"),
    (["--tokens", "0"], "positive integers expected"),
    (["--dtype", "f16"], "--dtype 'f16' is not one of"),
    (["--iters", "0"], "--iters 0 is too small"),
    (["--pass-options", "[1]"], "is not a JSON object"),
])
def test_bad_arguments_are_named(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        layer.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_arguments():
    args = layer.parse_args(["--config", "8b", "--tokens", "4096,8192", "--json", "out/l.json",
                             "--pass-options", '{"enable_last_dim": true}'])
    assert args.configs == ["8b"] and args.token_list == [4096, 8192]
    assert args.arm_list == list(layer.ARMS) and args.dtypes == ["bf16", "fp8"]
    assert args.plot == "out/l.svg" and args.pass_options == {"enable_last_dim": True}


def test_profile_summary_splits_busy_idle_and_kinds():
    from asynctp.bench import profile

    # Two steps; per step a GEMM (0-100) overlapping an NCCL kernel on another stream (50-150),
    # then a gap, then a Triton kernel (200-220).
    events = []
    for s in (0.0, 1000.0):
        events += [("sm90_xmma_gemm_bf16", "kernel", 7, s, 100.0),
                   ("ncclDevKernel_AllGather", "kernel", 9, s + 50, 100.0),
                   ("triton_poi_fused_add_0", "kernel", 7, s + 200, 20.0),
                   ("Memcpy DtoD", "gpu_memcpy", 9, s + 220, 10.0)]
    got = profile.summarize(events, steps=2)
    assert got["wall_us"] == 615.0  # 0 to 1230, two steps
    assert got["busy_us"] == 180.0  # 0-150, 200-230
    assert got["idle_us"] == 435.0
    assert got["by_kind"] == {"gemm": 100.0, "nccl": 100.0, "triton": 20.0, "copy": 10.0}
    assert got["top"][0]["calls"] == 1.0
    assert profile.kind_of("void asynctp::kernels::async_gemm_kernel<...>") == "native"
    assert profile.kind_of("pytorch_flash::flash_fwd_kernel") == "attention"
    assert profile.kind_of("vectorized_elementwise_kernel") == "elementwise"
    assert profile.kind_of("triton_poi_fused__to_copy_add_cos_0") == "triton"
    assert profile.summarize([], steps=3) == {"steps": 3, "kernels": 0}


def test_recompile_during_timing_fails_the_arm():
    """A variant whose timed steps made Dynamo compile is not reported as a time: the arm fails,
    naming the variant and the count."""
    ctx = layer._ArmContext("compile", None, {})
    case = {"name": "tiny bf16 T=16", "seq_len": 32}
    result = {"status": "failed", "failures": [],
              "variants": {"default": {"ms": 1.0, "recompiles": 2}}}
    out = layer.finish_arm("compile", case, result, ctx)
    assert out["status"] == "failed" and "ms" not in out
    assert out["failures"] == ["tiny bf16 T=16 compile (default): Dynamo compiled 2 graph(s) "
                               "during its warm-up or timed steps: its time may hold compiles"]
    clean = {"status": "failed", "failures": [],
             "variants": {"default": {"ms": 1.0, "recompiles": 0}}}
    assert layer.finish_arm("compile", case, clean, ctx)["ms"] == 1.0


def test_arm_context_undoes_what_it_installs():
    """asynctp's pass arm: entered and exited twice, Inductor's config is back as it was each
    time (the pass is not left installed for the arms after it, nor chained to a stale one)."""
    import torch._inductor.config as inductor_config

    before = (inductor_config.post_grad_custom_post_pass, inductor_config.force_disable_caches)
    for _ in range(2):
        ctx = layer._ArmContext("compile_asynctp", None, {})
        ctx.enter()
        installed = ctx.options["post_grad_custom_post_pass"]
        assert inductor_config.post_grad_custom_post_pass is installed
        assert installed.previous == () and inductor_config.force_disable_caches
        assert ctx.compile_options(None)["post_grad_custom_post_pass"] is installed
        ctx.exit()
        assert (inductor_config.post_grad_custom_post_pass,
                inductor_config.force_disable_caches) == before
    plain = layer._ArmContext("compile", None, {})
    plain.enter()
    assert plain.compile_options(None) == {}
    plain.exit()
