"""One job at a time on a held cluster: a lock on the head node, held by a command that lives
as long as the controller's connection (the controller gone, the lock goes with it), and the
`running` lock every job's shell holds on its run (`bootstrap/train.py`)."""

from __future__ import annotations

import contextlib
import shlex

from fabric import Connection
from paramiko import Channel

from sortie.bootstrap.node_layout import NODES_DIR, RUNS_DIR
from sortie.bootstrap.ssh import NodeError
from sortie.core.errors import SortieError
from sortie.core.inventory import Node


class ClusterBusy(SortieError):
    """Another job runs on the cluster, or another `exec` is starting one."""


LOCK_TIMEOUT_S = 30.0
LEAVING_S = 5.0  # how long a lock held by an exec that is ending is waited for


def lock_cluster(conn: Connection, head: Node, run_id: str, cluster: str) -> Channel:
    """Hold the cluster for run ``run_id`` while the returned channel is open (until ``conn``
    closes): a lock on the head, taken
    before anything is synced or started, held by a command that lives as long as this
    connection (the controller gone, the lock goes with it). Refused (ClusterBusy, naming the
    other run) while another exec holds it or a job, even one whose controller died, still
    runs there (its own lock on `running`)."""
    base = shlex.quote(head.workdir)
    script = (
        f"exec 8>> {base}/.sortie-exec.lock || exit 1\n"
        # An exec that just ended may still be leaving (its connection closed, the command
        # holding the lock not yet gone): it gets a few seconds.
        f"flock -w {LEAVING_S:g} 8 || "
        f"{{ echo \"busy exec $(head -c 64 {base}/.sortie-exec.run)\"; exit 0; }}\n"
        f"for f in {base}/{NODES_DIR}/*/{RUNS_DIR}/*/running; do [ -e \"$f\" ] || continue\n"
        '  flock -n "$f" true 2>/dev/null || { echo "busy job $(basename "$(dirname "$f")")"; '
        "exit 0; }\ndone\n"
        f"echo {shlex.quote(run_id)} > {base}/.sortie-exec.run\n"
        "echo locked\nexec cat > /dev/null\n")
    transport = conn.client.get_transport() if conn.is_connected else None
    if transport is None:
        conn.open()
        transport = conn.client.get_transport()
    channel = transport.open_session(timeout=LOCK_TIMEOUT_S)
    channel.settimeout(LOCK_TIMEOUT_S)
    channel.exec_command(f"bash -c {shlex.quote(script)}")
    answer = b""
    with contextlib.suppress(OSError):  # a timeout: said below
        while not answer.endswith(b"\n") and len(answer) < 512:
            chunk = channel.recv(512)
            if not chunk:
                break
            answer += chunk
    words = answer.decode(errors="replace").split()
    if words == ["locked"]:
        return channel  # held while it is open: keep it (a dropped channel closes)
    channel.close()
    other = "".join(c for c in " ".join(words[2:3]) if c.isalnum() or c in "-_.")[:64]
    if words[:2] == ["busy", "job"]:
        raise ClusterBusy(f"{cluster}: job {other} still runs on it (`sortie logs {cluster} -f`"
                          f" follows it; `sortie exec` again once it ends): not starting "
                          "another beside it")
    if words[:2] == ["busy", "exec"]:
        raise ClusterBusy(f"{cluster}: another `sortie exec` (run {other or 'unknown'}) is "
                          "using it: not starting another beside it")
    raise NodeError(f"{head.name}: could not lock the cluster for this job: "
                    f"{' '.join(words)[:200] or 'no answer'}")
