"""One job at a time on a held cluster: a lock on the head node, held by a command that lives
as long as the controller's connection (the controller gone, the lock goes with it), and the
`running` lock every job's shell holds on its run (`bootstrap/train.py`)."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence

from sortie.bootstrap.node_layout import NODES_DIR, RUNS_DIR
from sortie.bootstrap.ssh import NodeError
from sortie.bootstrap.transport import CommandChannel, NodeTransport
from sortie.core.errors import SortieError
from sortie.core.inventory import Node


class ClusterBusy(SortieError):
    """Another job runs on the cluster, or another `exec` is starting one (and this one was
    not to wait: nothing was started)."""

    exit_code = 2


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


QUEUE_DIR = ".sortie-queue"  # on the head: one file per waiting exec, named to sort FIFO
SAID_EVERY_S = 5  # a waiting exec's line, again: its controller's sign that the head lives


def _queue_script(head: Node, run_id: str) -> str:
    """The head's side of a queued exec: a ticket in QUEUE_DIR (locked while this command
    lives: a waiter whose controller is gone is pruned by the next), then, once its ticket is
    the oldest, the exec lock and no job or setup left running; until then a line every
    SAID_EVERY_S seconds: ``queued PLACE RUN`` (behind the exec of RUN), ``waiting job RUN``
    or ``waiting setup NODE``."""
    base = shlex.quote(head.workdir)
    queue = f"{base}/{QUEUE_DIR}"
    return (
        f"mkdir -p {queue} && exec 7>> {base}/.sortie-queue.lock 8>> {base}/.sortie-exec.lock "
        "|| exit 1\n"
        f"ticket={queue}/$(date +%s%N)-{shlex.quote(run_id)}\n"
        'flock 7; exec 9> "$ticket"; flock 9; flock -u 7\n'
        'said=""; quiet=0\n'
        "while :; do\n"
        f"  flock 7; for f in {queue}/*; do [ \"$f\" = \"$ticket\" ] || [ ! -e \"$f\" ] || "
        '{ flock -n "$f" true 2>/dev/null && rm -f "$f"; }; done\n'
        f'  place=$(ls {queue} | grep -n -x -F "${{ticket##*/}}" | cut -d: -f1); flock -u 7\n'
        '  if [ "$place" = 1 ] && flock -n 8; then\n'
        f"    busy=$({busy_check(head)})\n"
        '    if [ -z "$busy" ]; then\n'
        f'      rm -f "$ticket"; exec 9>&-; echo {shlex.quote(run_id)} > {base}/.sortie-exec.run\n'
        "      echo locked; exec cat > /dev/null\n"
        "    fi\n"
        '    flock -u 8; now="waiting ${busy#busy }"\n'
        "  else\n"
        f'    now="queued $place $(head -c 64 {base}/.sortie-exec.run 2>/dev/null)"\n'
        "  fi\n"
        f'  if [ "$now" != "$said" ] || [ $quiet -ge {SAID_EVERY_S} ]; then '
        'echo "$now" || exit 0; said=$now; quiet=0; fi\n'
        "  sleep 1; quiet=$((quiet + 1))\n"
        "done\n")


def said_word(word: str) -> str:
    """A word the head said (a run id, a node name), as such at most: nothing else printed."""
    return "".join(c for c in word if c.isalnum() or c in "-_.")[:64]


class _Lines:
    """A command's output line by line (a read may bring two); "" when nothing more came by
    the channel's timeout, or at its end."""

    def __init__(self, channel: CommandChannel) -> None:
        self.channel, self.buffer = channel, b""

    def next(self, limit: int = 512) -> str:
        try:
            while b"\n" not in self.buffer and len(self.buffer) < limit:
                chunk = self.channel.recv(limit)
                if not chunk:
                    break
                self.buffer += chunk
        except OSError:  # a timeout: the caller says it
            pass
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode(errors="replace").strip()


def lock_cluster(conns: Mapping[str, NodeTransport], nodes: Sequence[Node], run_id: str,
                 cluster: str, queued: Callable[[str], None] | None = None) -> CommandChannel:
    """Hold the cluster for run ``run_id`` while the returned channel is open (until the
    head's connection closes): a lock on the head (``nodes[0]``), taken before anything is
    synced or started, held by a command that lives as long as this connection (the
    controller gone, the lock goes with it). Refused (ClusterBusy, naming the other run) while
    another exec holds it, or a job or a setup, even one whose controller died, still runs on
    any node (its own lock on `running`, `setup.running`): every node is asked, as nodes need
    not share a disk. With ``queued``, a busy head is waited for in FIFO order with the other
    waiting execs (`_queue_script`), ``queued`` told each change of where this one stands."""
    head = nodes[0]
    base = shlex.quote(head.workdir)
    script = _queue_script(head, run_id) if queued else (
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
    lines = _Lines(channel)
    answer = lines.next()
    while queued and answer.split()[:1] in (["queued"], ["waiting"]):
        queued(answer)
        last = answer
        while answer == last:  # the same line again: the head lives, nothing changed
            answer = lines.next()
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
    other = said_word(" ".join(words[2:3]))
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
