"""The report's plots as inline SVG (matplotlib, no network): a metric against step with the
checkpoint saves marked, and the timeline of a run's phases."""

from __future__ import annotations

import contextlib
import html
import io
import math
import threading
from typing import Any

from sortie.rundir.run_file import RecordedRecovery, RecordedSpan


def warm_up(metrics: bool = True) -> threading.Thread | None:
    """Import matplotlib in the background (about a second), while the job trains, so that the
    report's metric plots are drawn at once when the sortie ends; nothing when the job is not
    known to log ``metrics`` (the timeline needs no matplotlib)."""
    if not metrics:
        return None

    def load() -> None:
        with contextlib.suppress(Exception):  # the report itself will say what is wrong
            import matplotlib.backends.backend_svg  # noqa: F401
            import matplotlib.figure  # noqa: F401

    thread = threading.Thread(target=load, name="report-warm-up", daemon=True)
    thread.start()
    return thread


def _svg(figure: Any) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg",  # no metadata: no date in it
                   metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    text = buffer.getvalue()
    return text[text.index("<svg"):]  # inline: no XML declaration or doctype


def _styled() -> Any:
    import matplotlib

    # Text stays text (smaller, selectable); every point is drawn (a plot has one per step);
    # ids are the same every time the same run is drawn.
    return matplotlib.rc_context({"svg.fonttype": "none", "path.simplify": False,
                                  "svg.hashsalt": "sortie", "font.size": 9,
                                  "axes.spines.top": False, "axes.spines.right": False})


def _few_ticks(axes: Any) -> None:
    """A handful of ticks a side: easier to read, and ticks are most of a plot's drawing time."""
    from matplotlib.ticker import MaxNLocator

    axes.xaxis.set_major_locator(MaxNLocator(6, integer=True))
    axes.yaxis.set_major_locator(MaxNLocator(5))


def metric_plot(name: str, steps: list[int], values: list[float], checkpoints: list[int],
                resumes: list[int]) -> str:
    """One numeric field against step, saves and resumes marked, as an SVG element."""
    from matplotlib.figure import Figure

    with _styled():
        figure = Figure(figsize=(5.6, 2.4))
        # Fixed margins: a tight bounding box would draw every plot twice.
        figure.subplots_adjust(left=0.13, right=0.98, top=0.88, bottom=0.2)
        axes = figure.subplots()
        (line,) = axes.plot(steps, values, marker="." if len(steps) < 60 else None,
                            linewidth=1.4, color="#1f5fa8")
        line.set_gid(f"series-{name}")
        if checkpoints:  # one element for all of them: a save every step stays small
            axes.vlines(checkpoints, 0, 1, transform=axes.get_xaxis_transform(),
                        color="#2e8b57", alpha=0.8, linewidth=1.2, linestyles="dotted",
                        gid=f"{name}-checkpoints")
        for number, step in enumerate(resumes, 1):
            axes.axvline(step, color="#c0392b", linestyle="--", linewidth=1.0,
                         gid=f"{name}-resume-{number}")
        _few_ticks(axes)
        axes.set_title(name, loc="left", fontsize=10)
        axes.set_xlabel("step")
        axes.grid(alpha=0.25)
        return _svg(figure)


TIMELINE_ROWS = ("up", "launch retry", "bootstrap", "sync", "setup", "train", "recover", "stop",
                 "collect", "down")


def timeline_plot(spans: list[RecordedSpan], recoveries: list[RecordedRecovery]) -> str:
    """The phases as bars against time since the sortie started; failed ones in red, each
    recovery labelled with what it cost. Plain SVG, written here: every report has a timeline,
    and drawing one must not cost a matplotlib import (about a second)."""
    rows = [row for row in TIMELINE_ROWS if any(s.phase == row for s in spans)]
    rows += sorted({s.phase for s in spans} - set(rows))
    left, right, top, row_h, bottom = 110, 70, 8, 26, 42
    plot_w = TIMELINE_WIDTH - left - right
    end = max((s.end_s for s in spans), default=1.0) or 1.0
    step = _tick_step(end)
    ticks = [i * step for i in range(int(end / step) + 1)]
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
        y = top + row_h * rows.index("recover") + row_h / 2 + 4
        parts.append(f'<text x="{x(span.end_s) + 4:.1f}" y="{y:.1f}" font-size="10">'
                     f'cost {recovery.cost_s:.1f}s</text>')
    parts.append(f'<line x1="{left}" y1="{axis_y}" x2="{left + plot_w}" y2="{axis_y}" '
                 'stroke="#000"/></svg>')
    return "".join(parts)


TIMELINE_WIDTH = 720


def _tick_step(end: float) -> float:
    """A round step (1, 2 or 5 times a power of ten) giving about six ticks up to ``end``."""
    raw = end / 6
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
