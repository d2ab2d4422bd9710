"""What a user's job wrote in its workdir on each node, found before teardown so that nothing
it made goes with the cluster unsaid, and nothing older is taken for this run's.

A run owns a file when the file was created or changed after the run started there: its
modification or status-change time (``ctime``, which no program can set back: a copy that
keeps an old mtime is still new) is after that of the ``started`` marker the launch writes in
the run's directory (`node_layout.started_marker`), by the same file system's clock (the job
starts well after the marker: torch alone takes a second to import). The synced code
keeps the controller's times (rsync ``-t``) and its status-change time from the sync, both
before the launch, so the code is never taken for the job's output; a file the job changed is.
`.git`, `.venv` and `__pycache__` (Python's own bytecode, written as modules load) are not
looked in.

The controller then takes (`choose`): every file the task's ``artifacts`` globs name, and the
job's other new files, smallest first, up to a cap (``--collect-max``, 1 GiB a run); what is
left is named with its size and the flag that keeps it. Nodes that share a file system (a
Slurm cluster's, hosts on one NFS home) list the same files: each is taken once, from the first
node in rank order (rank 0's first) that lists it. Nodes share one when each sees the other's
own directory (`node_layout.node_dir`) beside its workdir; nodes of disks of their own never
do, so a file two of them wrote alike (one path, size and time: a file saved by every node at
the same step, times as coarse as the kernel's clock tick) is each node's, taken from each."""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from sortie.bootstrap.collect import on_files
from sortie.bootstrap.node_layout import (
    JOB_DIR,
    JOB_ENV_DIR,
    NODES_DIR,
    TRAINERS_DIR,
    job_dir,
    node_dir,
    started_marker,
)
from sortie.bootstrap.ssh import NodeError
from sortie.bootstrap.transport import NodeTransport
from sortie.core.errors import last_line
from sortie.core.inventory import Node
from sortie.core.progress import some_of
from sortie.core.sizes import human_bytes, readable_bytes

MAX_LISTED = 100_000  # new files one node may list (the listing is held in memory)
LIST_TIMEOUT_S = 300
SKIPPED = (".git", ".venv", "__pycache__")  # not looked in
NAMES_SHOWN = 3

MAX_SEEN = 4096  # nodes' directories one node may say it sees
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


# First the nodes' own directories this node sees beside its workdir (type "n"), then the
# workdir's files changed or created after the marker (modification or status-change time:
# `-newer`, `-cnewer`), NUL-separated: type, path, size, modification time; at most MAX_LISTED.
# `find`, not the node's Python: a Python start per node cost ~0.1 s of CPU (25 s at 254 nodes).
def _find(root: str, marker: str, nodes_root: str) -> str:
    pruned = " -o ".join(f"-name {shlex.quote(name)}" for name in SKIPPED)
    records = 4 * (MAX_LISTED + 1)  # one more file than listed: there are more
    return (f"test -e {shlex.quote(marker)} && cd {shlex.quote(root)} || exit 0\n"
            f"find {shlex.quote(nodes_root)} -mindepth 1 -maxdepth 1 -type d "
            f"-printf 'n\\0%f\\0\\0\\0' 2>/dev/null | head -z -n {4 * MAX_SEEN}\n"
            f"find . \\( {pruned} \\) -prune -o \\( -newer {shlex.quote(marker)} -o -cnewer "
            f"{shlex.quote(marker)} \\) \\( -type f -o -type l \\) ! -name '*.tmp' "
            f"-printf '%y\\0%P\\0%s\\0%T@\\0' | head -z -n {records}")


# What a job's Python, torch and container runtime, and the node's services, keep in $HOME and
# the temporary directory on their own (caches, torchrun's and multiprocessing's scratch, a
# login user's podman's run and storage state, systemd's private directories), never the
# job's results: not looked in.
OUTSIDE_SKIPPED = (".*", "__pycache__", "torchelastic_*", "pymp-*", "torchinductor_*",
                   "podman-run-*", "storage-run-*", "containers-user-*", "systemd-private-*",
                   "snap-private-tmp", "snap", "anaconda3", "miniconda3", "miniforge3")
OWN_PARTS = (JOB_DIR, JOB_ENV_DIR, TRAINERS_DIR, NODES_DIR)  # of the node's directory
OUTSIDE_LIST_S = 60  # how long one node's look may take (a $HOME of millions of files)
MAX_OUTSIDE = 1000  # files outside the workdir one node may list
# Said after the look's records where it ran out of time, as a field of its own: never a size
# (digits) nor a path (from /), wherever the timeout cut find's output (mid-record, at times).
CUT = "sortie:cut"


# The node's data disks: every local file system mounted writable outside the system's own
# directories (an instance's local NVMe, a cloud's temporary disk, wherever the image or the
# job's setup mounted it), where jobs put checkpoints for speed and which go with the machine.
# Network file systems (NFS, Lustre) outlive it and are not looked in; nor are paths that
# /proc/self/mounts escapes (a space in them).
DATA_DISK_TYPES = ("ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs")
SYSTEM_MOUNTS = ("boot", "proc", "sys", "dev", "run", "snap", "var/lib/docker",
                 "var/lib/containers")
_DATA_DISKS = ("awk '$4 ~ /^rw(,|$)/ && $3 ~ /^(" + "|".join(DATA_DISK_TYPES) + ")$/ && "
               "$2 != \"/\" && $2 !~ /\\\\/ && $2 !~ \"^/(" + "|".join(SYSTEM_MOUNTS) +
               ")(/|$)\" { print $2 }' /proc/self/mounts 2>/dev/null")


def _find_outside(node_root: str, marker: str, limit_s: float = OUTSIDE_LIST_S) -> str:
    """The files the job's user created or changed since the marker in $HOME, the temporary
    directory, /mnt, the node's data disks and sortie's own directory on the node (a job's
    `../model.pt`), that directory's parts left out (the workdir, listed apart; the job's
    environment, the trainer, the runs' own files): size, path (NUL-separated); then `CUT`
    where the look ran out of its ``limit_s`` (there may be more)."""
    pruned = " -o ".join([*(f"-path {shlex.quote(f'{node_root}/{part}')}" for part in OWN_PARTS),
                          *(f"-name {shlex.quote(name)}" for name in OUTSIDE_SKIPPED)])
    return (f"test -e {shlex.quote(marker)} || exit 0\n"
            'set -- "${TMPDIR:-/tmp}"; case $HOME in /|"") ;; *) set -- "$HOME" "$@" ;; esac\n'
            f"for disk in {shlex.quote(node_root)} /mnt $({_DATA_DISKS}); do "
            'test -d "$disk" && set -- "$@" "$disk"; done\n'
            f"{{ timeout {limit_s} find \"$@\" -mindepth 1 -xdev \\( "
            f"{pruned} \\) -prune -o -user \"$(id -u)\" \\( "
            f"-newer {shlex.quote(marker)} -o -cnewer {shlex.quote(marker)} \\) -type f "
            f"-printf '%s\\0%p\\0' 2>/dev/null; test $? -ne 124 || printf '\\0{CUT}\\0'; }} "
            f"| head -z -n {2 * (MAX_OUTSIDE + 1)}")


@dataclass(frozen=True)
class OutsideLook:
    """What one node's look outside the workdir found; ``short``: why it may have missed some
    (it ran out of time, it failed), empty when it looked everywhere."""

    node: str
    files: list[NewFile]
    short: str = ""


def list_outside(conn: NodeTransport, node: Node, run_id: str) -> OutsideLook:
    """What the job wrote on ``node`` outside its workdir, in $HOME, the temporary directory,
    /mnt and the node's data disks, since the run started there: never collected (only the
    workdir is), named so that a model saved to `~/model.pt` (or to the local NVMe) on a
    machine that goes at teardown is not lost unsaid; a look cut short is said too.
    Asked only of machines of the cluster's own (`collection`), whose home is the job's."""
    result = on_files(conn).run(_find_outside(node.workdir, started_marker(node, run_id)),
                                timeout=OUTSIDE_LIST_S + 60)
    if not result.ok:
        return OutsideLook(node.name, [], "the look failed: "
                           + last_line(result.stderr, f"exit {result.exited}", 200))
    found, cut = outside_records(result.stdout)
    return OutsideLook(node.name, [NewFile(node.name, path, size, "", False)
                                   for path, size in found.items()],
                       f"the look stopped after {OUTSIDE_LIST_S} s" if cut else "")


def outside_records(listed: str) -> tuple[dict[str, int], bool]:
    """The look's (`_find_outside`) files, path -> size, and whether it ran out of time. Its
    timeout may cut find's output within a record (find writes a buffer at a time): the
    part before the cut is left out, never read as a file of a shorter name."""
    marker = f"\0{CUT}\0"
    cut = marker in listed
    if cut:
        listed = listed[:listed.index(marker)]
        listed = listed[:listed.rfind("\0") + 1]
    fields = listed.split("\0")
    return {path: int(size) for size, path in zip(fields[0:-1:2], fields[1::2], strict=False)
            if size.isdigit() and path.startswith("/")}, cut  # (a $HOME in /tmp: listed twice)


def outside_line(looks: Sequence[OutsideLook], where: str) -> str | None:
    """One line naming the files the job wrote outside its workdir, and what becomes of them;
    where a node's look was cut short, that it may have written more there."""
    outside = [new for look in looks for new in look.files]
    short = "; ".join(f"{look.node}: {look.short}" for look in looks if look.short)
    if not outside and not short:
        return None
    save = "save into the workdir (or $SORTIE_ARTIFACT_DIR) what is to come back"
    if not outside:
        return (f"the job may have written files outside its workdir that were not looked at "
                f"({short}; a $HOME or disk of very many files), not collected (only the "
                f"workdir is); {where}; {save}")
    more = any(len(look.files) > MAX_OUTSIDE for look in looks)
    return (f"the job wrote {len(outside):,}{'+' if more or short else ''} "
            f"file{'s' if len(outside) != 1 else ''} outside its workdir, not collected (only "
            f"the workdir is): {_biggest(outside)}{f' ({short})' if short else ''}; {where}; "
            f"{save}")


def _biggest(files: Sequence[NewFile]) -> str:
    """The biggest few of ``files``, each with its size and node, then how many more."""
    return some_of([f.line() for f in sorted(files, key=lambda f: -f.bytes)], NAMES_SHOWN)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A task's `artifacts` glob as Python's glob reads it (``*`` and ``?`` within one name,
    ``**/`` any depth, ``[...]``), matched against a whole path relative to the workdir."""
    out, at = [], 0
    while at < len(pattern):
        if pattern.startswith("**/", at):
            out.append("(?:.*/)?")
            at += 3
        elif pattern.startswith("**", at):
            out.append(".*")
            at += 2
        elif pattern[at] == "*":
            out.append("[^/]*")
            at += 1
        elif pattern[at] == "?":
            out.append("[^/]")
            at += 1
        elif pattern[at] == "[" and (close := pattern.find("]", at + 2)) != -1:
            inner = pattern[at + 1:close]
            out.append("[" + ("^" + inner[1:] if inner.startswith("!") else inner) + "]")
            at = close + 1
        else:
            out.append(re.escape(pattern[at]))
            at += 1
    return re.compile("".join(out))


def named_by(path: str, patterns: Sequence[re.Pattern[str]]) -> bool:
    """Whether a glob names ``path`` or a directory it lies in (a directory brings back all)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:end]) for end in range(len(parts), 0, -1)]
    return any(pattern.fullmatch(prefix) for pattern in patterns for prefix in prefixes)


@dataclass(frozen=True)
class NewFile:
    """A file under the workdir that the job wrote on ``node``."""

    node: str
    path: str  # relative to the workdir
    bytes: int
    mtime: str  # as the node's find wrote it (seconds, with its fraction)
    named: bool  # a glob of the task's `artifacts` names it: always collected

    def line(self) -> str:
        return f"{self.path} ({readable_bytes(self.bytes)}, {self.node})"

    def recorded(self) -> str:
        """As `run.json`'s ``left_on_nodes`` lists it."""
        return f"{self.node}: {self.path} ({self.bytes} bytes)"


@dataclass
class Listed:
    """One node's new files, and what it could not list (said, never copied); ``sees``: the
    nodes whose own directories it sees beside its workdir (itself, and any node it shares a
    file system with)."""

    files: list[NewFile] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    node: str = ""
    sees: frozenset[str] = frozenset()

    def shares_with(self, other: Listed) -> bool:
        """Whether the two nodes' workdirs are one file system: each sees the other's own
        directory (a disk of its own holds its node's alone)."""
        return self.node in other.sees and other.node in self.sees


def list_new(conn: NodeTransport, node: Node, run_id: str, patterns: Sequence[str]) -> Listed:
    """The files the job created or changed in its workdir on ``node`` since the run started
    there (`node_layout.started_marker`), each marked when one of ``patterns`` names it."""
    result = on_files(conn).run(_find(job_dir(node), started_marker(node, run_id),
                                      posixpath.dirname(node_dir(node))),
                                timeout=LIST_TIMEOUT_S)
    if not result.ok:
        raise NodeError(f"{node.name}: listing what the job wrote failed: "
                        f"{last_line(result.stderr, '?')}")
    # (Read as UTF-8 with a replacement character where a name is not: such a name cannot be
    # named to SFTP, and is said instead.)
    fields = result.stdout.split("\0")
    globs = [glob_regex(pattern) for pattern in patterns]
    listed, sees = Listed(node=node.name), set[str]()
    for at in range(0, len(fields) - 3, 4):
        kind, path, size, mtime = fields[at:at + 4]
        if kind == "n":
            if NODE_NAME.fullmatch(path):
                sees.add(path)
            continue
        if "\ufffd" in path:
            listed.refused.append(f"{node.name}: {path!r} (not a UTF-8 file name)")
            continue
        if len(listed.files) >= MAX_LISTED:
            listed.refused.append(f"{node.name}: more than {MAX_LISTED:,} new files in the "
                                  "workdir; the rest were not looked at")
            break
        if kind == "l":
            listed.refused.append(f"{node.name}: {path!r} (a symlink)")
        elif size.isdigit() and path:
            listed.files.append(NewFile(node.name, path, int(size), mtime,
                                        named_by(path, globs)))
    listed.sees = frozenset(sees)
    return listed


@dataclass
class Chosen:
    """What collection takes of the jobs' new files, and what it leaves on the nodes."""

    taken: list[NewFile] = field(default_factory=list)
    left: list[NewFile] = field(default_factory=list)

    def on(self, node: str) -> list[NewFile]:
        return [f for f in self.taken if f.node == node]


def choose(listed: Sequence[Listed], most_bytes: int) -> Chosen:
    """Every file the task's globs name, then the rest, smallest first, while they fit in
    ``most_bytes``; a file that nodes sharing a file system both list (one path, size and
    time) is taken once, from the first of ``listed`` (rank order)."""
    seen: dict[tuple[str, int, str], list[Listed]] = {}
    unique: list[NewFile] = []
    for node_files in listed:
        for new in node_files.files:
            listers = seen.setdefault((new.path, new.bytes, new.mtime), [])
            if not any(node_files.shares_with(earlier) for earlier in listers):
                unique.append(new)
            listers.append(node_files)
    chosen, room = Chosen(), most_bytes
    for new in (f for f in unique if f.named):
        chosen.taken.append(new)
    for new in sorted((f for f in unique if not f.named), key=lambda f: (f.bytes, f.path)):
        if new.bytes <= room:
            chosen.taken.append(new)
            room -= new.bytes
        else:
            chosen.left.append(new)
    return chosen


def unmatched(patterns: Sequence[str], listed: Sequence[Listed]) -> list[str]:
    """The task's `artifacts` globs that name no file the job wrote on any node (a typo, a
    model saved elsewhere): said, since nothing of them comes back."""
    paths = {new.path for node_files in listed for new in node_files.files}
    return [glob for glob, regex in ((glob, glob_regex(glob)) for glob in patterns)
            if not any(named_by(path, [regex]) for path in paths)]


def left_line(left: Sequence[NewFile], most_bytes: int, where: str) -> str | None:
    """One line naming what the job wrote that was not collected, its size, and the flag that
    keeps it; ``where``: what becomes of it ("they go with the cluster", ...)."""
    if not left:
        return None
    total = sum(f.bytes for f in left)
    why = ("--no-collect" if most_bytes == 0 else
           f"over the {readable_bytes(most_bytes)} of new files collected a run")
    keep = human_bytes(_round_up(total + most_bytes))
    return (f"not collected ({why}): {len(left):,} file{'s' if len(left) != 1 else ''} the job "
            f"wrote, {readable_bytes(total)}: {_biggest(left)}; {where}; --collect-max {keep} "
            "(or --artifact GLOB) keeps them")


def _round_up(count: int) -> int:
    """A flag value that covers ``count`` bytes: the next whole GiB (MiB under one GiB)."""
    unit = 1 << 30 if count >= 1 << 30 else 1 << 20
    return -(-count // unit) * unit
