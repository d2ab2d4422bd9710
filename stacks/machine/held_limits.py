"""What a held local cluster carries besides its nodes: the tag every process sortie starts on
it has in its environment (how `down` and the watchdog know the cluster's processes), and its
limits (idle stop, a budget) with the watchdog that holds them (`stacks/local/idle_stop.py`).

In the cluster's state directory: ``process-tag`` (drawn at `up`), ``watch.json`` (the limits,
so that a watchdog restarted by `sortie reap` holds the same), ``watchdog.json`` (the watchdog
process: a Controller record with a heartbeat, so that `sortie status` sees it gone)."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import sortie
from sortie.core import statefile
from sortie.core.statefile import CorruptStateError
from sortie.stacks.backend import HeldLimits
from sortie.stacks.listing import SortieRow
from sortie.stacks.records import Controller

# "<the cluster's tag>:<node-i | watchdog>": sshd's SetEnv gives it to every session, the
# watchdog has its own. A process is the cluster's by what sortie started, never by the
# directory it runs in or names (a user's `tail -f` of a cluster file is not the cluster's).
TAG_ENV, TAG_FILE = "SORTIE_LOCAL_NODE", "process-tag"
WATCHDOG = "watchdog"  # the tag's second part for a held cluster's watchdog (not a node)
WATCH_FILE = "watch.json"
WATCHDOG_FILE = "watchdog.json"
# Where the `sortie` package is found (a checkout's root, or site-packages): the watchdog runs
# from the cluster's state directory, where an uninstalled checkout is not on its path.
SORTIE_ROOT = str(Path(sortie.__file__).resolve().parent.parent)


def draw_tag(state: Path) -> None:
    statefile.write_text(state / TAG_FILE, secrets.token_hex(8) + "\n")


def tag_of(state: Path) -> str | None:
    """The cluster's process tag (None for a cluster started before tags, or damaged)."""
    try:
        tag = statefile.read_regular(state / TAG_FILE, 64).decode(errors="replace").strip()
    except OSError:
        return None
    return tag if re.fullmatch(r"[0-9a-f]{16}", tag) else None


def hold_limits(state: Path, cluster_id: str, watch: HeldLimits) -> None:
    """Keep the cluster's limits and start its watchdog."""
    if not watch.started:
        watch = watch.model_copy(update={"started": time.time()})
    statefile.write_text(state / WATCH_FILE, watch.model_dump_json() + "\n")
    start_watchdog(state, cluster_id)


WATCHDOG_START_S = 30.0  # how long a watchdog may take to record itself (a busy machine)


def start_watchdog(state: Path, cluster_id: str) -> None:
    """(Re)start the watchdog of a held cluster that has limits, detached, with the cluster's
    tag: one of the cluster's processes, so `down` stops it too. Returns once it has recorded
    itself (or died, or WATCHDOG_START_S passed): before, a `status` right after `up` on a busy
    machine read its watchdog as gone."""
    with open(state / "idle-stop.log", "ab") as log:
        watchdog = subprocess.Popen(
            [sys.executable, "-m", "sortie.stacks.local.idle_stop", str(state), cluster_id],
            start_new_session=True, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            cwd=state, env=tagged_env(f"{tag_of(state)}:{WATCHDOG}"))
    deadline = time.monotonic() + WATCHDOG_START_S
    while watchdog_gone(state) and watchdog.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)


def tagged_env(tag: str) -> dict[str, str]:
    """The environment of a process sortie leaves running for a cluster (a watchdog, a booted
    node's relay): this one's, the cluster's tag (so `down` finds it), and the package's path."""
    return {**os.environ, "PYTHONPATH": SORTIE_ROOT, TAG_ENV: tag}


def read_limits(state: Path) -> HeldLimits | None:
    """A held cluster's limits (None: it has none, or they cannot be read)."""
    try:
        return statefile.read_model(HeldLimits, state / WATCH_FILE)
    except (FileNotFoundError, CorruptStateError):
        return None


def watchdog_gone(state: Path) -> bool:
    """Whether a held cluster's watchdog is gone (killed, or never started): nothing then
    enforces its idle stop or its budget. Asked only of a cluster that has limits."""
    try:
        return statefile.read_model(Controller, state / WATCHDOG_FILE).gone()
    except (FileNotFoundError, CorruptStateError):
        return True


def describe_limits(state: Path, row: SortieRow) -> None:
    """A held cluster's `status` row: its limits, and whether its watchdog still holds them."""
    limits = read_limits(state)
    if limits is None:
        return
    row.idle_stop_s = limits.idle_s
    if watchdog_gone(state):
        row.unwatched = True
        row.detail = (f"its watchdog is gone: {limits.text()} not enforced (`sortie reap` "
                      "restarts it)")
    else:
        row.detail = f"held: ends itself with {limits.text()}"
