"""One job at a time on a held cluster: a lock on the head node, held by a command that lives
as long as the controller's connection (the controller gone, the lock goes with it), and the
`running` lock every job's shell holds on its run (`bootstrap/train.py`)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from sortie.bootstrap.node_layout import NODES_DIR, RUNS_DIR
from sortie.bootstrap.ssh import NodeError
from sortie.bootstrap.ssh_channel import first_line
from sortie.bootstrap.transport import CommandChannel, NodeTransport
from sortie.core.errors import SortieError
from sortie.core.inventory import Node


class ClusterBusy(SortieError):
    """Another job runs on the cluster, or another `exec` is starting one."""


LOCK_TIMEOUT_S = 30.0
LEAVING_S = 5.0  # how long a lock held by an exec that is ending is waited for


SETUP_RUNNING = "setup.running"  # in a node's own directory: locked while its setup runs


def busy_check(node: Node) -> str:
    """Shell that prints ``busy job RUN`` (or ``busy setup NODE``) and exits when a job's
    `running` lock, or a setup's, is held in ``node``'s workdir (a job or a setup left running
    by a controller that died holds it still)."""
    base = shlex.quote(node.workdir)
    return (f"for f in {base}/{NODES_DIR}/*/{RUNS_DIR}/*/running "
            f"{base}/{NODES_DIR}/*/{SETUP_RUNNING}; do [ -e \"$f\" ] || continue\n"
            '  flock -n "$f" true 2>/dev/null && continue\n'
            f'  case "$f" in *{SETUP_RUNNING}) echo "busy setup $(basename "$(dirname "$f")")";;'
            '\n  *) echo "busy job $(basename "$(dirname "$f")")";; esac; exit 0\ndone\n')


def lock_cluster(conns: Mapping[str, NodeTransport], nodes: Sequence[Node], run_id: str,
                 cluster: str) -> CommandChannel:
    """Hold the cluster for run ``run_id`` while the returned channel is open (until the
    head's connection closes): a lock on the head (``nodes[0]``), taken before anything is
    synced or started, held by a command that lives as long as this connection (the
    controller gone, the lock goes with it). Refused (ClusterBusy, naming the other run) while
    another exec holds it, or a job or a setup, even one whose controller died, still runs on
    any node (its own lock on `running`, `setup.running`): every node is asked, as nodes need
    not share a disk."""
    head = nodes[0]
    base = shlex.quote(head.workdir)
    script = (
        f"exec 8>> {base}/.sortie-exec.lock || exit 1\n"
        # An exec that just ended may still be leaving (its connection closed, the command
        # holding the lock not yet gone): it gets a few seconds.
        f"flock -w {LEAVING_S:g} 8 || "
        f"{{ echo \"busy exec $(head -c 64 {base}/.sortie-exec.run)\"; exit 0; }}\n"
        f"{busy_check(head)}"
        f"echo {shlex.quote(run_id)} > {base}/.sortie-exec.run\n"
        "echo locked\nexec cat > /dev/null\n")
    channel = conns[head.name].open_channel(LOCK_TIMEOUT_S)
    channel.settimeout(LOCK_TIMEOUT_S)
    channel.exec_command(f"bash -c {shlex.quote(script)}")
    answer = first_line(channel)
    words, where = answer.split(), head
    if words == ["locked"]:  # the others: held by the head's lock, no exec starts there now
        for node in nodes[1:]:
            said = conns[node.name].run(f"bash -c {shlex.quote(busy_check(node))}",
                                        timeout=LOCK_TIMEOUT_S, warn=True)
            words, where = said.stdout.split() or ["locked"], node
            if words != ["locked"]:
                break
    if words == ["locked"]:
        return channel  # held while it is open: keep it (a dropped channel closes)
    channel.close()
    other = "".join(c for c in " ".join(words[2:3]) if c.isalnum() or c in "-_.")[:64]
    if words[:2] == ["busy", "job"]:
        raise ClusterBusy(f"{cluster}: job {other} still runs on it ({where.name}; `sortie logs "
                          f"{cluster} -f` follows it; `sortie exec` again once it ends): not "
                          "starting another beside it")
    if words[:2] == ["busy", "setup"]:
        raise ClusterBusy(f"{cluster}: a setup still runs on {other} (an earlier exec's, whose "
                          "controller is gone; its log is that run's setup.log): not starting "
                          "another beside it")
    if words[:2] == ["busy", "exec"]:
        raise ClusterBusy(f"{cluster}: another `sortie exec` (run {other or 'unknown'}) is "
                          "using it: not starting another beside it")
    raise NodeError(f"{where.name}: could not lock the cluster for this job: "
                    f"{' '.join(words)[:200] or 'no answer'}")
