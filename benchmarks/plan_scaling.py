"""Plan scaling: how `sortie plan` grows with the node count (aws-p4d: EFA, an EIP per node).

Times the whole plan (the real program under Pulumi's mock runtime, the security reading and the
cost) for 1, 16, 64 and 256 nodes, interleaved round by round so that machine noise hits every
size alike, after one untimed warm-up (imports). Prints the median of each size and
RESULT plan_256_nodes_s=<median at 256> (target <= 10) and
RESULT plan_growth=<(t(256)/256) / (t(16)/16)> (time per node at 256 over that at 16; <= 1.5).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sortie.stacks.cloud.plan import make_plan  # noqa: E402

SIZES = (1, 16, 64, 256)
ROUNDS = 3
PROFILE = "aws-p4d"


def time_plan(nodes: int) -> tuple[float, int]:
    started = time.perf_counter()
    plan = make_plan(PROFILE, (f"nodes={nodes}",))
    return time.perf_counter() - started, len(plan.evaluation.resources)


def main() -> None:
    time_plan(1)  # warm-up: SDK imports and first-use caches
    times: dict[int, list[float]] = {n: [] for n in SIZES}
    resources: dict[int, int] = {}
    for _ in range(ROUNDS):
        for nodes in SIZES:
            elapsed, resources[nodes] = time_plan(nodes)
            times[nodes].append(elapsed)
    median = {n: statistics.median(ts) for n, ts in times.items()}
    print(f"{'nodes':>6} {'resources':>10} {'median s':>9} {'ms/node':>8}")
    for nodes in SIZES:
        print(f"{nodes:>6} {resources[nodes]:>10} {median[nodes]:>9.3f} "
              f"{1000 * median[nodes] / nodes:>8.1f}")
    growth = (median[256] / 256) / (median[16] / 16)
    print(f"RESULT plan_256_nodes_s={median[256]:.3f}")
    print(f"RESULT plan_growth={growth:.3f}")


if __name__ == "__main__":
    main()
