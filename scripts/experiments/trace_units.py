#!/usr/bin/env python3
"""Writes a copy of src/kernels/async_gemm.cu whose consumer 0 stamps every work unit it runs.

By hand, for scripts/experiments/gemm_alone.cu built with -DEXP_TRACE (see its header): per CTA
and unit, the global timer and the SM clock when the unit starts and when its main loop is done
(after the last MMAs, before the epilogue), into a device buffer of
[CTAs][kTraceUnits units][4] u64 that gemm_alone hands over with exp_set_trace(). Units past
kTraceUnits are not stamped. Why: timing whole kernels could not say whether an epilogue change
moved the epilogue, the main loop or the clock (docs/PERFORMANCE.md, thirteenth session).

  python3 scripts/experiments/trace_units.py src/kernels/async_gemm.cu /tmp/async_gemm_traced.cu
"""
import sys

TRACE_UNITS = 256  # gemm_alone.cu's kTraceUnits

HOOK = """
__device__ unsigned long long* g_exp_trace = nullptr;
cudaError_t exp_set_trace(void* p) { return cudaMemcpyToSymbol(g_exp_trace, &p, sizeof(p)); }
"""


def stamp(first):
    return f"""    if (threadIdx.x == 128 && g_exp_trace != nullptr && (u - cluster_id) / clusters < {TRACE_UNITS}) {{
      unsigned long long* t = g_exp_trace + (blockIdx.x * {TRACE_UNITS} + (u - cluster_id) / clusters) * 4;
      t[{first}] = detail::global_timer_ns();
      t[{first + 2}] = clock64();
    }}
"""


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src = open(sys.argv[1]).read()
    anchors = [
        ("namespace asynctp::kernels {\n", HOOK),
        ("    const Unit w = unit(u);\n    Tile tile = tile_at(", None),
        ("    if (w.part >= 0) {\n      // A tail tile's K-range.", None),
    ]
    for anchor, _ in anchors:
        if src.count(anchor) != 1:
            sys.exit(f"trace_units.py: the kernel source changed: {anchor.splitlines()[0]!r} "
                     "not found exactly once")
    src = src.replace(anchors[0][0], anchors[0][0] + HOOK)
    unit_start = "    const Unit w = unit(u);\n"
    src = src.replace(anchors[1][0], unit_start + stamp(0) + anchors[1][0][len(unit_start):])
    src = src.replace(anchors[2][0], stamp(1) + anchors[2][0])
    open(sys.argv[2], "w").write(src)


if __name__ == "__main__":
    main()
