"""Bootstrap fan-out: how much longer 8 nodes take than 1 (node by node would be about 8x).

Bootstrap = reach every node over SSH with pinned keys, check it, install the trainer. Each round
starts fresh local clusters (untimed), times the bootstrap of 1 and of 8 nodes side by side, and
tears them down. Prints RESULT fanout_ratio=<median t(8) / median t(1)> (target <= 1.5).

All local "nodes" share this machine's cores, so it also prints the CPU the 8-node bootstrap used
(controller, sshd and node-side commands together) and the floor that sets on t(8): on separate
machines each node would bring its own CPU.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sortie.bootstrap.prepare import prepare  # noqa: E402
from sortie.stacks.local.local_backend import LocalBackend  # noqa: E402

ROUNDS = 5


def machine_cpu_s() -> float:
    """CPU seconds spent by every process on the machine so far (from /proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle, iowait = fields[3], fields[4]
    return (sum(fields) - idle - iowait) / os.sysconf("SC_CLK_TCK")


def time_bootstrap(backend: LocalBackend, cluster_id: str, nodes: int) -> tuple[float, float]:
    """(wall seconds, machine CPU seconds) of bootstrapping a fresh cluster of ``nodes``."""
    inventory = backend.up(cluster_id, nodes)
    try:
        cpu, started = machine_cpu_s(), time.perf_counter()
        conns = prepare(inventory)
        elapsed, used = time.perf_counter() - started, machine_cpu_s() - cpu
        for conn in conns.values():
            conn.close()
        return elapsed, used
    finally:
        backend.down(cluster_id)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="sortie-bench-") as home:
        backend = LocalBackend(Path(home))
        time_bootstrap(backend, "warmup", 2)  # page in ssh, python and the key exchange code
        one, eight, cpu8 = [], [], []
        for round_ in range(ROUNDS):
            one.append(time_bootstrap(backend, f"one-{round_}", 1)[0])
            wall, cpu = time_bootstrap(backend, f"eight-{round_}", 8)
            eight.append(wall)
            cpu8.append(cpu)
    t1, t8 = statistics.median(one), statistics.median(eight)
    cores = os.cpu_count() or 1
    print(f"bootstrap of 1 node:  median {t1:.3f}s  ({', '.join(f'{t:.3f}' for t in one)})")
    print(f"bootstrap of 8 nodes: median {t8:.3f}s  ({', '.join(f'{t:.3f}' for t in eight)})")
    floor = statistics.median(cpu8) / cores
    print(f"8-node bootstrap used {statistics.median(cpu8):.3f} CPU-s on {cores} cores: "
          f"t(8) >= {floor:.3f}s here, ratio >= {floor / t1:.2f} from shared CPU alone")
    print(f"RESULT fanout_ratio={t8 / t1:.3f}")


if __name__ == "__main__":
    main()
