"""Where a step's GPU time goes: a few steps under torch.profiler, their kernels summed by kind.

The layer benchmark's --profile N runs N more steps of each arm under the profiler (after the
timed loops, so that the timing is the profiler's guest never) and keeps, per step:

  wall_us     first kernel's start to the last one's end, over the N steps, divided by N
  busy_us     the union of every stream's kernel and copy intervals (time the GPU ran anything)
  idle_us     wall_us - busy_us: the GPU ran nothing (waiting for the host, or for a peer)
  by_kind     the kernels' summed durations by kind (overlapping streams counted each)
  streams     each stream's summed kernel time
  top         the costliest kernels: name (shortened), kind, calls per step, us per step

Kinds, by kernel name: gemm (cuBLAS/cuBLASLt/CUTLASS/nvjet), native (asynctp's fused GEMM),
attention (flash/cudnn/efficient SDPA), nccl, copy (memcpy/memset and copy kernels), triton
(Inductor's fused kernels), elementwise (everything else).
"""

from __future__ import annotations

import json
import os
import re
import tempfile

import torch

_KINDS = (
    ("native", re.compile(r"async_gemm|native_gemm|asynctp::kernels::.*gemm_kernel", re.I)),
    ("nccl", re.compile(r"nccl", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa|cudnn", re.I)),
    ("gemm", re.compile(r"gemm|nvjet|xmma|cutlass|sm90_|sm80_|cublas", re.I)),
    # Before copy: Inductor's fused kernels are named after their ops ("triton_poi_fused__to_copy").
    ("triton", re.compile(r"triton", re.I)),
    ("copy", re.compile(r"copy|memcpy|memset|put_signal|wait_signal|wait_flags|barrier", re.I)),
)


def kind_of(name: str) -> str:
    for kind, pattern in _KINDS:
        if pattern.search(name):
            return kind
    return "elementwise"


def _union(intervals):
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def summarize(events, steps: int, top: int = 12) -> dict:
    """events: (name, category, stream, start_us, duration_us) of the device's kernels and
    copies over `steps` steps."""
    if not events:
        return {"steps": steps, "kernels": 0}
    starts = [e[3] for e in events]
    ends = [e[3] + e[4] for e in events]
    wall = (max(ends) - min(starts)) / steps
    busy = _union([(e[3], e[3] + e[4]) for e in events]) / steps
    by_kind, streams, per_kernel = {}, {}, {}
    for name, cat, stream, _, dur in events:
        kind = "copy" if cat in ("gpu_memcpy", "gpu_memset") else kind_of(name)
        by_kind[kind] = by_kind.get(kind, 0.0) + dur / steps
        streams[str(stream)] = streams.get(str(stream), 0.0) + dur / steps
        short = re.sub(r"\(.*", "", name)[:90]
        calls, total = per_kernel.get(short, (0, 0.0))
        per_kernel[short] = (calls + 1, total + dur)
    ranked = sorted(per_kernel.items(), key=lambda kv: -kv[1][1])[:top]
    return {
        "steps": steps,
        "kernels": len(events),
        "wall_us": round(wall, 1),
        "busy_us": round(busy, 1),
        "idle_us": round(wall - busy, 1),
        "by_kind": {k: round(v, 1) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "streams": {k: round(v, 1) for k, v in sorted(streams.items(), key=lambda kv: -kv[1])},
        "top": [{"name": n, "kind": kind_of(n), "calls": round(c / steps, 2),
                 "us": round(t / steps, 1)} for n, (c, t) in ranked],
    }


def profile_steps(step, steps: int, device: torch.device) -> dict:
    """Runs `step` `steps` times under torch.profiler; the summary above (CUDA only)."""
    if device.type != "cuda":
        return {"skipped": "the kernel profile needs CUDA"}
    from torch.profiler import ProfilerActivity, profile

    step()  # outside the profile: a step whose first kernel waits for nothing recorded
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    events = [(e.get("name", ""), e.get("cat"), e.get("tid"), float(e["ts"]), float(e["dur"]))
              for e in trace.get("traceEvents", [])
              if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return summarize(events, steps)


def format_summary(label: str, summary: dict) -> str:
    if "wall_us" not in summary:
        return f"{label}: {summary}"
    kinds = ", ".join(f"{k} {v:.0f}" for k, v in summary["by_kind"].items())
    lines = [f"{label}: wall {summary['wall_us']:.0f} us/step, busy {summary['busy_us']:.0f}, "
             f"idle {summary['idle_us']:.0f}; by kind (us): {kinds}"]
    for t in summary["top"]:
        lines.append(f"    {t['us']:9.1f} us {t['calls']:6.2f}x  {t['kind']:<11} {t['name']}")
    return "\n".join(lines)
