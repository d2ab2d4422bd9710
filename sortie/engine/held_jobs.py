"""The jobs of a held cluster, as `sortie jobs`, `sortie cancel` and `sortie exec --detach` see
them: each `exec` is a controller process of this machine with a line in the run history
(`rundir/history.py`: queued, running, then how it ended); the queue itself is on the
cluster's head (`bootstrap/cluster_lock.py`), so execs from every controller wait in one line.

Cancelling a job is asking its controller to stop it (SIGTERM, as Ctrl-C would): the job is
stopped on every node, what it wrote is collected and the cluster stays up; a queued one leaves
the queue. Only a sortie controller this machine runs is signalled, and only the one that
started before the run did: a pid read from a file is never trusted to be ours.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sortie.core import naming
from sortie.core.errors import UsageError
from sortie.fleet.held_state import last_run
from sortie.rundir import history
from sortie.rundir.history import RunEntry

LIVE = ("running", "queued")
CANCEL_WAIT_S = 120.0  # for the controller to stop the job, collect and record it
DETACH_WAIT_S = 600.0  # for a detached exec to reach the head (connect, checks) and start
DETACHED = "detached"  # $SORTIE_HOME/detached/<run id>.log: a detached exec's own output


def jobs(home: Path, name: str) -> list[tuple[RunEntry, str]]:
    """Every job of cluster NAME in the run history, oldest first, each with its state now."""
    return [(entry, entry.shown_state()) for entry in history.select(
        history.read_history(home), cluster=name)]


def to_cancel(home: Path, name: str, job: str | None) -> RunEntry:
    """The job ``job`` of cluster NAME (default: the one running), if it still runs or waits."""
    live = [entry for entry, state in jobs(home, name) if state in LIVE]
    if job is not None:
        naming.check_name(job, "JOB")
        found = [entry for entry in live if entry.id == job]
        if not found:
            raise UsageError(f"JOB: no job {job} runs or waits on {name} (`sortie jobs {name}` "
                             "lists them)")
        return found[-1]
    running = [entry for entry in live if entry.state == "running"]
    if not running:
        queued = ", ".join(entry.id for entry in live)
        raise UsageError(f"JOB: no job runs on {name}" + (
            f"; queued: {queued} (name one)" if queued else ""))
    return running[-1]


def cancel(home: Path, entry: RunEntry, wait_s: float = CANCEL_WAIT_S) -> str:
    """Ask the controller of ``entry`` to stop its job (SIGTERM) and wait for the run to be
    recorded as ended; its state then."""
    pid = controller_pid(entry)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        now = history.find_entry(home, entry)
        if now is not None and now.shown_state() not in LIVE:
            return now.shown_state()
        time.sleep(0.2)
    raise UsageError(f"JOB: {entry.id}'s controller (pid {pid}) was asked to stop it "
                     f"{wait_s:.0f}s ago and has not said it ended; it may still be collecting")


def controller_pid(entry: RunEntry) -> int:
    """The pid of the controller running ``entry``, checked to be the process that wrote it,
    on this machine (a pid recycled since is another process: `stacks/records.Process`)."""
    controller = entry.controller
    if controller is None or not controller.here():
        where = controller.host if controller else "another machine"
        raise UsageError(f"JOB: {entry.id}'s controller runs on {where}: cancel it there")
    if not controller.alive():
        raise UsageError(f"JOB: {entry.id}'s controller is gone (pid {controller.pid}"
                         + (" is another process now)" if controller.exists() else ")"))
    return controller.pid


def start_detached(home: Path, argv: list[str], run_id: str) -> tuple[subprocess.Popen, Path]:
    """``sortie ARGV`` in a session of its own (a closed terminal does not end it), its output
    in $SORTIE_HOME/detached/<run id>.log."""
    folder = home / DETACHED
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    log = folder / f"{run_id}.log"
    with open(log, "ab", opener=lambda path, flags: os.open(path, flags, 0o600)) as out:
        child = subprocess.Popen([sys.executable, "-m", "sortie", *argv], stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return child, log


def wait_started(home: Path, state: Path, run_id: str, child: subprocess.Popen,
                 wait_s: float = DETACH_WAIT_S) -> str:
    """How a detached exec stands once it started its job ("running") or waits in the queue
    ("queued"), or ended before either (its history state; "failed to start" without one)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if last_run(state) == run_id:
            return "running"
        exited = child.poll() is not None  # (before the read: an exit's last entry is in it)
        entry = history.find_run(home, run_id, made=False)
        if entry is not None and (exited or entry.state == "queued"):
            return entry.state
        if exited:
            return "failed to start"
        time.sleep(0.1)
    return "still starting"
