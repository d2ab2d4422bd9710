"""Rank 0's metrics: JSON lines in ``metrics.jsonl``, a readable line on stdout, ``summary.json``.
On every other rank it does nothing, so the training loop needs no rank checks for it."""

from __future__ import annotations

import json
from pathlib import Path


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

    def record(self, step: int, total_steps: int, **values: float) -> None:
        if not self._file:
            return
        self._file.write(json.dumps({"step": step, **values}) + "\n")
        self._file.flush()  # a preempted or killed run keeps every line written so far
        print(f"step {step:>6}/{total_steps}  loss {values['loss']:.5f}  "
              f"{values['samples_per_s']:,.0f} samples/s", flush=True)

    def write_json(self, name: str, document: dict) -> None:
        if self.enabled:
            (self.out / name).write_text(json.dumps(document, indent=2) + "\n")

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None
