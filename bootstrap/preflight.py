"""Machines sortie did not create, seen from the nodes: the checks before a cluster is attached
(preflight), and the clean-up when it is detached.

Everything sortie puts on an attached node lives in one directory it makes there and marks as
its own, ``<base>/sortie-<cluster>/`` with a ``.sortie-attached`` file (the node's workdir). So
detaching stops the processes that run from that directory or name it, removes it, and touches
nothing else on the machine.
"""

from __future__ import annotations

import re
import shlex

from pydantic import BaseModel, computed_field

from sortie.bootstrap import ssh
from sortie.bootstrap.checks import PROBE, NodeFacts, wait_for_cloud_init
from sortie.bootstrap.contract import cluster_environment
from sortie.bootstrap.ssh_channel import first_line
from sortie.bootstrap.transport import NodeTransport
from sortie.core.errors import SortieError, last_line
from sortie.core.inventory import PLAIN_PATH, Inventory, Node
from sortie.core.sizes import human_bytes, readable_bytes

MARKER = ".sortie-attached"
WORKDIR_PREFIX = "sortie-"
HOME = "~"  # a workdir base of "~": the node user's home directory
REACH_TIMEOUT_S = 5
RSYNC_MIN = (3, 2, 3)  # the first with --mkpath, which every sync uses
RSYNC_MIN_TEXT = ".".join(map(str, RSYNC_MIN))


def rsync_version(line: str) -> tuple[int, ...] | None:
    """"rsync  version 3.2.7  protocol version 31" -> (3, 2, 7); None when unreadable."""
    found = re.search(r"version v?(\d+)\.(\d+)\.(\d+)", line)
    return tuple(int(part) for part in found.groups()) if found else None

# On the head: listen on the rendezvous port (as torchrun's store will) until stdin ends.
_LISTEN = r"""
import signal, socket, sys, threading
signal.alarm(120)  # never outlive a controller that went away
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    server.bind(("", int(sys.argv[1])))
except OSError as exc:
    print(exc.strerror or exc, flush=True)
    sys.exit(0)
server.listen(512)
print("listening", flush=True)
def serve():
    while True:
        server.accept()[0].close()
threading.Thread(target=serve, daemon=True).start()
sys.stdin.read()
"""

# On every node: can it open a TCP connection to the head's rendezvous address?
_REACH = r"""
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("ok")
except OSError as exc:
    print(exc.strerror or str(exc) or type(exc).__name__)
"""

# On a node being detached: stop every process running from the workdir or naming it (its own
# ancestors, the SSH session running this, aside), SIGTERM then SIGKILL; print how many were
# stopped, then the pids of any still alive.
_STOP = r"""
# sortie-detach-step: hosts sharing a disk (and here a machine) run this at once; none stops
# another's (nor its removal loop, which says the same), only the workdir's own processes.
import os, signal, sys, time
DETACHING = "sortie-detach-step"
workdir = sys.argv[1].rstrip("/") + "/"
ours, pid = set(), os.getpid()
while pid > 1:
    ours.add(pid)
    with open(f"/proc/{pid}/stat") as f:
        pid = int(f.read().rsplit(")", 1)[1].split()[1])
def found():
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in ours:
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            cwd = os.readlink(f"/proc/{entry}/cwd") + "/"
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if (cwd.startswith(workdir) or workdir in cmdline) and DETACHING not in cmdline:
            pids.append(int(entry))
    return pids
stopped = set()
for sig in (signal.SIGTERM, signal.SIGKILL):
    pids = found()
    stopped.update(pids)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    deadline = time.monotonic() + 5
    while found() and time.monotonic() < deadline:
        time.sleep(0.1)
print(len(stopped), *found())
"""


class NodeCheck(BaseModel):
    """One node's preflight: what was found, and the first problem (None: ready)."""

    node: str
    address: str
    ssh: bool = False
    python: str | None = None
    torch: str | None = None
    gpus: int | None = None
    free_bytes: int | None = None
    workdir: str | None = None
    reaches_head: bool | None = None  # None: not checked (an earlier check failed)
    problem: str | None = None


class Preflight(BaseModel):
    """Every node's preflight (`sortie attach`)."""

    cluster: str
    rendezvous: str  # head address:port, as every node must reach it
    nodes: list[NodeCheck]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        return all(check.problem is None for check in self.nodes)

    def problems(self) -> str:
        return "; ".join(f"{c.node}: {c.problem}" for c in self.nodes if c.problem)


def preflight(inventory: Inventory, min_free_bytes: int, gpus: int | None = None,
              timeout_s: float = 15.0, first_boot: bool = False
              ) -> tuple[Preflight, dict[str, NodeTransport]]:
    """Check every node of a cluster about to be attached, all in parallel: SSH with the pinned
    host key, its workdir made (``<node.workdir>/sortie-<cluster>``, ``~`` for the home
    directory) with ``min_free_bytes`` free, python and torch there, the GPU count (``gpus``,
    else the same on every node), then that every node reaches the head's rendezvous port. With
    ``first_boot`` (a stack's nodes, perhaps just made) each node's cloud-init is waited for
    first: it installs what the checks look for.

    Returns the checks and the connections opened (the caller closes them; on failure, after
    `remove_workdir` on each)."""
    conns: dict[str, NodeTransport] = {}

    def check(node: Node) -> NodeCheck:
        row = NodeCheck(node=node.name, address=f"{node.address}:{node.port}")
        try:
            conns[node.name] = ssh.connect(node, timeout_s)
            row.ssh = True
            if first_boot:
                wait_for_cloud_init(conns[node.name], node)
            _probe(conns[node.name], node, inventory, min_free_bytes, row)
        except ssh.TRANSIENT_SSH_ERRORS as exc:
            row.problem = f"not reachable over SSH: {exc or type(exc).__name__}"
        except SortieError as exc:
            row.problem = str(exc).removeprefix(f"{node.name} ")
        return row

    rows = ssh.on_all(inventory.nodes, check)
    _check_gpus(rows, gpus)
    report = Preflight(cluster=inventory.cluster_id, nodes=rows,
                       rendezvous=f"{inventory.head.private_address}:{inventory.rdzv_port}")
    if report.ok:
        _check_rendezvous(inventory, conns, rows, timeout_s)
    return report, conns


def _probe(conn: NodeTransport, node: Node, inventory: Inventory, min_free_bytes: int,
           row: NodeCheck) -> None:
    """Make the node's workdir, then read its free space, python, torch and GPUs: one command."""
    name = inventory.cluster_id
    # A workdir this check made goes again when a check after it fails: the clean-up after a
    # failed preflight needs the node's python, which may be what failed.
    result = conn.run(
        f"base={shlex.quote(node.workdir)}\n"
        f'[ "$base" = {shlex.quote(HOME)} ] && base=$HOME\n'
        f'workdir="${{base%/}}/{WORKDIR_PREFIX}{name}"; made=\n'
        # Made whole, marker inside, by a rename: hosts sharing a file system (an NFS home)
        # make it at once; one rename wins, and no host meets it without its marker.
        'if [ ! -e "$workdir" ]; then\n'
        '  mkdir -p "${base%/}/" && new=$(mktemp -d "${base%/}/.sortie-new.XXXXXX") && '
        f'echo {name} > "$new/{MARKER}" || {{ echo "cannot create $workdir" >&2; exit 3; }}\n'
        '  if mv -T "$new" "$workdir" 2>/dev/null; then made=1; else rm -rf "$new"; fi\nfi\n'
        f'if [ ! -f "$workdir/{MARKER}" ]; then\n'
        '  echo "$workdir exists and sortie did not make it" >&2; exit 3; fi\n'
        # The marker alone is no proof where others can write (a mode-1777 base): another user
        # could have made it first and seeded what the nodes run (issue 61).
        'if [ -L "$workdir" ] || [ ! -O "$workdir" ] || '
        '[ -n "$(find "$workdir" -maxdepth 0 -perm /022)" ]; then\n'
        '  echo "$workdir is not this user\'s own, or others can write in it: sortie works only '
        'in one it made" >&2; exit 3; fi\n'
        'undo() { [ -z "$made" ] || rm -rf "$workdir"; }\n'
        'command -v rsync >/dev/null || { undo; echo "rsync is not installed (sortie sends '
        f'code with it: install rsync {RSYNC_MIN_TEXT} or later)" >&2; exit 3; }}\n'
        'echo "$workdir"; df -Pk "$workdir" | awk \'NR == 2 {print $4}\'\n'
        "rsync --version | head -n 1\n"
        f"{ssh.shell_env(cluster_environment(inventory, node))} {shlex.quote(node.python)} "
        f"-c {shlex.quote(PROBE)} || {{ code=$?; undo; exit $code; }}", timeout=60)
    lines = result.stdout.splitlines()
    if not result.ok:
        why = last_line(result.stderr, "no output")
        row.problem = why if result.exited == 3 else f"{node.python} did not run: {why}"
        return
    try:
        workdir, free_kb, rsync_line, probe = lines[:4]
        facts = NodeFacts.parse(probe)
        free = int(free_kb) * 1024
    except ValueError:
        row.problem = f"unexpected answer to the node check: {result.stdout[:200]!r}"
        return
    rsync = rsync_version(rsync_line)
    if rsync is None or rsync < RSYNC_MIN:
        row.workdir = workdir if _plain_path(workdir) else None  # removed by the caller
        row.problem = (f"rsync {'.'.join(map(str, rsync)) if rsync else '(version unknown)'} "
                       f"is too old: sortie needs {RSYNC_MIN_TEXT} or later (--mkpath)")
        return
    if not _plain_path(workdir):
        row.problem = f"workdir {workdir[:200]!r}: not a plain absolute path; set `workdir`"
        return
    row.workdir, row.free_bytes = workdir, free
    row.python, row.torch, row.gpus = facts.python, facts.torch, facts.gpus
    if facts.torch is None:
        row.problem = f"torch is not installed for {node.python}"
    elif free < min_free_bytes:
        row.problem = (f"only {readable_bytes(free)} free in {workdir} (at least "
                       f"{human_bytes(min_free_bytes)} wanted: --min-free-disk)")


def _check_gpus(rows: list[NodeCheck], gpus: int | None) -> None:
    counted = [row for row in rows if row.gpus is not None]
    if gpus is None and counted:
        gpus = counted[0].gpus
        source = f"{counted[0].node} has {gpus}: every node needs the same number"
    else:
        source = f"the stack says {gpus}"
    for row in counted:
        if row.gpus != gpus and row.problem is None:
            row.problem = f"{row.gpus} GPUs, but {source}"


def _check_rendezvous(inventory: Inventory, conns: dict[str, NodeTransport],
                      rows: list[NodeCheck], timeout_s: float) -> None:
    """Listen on the head's rendezvous port for a moment and have every node connect to it."""
    head, port = inventory.head, inventory.rdzv_port
    channel = conns[head.name].open_channel(timeout_s)
    try:
        channel.settimeout(timeout_s)
        channel.exec_command(f"{shlex.quote(head.python)} -c {shlex.quote(_LISTEN)} {port}")
        answer = first_line(channel)
        if answer != "listening":
            rows[0].problem = (f"cannot listen on the rendezvous port {port}: "
                               f"{answer or 'no answer'} (set `rdzv_port`)")
            return
        target = shlex.quote(head.private_address)

        def reach(node: Node) -> str:
            return conns[node.name].run(
                f"{shlex.quote(node.python)} -c {shlex.quote(_REACH)} {target} {port} "
                f"{REACH_TIMEOUT_S}", timeout=REACH_TIMEOUT_S + 30).stdout.strip()

        answers = ssh.on_all(inventory.nodes, reach)
    finally:
        channel.close()
    for row, reached in zip(rows, answers, strict=True):
        row.reaches_head = reached == "ok"
        if not row.reaches_head:
            row.problem = (f"cannot reach the head's rendezvous port "
                           f"{head.private_address}:{port}: {reached[:200] or 'no answer'}")


def _plain_path(path: str) -> bool:
    """An absolute path a shell needs no quoting for, that never goes up a directory."""
    return bool(PLAIN_PATH.fullmatch(path)) and "/../" not in f"{path}/"


def workdir_is_ours(workdir: str) -> bool:
    """Whether ``workdir`` is one sortie would have made on an attached node."""
    return _plain_path(workdir) and workdir.rsplit("/", 1)[-1].startswith(WORKDIR_PREFIX)


def remove_workdir(conn: NodeTransport, node: Node, stop: bool = True) -> tuple[int, str | None]:
    """Stop sortie's processes on an attached node and remove its workdir (only one carrying
    sortie's marker). Returns (processes stopped, None), or what is left and why. Without
    ``stop`` (after a failed preflight, when no job has run and the node's python may be what
    failed) the shell alone removes it."""
    if not workdir_is_ours(node.workdir):
        return 0, f"{node.workdir!r} is not a workdir sortie made; left as it is"
    workdir, count = shlex.quote(node.workdir), 0
    if stop:
        stopped = conn.run(f"test -d {workdir} || exit 0\n"
                           f"{shlex.quote(node.python)} -c {shlex.quote(_STOP)} {workdir}",
                           timeout=60)
        counts = stopped.stdout.split()
        if not stopped.ok or (counts and not counts[0].isdigit()):
            why = last_line(stopped.stderr, "no output", 200)
            return 0, f"could not stop sortie's processes ({why})"
        count = int(counts[0]) if counts else 0  # nothing printed: there was no workdir
        if len(counts) > 1:
            return count, f"processes {' '.join(counts[1:])} still run from {node.workdir}"
    # Hosts that share the disk remove the one directory at once: two `rm -rf` of one tree make
    # each other fail half-way (fts_read: No such file), leaving a part without its marker. So
    # one renames it aside (atomic: the others find it gone) and removes it alone.
    aside = shlex.quote(f"{node.workdir}.removing-") + "$$"
    removed = conn.run(": sortie-detach-step\n"
                       f"for i in $(seq 100); do test -e {workdir} || exit 0\n"
                       f"if test -f {workdir}/{MARKER} && mv -T {workdir} {aside} 2>/dev/null; "
                       f"then rm -rf {aside}; test ! -e {aside}; exit; fi\n"
                       "sleep 0.1; done; exit 1", timeout=120)
    return count, None if removed.ok else f"{node.workdir} could not be removed"
