"""Idle stop for a held local cluster (`sortie up --idle-stop 30m`): a watchdog process that
belongs to the cluster, like its nodes (`LocalBackend.up` starts it), and tears it down with
proof once nothing but the nodes' own sshd daemons has run on it for the idle limit. It works
with no controller at all, as a cloud node's own timer does.

    python -m stacks.idle_stop STATE_DIR CLUSTER IDLE_S

Activity is any process of the cluster besides its sshd listeners and this watchdog: a job, its
setup, a sync, an open `sortie ssh` session.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil

from stacks.local import LocalBackend

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


def watch(state: Path, cluster_id: str, idle_s: float) -> None:
    backend = LocalBackend(state.parent.parent)
    last_busy = time.monotonic()
    while state.is_dir():
        if busy(backend.processes(cluster_id), state):
            last_busy = time.monotonic()
        elif time.monotonic() - last_busy >= idle_s:
            print(f"idle for {idle_s:g}s: tearing down {cluster_id}", flush=True)
            print(backend.down(cluster_id).summary(), flush=True)
            return
        time.sleep(POLL_S)


if __name__ == "__main__":
    watch(Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]))
