"""Rank 0's metrics: JSON lines in ``metrics.jsonl``, a readable line on stdout, ``summary.json``.
On every other rank it does nothing, so the training loop needs no rank checks for it.

The lines on stdout are read back by the controller (which node runs rank 0, how far training
got, where it resumed): their format and the patterns that read them are defined here, once."""

from __future__ import annotations

import json
import re
from pathlib import Path

STEP_LINE = "step {step:>6}/{total}  loss {loss:.5f}  {samples_per_s:,.0f} samples/s"
STEP_PATTERN = re.compile(r"\bstep\s+(\d+)/\d+")  # group 1: the step
RESUMED_LINE = ", resumed from step {step}"
RESUMED_PATTERN = re.compile(r"resumed from step (\d+)")  # group 1: the checkpoint's step


class MetricsLog:
    def __init__(self, out: Path, enabled: bool, resuming: bool) -> None:
        self.out, self.enabled = out, enabled
        self._file = None
        if enabled:
            out.mkdir(parents=True, exist_ok=True)
            self._file = (out / "metrics.jsonl").open("a" if resuming else "w")

    def say(self, text: str) -> None:
        if self.enabled:
            print(f"trainer: {text}", flush=True)

    def started(self, model: str, world: int, device: str, steps: int,
                resumed_from: int | None) -> None:
        resumed = RESUMED_LINE.format(step=resumed_from) if resumed_from is not None else ""
        self.say(f"{model} world_size={world} device={device} steps={steps}{resumed}")

    def record(self, step: int, total_steps: int, **values: float) -> None:
        if not self._file:
            return
        self._file.write(json.dumps({"step": step, **values}) + "\n")
        self._file.flush()  # a preempted or killed run keeps every line written so far
        print(STEP_LINE.format(step=step, total=total_steps, **values), flush=True)

    def checkpoint(self, step: int) -> None:
        """A checkpoint of ``step`` was saved: a line of its own (its flag is not a number, so
        no plot reads it as one; the run report marks the save)."""
        if self._file:
            self._file.write(json.dumps({"step": step, "checkpoint": True}) + "\n")
            self._file.flush()

    def write_json(self, name: str, document: dict) -> None:
        if self.enabled:
            (self.out / name).write_text(json.dumps(document, indent=2) + "\n")

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None
