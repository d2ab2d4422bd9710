"""Throughput of the bundled trainer (checkpointing on) against a bare DDP loop.

Same model, batch, steps and world size (one process per GPU with NCCL and bf16, else 2 CPU
processes with gloo), alternated A/B/A/B in one run; medians are compared. Prints
RESULT throughput_ratio=<trainer / bare> (target >= 0.95).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.torchrun import torchrun_command  # noqa: E402

MODEL = ["--model", "gpt", "--batch-size", "8", "--seq-len", "64", "--d-model", "128",
         "--n-layers", "2", "--n-heads", "4", "--steps", "150"]
ROUNDS = 3


def torchrun(*args: str) -> str:
    result = subprocess.run(torchrun_command(*args), cwd=REPO, capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        sys.exit(f"run failed: {result.stderr[-2000:]}")
    return result.stdout


def trainer_samples_per_s(tmp: Path, round_: int) -> float:
    out = tmp / f"trainer-{round_}"
    torchrun("-m", "trainer", *MODEL, "--out", str(out), "--ckpt-every", "50",
             "--log-every", "25")
    return json.loads((out / "summary.json").read_text())["samples_per_s"]


def bare_samples_per_s() -> float:
    stdout = torchrun(str(REPO / "benchmarks" / "bare_ddp.py"), *MODEL)
    line = next(line for line in stdout.splitlines() if line.startswith("BARE "))
    return float(line.split("=", 1)[1])


def main() -> None:
    trainer, bare = [], []
    with tempfile.TemporaryDirectory(prefix="sortie-bench-") as tmp:
        for round_ in range(ROUNDS):
            trainer.append(trainer_samples_per_s(Path(tmp), round_))
            bare.append(bare_samples_per_s())
    t, b = statistics.median(trainer), statistics.median(bare)
    print(f"trainer (checkpoint every 50 steps): {t:,.0f} samples/s  "
          f"({', '.join(f'{x:,.0f}' for x in trainer)})")
    print(f"bare DDP loop:                       {b:,.0f} samples/s  "
          f"({', '.join(f'{x:,.0f}' for x in bare)})")
    print(f"RESULT throughput_ratio={t / b:.3f}")


if __name__ == "__main__":
    main()
