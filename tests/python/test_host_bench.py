"""The host-time benchmark (asynctp.bench.host) on the CPU: torchrun, ws 2, gloo, a tiny shape.

One short run writes the JSON; the test checks that every call of run_gpu.py's host_us record is
timed, took a path, and has the library's profile: phases from entering the C ABI to returning,
which add up to the library's mean call.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from asynctp.bench import host
from conftest import package_env


def _env():
    return package_env()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("host") / "host.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "asynctp.bench.host", "--device", "cpu", "--shapes", "tiny:32x16x16",
           "--calls", "20", "--json", str(out)]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return json.loads(out.read_text()), proc.stdout


def test_every_call_is_timed_and_profiled(results):
    data, stdout = results
    assert data["ws"] == 2 and data["device"] == "cpu"
    rec = data["shapes"]["tiny"]
    assert (rec["M"], rec["K"], rec["N"]) == (32, 16, 16)
    assert rec["torch_mm"] > 0
    for name in host.CALLS:
        r = rec[name]
        assert r["host_us"] > 0 and r["profiled_us"] > 0, name
        assert r["path"] in ("native", "split", "fallback"), name
        assert 0 < r["library_us"] <= r["profiled_us"] * 2, name
        phases = r["phases"]
        assert phases[0]["from"] == "entry" and phases[0]["to"] == "run", name
        assert any(p["to"] == "return" for p in phases), name
        # The phases partition each call: their means per call add up to the mean call.
        total = sum(p["per_call_us"] for p in phases)
        assert total == pytest.approx(r["library_mean_us"], rel=1e-3, abs=1e-3), name
        assert f"{name:<11}" in stdout


def test_shapes_are_checked():
    assert host.parse_shapes("a:8x4x2, b:1x1x1") == [("a", 8, 4, 2), ("b", 1, 1, 1)]
    for bad in ("a:8x4", "8x4x2", "a:8x0x2", "a:8xkx2", ""):
        with pytest.raises(ValueError):
            host.parse_shapes(bad)


def test_help_names_the_calls():
    proc = subprocess.run([sys.executable, "-m", "asynctp.bench.host", "--help"], env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for name in ("ag_mm_func", "mm_rs_func", "ag_mm_ops", "mm_rs_ops", "torch_mm", "--shapes"):
        assert name in proc.stdout
