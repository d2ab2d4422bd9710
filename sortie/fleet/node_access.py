"""Looking inside a sortie's nodes: the nodes and pinned keys of a sortie (`running_nodes`, which
`sortie ssh` reaches through `ssh_access.py`), and the torchrun logs (live from the nodes while
it runs, from the run's directory once collected)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from sortie.bootstrap import ssh
from sortie.bootstrap.follow import LineSink
from sortie.bootstrap.setup_cache import SETUP_LOGS
from sortie.bootstrap.train import MAX_LOG_READ, progress, read_log, watch
from sortie.core import naming
from sortie.core.errors import UsageError, first_line
from sortie.core.inventory import INVENTORY_FILE, KNOWN_HOSTS_FILE, Inventory, Node
from sortie.core.statefile import read_tail
from sortie.fleet import registry
from sortie.fleet.held_state import last_run


def _node(inventory: Inventory, name: str) -> Node:
    try:
        return inventory.node(name)
    except KeyError as exc:
        raise UsageError(f"NODE: {exc.args[0]}") from None


# A sortie in one of these states has no nodes to reach (a Slurm allocation that ended, or
# waits in the queue again; nodes past their TTL, powered off).
GONE_STATES = ("ended", "queued", "completing", "expired", "cancelled", "timeout", "failed",
               "node_fail", "preempted")


def running_nodes(home: Path, name: str | None) -> tuple[Inventory, Path]:
    """(inventory, pinned known_hosts) of a sortie, for commands that reach its nodes; NAME may
    be left out when exactly one sortie runs."""
    if name is None:
        up = [seen for seen in registry.survey(home) if seen.kind in registry.LIVE_KINDS]
        if len(up) != 1:
            names = ", ".join(seen.row.name for seen in up)
            raise UsageError("NAME: " + ("no sortie is running" if not up else
                             f"several sorties run ({names}); name one"))
        seen = up[0]
    else:
        seen = registry.find(home, name)
    state = registry.state_of(home, seen)
    if seen.kind not in registry.LIVE_KINDS or not (state / INVENTORY_FILE).is_file():
        raise UsageError(f"NAME: sortie {seen.row.name!r} has no nodes (see `sortie status`)")
    if seen.row.state in GONE_STATES:  # (an allocation ended or cancelled outside sortie)
        raise UsageError(f"NAME: sortie {seen.row.name!r} is {seen.row.state}"
                         + (f" ({seen.row.detail})" if seen.row.detail else "")
                         + f": its nodes are gone; `sortie down {seen.row.name}` clears it")
    return Inventory.load(state / INVENTORY_FILE), state / KNOWN_HOSTS_FILE


def live_run(home: Path, name: str) -> tuple[str, str] | None:
    """(cluster, run id) whose logs are on the nodes for NAME: a sortie's own run, a held
    cluster's newest `exec`, or an `exec`'s run id on the held cluster that runs it; None when
    NAME is neither (its logs may have been collected into the runs directory)."""
    try:
        seen = registry.find(home, name)
    except UsageError:
        seen = None
    if seen is not None and seen.kind in registry.LIVE_KINDS:
        return name, last_run(registry.state_of(home, seen)) or name
    for other in registry.survey(home):
        if other.kind in registry.LIVE_KINDS and last_run(registry.state_of(home, other)) == name:
            return other.row.name, name
    return None


class NodeLog(NamedTuple):
    node: str
    text: str  # its torchrun log (or why it could not be read)
    running: bool  # its job still runs
    answered: bool = True  # False: the node did not answer (`text` says why)


def logs(home: Path, name: str, node: str | None, runs_dir: Path) -> Iterator[NodeLog]:
    """The torchrun log of every node of sortie NAME, or
    NODE only: live from the nodes (a held cluster's: its newest `exec`'s; an `exec`'s run id:
    that run's, while its cluster holds it), else as collected into RUNS_DIR/NAME/logs."""
    naming.check_name(name, "NAME")
    live = live_run(home, name)
    if live:
        cluster, run_id = live
        try:
            inventory, _ = running_nodes(home, cluster)
        except UsageError:  # its nodes are gone: what was collected is read instead
            return
        for target in [_node(inventory, node)] if node else inventory.nodes:
            running, answered = False, True
            try:
                conn = ssh.connect(target)
                try:
                    text = read_log(conn, target, run_id)
                    running = bool(text) and progress(conn, target, run_id)[0] is None
                finally:
                    conn.close()
            except Exception as exc:  # noqa: BLE001 - an unreachable node is said, not raised
                text = f"[sortie: {target.name} did not answer: {first_line(exc)}]\n"
                answered = False
            yield NodeLog(target.name, text, running, answered)
        return
    found = list(collected_logs(runs_dir, name, node))
    if not found:
        raise UsageError(f"NAME: no running sortie named {name!r} and no logs in "
                         f"{runs_dir / name / 'logs'}")
    yield from found


def collected_logs(runs_dir: Path, run_id: str, node: str | None) -> Iterator[NodeLog]:
    """Run ``run_id``'s logs as collected into RUNS_DIR/RUN/logs (every node's, or NODE's);
    where its job never started there (a setup that failed), its setup's output instead."""
    for kept, said in (("logs", ""), (SETUP_LOGS, "[its setup's output: the job never started]\n")):
        directory = runs_dir / run_id / kept
        if (runs_dir / run_id).is_symlink() or directory.is_symlink():
            raise UsageError(f"NAME: {directory} is reached through a symlink: not read")
        files = [directory / f"{naming.check_name(node, 'NODE')}.log"] if node else \
            sorted(directory.glob("*.log"))
        files = [f for f in files if f.is_file() and not f.is_symlink()]
        for path in files:
            tail = read_tail(path, MAX_LOG_READ)  # never through a symlink
            if tail is not None:
                data, skipped = tail
                cut = f"[the first {skipped} bytes of {path} are not shown]\n" if skipped else ""
                yield NodeLog(path.stem, said + cut + data.decode("utf-8", "replace"), False)
        if files:
            return


def follow(home: Path, name: str, node: str | None, sink: LineSink) -> bool:
    """`sortie logs NAME -f`: stream the live job's log from every node (or NODE), from the
    start of its latest attempt, until the job ends there, as `tail -f` would; nothing is
    stopped. False when NAME runs nothing live (its logs are collected: print those)."""
    naming.check_name(name, "NAME")
    live = live_run(home, name)
    if not live:
        return False
    cluster, run_id = live
    try:
        inventory, _ = running_nodes(home, cluster)
    except UsageError:  # its nodes are gone: print what was collected
        return False

    def one(target: Node) -> None:
        try:
            with ssh.Connections({target.name: ssh.connect(target)}) as conns:
                watch(conns[target.name], target, run_id, sink)
        except Exception as exc:  # noqa: BLE001 - an unreachable node is said, not raised
            sink(target.name, f"[sortie: {target.name} did not answer: {first_line(exc)}]")

    ssh.on_all([_node(inventory, node)] if node else inventory.nodes, one)
    return True
