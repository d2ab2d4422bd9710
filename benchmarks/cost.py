"""Spend only what was allowed (issue 35), on local nodes at a notional price.

- budget_overshoot_usd: a 2-node run at $1 a node-second ($SORTIE_LOCAL_USD_PER_HOUR=3600) with
  `--max-cost 40`: what it had cost at teardown minus the budget (goal: at most one checkpoint
  interval plus the teardown, priced the same; both are printed beside it);
- idle_stop_late_s: a held cluster with `--idle-stop 5s` runs a job; seconds from the end of the
  job plus the limit to the cluster being gone (goal: 60 s at most);
- plan_gpu_options: how many choices `sortie plan --gpu A100:8 --nodes 2` lists;
- gpu_types_in_catalog: the H100 and H200 machine types `sortie plan --gpu H100:8` and `H200:8`
  list (issue 69: goal at least 6 across the 3 clouds), and plan_h100_clouds: the clouds the
  H100 list spans (goal 3).

Prints `RESULT budget_overshoot_usd=…`, `RESULT idle_stop_late_s=…`, `RESULT plan_gpu_options=…`,
`RESULT gpu_types_in_catalog=…`, `RESULT plan_h100_clouds=…`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RATE_PER_NODE_S = 1.0  # dollars
BUDGET_USD = 40  # 20 s of two nodes: the gate and start-up take about 10 of them here


def sortie(home: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sortie", *args], capture_output=True,
                          text=True, cwd=home.parent,
                          env={**os.environ, "SORTIE_HOME": str(home), "PYTHONPATH": str(ROOT),
                               **(env or {})})


def budget_overshoot(home: Path) -> tuple[float, float, float]:
    """(overshoot $, one checkpoint interval $, teardown $)."""
    done = sortie(home, "run", "--nodes", "2", "-p", "1", "--steps", "1000000", "--max-cost",
                  str(BUDGET_USD), "--ckpt-every", "20", "--name", "bench-budget", "--json", "--",
                  "--log-every", "20", env={"SORTIE_LOCAL_USD_PER_HOUR": "3600"})
    assert done.returncode == 1, done.stderr[-2000:]
    result = json.loads(done.stdout)
    rate = 2 * RATE_PER_NODE_S
    metrics = [json.loads(line) for line in (home.parent / "runs" / "bench-budget" / "artifacts"
                                             / "metrics.jsonl").read_text().splitlines()]
    step_times = sorted(m["step_time_s"] for m in metrics if "step_time_s" in m)
    interval_s = 20 * step_times[len(step_times) // 2] if step_times else 0.0
    down_s = result["phase_s"].get("down", 0)
    return result["spent_usd"] - BUDGET_USD, interval_s * rate, down_s * rate


def idle_stop_late(home: Path) -> float:
    assert sortie(home, "up", "--nodes", "2", "--name", "bench-idle", "--idle-stop",
                  "5s").returncode == 0
    state = home / "clusters" / "bench-idle"
    done = sortie(home, "run", "--on", "bench-idle", "--steps", "40", "--health", "off")
    assert done.returncode == 0, done.stderr[-2000:]
    due = time.monotonic() + 5
    while state.is_dir():
        time.sleep(0.1)
    return time.monotonic() - due


def plan_options(home: Path, gpu: str = "A100:8") -> list[dict]:
    done = sortie(home, "plan", "--gpu", gpu, "--nodes", "2", "--json")
    return json.loads(done.stdout)["offers"]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="sortie-bench-cost-") as tmp:
        home = Path(tmp) / "home"
        overshoot, interval, teardown = budget_overshoot(home)
        print(f"budget ${BUDGET_USD}: over by ${overshoot:.2f}; one checkpoint interval costs "
              f"${interval:.2f}, the teardown ${teardown:.2f}")
        late = idle_stop_late(home)
        options = len(plan_options(home))
        hopper = plan_options(home, "H100:8") + plan_options(home, "H200:8")
    print(f"RESULT budget_overshoot_usd={overshoot:.3f}")
    print(f"RESULT idle_stop_late_s={late:.3f}")
    print(f"RESULT plan_gpu_options={options}")
    print(f"RESULT gpu_types_in_catalog={len({o['instance_type'] for o in hopper})}")
    h100_clouds = {o["cloud"] for o in hopper if o["gpu_model"] == "H100"}
    print(f"RESULT plan_h100_clouds={len(h100_clouds)}")


if __name__ == "__main__":
    main()
