"""A sortie's report: ``runs/<id>/report.html``, one page that stands alone (no network, no
script, plots as inline SVG drawn by matplotlib) and is kept with the run's artifacts.

It is rendered from the run directory alone, so `sortie report` renders any earlier run:
- ``run.json``: what ran where (backend, nodes, processes, GPUs, each node's Python and torch),
  its phases on a timeline, launch retries and recoveries, exit codes, cost and teardown; the
  lifecycle writes it at the end of every sortie (`write_run_file`);
- ``metrics.jsonl``: the bundled trainer's, or a user's job's (written to
  ``$SORTIE_ARTIFACT_DIR``): one JSON object per line with an integer ``step`` and any numeric
  fields, each of which gets a plot against step; ``"checkpoint": true`` on a line marks a save;
- ``manifest.json``: the artifacts with their sizes and SHA-256;
- ``logs/<node>.log``: the last lines of each node whose job failed.

All of it may come from the nodes: sizes are capped, names checked, everything escaped.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import math
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic
from jinja2 import Environment, PackageLoader, select_autoescape

from bootstrap.collect import ARTIFACTS_DIR, LOGS_DIR, Manifest
from sortie.core import statefile
from sortie.core.errors import UsageError
from sortie.core.naming import NAME
from sortie.core.sizes import readable_bytes
from sortie.core.statefile import RUN_FILE_MODE, open_regular, read_tail
from sortie.rundir.result import RunResult

REPORT_FILE = "report.html"
RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
MAX_METRICS_BYTES = 32 << 20  # read at most this much of metrics.jsonl
MAX_FILE_BYTES = 8 << 20  # run.json, manifest.json
MAX_PLOTS = 24
LOG_TAIL_LINES = 20
FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]{0,63}")
# The order plots come in: loss and learning rate, then throughput, then the rest as found.
FIRST_FIELDS = ("loss", "lr", "samples_per_s", "tokens_per_s")
SPARK = "▁▂▃▄▅▆▇█"


class RecordedSpan(pydantic.BaseModel):
    phase: str = pydantic.Field(max_length=40)
    start_s: float
    end_s: float
    ok: bool = True


class RecordedRecovery(pydantic.BaseModel):
    lost: list[str]
    reason: str
    failed_at_step: int | None = None
    resumed_from_step: int | None = None
    downtime_s: float = 0.0
    redone_s: float = 0.0
    cost_s: float = 0.0


class RecordedResult(pydantic.BaseModel, extra="allow"):
    """What the report reads of the RunResult in ``run.json`` (the rest is kept as it is)."""

    ok: bool = False
    ranks: int = 0
    cluster: str | None = pydantic.Field(default=None, max_length=64)  # an `exec`'s cluster
    wall_s: float | None = None
    exit_codes: dict[str, int | None] = pydantic.Field(default_factory=dict)
    node_states: dict[str, str] = pydantic.Field(default_factory=dict)
    timeline: list[RecordedSpan] = pydantic.Field(default_factory=list)
    recoveries: list[RecordedRecovery] = pydantic.Field(default_factory=list)
    launch_failures: list[str] = pydantic.Field(default_factory=list)
    summary: dict[str, Any] | None = None  # the trainer's summary.json, from a node


class RunFile(pydantic.BaseModel):
    """``run.json``: what the report needs besides the metrics and the manifest."""

    run_id: str
    backend: str  # "local", "aws", "gcp", "azure", "attached"
    profile: str | None = None  # the stack profile, for a cloud sortie
    nodes: int
    procs_per_node: int
    gpus_per_node: int = 0
    job: str  # "bundled trainer", or what the user's job runs
    started_at: str  # ISO 8601, UTC
    usd_per_hour: float | None = None  # at the launch terms; None: no cloud cost (local)
    pricing: str = ""  # "on-demand", "spot workers, on-demand head", ...
    node_facts: dict[str, dict[str, Any]] = pydantic.Field(default_factory=dict)
    failure: str | None = None  # what went wrong, in one line
    teardown: str | None = None  # the teardown's proof line
    result: RecordedResult  # the RunResult, as `--json` prints it


def write_run_file(result: RunResult, *, backend: str, profile: str | None,
                   procs_per_node: int, gpus_per_node: int, job: str, started_at: float,
                   usd_per_hour: float | None, pricing: str,
                   node_facts: dict[str, dict[str, Any]]) -> Path:
    document = RunFile(
        run_id=result.run_id, backend=backend, profile=profile, nodes=result.nodes,
        procs_per_node=procs_per_node, gpus_per_node=gpus_per_node, job=job,
        started_at=datetime.datetime.fromtimestamp(started_at, datetime.timezone.utc)
        .isoformat(timespec="seconds"),
        usd_per_hour=usd_per_hour, pricing=pricing, node_facts=node_facts,
        failure=result.failure(), teardown=result.teardown.summary() if result.teardown else None,
        result=pydantic.TypeAdapter(RunResult).dump_python(result, mode="json", by_alias=True))
    path = result.artifacts / RUN_FILE
    statefile.write_text(path, document.model_dump_json(indent=2) + "\n", RUN_FILE_MODE)
    return path


@dataclass
class Metrics:
    """The metric series of a run: one value per step (a step logged again after a resume
    counts once, its last value), and the steps a checkpoint was saved at."""

    series: dict[str, dict[int, float]] = field(default_factory=dict)
    checkpoints: list[int] = field(default_factory=list)
    skipped: int = 0  # lines that were not a JSON object with an integer step
    skipped_bytes: int = 0  # the middle of a file over MAX_METRICS_BYTES, not read

    def steps(self, name: str) -> tuple[list[int], list[float]]:
        points = sorted(self.series[name].items())
        return [step for step, _ in points], [value for _, value in points]


def metrics_path(run_dir: Path) -> Path:
    """The job's metrics: in its outputs (``artifacts/``); at the top of runs made before
    nodes' files had a folder of their own."""
    outputs = run_dir / ARTIFACTS_DIR
    return (outputs if outputs.is_dir() else run_dir) / METRICS_FILE


def _metrics_text(path: Path) -> tuple[str, int]:
    """The text of ``path``, or of its first and last halves of MAX_METRICS_BYTES when it is
    larger (the end of a run matters most); and how many bytes were skipped between them."""
    handle = open_regular(path)
    if handle is None:
        return "", 0
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if size <= MAX_METRICS_BYTES:
            return handle.read(MAX_METRICS_BYTES).decode("utf-8", errors="replace"), 0
        half = MAX_METRICS_BYTES // 2
        head = handle.read(half)
        handle.seek(size - half)
        tail = handle.read(half)
    # Cut at line ends: the lines the cut splits are skipped, not misread.
    head, tail = head[:head.rfind(b"\n") + 1], tail[tail.find(b"\n") + 1:]
    return (head + tail).decode("utf-8", errors="replace"), size - len(head) - len(tail)


def read_metrics(path: Path) -> Metrics:
    metrics = Metrics()
    text, metrics.skipped_bytes = _metrics_text(path)
    saves = set()
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):  # a node wrote it: anything may be in it
            metrics.skipped += bool(line.strip())
            continue
        step = entry.get("step") if isinstance(entry, dict) else None
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            metrics.skipped += 1
            continue
        if entry.get("checkpoint") is True:
            saves.add(step)
        for name, value in entry.items():
            if name == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if not FIELD_NAME.fullmatch(name) or not math.isfinite(value):
                continue
            if name in metrics.series or len(metrics.series) < MAX_PLOTS:
                metrics.series.setdefault(name, {})[step] = float(value)
    metrics.checkpoints = sorted(saves)
    return metrics


def sparkline(values: list[float], width: int = 40) -> str:
    """Values as one line of block characters, evenly sampled to at most ``width``."""
    if not values:
        return ""
    if len(values) > width:
        values = [values[round(i * (len(values) - 1) / (width - 1))] for i in range(width)]
    low, high = min(values), max(values)
    scale = (len(SPARK) - 1) / (high - low) if high > low else 0.0
    return "".join(SPARK[round((value - low) * scale)] for value in values)


def loss_sparkline(metrics: Metrics) -> str | None:
    return sparkline(metrics.steps("loss")[1]) if "loss" in metrics.series else None


def _plot_order(names: list[str]) -> list[str]:
    return [n for n in FIRST_FIELDS if n in names] + [n for n in names if n not in FIRST_FIELDS]


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


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of a log, reading only its last 64 KiB."""
    tail = read_tail(path, 64 * 1024)
    return tail[0].decode("utf-8", errors="replace").splitlines()[-lines:] if tail else []


def _read_json(path: Path) -> Any:
    handle = open_regular(path)
    if handle is None:
        return None
    with handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        return None
    try:
        return json.loads(data.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return None


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(round(seconds, 1), 60)
    return f"{int(minutes)}m {secs:04.1f}s" if minutes else f"{secs:.1f}s"


class ReportError(UsageError):
    """The directory is not a run sortie can report on; the message says why."""


def render_report(run_dir: Path, metrics: Metrics | None = None) -> str:
    """The HTML of ``run_dir``'s report (``metrics``: its metrics.jsonl, if already read)."""
    raw = _read_json(run_dir / RUN_FILE)
    if raw is None:
        raise ReportError(f"{run_dir}: no readable {RUN_FILE} (written at the end of every "
                          "sortie since reports began)")
    try:
        run = RunFile.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise ReportError(f"{run_dir / RUN_FILE}: not a run record "
                          f"({exc.errors()[0]['loc']}: {exc.errors()[0]['msg']})") from None
    result = run.result
    spans, recoveries = result.timeline, result.recoveries
    metrics = metrics if metrics is not None else read_metrics(metrics_path(run_dir))
    resumes = [r.resumed_from_step for r in recoveries if r.resumed_from_step is not None]
    plots = [(name, metric_plot(name, *metrics.steps(name), metrics.checkpoints, resumes))
             for name in _plot_order(list(metrics.series))]
    manifest_raw = _read_json(run_dir / "manifest.json")
    try:
        artifacts = Manifest.model_validate(manifest_raw).files if manifest_raw else []
    except pydantic.ValidationError:
        artifacts = []
    exit_codes, states, wall_s = result.exit_codes, result.node_states, result.wall_s
    cost = (run.usd_per_hour * wall_s / 3600 if run.usd_per_hour is not None and wall_s
            else None)
    nodes = []
    for name in sorted(set(exit_codes) | set(run.node_facts)):
        facts = run.node_facts.get(name, {})
        code = exit_codes.get(name)
        nodes.append({"name": name, "python": facts.get("python", "-"),
                      "torch": facts.get("torch") or "-", "gpus": facts.get("gpus", "-"),
                      "exit_code": "-" if code is None else code,
                      "state": states.get(name, "-"),
                      # A name from run.json makes a path: only a node name may.
                      "tail": log_tail(run_dir / LOGS_DIR / f"{name}.log")
                      if name in exit_codes and code != 0 and NAME.fullmatch(name) else []})
    template = Environment(loader=PackageLoader("sortie", "templates"),
                           autoescape=select_autoescape(default=True)).get_template(
        "report.html.j2")
    return template.render(
        run=run, result=result, ok=result.ok, wall=_duration(wall_s),
        phases=[(span, _duration(span.end_s - span.start_s)) for span in
                sorted(spans, key=lambda s: s.start_s)],
        timeline=timeline_plot(spans, recoveries) if spans else None,
        recoveries=recoveries, launch_failures=result.launch_failures,
        plots=plots, checkpoints=metrics.checkpoints, skipped=metrics.skipped,
        skipped_bytes=readable_bytes(metrics.skipped_bytes) if metrics.skipped_bytes else None,
        nodes=nodes, cost=cost, artifacts=[(a, readable_bytes(a.bytes)) for a in artifacts],
        # From a node: only the numbers the header shows, and only if they are numbers.
        summary={key: value for key, value in (result.summary or {}).items()
                 if key in ("steps", "final_loss", "samples_per_s")
                 and isinstance(value, (int, float)) and not isinstance(value, bool)
                 and math.isfinite(value)})


def run_directory(run: str, runs_dir: Path) -> Path:
    """``run``: a run id (its directory in ``runs_dir``) or a run directory's path."""
    path = Path(run)
    if path.is_dir() and (path / RUN_FILE).is_file():
        return path
    by_id = runs_dir / run
    if "/" not in run and run not in (".", "..") and by_id.is_dir():
        return by_id
    where = f"{path}: no {RUN_FILE} there" if path.is_dir() else \
        f"no run directory {by_id} and no directory {path}"
    raise UsageError(f"RUN: {where} (give a run id from {runs_dir}/ or a run directory)")


def open_in_browser(path: Path) -> bool:
    """Open the report in the desktop's browser; False where there is none (a server)."""
    import webbrowser

    try:
        browser = webbrowser.get()
    except webbrowser.Error:
        return False
    return browser.open(path.resolve().as_uri())


def write_report(run_dir: Path, metrics: Metrics | None = None) -> Path:
    """Render ``run_dir``'s report into it; returns its path."""
    path = run_dir / REPORT_FILE
    if path.is_symlink():  # in a shared runs directory, planted to be written through
        raise ReportError(f"RUN: {path} is a symlink; not written through (remove it)")
    html = render_report(run_dir, metrics)
    try:
        statefile.write_text(path, html, RUN_FILE_MODE)
    except OSError as exc:
        raise ReportError(f"RUN: cannot write {path}: {exc.strerror}") from None
    return path
