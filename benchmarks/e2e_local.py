"""A whole 2-node x 2-process local sortie through the real CLI, and what it costs beyond training.

Measured side by side in one run, each twice (the faster counts: the machine is noisy):
- the sortie: `sortie run --nodes 2 -p 2 --steps 200` (start nodes, SSH, checks, install,
  torchrun on each node with cross-node rendezvous, train, collect and verify, tear down);
- bare torchrun: `torchrun --standalone --nproc-per-node 4 -m trainer --steps 200` on this
  machine, the same training with the same checkpoints, nothing else.

Prints RESULT wall_s, RESULT overhead_s (the sortie's wall time minus the trainer's own training
time, from its summary; target <= 15 s) and RESULT vs_bare_torchrun (sortie wall / bare wall;
target <= 1.15).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STEPS, CKPT_EVERY = "200", "20"  # `sortie run`'s default checkpoint interval


def sortie_run(tmp: Path) -> tuple[float, dict]:
    env = {**os.environ, "SORTIE_HOME": str(tmp / "home"), "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "sortie", "run", "--nodes", "2", "--procs-per-node", "2",
         "--steps", STEPS, "--ckpt-every", CKPT_EVERY, "--runs-dir", str(tmp / "runs"),
         "--json"], env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"sortie run failed ({result.returncode}): {result.stderr[-2000:]}")
    return wall, json.loads(result.stdout)


def bare_torchrun(tmp: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
         "-m", "trainer", "--steps", STEPS, "--ckpt-every", CKPT_EVERY, "--out", str(tmp)],
        env=env, capture_output=True, check=True)
    return time.perf_counter() - started


def main() -> None:
    sortie_walls, bare_walls, reports = [], [], []
    with tempfile.TemporaryDirectory(prefix="sortie-bench-") as tmp:
        for attempt in range(2):
            bare_walls.append(bare_torchrun(Path(tmp) / f"bare-{attempt}"))
            wall, report = sortie_run(Path(tmp) / f"sortie-{attempt}")
            sortie_walls.append(wall)
            reports.append(report)
    best = min(range(2), key=lambda i: sortie_walls[i])
    wall, report, bare = sortie_walls[best], reports[best], min(bare_walls)
    train_s = report["summary"]["train_time_s"]
    for phase, seconds in report["phase_s"].items():
        print(f"phase {phase:<8} {seconds:7.2f}s")
    print(f"sortie {', '.join(f'{w:.2f}s' for w in sortie_walls)}; "
          f"bare torchrun {', '.join(f'{w:.2f}s' for w in bare_walls)}")
    print(f"trainer's own time {train_s:.2f}s of {wall:.2f}s")
    print(f"RESULT wall_s={wall:.2f}")
    print(f"RESULT overhead_s={wall - train_s:.2f}")
    print(f"RESULT vs_bare_torchrun={wall / bare:.3f}")


if __name__ == "__main__":
    main()
