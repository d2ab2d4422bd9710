"""A whole 2-node local sortie through the real CLI, and what it costs beyond training.

overhead_s = wall time of `sortie run` minus the trainer's own training time (its summary's
train_time_s): starting nodes, SSH, checks, install, torchrun start-up and rendezvous, collection
and teardown. Prints RESULT wall_s=... and RESULT overhead_s=... (target overhead <= 15 s).
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


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="sortie-bench-") as tmp:
        env = {**os.environ, "SORTIE_HOME": str(Path(tmp) / "home"),
               "PYTHONPATH": str(REPO)}
        started = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "sortie", "run", "--nodes", "2", "--procs-per-node", "2",
             "--steps", "200", "--runs-dir", str(Path(tmp) / "runs"), "--json"],
            env=env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"sortie run failed ({result.returncode}): {result.stderr[-2000:]}")
    report = json.loads(result.stdout)
    train_s = report["summary"]["train_time_s"]
    for phase, seconds in report["phase_s"].items():
        print(f"phase {phase:<8} {seconds:7.2f}s")
    print(f"trainer's own time {train_s:.2f}s of {wall:.2f}s")
    print(f"RESULT wall_s={wall:.2f}")
    print(f"RESULT overhead_s={wall - train_s:.2f}")


if __name__ == "__main__":
    main()
