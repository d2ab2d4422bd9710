"""The report's plots as inline SVG, written here (no plotting library, no network): a metric
against step with the checkpoint saves and resumes marked, and the timeline of a run's phases.
Drawing them costs microseconds, not a plotting library's import (about a second, which on a
small controller competed with the job's own start-up)."""

from __future__ import annotations

import html
import math

from sortie.rundir.run_file import RecordedRecovery, RecordedSpan

BLUE, RED, GREEN = "#1f5fa8", "#c0392b", "#2e8b57"
FONT = 'font-family="sans-serif" font-size="9"'


def nice_ticks(low: float, high: float, count: int, integer: bool = False) -> list[float]:
    """About ``count`` round ticks (1, 2 or 5 times a power of ten apart) from ``low`` to
    ``high``."""
    raw = (high - low) / max(count, 1)
    if raw <= 0 or not math.isfinite(raw):
        return [low]
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    if integer:
        step = max(1.0, math.ceil(step))
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _label(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 10_000 else f"{value:.4g}"


def metric_plot(name: str, steps: list[int], values: list[float], checkpoints: list[int],
                resumes: list[int]) -> str:
    """One numeric field against step, saves and resumes marked, as an SVG element. ``name``
    comes from a node's metrics: escaped wherever it appears."""
    points = [(s, v) for s, v in zip(steps, values, strict=False) if math.isfinite(v)]
    width, height, left, right, top, bottom = 560, 240, 73, 11, 29, 48
    xs = [s for s, _ in points] or [0]
    ys = [v for _, v in points] or [0.0]
    x_lo, x_hi = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    pad = (max(ys) - min(ys)) * 0.05 or abs(ys[0]) * 0.1 or 1.0
    y_lo, y_hi = min(ys) - pad, max(ys) + pad
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(step: float) -> float:
        return left + plot_w * (step - x_lo) / (x_hi - x_lo)

    def y(value: float) -> float:
        return top + plot_h * (1 - (value - y_lo) / (y_hi - y_lo))

    gid = html.escape(name, quote=True)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" {FONT}>',
             f'<text x="{left}" y="{top - 10}" font-size="10">{html.escape(name)}</text>']
    for tick in nice_ticks(x_lo, x_hi, 6, integer=True):
        parts.append(f'<line x1="{x(tick):.1f}" y1="{top}" x2="{x(tick):.1f}" '
                     f'y2="{top + plot_h}" stroke="#000" stroke-opacity="0.25" '
                     f'stroke-width="0.5"/><text x="{x(tick):.1f}" y="{top + plot_h + 13}" '
                     f'text-anchor="middle">{tick:g}</text>')
    for tick in nice_ticks(y_lo, y_hi, 5):
        parts.append(f'<line x1="{left}" y1="{y(tick):.1f}" x2="{left + plot_w}" '
                     f'y2="{y(tick):.1f}" stroke="#000" stroke-opacity="0.25" '
                     f'stroke-width="0.5"/><text x="{left - 4}" y="{y(tick) + 3:.1f}" '
                     f'text-anchor="end">{_label(tick)}</text>')
    parts.append(f'<path d="M {left} {top} L {left} {top + plot_h} L {left + plot_w} '
                 f'{top + plot_h}" style="fill: none; stroke: #000; stroke-width: 0.8"/>'
                 f'<text x="{left + plot_w / 2:.1f}" y="{height - 12}" '
                 'text-anchor="middle">step</text>')
    if checkpoints:
        parts.append(f'<g id="{gid}-checkpoints">' + "".join(
            f'<path d="M {x(step):.2f} {top} L {x(step):.2f} {top + plot_h}" style="fill: '
            f'none; stroke: {GREEN}; stroke-opacity: 0.8; stroke-width: 1.2; '
            'stroke-dasharray: 1.2,2"/>' for step in checkpoints if x_lo <= step <= x_hi)
            + "</g>")
    for number, step in enumerate(resumes, 1):
        parts.append(f'<g id="{gid}-resume-{number}"><path d="M {x(step):.2f} {top} L '
                     f'{x(step):.2f} {top + plot_h}" style="fill: none; stroke: {RED}; '
                     'stroke-width: 1; stroke-dasharray: 4,2"/></g>')
    line = " L ".join(f"{x(s):.2f} {y(v):.2f}" for s, v in points)
    marks = "".join(f'<circle cx="{x(s):.2f}" cy="{y(v):.2f}" r="1.8" fill="{BLUE}"/>'
                    for s, v in points) if len(points) < 60 else ""
    parts.append(f'<g id="series-{gid}"><path d="M {line}" style="fill: none; stroke: {BLUE}; '
                 f'stroke-width: 1.4; stroke-linejoin: round"/>{marks}</g>' if points else "")
    parts.append("</svg>")
    return "".join(parts)


TIMELINE_WIDTH = 720
# In the order a sortie goes through them (a phase not named here comes after them all).
TIMELINE_ROWS = ("up", "launch retry", "connect", "bootstrap", "health", "sync", "setup", "train",
                 "recover", "stop", "collect", "down")


def timeline_plot(spans: list[RecordedSpan], recoveries: list[RecordedRecovery]) -> str:
    """The phases as bars against time since the sortie started; failed ones in red, each
    recovery labelled with what it cost."""
    rows = [row for row in TIMELINE_ROWS if any(s.phase == row for s in spans)]
    rows += sorted({s.phase for s in spans} - set(rows))
    left, right, top, row_h, bottom = 110, 70, 8, 26, 42
    plot_w = TIMELINE_WIDTH - left - right
    end = max((s.end_s for s in spans), default=1.0) or 1.0
    ticks = nice_ticks(0.0, end, 6)
    span_end = max(end, ticks[-1])

    def x(seconds: float) -> float:
        return left + plot_w * seconds / span_end

    height = top + row_h * len(rows) + bottom
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{TIMELINE_WIDTH}" '
             f'height="{height}" viewBox="0 0 {TIMELINE_WIDTH} {height}" font-size="11" '
             'font-family="sans-serif">']
    axis_y = top + row_h * len(rows)
    for tick in ticks:
        parts.append(f'<line x1="{x(tick):.1f}" y1="{top}" x2="{x(tick):.1f}" y2="{axis_y}" '
                     'stroke="#000" stroke-opacity="0.12"/>'
                     f'<text x="{x(tick):.1f}" y="{axis_y + 14}" text-anchor="middle">'
                     f'{tick:g}</text>')
    parts.append(f'<text x="{left + plot_w / 2:.1f}" y="{axis_y + 32}" text-anchor="middle">'
                 'seconds since the sortie started</text>')
    for index, row in enumerate(rows):
        y = top + row_h * index
        gid = html.escape(row.replace(" ", "-"))
        parts.append(f'<text x="{left - 8}" y="{y + row_h / 2 + 4:.1f}" text-anchor="end">'
                     f'{html.escape(row)}</text><g id="phase-{gid}">')
        for span in (s for s in spans if s.phase == row):
            width = max(x(span.end_s) - x(span.start_s), 1.0)
            parts.append(f'<rect x="{x(span.start_s):.1f}" y="{y + 4}" width="{width:.1f}" '
                         f'height="{row_h - 8}" fill="{"#1f5fa8" if span.ok else "#c0392b"}"/>')
        parts.append("</g>")
    recover = [s for s in spans if s.phase == "recover"]
    for span, recovery in zip(recover, recoveries, strict=False):
        label_y = top + row_h * rows.index("recover") + row_h / 2 + 4
        parts.append(f'<text x="{x(span.end_s) + 4:.1f}" y="{label_y:.1f}" font-size="10">'
                     f'cost {recovery.cost_s:.1f}s</text>')
    parts.append(f'<line x1="{left}" y1="{axis_y}" x2="{left + plot_w}" y2="{axis_y}" '
                 'stroke="#000"/></svg>')
    return "".join(parts)

