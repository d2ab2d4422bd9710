"""Idle stop for a held local cluster (`sortie up --idle-stop 30m`): a watchdog process that
belongs to the cluster, like its nodes (`LocalBackend.up` starts it), and tears it down with
proof once nothing but the nodes' own sshd daemons has run on it for the idle limit. It works
with no controller at all, as a cloud node's own timer does.

    python -m stacks.idle_stop STATE_DIR CLUSTER     (its limits: STATE_DIR/watch.json)

With a budget (`sortie up --max-cost`, at the notional price), it also tears the cluster down
BUDGET_S after the cluster started, whatever runs. It keeps a record of itself with a heartbeat
(watchdog.json), so that `sortie status` says when it is gone and `sortie reap` restarts it.

Activity is any process of the cluster besides its sshd listeners and this watchdog: a job, its
setup, a sync, an open `sortie ssh` session.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import psutil

from sortie.core import statefile
from sortie.cost.ledger import CostEntry, record_cost
from sortie.stacks.local.local_backend import LocalBackend
from sortie.stacks.local.local_rehearsal import recorded_price
from sortie.stacks.machine.held_limits import WATCH_FILE, WATCHDOG_FILE, read_limits
from sortie.stacks.records import HEARTBEAT_S, Controller

POLL_S = 2.0


def daemons(state: Path) -> set[int]:
    """The pids of the nodes' sshd listeners."""
    pids = set()
    for pid_file in state.glob("nodes/*/sshd.pid"):
        try:
            pids.add(int(pid_file.read_text()))
        except (OSError, ValueError):
            continue
    return pids


def busy(processes: list[psutil.Process], state: Path) -> bool:
    """Whether anything runs on the cluster but its sshd listeners (and this watchdog)."""
    quiet = daemons(state) | {os.getpid()}
    return any(p.pid not in quiet for p in processes)


def watch(state: Path, cluster_id: str) -> None:
    backend = LocalBackend(state.parent.parent)
    limits = read_limits(state)
    if limits is None:
        print(f"{cluster_id}: no limits to hold ({WATCH_FILE} missing or damaged)", flush=True)
        return
    idle_s, budget_s = limits.idle_s or 0.0, limits.budget_s or 0.0
    price = recorded_price(state)  # the cluster's one price (`status`, `down`, the ledger)
    began = limits.started or time.time()
    idle_since: float | None = time.monotonic()
    nodes, beat = len(backend.inventory(cluster_id).nodes), 0.0
    while state.is_dir():
        now = time.monotonic()
        if now - beat >= HEARTBEAT_S:
            with contextlib.suppress(OSError):  # torn down meanwhile: the loop ends
                statefile.write_json(state / WATCHDOG_FILE, Controller.me().model_dump())
            beat = now
        # Idle from the first poll that finds nothing running (activity may have gone on until
        # just before it): never early, at most one poll late.
        if busy(backend.processes(cluster_id), state):
            idle_since = None
        elif idle_since is None:
            idle_since = now
        why = (f"idle for {idle_s:g}s" if idle_s and idle_since is not None and
               now - idle_since >= idle_s else
               f"its budget is spent ({budget_s:g}s)" if budget_s and
               time.time() - began >= budget_s else None)
        if why:
            print(f"{why}: tearing down {cluster_id}", flush=True)
            print(backend.down(cluster_id).summary(), flush=True)
            record_cost(backend.home, CostEntry(
                name=cluster_id, kind="held", backend="local", owner=backend.owner, nodes=nodes,
                usd_per_hour=price.usd_per_hour if price else 0.0, started=began,
                ended=time.time()))
            return
        time.sleep(POLL_S)


if __name__ == "__main__":
    watch(Path(sys.argv[1]), sys.argv[2])
