"""The report's plots as inline SVG (matplotlib, no network): a metric against step with the
checkpoint saves marked, and the timeline of a run's phases."""

from __future__ import annotations

import contextlib
import io
import threading
from typing import Any

from sortie.rundir.run_file import RecordedRecovery, RecordedSpan


def warm_up() -> threading.Thread:
    """Import matplotlib in the background (about a second), while the job trains, so that the
    report is drawn at once when the sortie ends."""
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
    recovery labelled with what it cost."""
    from matplotlib.figure import Figure

    rows = [row for row in TIMELINE_ROWS if any(s.phase == row for s in spans)]
    rows += sorted({s.phase for s in spans} - set(rows))
    with _styled():
        height = 0.45 * len(rows) + 0.9
        figure = Figure(figsize=(7.2, height))
        figure.subplots_adjust(left=0.14, right=0.9, top=1 - 0.15 / height,
                               bottom=0.6 / height)
        axes = figure.subplots()
        for index, row in enumerate(rows):
            mine = [s for s in spans if s.phase == row]
            axes.broken_barh([(s.start_s, max(s.end_s - s.start_s, 0.01)) for s in mine],
                             (index - 0.35, 0.7), gid=f"phase-{row.replace(' ', '-')}",
                             facecolors=["#1f5fa8" if s.ok else "#c0392b" for s in mine])
        recover = [s for s in spans if s.phase == "recover"]
        for span, recovery in zip(recover, recoveries, strict=False):
            axes.annotate(f"cost {recovery.cost_s:.1f}s",
                          (span.end_s, rows.index("recover")), xytext=(4, 0),
                          textcoords="offset points", va="center", fontsize=8)
        axes.set_yticks(range(len(rows)), rows)
        axes.invert_yaxis()
        axes.set_xlabel("seconds since the sortie started")
        axes.grid(axis="x", alpha=0.25)
        return _svg(figure)
