"""The layer benchmark's plot, written as SVG by hand (no plotting library needed): time per
token (µs) against tokens per rank T (log2 axis), one line per arm, one panel per
(config, dtype, pass), the floor dashed."""

from __future__ import annotations

import math
from xml.sax.saxutils import escape

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]
PANEL_W, PANEL_H = 560, 300
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 70, 190, 34, 44


def _series(result_rows):
    """{panel title: {line name: [(T, µs per token)]}} from the JSON's results."""
    panels: dict[str, dict[str, list]] = {}
    for row in result_rows:
        title = f"{row['config']} {row['dtype']} {row['pass']}, ws {row['world_size']}"
        lines = panels.setdefault(title, {})
        S = row["seq_len"]
        for arm, res in row["arms"].items():
            if res.get("status") == "ok":
                lines.setdefault(arm, []).append((row["tokens_per_rank"], res["ms"] * 1e3 / S))
        if row.get("floor", {}).get("ms"):
            lines.setdefault("floor", []).append((row["tokens_per_rank"],
                                                  row["floor"]["ms"] * 1e3 / S))
    return panels


def _ticks(lo, hi, n=5):
    if hi <= lo:
        hi = lo + 1.0
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    # From the step at or below lo to the first at or above hi: every value lies inside.
    ticks = [math.floor(lo / step) * step]
    while ticks[-1] < hi - 1e-12 * step:
        ticks.append(ticks[-1] + step)
    return ticks


def svg(result_rows) -> str:
    panels = _series(result_rows)
    height = max(1, len(panels)) * PANEL_H
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{PANEL_W}" height="{height}" '
           'font-family="sans-serif" font-size="11">',
           f'<rect width="{PANEL_W}" height="{height}" fill="white"/>']
    if not panels:
        out.append('<text x="20" y="40">no results</text>')
    for p, (title, lines) in enumerate(sorted(panels.items())):
        y0 = p * PANEL_H
        x_lo, x_hi = MARGIN_L, PANEL_W - MARGIN_R
        y_top, y_bot = y0 + MARGIN_T, y0 + PANEL_H - MARGIN_B
        Ts = sorted({t for pts in lines.values() for t, _ in pts})
        vals = [v for pts in lines.values() for _, v in pts]
        if not Ts:
            continue
        lt_lo, lt_hi = math.log2(Ts[0]), math.log2(Ts[-1])
        if lt_hi == lt_lo:
            lt_lo, lt_hi = lt_lo - 1, lt_hi + 1
        yt = _ticks(0.0, max(vals) * 1.05)
        v_hi = yt[-1] if yt[-1] > 0 else 1.0

        def px(t):
            return x_lo + (math.log2(t) - lt_lo) / (lt_hi - lt_lo) * (x_hi - x_lo)

        def py(v):
            return y_bot - v / v_hi * (y_bot - y_top)

        out.append(f'<text x="{x_lo}" y="{y0 + 20}" font-size="13">{escape(title)}</text>')
        out.append(f'<line x1="{x_lo}" y1="{y_bot}" x2="{x_hi}" y2="{y_bot}" stroke="black"/>')
        out.append(f'<line x1="{x_lo}" y1="{y_top}" x2="{x_lo}" y2="{y_bot}" stroke="black"/>')
        for t in Ts:
            out.append(f'<text x="{px(t):.1f}" y="{y_bot + 15}" text-anchor="middle">{t}</text>')
        out.append(f'<text x="{(x_lo + x_hi) / 2:.1f}" y="{y_bot + 32}" text-anchor="middle">'
                   'tokens per rank T</text>')
        for v in yt:
            out.append(f'<line x1="{x_lo - 4}" y1="{py(v):.1f}" x2="{x_hi}" y2="{py(v):.1f}" '
                       'stroke="#ddd"/>')
            out.append(f'<text x="{x_lo - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
        out.append(f'<text x="16" y="{(y_top + y_bot) / 2:.1f}" text-anchor="middle" '
                   f'transform="rotate(-90 16 {(y_top + y_bot) / 2:.1f})">µs per token</text>')
        for i, (name, pts) in enumerate(sorted(lines.items())):
            color = "black" if name == "floor" else COLORS[i % len(COLORS)]
            dash = ' stroke-dasharray="5,4"' if name == "floor" else ""
            pts = sorted(pts)
            path = " ".join(f"{px(t):.1f},{py(v):.1f}" for t, v in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" '
                       f'stroke-width="2"{dash}/>')
            for t, v in pts:
                out.append(f'<circle cx="{px(t):.1f}" cy="{py(v):.1f}" r="3" fill="{color}"/>')
            ly = y_top + 14 * i
            out.append(f'<line x1="{x_hi + 12}" y1="{ly}" x2="{x_hi + 32}" y2="{ly}" '
                       f'stroke="{color}" stroke-width="2"{dash}/>')
            out.append(f'<text x="{x_hi + 36}" y="{ly + 4}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
