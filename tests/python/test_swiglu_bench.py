"""The SwiGLU gate/up benchmark (asynctp.bench.swiglu) on the CPU: torchrun, ws 2, gloo, tiny
shapes, without the compiled variant (CI keeps its compiles few). Every variant is validated
against the unfused one and timed; the fused ops report the path they took."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from asynctp.bench import swiglu
from conftest import package_env


def _run(out, **env):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "asynctp.bench.swiglu", "--device", "cpu", "--tokens", "40", "--hidden", "24",
           "--ffn", "48", "--no-compile", "--iters", "2", "--loops", "3", "--json", str(out)]
    proc = subprocess.run(cmd, env={**package_env(), **env}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return json.loads(out.read_text()), proc.stdout


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("swiglu") / "swiglu.json")


def test_every_variant_is_validated_and_timed(results):
    data, stdout = results
    assert data["ws"] == 2 and data["device"] == "cpu"
    assert set(data["variants"]) == set(swiglu.VARIANTS) - {"compiled"}
    for name, v in data["variants"].items():
        assert v["error"] <= 2e-2, name
        assert v["us"] > 0 and len(v["rank_loops_us"]) == 3, name
        assert f"  {name:<13}" in stdout
    assert data["variants"]["unfused"]["error"] == 0
    assert data["variants"]["epilogue_pre"]["pre_error"] <= 2e-2
    # 40 gathered rows a rank: the CPU backend emulates the native kernel for both fused ops.
    for name in ("gemm", "unfused", "epilogue_pre", "epilogue"):
        assert data["variants"][name]["path"] == "native", name
    assert "path" not in data["variants"]["mm"]


def test_asynctp_path_pins_every_fused_variant(tmp_path):
    data, _ = _run(tmp_path / "split.json", ASYNCTP_PATH="split")
    for name in ("gemm", "unfused", "epilogue_pre", "epilogue"):
        assert data["variants"][name]["path"] == "split", name


@pytest.mark.parametrize("argv", [["--tokens", "0"], ["--iters", "0"], ["--warmup", "-1"],
                                  ["--warmup-ms", "nan"], ["--dtype", "f8"],
                                  ["--json", "/nonexistent-dir/x.json"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        swiglu.parse_args(argv)
    assert "error" in capsys.readouterr().err
