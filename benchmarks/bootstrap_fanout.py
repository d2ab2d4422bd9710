"""Bootstrap fan-out: how much longer 8 nodes take than 1 (node by node would be about 8x).

Bootstrap = reach every node over SSH with pinned keys, check it, install the trainer. Each round
starts fresh local clusters (untimed), times the bootstrap of 1 and of 8 nodes side by side, and
tears them down. Prints RESULT fanout_ratio=<median t(8) / median t(1)> (target <= 1.5).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bootstrap.prepare import prepare  # noqa: E402
from stacks.local import LocalBackend  # noqa: E402

ROUNDS = 5


def time_bootstrap(backend: LocalBackend, cluster_id: str, nodes: int) -> float:
    inventory = backend.up(cluster_id, nodes)
    try:
        started = time.perf_counter()
        conns = prepare(inventory)
        elapsed = time.perf_counter() - started
        for conn in conns.values():
            conn.close()
        return elapsed
    finally:
        backend.down(cluster_id)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="sortie-bench-") as home:
        backend = LocalBackend(Path(home))
        time_bootstrap(backend, "warmup", 2)  # page in ssh, python and the key exchange code
        one, eight = [], []
        for round_ in range(ROUNDS):
            one.append(time_bootstrap(backend, f"one-{round_}", 1))
            eight.append(time_bootstrap(backend, f"eight-{round_}", 8))
    t1, t8 = statistics.median(one), statistics.median(eight)
    print(f"bootstrap of 1 node:  median {t1:.3f}s  ({', '.join(f'{t:.3f}' for t in one)})")
    print(f"bootstrap of 8 nodes: median {t8:.3f}s  ({', '.join(f'{t:.3f}' for t in eight)})")
    print(f"RESULT fanout_ratio={t8 / t1:.3f}")


if __name__ == "__main__":
    main()
