"""The health gate's cost and its findings (issue 34), measured side by side in one run.

- health_quick_8_nodes_s: the quick gate (`bootstrap/health.py`) on 8 local nodes, median of 3
  (goal <= 5 s), beside what a check through torch would pay at least on this machine: 8 bare
  processes that import torch, make a gloo process group and all-reduce once
  (`bare_init_8_procs_s`). The quick gate's link test imports no torch, so it is under that.
- slow_node_found: 4 nodes with their own network (root), node-1's link at a tenth of the
  others' (100 vs 1000 Mbit/s): 1 when the gate names node-1 and no other node.
- hang_detected_s: a 3-node run with `--hang-timeout 10s`; node-1's link is cut at step 40;
  seconds from the cut to sortie naming node-1 (goal: the timeout + 10 s at most).

Prints `RESULT health_quick_8_nodes_s=…`, `RESULT bare_init_8_procs_s=…`,
`RESULT slow_node_found=…`, `RESULT hang_detected_s=…` (the last two need root: namespaces).
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bootstrap.health import check_health  # noqa: E402
from bootstrap.prepare import prepare  # noqa: E402
from stacks.local import LocalBackend  # noqa: E402
from stacks.loopback import free_port_everywhere  # noqa: E402
from stacks.node_network import LINKS_ENV, NETWORK_ENV, NodeNetwork  # noqa: E402

BARE = """
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[2]}",
                        rank=int(sys.argv[1]), world_size=8)
dist.all_reduce(torch.ones(1 << 20))
dist.destroy_process_group()
"""


def bare_init(nodes: int = 8) -> float:
    port = free_port_everywhere(0)
    started = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", BARE, str(rank), str(port)])
             for rank in range(nodes)]
    assert all(proc.wait() == 0 for proc in procs)
    return time.perf_counter() - started


def quick_gate(home: Path, nodes: int = 8) -> tuple[list[float], list[float]]:
    """(gate seconds, bare seconds), alternated: the same machine state for both."""
    backend = LocalBackend(home)
    inventory = backend.up("bench-health", nodes)
    gate, bare = [], []
    try:
        with prepare(inventory) as conns:
            for _ in range(3):
                started = time.perf_counter()
                report = check_health(conns, inventory, "quick")
                gate.append(time.perf_counter() - started)
                assert report.ok, report.summary()
                bare.append(bare_init(nodes))
    finally:
        backend.down("bench-health")
    return gate, bare


def slow_node(home: Path) -> int:
    os.environ[LINKS_ENV] = "1000,100,1000,1000"
    backend = LocalBackend(home)
    try:
        inventory = backend.up("bench-slow", 4)
        with prepare(inventory) as conns:
            report = check_health(conns, inventory, "quick")
        print(report.summary())
        return int(list(report.bad) == ["node-1"])
    finally:
        del os.environ[LINKS_ENV]
        backend.down("bench-slow")


def hang(home: Path, runs: Path) -> float:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sortie", "run", "--nodes", "3", "-p", "1", "--steps", "400",
         "--ckpt-every", "20", "--name", "bench-hang", "--runs-dir", str(runs),
         "--hang-timeout", "10s", "--", "--log-every", "10"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "SORTIE_HOME": str(home), "PYTHONPATH": str(ROOT)})
    cut_at = detected = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if cut_at is None and re.search(r"step\s+40/", line):
            NodeNetwork(LocalBackend(home).state_dir("bench-hang")).cut(1)
            cut_at = time.perf_counter()
        if cut_at and detected is None and "node-1: unreachable" in line:
            detected = time.perf_counter() - cut_at
    assert proc.wait() == 0 and detected is not None, "the cut was not recovered"
    return detected


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="sortie-bench-health-") as tmp:
        home = Path(tmp)
        gate, bare = quick_gate(home / "home")
        print(f"quick gate on 8 nodes: {[round(s, 2) for s in gate]} s; bare torch init of 8 "
              f"processes beside it: {[round(s, 2) for s in bare]} s")
        figures = {"health_quick_8_nodes_s": statistics.median(gate),
                   "bare_init_8_procs_s": statistics.median(bare)}
        if os.geteuid() == 0 and shutil.which("tc"):
            os.environ[NETWORK_ENV] = "netns"
            figures["slow_node_found"] = slow_node(home / "home")
            figures["hang_detected_s"] = hang(home / "home", home / "runs")
        else:
            print("slow_node_found, hang_detected_s: need root (network namespaces); skipped")
    for name, value in figures.items():
        print(f"RESULT {name}={value:.3f}" if isinstance(value, float) else
              f"RESULT {name}={value}")


if __name__ == "__main__":
    main()
