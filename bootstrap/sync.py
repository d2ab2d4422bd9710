"""Send the user's workdir to every node: rsync over SSH with the cluster's pinned host keys.

What is sent:
- `.sortieignore`, when the workdir has one, replaces every other rule (gitignore syntax);
- else, in a git repository, what git itself would consider (`git ls-files --cached --others
  --exclude-standard`: every `.gitignore`, `.git/info/exclude`);
- else the workdir's `.gitignore`;
- never `.git`, `.venv` or `__pycache__`.

A sync with nothing to send costs one round trip per node: over the connection sortie already
holds, the node lists the names, sizes and modification times (to the nanosecond, which rsync
keeps) of its copies; when they are the workdir's, rsync is not started there.

What is deleted on the nodes: only files an earlier sync sent that are gone from the workdir.
The sync remembers what it sent (``synced_list``, on the controller); each sync lists those
files to rsync beside the current ones, and `--delete-missing-args` removes the missing ones on
the node. Whatever the job wrote there (outputs, checkpoints, a `.venv` made by setup) was never
sent, so no sync deletes it, as plain `rsync --delete` would.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pathspec
from fabric import Connection

from bootstrap.ssh import NodeError, on_all, openssh_args, run_with_input, ssh_host
from sortie.core.errors import SortieError, UsageError
from sortie.core.inventory import Inventory, Node
from sortie.core.sizes import readable_bytes
from sortie.core.userfile import read_capped

IGNORE_FILE = ".sortieignore"
JOB_DIR = "job"
ALWAYS_EXCLUDED = (".git", ".venv", "__pycache__")
DEFAULT_MAX_BYTES = 1 << 30
RSYNC_TIMEOUT_S = 600
MAX_IGNORE_BYTES = 1 << 20
MAX_SYNC_FILES = 200_000


@dataclass(frozen=True)
class SyncPlan:
    """The files of a workdir that go to the nodes (paths relative to it, sorted)."""

    root: Path
    files: tuple[str, ...]
    bytes: int
    rules: str  # which ignore rules chose them, for the terminal
    skipped: tuple[str, ...] = ()  # "data (a symlinked directory)", "lib (a git submodule)"

    def describe(self) -> str:
        count = f"{len(self.files):,} file{'' if len(self.files) == 1 else 's'}"
        skipped = f"; not sent: {', '.join(self.skipped[:5])}" + (
            f" and {len(self.skipped) - 5} more" if len(self.skipped) > 5 else "") \
            if self.skipped else ""
        return f"{count}, {readable_bytes(self.bytes)} ({self.rules}{skipped})"


def _encoded(names: Iterable[str]) -> bytes:
    """Names NUL-separated as the file system has them (a name that is not UTF-8 included)."""
    return "\0".join(names).encode("utf-8", "surrogateescape")


def _decoded(data: bytes) -> list[str]:
    return data.decode("utf-8", "surrogateescape").split("\0")


def _always_excluded(relative: str) -> bool:
    return any(part in ALWAYS_EXCLUDED for part in relative.split("/"))


def _walk(root: Path, skipped: list[str]) -> Iterable[str]:
    """Every regular file and symlink under ``root``, relative, skipping the excluded trees;
    symlinked directories (not followed: not sent) go to ``skipped``."""
    for directory, subdirs, files in os.walk(root):
        base = Path(directory).relative_to(root)
        linked = [d for d in subdirs if (Path(directory) / d).is_symlink()]
        skipped += [f"{(base / d).as_posix()} (a symlinked directory)" for d in sorted(linked)
                    if d not in ALWAYS_EXCLUDED]
        subdirs[:] = sorted(d for d in subdirs if d not in ALWAYS_EXCLUDED and d not in linked)
        for name in sorted(files):
            yield (base / name).as_posix()


def _git_files(root: Path) -> list[str] | None:
    """What git would consider in ``root``, or None when it is not in a git work tree."""
    try:
        inside = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
                                capture_output=True, text=True, timeout=30)
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        listed = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
             "--exclude-standard"], capture_output=True, timeout=120, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return sorted({name for name in listed.stdout.decode("utf-8", "surrogateescape").split("\0")
                   if name})


def _ignore_lines(path: Path) -> list[str]:
    """An ignore file's rules, as bytes on disk (a pattern that is not UTF-8 matches the names
    that are not either, which are decoded the same way); capped like a task file."""
    data = read_capped(path, MAX_IGNORE_BYTES, " of ignore rules")
    return data.decode("utf-8", "surrogateescape").splitlines()


def plan_sync(root: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> SyncPlan:
    """Choose the files to send; a UsageError when the workdir is missing or over the cap."""
    root = root.expanduser().resolve()
    if not root.is_dir():
        raise UsageError(f"--workdir {root}: not a directory")
    if not str(root).isprintable():  # records name it as UTF-8 (a surrogate is not printable)
        raise UsageError(f"--workdir {ascii(str(root))}: its path is not printable UTF-8; "
                         "rename it")
    ignore = root / IGNORE_FILE
    skipped: list[str] = []
    names: Iterable[str]
    if ignore.is_file():
        spec = pathspec.GitIgnoreSpec.from_lines(_ignore_lines(ignore))
        names = (n for n in _walk(root, skipped) if not spec.match_file(n))
        rules = IGNORE_FILE
    elif (listed := _git_files(root)) is not None:
        names, rules = listed, "git's ignore rules"
    else:
        gitignore = root / ".gitignore"
        lines = _ignore_lines(gitignore) if gitignore.is_file() else []
        spec = pathspec.GitIgnoreSpec.from_lines(lines)
        names = (n for n in _walk(root, skipped) if not spec.match_file(n))
        rules = ".gitignore" if lines else "no ignore file"
    files, total = [], 0
    for name in names:  # counted as they come: a workdir of `/` stops at the cap, not the end
        if _always_excluded(name):
            continue
        try:
            found = os.lstat(root / name)
        except OSError as exc:  # gone since git listed it, or not ours to read
            if not isinstance(exc, FileNotFoundError):
                skipped.append(f"{name} (unreadable: {exc.strerror})")
            continue
        if stat.S_ISDIR(found.st_mode):  # git lists a submodule so
            skipped.append(f"{name} (a git submodule)")
        elif stat.S_ISREG(found.st_mode) or stat.S_ISLNK(found.st_mode):
            files.append(name)
            total += found.st_size
        if total > max_bytes or len(files) > MAX_SYNC_FILES:
            over = (f"more than the {readable_bytes(max_bytes)} cap (--max-sync-bytes raises "
                    "it)" if total > max_bytes else f"more than {MAX_SYNC_FILES:,} files")
            raise UsageError(f"--workdir {root}: {over} to sync; put datasets in the cluster's "
                             "bucket ($SORTIE_CHECKPOINT_URL's bucket) instead")
    excluded = ", ".join(ALWAYS_EXCLUDED)
    return SyncPlan(root, tuple(sorted(files)), total, f"{rules}; {excluded} excluded",
                    tuple(skipped))


def ssh_transport(node: Node, known_hosts: Path) -> str:
    """rsync's `-e`: the cluster's own key and pinned known_hosts, never trust on first use."""
    return shlex.join(["ssh", *openssh_args(node, known_hosts), "-o", "BatchMode=yes",
                       "-o", "ConnectTimeout=15"])


# One line per change rsync made: its itemized change (`<f…` a file sent to the node, `.f…` only
# its permissions, `cL…` a symlink made there, `*deleting` a deletion) and the file's length.
# `--stats` would be shorter, but it does not count what `--delete-missing-args` deletes.
CHANGE_FORMAT = "%i\t%l"


@dataclass(frozen=True)
class Sent:
    """What one node's rsync changed: files (and symlinks) sent, their bytes, files deleted."""

    files: int = 0
    bytes: int = 0
    deleted: int = 0

    @classmethod
    def from_changes(cls, out: str) -> Sent:
        """Read rsync's `CHANGE_FORMAT` lines (anything else is skipped)."""
        files = size = deleted = 0
        for line in out.splitlines():
            change, _, length = line.partition("\t")
            if change.startswith("*deleting"):
                deleted += 1
            elif change.startswith(("<f", ".f", "cL")):
                files += 1
                size += int(length) if length.isdigit() and change.startswith("<f") else 0
        return cls(files, size, deleted)

    def describe(self) -> str:
        """"sent 2 files (3.1 KiB), deleted 1", or "nothing changed"."""
        said = [f"sent {self.files:,} file{'' if self.files == 1 else 's'} "
                f"({readable_bytes(self.bytes)})"] if self.files else []
        said += [f"deleted {self.deleted:,}"] if self.deleted else []
        return ", ".join(said) or "nothing changed"


def describe_sync(sent: dict[str, Sent], nodes: Iterable[str]) -> list[str]:
    """One line per distinct outcome over ``nodes``, naming its nodes: what `sync` sent to
    each, and "unchanged" where rsync was not needed or changed nothing."""
    outcomes: dict[str, list[str]] = {}
    for name in nodes:
        done = sent.get(name, Sent())
        said = "workdir unchanged" if done == Sent() else f"workdir: {done.describe()}"
        outcomes.setdefault(said, []).append(name)
    return [f"{said} on {', '.join(names)}" for said, names in outcomes.items()]


def rsync_command(node: Node, known_hosts: Path, source: Path, destination: str,
                  file_list: Path, compress: bool = True) -> list[str]:
    """Compression pays over a network; between local nodes it only costs CPU. Modification
    times are compared to the nanosecond (`--modify-window=-1`): to the second, rsync skips a file
    edited within the second of its last sync when its size stayed the same. Each change is
    printed (`CHANGE_FORMAT`) so that the sync can say what it sent."""
    return ["rsync", "--archive", "--modify-window=-1", *(["--compress"] if compress else []),
            "--partial", "--from0", f"--out-format={CHANGE_FORMAT}",
            f"--files-from={file_list}", "--delete-missing-args", "--mkpath",
            "-e", ssh_transport(node, known_hosts),
            f"{source}/", f"{ssh_host(node.address)}:{destination}/"]


def job_dir(node: Node) -> str:
    """Where the user's workdir lands on a node ($SORTIE_WORKDIR): beside sortie's own files."""
    return f"{node.workdir}/{JOB_DIR}"


# GNU stat --printf: name, size, mtime to the nanosecond, permissions (a `chmod +x` changes no
# mtime, and rsync --archive sends it).
STAT_FORMAT = "%n\t%s\t%.9Y\t%a\n"


def _stat_digest(plan: SyncPlan) -> str | None:
    """What `_up_to_date` expects a node to list, hashed; None when the quick check cannot
    tell (symlinks: rsync does not keep their modification times)."""
    digest = hashlib.sha256()
    for name in plan.files:
        found = os.lstat(plan.root / name)
        if not stat.S_ISREG(found.st_mode):
            return None
        seconds, nanoseconds = divmod(found.st_mtime_ns, 1_000_000_000)
        digest.update(f"{name}\t{found.st_size}\t{seconds}.{nanoseconds:09d}\t"
                      f"{stat.S_IMODE(found.st_mode):o}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def _up_to_date(conn: Connection, node: Node, plan: SyncPlan, expected: str) -> bool:
    """One round trip: whether the node's copies have the workdir's names, sizes and
    modification times (a missing or changed file, or an older `stat`, says no)."""
    # Every path reads all of stdin: a command that ends first cuts the channel under the sender.
    try:
        listed = run_with_input(
            conn, f"{{ cd {shlex.quote(job_dir(node))} 2>/dev/null && xargs -0 -r stat "
            f"--printf {shlex.quote(STAT_FORMAT)} -- 2>/dev/null; cat > /dev/null; }} "
            "| sha256sum", _encoded(plan.files), 60)
    except Exception:  # noqa: BLE001 - only a shortcut: rsync runs, and says what is wrong
        return False
    return listed.ok and listed.stdout.split()[:1] == [expected]


def _rsync_all(inventory: Inventory, plan: SyncPlan, removed: list[str], targets: list[Node],
               synced_list: Path) -> list[Sent]:
    """One rsync per node in ``targets``, in parallel: the plan's files, and ``removed`` (listed
    so that `--delete-missing-args` deletes them there). Returns what each sent, in order."""
    listing = synced_list.with_suffix(".sending")
    listing.write_bytes(_encoded([*plan.files, *removed]))
    known_hosts = synced_list.with_suffix(".known_hosts")  # what rsync's ssh may trust
    known_hosts.write_text(inventory.known_hosts())
    try:
        def send(node: Node) -> Sent:
            command = rsync_command(node, known_hosts, plan.root, job_dir(node), listing,
                                    compress=inventory.backend != "local")
            try:
                done = subprocess.run(command, capture_output=True, text=True,
                                      timeout=RSYNC_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise NodeError(f"{node.name}: syncing the workdir took over "
                                f"{RSYNC_TIMEOUT_S}s") from None
            except OSError as exc:
                raise SortieError(f"syncing the workdir needs rsync here ({exc})") from None
            if done.returncode != 0:
                lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
                raise NodeError(f"{node.name}: syncing the workdir failed: {lines[-1]}")
            return Sent.from_changes(done.stdout)

        return on_all(targets, send)
    finally:
        listing.unlink(missing_ok=True)
        known_hosts.unlink(missing_ok=True)


def sync(inventory: Inventory, plan: SyncPlan, synced_list: Path,
         nodes: list[Node] | None = None,
         conns: dict[str, Connection] | None = None) -> dict[str, Sent]:
    """rsync ``plan`` to every node's `job_dir` in parallel, trusting only the inventory's
    pinned host keys; files a sync listed in ``synced_list`` that the plan no longer has are
    deleted there (if the workdir no longer has them either). With ``conns`` (open connections
    by node name), a node whose copies are already the workdir's is skipped. Returns what rsync
    sent to each node it ran for, by name. Raises NodeError naming the first node that
    failed."""
    previous = _decoded(synced_list.read_bytes()) if synced_list.is_file() else []
    current = set(plan.files)
    # A state file is untrusted like any other: only plain relative names may become deletions.
    removed = [name for name in previous if name and name not in current
               and not name.startswith("/") and ".." not in name.split("/")
               and not _always_excluded(name) and not (plan.root / name).exists()
               and not (plan.root / name).is_symlink()]
    targets = nodes or inventory.nodes
    expected = _stat_digest(plan) if conns and not removed else None
    if expected:
        fresh = on_all(targets, lambda n: n.name in conns and _up_to_date(
            conns[n.name], n, plan, expected))
        targets = [node for node, same in zip(targets, fresh, strict=True) if not same]
    sent = _rsync_all(inventory, plan, removed, targets, synced_list) if targets else []
    synced_list.write_bytes(_encoded(plan.files))
    return {node.name: done for node, done in zip(targets, sent, strict=True)}


def content_digest(plan: SyncPlan, names: Iterable[str]) -> str:
    """SHA-256 over ``names`` (files of the plan) and what each holds (a symlink: its target)."""
    digest = hashlib.sha256()
    for name in names:
        path = plan.root / name
        digest.update(f"{name}\0".encode("utf-8", "surrogateescape"))
        try:
            digest.update(os.readlink(path).encode("utf-8", "surrogateescape")
                          if path.is_symlink() else hashlib.sha256(path.read_bytes()).digest())
        except OSError as exc:
            raise UsageError(f"--workdir: {name}: cannot read it ({exc.strerror})") from None
    return digest.hexdigest()


def files_under(plan: SyncPlan, name: str) -> list[str]:
    """The plan's files ``name`` stands for: itself, or every file below it (a directory;
    ``.`` the whole workdir)."""
    wanted = PurePosixPath(name).as_posix()
    if wanted == ".":
        return list(plan.files)
    return [f for f in plan.files if f == wanted or f.startswith(f"{wanted}/")]


def workdir_facts(plan: SyncPlan) -> dict[str, Any]:
    """What code ran: the synced files' content hash and, in a git repository, its commit and
    whether the work tree differed from it."""
    facts: dict[str, Any] = {"path": str(plan.root), "files": len(plan.files),
                             "bytes": plan.bytes, "sha256": content_digest(plan, plan.files)}
    try:
        head = subprocess.run(["git", "-C", str(plan.root), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=30)
        changes = subprocess.run(["git", "-C", str(plan.root), "status", "--porcelain"],
                                 capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return facts
    if head.returncode == 0:
        facts |= {"git_commit": head.stdout.strip(), "git_dirty": bool(changes.stdout.strip())}
    return facts
