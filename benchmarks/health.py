"""The health gate's cost and its findings (issue 34), measured side by side in one run.

- health_quick_8_nodes_s: the quick gate (`bootstrap/health.py`) on 8 local nodes, median of 3
  (goal <= 5 s), beside what a check through torch would pay at least on this machine: 8 bare
  processes that import torch, make a gloo process group and all-reduce once
  (`bare_init_8_procs_s`). The quick gate's link test imports no torch, so it is under that.
- slow_node_found: 4 nodes with their own network (root), node-1's link at a tenth of the
  others' (100 vs 1000 Mbit/s): 1 when the gate names node-1 and no other node.
- hang_detected_s: a 3-node run with `--hang-timeout 10s`; node-1's link is cut at step 40;
  seconds from the cut to sortie naming node-1 (goal: the timeout + 10 s at most).

- one_way_slow_found (issue 46): of the one-way cases (a node's egress slowed on its own eth0,
  or its ingress on its switch port, with tc as an operator would, on 3-, 4- and 8-node
  clusters), how many the quick gate named exactly (the node, the way, nobody else); "found/total".
- false_positives: healthy nodes named over 24 quick checks of a 5-node cluster beside two CPU
  burners (goal 0).
- lossy_node_found (issue 62): packets dropped at random on one node's link with iptables
  (1, 3 and 10 %; what it receives only, and both ways; 4- and 8-node clusters): the cases the
  quick gate named exactly (that node, by the way it loses, nobody else); "found/total".
- false_positives_loaded (issue 62): healthy nodes named in 40 quick checks of 8 healthy nodes
  beside four CPU burners (goal 0); inconclusive turns are counted apart
  (`inconclusive_loaded`).

Prints `RESULT health_quick_8_nodes_s=…`, `RESULT bare_init_8_procs_s=…`,
`RESULT slow_node_found=…`, `RESULT hang_detected_s=…`, `RESULT one_way_slow_found=…`,
`RESULT lossy_node_found=…` (these need root: namespaces), `RESULT false_positives=…`,
`RESULT false_positives_loaded=…`, `RESULT inconclusive_loaded=…`.
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
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sortie.bootstrap.health_report import HealthReport, check_health  # noqa: E402
from sortie.bootstrap.prepare import prepare  # noqa: E402
from sortie.core.errors import SortieError  # noqa: E402
from sortie.stacks.local.local_backend import LocalBackend  # noqa: E402
from sortie.stacks.machine.loopback import free_port_everywhere  # noqa: E402
from sortie.stacks.machine.node_network import LINKS_ENV, NETWORK_ENV, NodeNetwork  # noqa: E402

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


ONE_WAY_CASES = [(3, 1, "receiving"), (3, 2, "sending"), (4, 2, "sending"),
                 (4, 0, "receiving"), (8, 5, "receiving"), (8, 6, "sending")]


def checked_with(home: Path, name: str, nodes: int,
                 fault: Callable[[NodeNetwork], None]) -> HealthReport | SortieError:
    """A fresh cluster with its own network, ``fault`` made on it, checked once (the gate's
    error, where it gave one), torn down."""
    backend = LocalBackend(home)
    try:
        inventory = backend.up(name, nodes)
        fault(NodeNetwork(backend.state_dir(name)))
        with prepare(inventory) as conns:
            return check_health(conns, inventory, "quick")
    except SortieError as exc:
        return exc
    finally:
        backend.down(name)


def one_way(home: Path) -> str:
    """Each case on a fresh cluster: found when the gate names exactly that node, slow that
    way."""
    found = 0
    for nodes, slow, way in ONE_WAY_CASES:
        def shaped(network: NodeNetwork, slow: int = slow, way: str = way) -> None:
            namespace, device = (network.namespace(slow), "eth0") if way == "sending" else \
                (network.switch, f"n{slow}")
            subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "replace", "dev",
                            device, "root", "tbf", "rate", "200mbit", "burst", "64kb",
                            "latency", "400ms"], check=True)
        report = checked_with(home, f"bench-oneway-{nodes}-{slow}", nodes, shaped)
        hit = isinstance(report, HealthReport) and list(report.bad) == [f"node-{slow}"] and \
            report.bad[f"node-{slow}"].startswith(f"slow {way}")
        print(f"one way: {nodes} nodes, node-{slow} slow {way}: "
              f"{'found' if hit else 'MISSED'} ({_said(report)})")
        found += hit
    return f"{found}/{len(ONE_WAY_CASES)}"


LOSSY_CASES = [(nodes, share, sending) for nodes in (4, 8) for share in (0.01, 0.03, 0.1)
               for sending in (False, True)]


def lossy(home: Path) -> str:
    """Each case on a fresh cluster: node 1 loses ``share`` of what it receives (and,
    ``sending``, of what it sends); found when the gate names exactly it, by the ways it loses
    (or, where its links lost so much that the test's bytes never all arrived, as the node its
    failed links lead to)."""
    found = 0
    for nodes, share, sending in LOSSY_CASES:
        report = checked_with(home, f"bench-lossy-{nodes}-{int(share * 100)}-{int(sending)}",
                              nodes, lambda network, share=share, sending=sending:
                              network.lose(1, share, sending=sending))
        why = report.bad.get("node-1", "") if isinstance(report, HealthReport) else ""
        hit = isinstance(report, HealthReport) and list(report.bad) == ["node-1"] and (
            "a lossy link" in why or ("of what it receives" in why and
                                      ("of what it sends" in why) is sending))
        print(f"lossy: {nodes} nodes, node-1 losing {share:.0%} "
              f"{'both ways' if sending else 'of what it receives'}: "
              f"{'found' if hit else 'MISSED'} ({_said(report)})")
        found += hit
    return f"{found}/{len(LOSSY_CASES)}"


def _said(report: HealthReport | SortieError) -> str:
    return report.summary() if isinstance(report, HealthReport) else str(report)


def false_positives(home: Path, checks: int = 24) -> int:
    """Healthy nodes named over ``checks`` quick checks beside two CPU burners."""
    backend = LocalBackend(home)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    named = 0
    try:
        inventory = backend.up("bench-noise", 5)
        with prepare(inventory) as conns:
            for _ in range(checks):
                named += len(check_health(conns, inventory, "quick").bad)
    finally:
        for burner in burners:
            burner.kill()
        backend.down("bench-noise")
    return named


def loaded(home: Path, checks: int = 40) -> tuple[int, int]:
    """(healthy nodes named, nodes said inconclusive) over ``checks`` quick checks of 8
    healthy nodes beside four CPU burners."""
    backend = LocalBackend(home)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
    named = inconclusive = 0
    try:
        inventory = backend.up("bench-loaded", 8)
        with prepare(inventory) as conns:
            for _ in range(checks):
                report = check_health(conns, inventory, "quick")
                named += len(report.bad)
                inconclusive += sum("inconclusive" in warning for warning in report.warnings)
                if report.bad:
                    print(f"loaded: named {report.bad}")
    finally:
        for burner in burners:
            burner.kill()
        backend.down("bench-loaded")
    return named, inconclusive


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
            figures["one_way_slow_found"] = one_way(home / "home")
            if shutil.which("iptables-legacy") or shutil.which("iptables"):
                figures["lossy_node_found"] = lossy(home / "home")
            figures["false_positives"] = false_positives(home / "home")
        else:
            print("slow_node_found, hang_detected_s, one_way_slow_found: need root (network "
                  "namespaces); skipped")
            figures["false_positives"] = false_positives(home / "home")
        figures["false_positives_loaded"], figures["inconclusive_loaded"] = loaded(home / "home")
    for name, value in figures.items():
        print(f"RESULT {name}={value:.3f}" if isinstance(value, float) else
              f"RESULT {name}={value}")


if __name__ == "__main__":
    main()
