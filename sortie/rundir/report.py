"""A sortie's report: ``runs/<id>/report.html``, one page that stands alone (no network, no
script, plots as inline SVG written by `plots.py`) and is kept with the run's artifacts.

It is rendered from the run directory alone, so `sortie report` renders any earlier run:
- ``run.json``: what ran where (backend, nodes, processes, GPUs, each node's Python and torch),
  its phases on a timeline, launch retries and recoveries, exit codes, cost and teardown; the
  lifecycle writes it at the end of every sortie (`write_run_file`);
- ``metrics.jsonl``: the bundled trainer's, or a user's job's (written to
  ``$SORTIE_ARTIFACT_DIR``): one JSON object per line with an integer ``step`` and any numeric
  fields, each of which gets a plot against step; ``"checkpoint": true`` on a line marks a save;
- ``manifest.json``: the artifacts with their sizes and SHA-256;
- ``logs/<node>.log``: the last lines of each node whose job failed.

All of it may come from the nodes: sizes are capped, names checked, everything escaped."""

from __future__ import annotations

import contextlib
import functools
import math
import re
import stat
from pathlib import Path

import pydantic
from jinja2 import (
    Environment,
    FileSystemBytecodeCache,
    PackageLoader,
    Template,
    select_autoescape,
)

from sortie.bootstrap.follow import shown_lines
from sortie.bootstrap.verified_copy import LOGS_DIR, Manifest
from sortie.core import statefile
from sortie.core.errors import UsageError
from sortie.core.home import sortie_home
from sortie.core.naming import NAME
from sortie.core.sizes import readable_bytes
from sortie.core.statefile import RUN_FILE_MODE, not_private, read_tail
from sortie.rundir.metrics import Metrics, metrics_path, plot_order, read_metrics
from sortie.rundir.plots import metric_plot, timeline_plot
from sortie.rundir.run_file import RUN_FILE, RunFile, _read_json

REPORT_FILE = "report.html"
LOG_TAIL_LINES = 20


# A line that says what went wrong: C++'s std::terminate, a Python traceback or exception, a
# signal. Stack frames often follow it for longer than a tail shows.
FAILURE_LINE = re.compile(r"terminate called|Traceback \(most recent call last\)|"
                          r"^\S*(Error|Exception)\b|\bSignal \d+|SIG(ABRT|SEGV|KILL|BUS)|"
                          r"Segmentation fault|Killed")


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of a log (reading only its last 64 KiB), keeping the last line
    that names a failure (`FAILURE_LINE`) when more lines than that follow it: then it comes
    first, and a line saying how many were left out."""
    tail = read_tail(path, 64 * 1024)
    if not tail:
        return []
    every = shown_lines(tail[0].decode("utf-8", errors="replace"))  # (a bar's redraws: one)
    shown = every[-lines:]
    earlier = every[:-lines] if len(every) > lines else []
    named = [at for at, line in enumerate(earlier) if FAILURE_LINE.search(line)]
    if not named or lines < 3:
        return shown
    at = named[-1]
    kept = every[-(lines - 2):]
    return [earlier[at], f"[… {len(every) - at - 1 - len(kept):,} lines …]", *kept]


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(round(seconds, 1), 60)
    return f"{int(minutes)}m {secs:04.1f}s" if minutes else f"{secs:.1f}s"


class ReportError(UsageError):
    """The directory is not a run sortie can report on; the message says why."""


def read_run_file(run_dir: Path) -> RunFile:
    """``run_dir``'s ``run.json``, validated: a ReportError saying why when it cannot be read."""
    raw = _read_json(run_dir / RUN_FILE)
    if raw is None:
        raise ReportError(f"{run_dir}: no readable {RUN_FILE} (written at the end of every "
                          "sortie since reports began)")
    try:
        return RunFile.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise ReportError(f"{run_dir / RUN_FILE}: not a run record "
                          f"({exc.errors()[0]['loc']}: {exc.errors()[0]['msg']})") from None


@functools.cache
def _report_template() -> Template:
    """The report's template. Jinja2 keeps its compiled form in $SORTIE_HOME/cache/templates,
    keyed by the template's source: compiling it took 0.13 s of every `exec` (each writes a
    report); without a usable home it is compiled in memory. The cache is code Jinja2 loads:
    used only where the home and the cache are this user's own and no one else can write."""
    cache = None
    with contextlib.suppress(OSError, UsageError):
        home = sortie_home()
        directory = home / "cache" / "templates"
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not any(not_private(path) for path in (home, home / "cache", directory)):
            cache = FileSystemBytecodeCache(str(directory))
    return Environment(loader=PackageLoader("sortie", "templates"), bytecode_cache=cache,
                       autoescape=select_autoescape(default=True)).get_template(
        "report.html.j2")


def render_report(run_dir: Path, metrics: Metrics | None = None,
                  run: RunFile | None = None) -> str:
    """The HTML of ``run_dir``'s report: from ``run`` (the run as just written, in memory),
    else its ``run.json``; ``metrics``: its metrics.jsonl, if already read."""
    run = run if run is not None else read_run_file(run_dir)
    result = run.result
    spans, recoveries = result.timeline, result.recoveries
    metrics_file = metrics_path(run_dir)
    metrics = metrics if metrics is not None else read_metrics(metrics_file)
    try:  # its size, said beside an empty plot list: a regular file's only, never a link's
        found = metrics_file.lstat()
        metrics_size = readable_bytes(found.st_size) if stat.S_ISREG(found.st_mode) else None
    except OSError:
        metrics_size = None
    resumes = [r.resumed_from_step for r in recoveries if r.resumed_from_step is not None]
    plots = [(name, metric_plot(name, *metrics.steps(name), metrics.checkpoints, resumes))
             for name in plot_order(list(metrics.series))]
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
    return _report_template().render(
        run=run, result=result, ok=result.ok, wall=_duration(wall_s),
        outcome="ok" if result.ok else "interrupted" if result.interrupted else "failed",
        phases=[(span, _duration(span.end_s - span.start_s)) for span in
                sorted(spans, key=lambda s: s.start_s)],
        timeline=timeline_plot(spans, recoveries) if spans else None,
        recoveries=recoveries, launch_failures=result.launch_failures,
        plots=plots, checkpoints=metrics.checkpoints, skipped=metrics.skipped,
        metrics_size=metrics_size,
        skipped_bytes=readable_bytes(metrics.skipped_bytes) if metrics.skipped_bytes else None,
        nodes=nodes, cost=cost, artifacts=[(a, readable_bytes(a.bytes)) for a in artifacts],
        # From a node: only the numbers the header shows, and only if they are numbers.
        summary={key: value for key, value in (result.summary or {}).items()
                 if key in ("steps", "final_loss", "samples_per_s")
                 and isinstance(value, (int, float)) and not isinstance(value, bool)
                 and math.isfinite(value)})


def open_in_browser(path: Path) -> bool:
    """Open the report in the desktop's browser; False where there is none (a server)."""
    import webbrowser

    try:
        browser = webbrowser.get()
    except webbrowser.Error:
        return False
    return browser.open(path.resolve().as_uri())


def write_report(run_dir: Path, metrics: Metrics | None = None,
                 run: RunFile | None = None) -> Path:
    """Render ``run_dir``'s report into it (from ``run`` when given); returns its path."""
    path = run_dir / REPORT_FILE
    if path.is_symlink():  # in a shared runs directory, planted to be written through
        raise ReportError(f"RUN: {path} is a symlink; not written through (remove it)")
    html = render_report(run_dir, metrics, run)
    try:
        statefile.write_text(path, html, RUN_FILE_MODE)
    except OSError as exc:
        raise ReportError(f"RUN: cannot write {path}: {exc.strerror}") from None
    return path
