"""What a user's job wrote in its workdir on each node, found before teardown so that nothing
it made goes with the cluster unsaid, and nothing older is taken for this run's.

A run owns a file when the file was created or changed after the run started there: its
modification or status-change time (``ctime``, which no program can set back: a copy that
keeps an old mtime is still new) is at or after the ``started`` marker the launch writes in
the run's directory (`node_layout.started_marker`), by the same file system's clock. The synced code
keeps the controller's times (rsync ``-t``) and its status-change time from the sync, both
before the launch, so the code is never taken for the job's output; a file the job changed is.
`.git`, `.venv` and `__pycache__` (Python's own bytecode, written as modules load) are not
looked in.

The controller then takes (`choose`): every file the task's ``artifacts`` globs name, and the
job's other new files, smallest first, up to a cap (``--collect-max``, 1 GiB a run); what is
left is named with its size and the flag that keeps it. Nodes that share a file system (a
Slurm cluster's, hosts on one NFS home) list the same files: each is taken once, from the first
node in rank order (rank 0's first) that lists it."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from fabric import Connection

from sortie.bootstrap.collect import on_files
from sortie.bootstrap.node_layout import job_dir, started_marker
from sortie.bootstrap.ssh import NodeError
from sortie.core.inventory import Node
from sortie.core.sizes import human_bytes, readable_bytes

DEFAULT_COLLECT_BYTES = 1 << 30  # the job's own files collected without being named
MAX_LISTED = 100_000  # new files one node may list (the listing is held in memory)
LIST_TIMEOUT_S = 300
NAMES_SHOWN = 3

# Run by the node's Python (no shell expands the user's globs). Prints one JSON document:
# {"files": [[path, bytes, mtime_ns, named_by_a_glob]], "refused": [...], "more": bool}.
# No marker: the job never launched there, so nothing there is this run's.
_LIST = r"""
import glob, json, os, stat, sys
root, marker, patterns, most = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
skip = {".git", ".venv", "__pycache__"}
try:
    since = os.stat(marker).st_mtime_ns
    os.chdir(root)
except OSError:
    print(json.dumps({"files": [], "refused": [], "more": False}))
    sys.exit(0)
here = os.getcwd()
named = set()
for pattern in patterns:
    for match in glob.glob(pattern, recursive=True):
        if os.path.isdir(match) and not os.path.islink(match):
            named.update(os.path.normpath(os.path.join(d, f))
                         for d, _, fs in os.walk(match) for f in fs)
        else:
            named.add(os.path.normpath(match))
files, refused, more = [], [], False
for directory, subdirs, names in os.walk("."):
    subdirs[:] = sorted(d for d in subdirs if d not in skip)
    for name in sorted(names):
        path = os.path.normpath(os.path.join(directory, name))
        try:
            found = os.lstat(path)
        except OSError:
            continue  # gone since it was listed
        if max(found.st_mtime_ns, found.st_ctime_ns) < since or name.endswith(".tmp"):
            continue  # older than the run, or an unfinished atomic write
        if not stat.S_ISREG(found.st_mode):
            if stat.S_ISLNK(found.st_mode):
                refused.append(path + " (a symlink)")
            continue
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:
            refused.append(ascii(path) + " (not a UTF-8 file name)")
            continue
        if len(files) >= most:
            more = True
            break
        files.append([path, found.st_size, found.st_mtime_ns, path in named])
    if more:
        break
print(json.dumps({"files": files, "refused": refused[:100], "more": more}))
"""


@dataclass(frozen=True)
class NewFile:
    """A file under the workdir that the job wrote on ``node``."""

    node: str
    path: str  # relative to the workdir
    bytes: int
    mtime_ns: int
    named: bool  # a glob of the task's `artifacts` names it: always collected

    def line(self) -> str:
        return f"{self.path} ({readable_bytes(self.bytes)}, {self.node})"


@dataclass
class Listed:
    """One node's new files, and what it could not list (said, never copied)."""

    files: list[NewFile] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def list_new(conn: Connection, node: Node, run_id: str, patterns: Sequence[str]) -> Listed:
    """The files the job created or changed in its workdir on ``node`` since the run started
    there (`node_layout.started_marker`), each marked when one of ``patterns`` names it."""
    marker = started_marker(node, run_id)
    result = on_files(conn).run(shlex.join([node.python, "-c", _LIST, job_dir(node), marker,
                                           json.dumps(list(patterns)), str(MAX_LISTED)]),
                                timeout=LIST_TIMEOUT_S)
    if not result.ok:
        raise NodeError(f"{node.name}: listing what the job wrote failed: "
                        f"{(result.stderr.strip().splitlines() or ['?'])[-1]}")
    try:
        found = json.loads(result.stdout)
        files = [NewFile(node.name, str(path), int(size), int(mtime), bool(named))
                 for path, size, mtime, named in found["files"]]
        refused = [f"{node.name}: {str(entry)[:300]}" for entry in found["refused"]]
    except (ValueError, TypeError, KeyError):
        raise NodeError(f"{node.name}: its list of what the job wrote was not understood") \
            from None
    if found.get("more"):
        refused.append(f"{node.name}: more than {MAX_LISTED:,} new files in the workdir; the "
                       "rest were not looked at")
    return Listed(files, refused)


@dataclass
class Chosen:
    """What collection takes of the jobs' new files, and what it leaves on the nodes."""

    taken: list[NewFile] = field(default_factory=list)
    left: list[NewFile] = field(default_factory=list)

    def on(self, node: str) -> list[NewFile]:
        return [f for f in self.taken if f.node == node]


def choose(listed: Sequence[Listed], most_bytes: int) -> Chosen:
    """Every file the task's globs name, then the rest, smallest first, while they fit in
    ``most_bytes``; a file that nodes sharing a file system both list is taken once, from the
    first of ``listed`` (rank order)."""
    seen: set[tuple[str, int, int]] = set()
    unique: list[NewFile] = []
    for node_files in listed:
        for new in node_files.files:
            key = (new.path, new.bytes, new.mtime_ns)
            if key not in seen:
                seen.add(key)
                unique.append(new)
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


def left_line(left: Sequence[NewFile], most_bytes: int, where: str) -> str | None:
    """One line naming what the job wrote that was not collected, its size, and the flag that
    keeps it; ``where``: what becomes of it ("they go with the cluster", ...)."""
    if not left:
        return None
    biggest = sorted(left, key=lambda f: -f.bytes)
    total = sum(f.bytes for f in left)
    names = ", ".join(f.line() for f in biggest[:NAMES_SHOWN])
    more = f" and {len(left) - NAMES_SHOWN:,} more" if len(left) > NAMES_SHOWN else ""
    why = ("--no-collect" if most_bytes == 0 else
           f"over the {readable_bytes(most_bytes)} of new files collected a run")
    keep = human_bytes(_round_up(total + most_bytes))
    return (f"not collected ({why}): {len(left):,} file{'s' if len(left) != 1 else ''} the job "
            f"wrote, {readable_bytes(total)}: {names}{more}; {where}; --collect-max {keep} "
            "(or --artifact GLOB) keeps them")


def _round_up(count: int) -> int:
    """A flag value that covers ``count`` bytes: the next whole GiB (MiB under one GiB)."""
    unit = 1 << 30 if count >= 1 << 30 else 1 << 20
    return -(-count // unit) * unit
