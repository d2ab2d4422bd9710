"""A run's metrics (``metrics.jsonl``, one JSON object per line, each with a ``step``): read at
both ends when huge, numeric fields only, and the loss as a sparkline for the terminal."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from sortie.bootstrap.verified_copy import ARTIFACTS_DIR
from sortie.core.statefile import open_regular

METRICS_FILE = "metrics.jsonl"
MAX_PLOTS = 24  # metrics read (and plotted): a job cannot fill the report with thousands
MAX_METRICS_BYTES = 32 << 20  # read at most this much of metrics.jsonl
FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]{0,63}")
# The order plots come in: loss and learning rate, then throughput, then the rest as found.
FIRST_FIELDS = ("loss", "lr", "samples_per_s", "tokens_per_s")
SPARK = "▁▂▃▄▅▆▇█"


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


def plot_order(names: list[str]) -> list[str]:
    return [n for n in FIRST_FIELDS if n in names] + [n for n in names if n not in FIRST_FIELDS]
