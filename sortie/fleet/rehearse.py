"""What a rehearsal does to its nodes on purpose (`sortie rehearse ...`), as the cloud would:
a spot preemption announced through the node's own metadata service, then, once the notice's
time is up, the machine taken (`reclaim`: every process of it killed at once)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from sortie.core.errors import UsageError
from sortie.stacks.booted.cloud_rehearsal import MAX_DELAY_S, load_plan
from sortie.stacks.booted.nodes import BootedNodes
from sortie.stacks.local.local_backend import LocalBackend


def preempt(home: Path, cluster: str, node: str, after_s: float | None,
            say: Callable[[str], None]) -> list[int]:
    """Announce node ``node``'s preemption in its metadata service (the trainer's poller reads
    it there, checkpoints and stops), then take the machine after ``after_s`` (default: the
    cloud's documented notice, or the rehearsal's `notice` delay). Returns the pids killed; the
    node's controller replaces it."""
    if after_s is not None and not 0 <= after_s <= MAX_DELAY_S:  # (99999h slept for years)
        raise UsageError(f"--after: between 0 and {MAX_DELAY_S:g} s, as a rehearsal's delays")
    backend = LocalBackend(home)
    inventory = backend.inventory(cluster)  # a UsageError-like SortieError if there is none
    state = backend.state_dir(cluster)
    plan = load_plan(state)
    if plan is None:
        raise UsageError(f"{cluster}: not a rehearsal (`sortie run --stack PROFILE --rehearse`): "
                         "only a rehearsed cloud node has a metadata service to announce in")
    if node not in {n.name for n in inventory.nodes}:
        raise UsageError(f"NODE: {cluster} has no {node!r} "
                         f"({', '.join(n.name for n in inventory.nodes)})")
    wait_s = plan.delays.notice if after_s is None else after_s
    BootedNodes(state).post_notice(int(node.removeprefix("node-")))
    say(f"{node}: {plan.cloud} spot notice posted in its metadata service; the machine is "
        f"taken in {wait_s:g} s")
    time.sleep(wait_s)
    killed = backend.reclaim(cluster, node)
    say(f"{node}: taken ({len(killed)} processes killed at once)")
    return killed
