"""Copy a run's artifacts and logs from the nodes to the controller, before teardown, and prove
each copy: its SHA-256 must match the node's file (a mismatched copy is made once more).

What a node or a bucket lists is untrusted input, and the controller often runs as root, so:
- a name must be one plain path component (no separator, no ``.`` or ``..``, no NUL) and every
  file must land in a directory that resolves inside the run's directory;
- symlinks and special files on the node are refused, not followed, and every file is created on
  the controller with ``O_EXCL | O_NOFOLLOW``: a file already there (the controller's own, or a
  symlink planted in the run's directory) is never written over or through;
- what nodes return has its own subtree (``artifacts/``, ``nodes/<node>/``; the lifecycle picks),
  apart from the files the controller writes beside it;
- the number of files is capped (``MAX_FILES``);
- the bytes copied, from every node and the bucket together, are capped (``Budget``).
What is refused is reported by name; everything else is still copied, so nothing is lost."""

from __future__ import annotations

import hashlib
import shlex
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from sortie.bootstrap.node_layout import artifact_dir, job_dir, run_dir
from sortie.bootstrap.setup_cache import LOG, SETUP_LOGS
from sortie.bootstrap.ssh import NodeError, on_all
from sortie.bootstrap.transport import CommandRunner, NodeFiles, NodeTransport
from sortie.bootstrap.verified_copy import (
    CHECKPOINTS_DIR,
    LOGS_DIR,
    Artifact,
    Budget,
    Collected,
    UnsafePathError,
    _read,
    _sha256,
    is_plain_name,
    local_target,
    same_file_there,
    write_verified,
)
from sortie.core.errors import SortieError
from sortie.core.inventory import Inventory, Node
from sortie.trainer.checkpoint_layout import CheckpointLayout, open_regular

MAX_DEPTH = 32  # directory levels below out/: a node cannot make the listing endless
MAX_FILES = 100_000  # files one node may return: a listing is held in memory
HASH_BATCH = 200  # files per `sha256sum` command line (a command line has a length limit)
# The longest one step of collection waits on a node (a listing, one read, hashing a batch): a
# node that stops answering fails its collection, and teardown goes on.
NODE_TIMEOUT_S = 300


@dataclass(frozen=True)
class RemoteFile:
    source: PurePosixPath  # on the node
    parts: tuple[str, ...]  # where it goes, below the target directory


def remote_files(sftp: Any, remote: PurePosixPath, collected: Collected, node: str,
                 parts: tuple[str, ...] = (), room: int | None = None) -> list[RemoteFile]:
    """The regular files under ``remote`` on a node, skipping unfinished writes (``*.tmp``), at
    most ``room`` of them. Names that are not plain, symlinks, special files and files past the
    cap go to ``collected.refused``."""
    room = MAX_FILES if room is None else room
    try:
        entries = sftp.listdir_attr(str(remote))
    except FileNotFoundError:
        return []
    except UnicodeDecodeError:  # paramiko decodes names strictly: the directory cannot be read
        collected.refused.append(f"{node}: {'/'.join(parts) or 'out'!r} (holds a file name that "
                                 "is not UTF-8: nothing in it was copied)")
        return []
    found: list[RemoteFile] = []
    for entry in entries:
        if len(found) >= room:
            collected.refused.append(f"{node}: {'/'.join(parts) or 'out'!r} (more than "
                                     f"{MAX_FILES} files; the rest were not copied)")
            break
        name, mode = entry.filename, entry.st_mode or 0
        shown = "/".join((*parts, name))
        if not is_plain_name(name):
            collected.refused.append(f"{node}: {shown!r} (not a plain file name)")
        elif stat.S_ISLNK(mode):
            collected.refused.append(f"{node}: {shown!r} (a symlink)")
        elif stat.S_ISDIR(mode):
            if len(parts) >= MAX_DEPTH:
                collected.refused.append(f"{node}: {shown!r} (more than {MAX_DEPTH} levels deep)")
            else:
                found += remote_files(sftp, remote / name, collected, node, (*parts, name),
                                      room - len(found))
        elif not stat.S_ISREG(mode):
            collected.refused.append(f"{node}: {shown!r} (not a regular file)")
        elif not name.endswith(".tmp"):  # an interrupted atomic write, never a result
            found.append(RemoteFile(remote / name, (*parts, name)))
    return found


def on_files(conn: NodeTransport) -> CommandRunner:
    """Where a command that only reads and writes the node's run directory runs: on the node;
    a Slurm node's, here on the login node, which shares its file system (and outlives the
    allocation: collection follows an allocation cancelled from outside)."""
    return conn.files_runner


def remote_digests(conn: NodeTransport, node: Node, files: list[PurePosixPath]) -> dict[str, str]:
    """SHA-256 of each node file. ``-z`` ends each line with NUL and leaves names unescaped
    (without it, a name with a newline or a backslash comes back escaped)."""
    digests: dict[str, str] = {}
    for start in range(0, len(files), HASH_BATCH):
        batch = files[start:start + HASH_BATCH]
        result = on_files(conn).run("sha256sum -z -- " + " ".join(shlex.quote(str(f))
                                                                   for f in batch),
                                    timeout=NODE_TIMEOUT_S)
        if not result.ok:
            raise NodeError(f"{node.name}: hashing the artifacts failed: {result.stderr.strip()}")
        for record in result.stdout.split("\0"):
            digest, _, name = record.partition("  ")
            if name:
                digests[name] = digest
    return digests


def collect(conn: NodeTransport, node: Node, run_id: str, dest: Path, outputs_to: Path,
            budget: Budget | None = None, job_files: Sequence[str] = ()) -> Collected:
    """Copy the node's outputs (its ``out/``, ``$SORTIE_ARTIFACT_DIR``, and ``job_files``:
    paths under the workdir that the job wrote, `bootstrap/job_outputs.py`) into
    ``outputs_to``, a directory of their own inside ``dest``, and its torchrun log to
    ``dest/logs``, verifying every file. Raises NodeError when a file still differs after a
    second copy, CollectLimitError when the budget runs out.

    Rank 0 writes the outputs on whichever node the rendezvous placed it, so normally one node
    has them all; after a recovery an earlier rank 0's node may hold older ones too."""
    budget = budget or Budget()
    remote = PurePosixPath(run_dir(node, run_id))
    sftp = open_sftp(conn)
    try:
        return _collect(conn, sftp, node, remote, dest, outputs_to, budget, job_files)
    finally:
        sftp.close()


def has_output(conn: NodeTransport, node: Node, run_id: str, name: str) -> bool:
    """Whether the node's job left ``name`` in its outputs (``out/``)."""
    path = shlex.quote(f"{artifact_dir(node, run_id)}/{name}")
    return on_files(conn).run(f"test -f {path}", timeout=NODE_TIMEOUT_S).ok


def sole_holder(conns: dict[str, NodeTransport], inventory: Inventory, run_id: str,
                name: str) -> str:
    """The node whose job left ``name`` in its outputs when exactly one did, else the head (a
    user job's `run:` line places its rank 0 on any node: the one holding its metrics is where
    it wrote). Only a choice of folder: a node that cannot be asked counts as not holding it."""
    reachable = [n for n in inventory.nodes if n.name in conns]
    try:
        holds = on_all(reachable, lambda n: has_output(conns[n.name], n, run_id, name))
    except Exception:  # noqa: BLE001 - collection itself says what failed
        return inventory.head.name
    holders = [n.name for n, held in zip(reachable, holds, strict=True) if held]
    return holders[0] if len(holders) == 1 else inventory.head.name


def open_sftp(conn: NodeTransport) -> NodeFiles:
    """A new SFTP session on ``conn``, its caller's own: one session is not for two threads
    (two collections sharing one blocked each other for good)."""
    sftp = conn.open_files()
    sftp.get_channel().settimeout(NODE_TIMEOUT_S)  # a node that stops answering ends the wait
    return sftp


def _collect(conn: NodeTransport, sftp: Any, node: Node, remote: PurePosixPath, dest: Path,
             outputs_to: Path, budget: Budget, job_files: Sequence[str]) -> Collected:
    collected = Collected()
    files = [(f, outputs_to) for f in remote_files(sftp, remote / "out", collected, node.name)]
    workdir = PurePosixPath(job_dir(node))
    files += [(RemoteFile(workdir / path, tuple(path.split("/"))), outputs_to)
              for path in job_files]
    # The job's log (absent when it never started on this node) and this run's setup output
    # (absent when setup was cached or there is none).
    for log, kept in (("torchrun.log", LOGS_DIR), (LOG, SETUP_LOGS)):
        if _exists(sftp, remote / log):
            files.append((RemoteFile(remote / log, (kept, f"{node.name}.log")), dest))
    digests = remote_digests(conn, node, [f.source for f, _ in files])
    for remote_file, base in files:
        shown = "/".join(remote_file.parts)
        try:
            target = local_target(dest, base, remote_file.parts)
            got = _copy_verified(sftp, remote_file.source, target, digests, budget,
                                 f"{node.name}: {shown}")
        except UnsafePathError as exc:
            collected.refused.append(f"{node.name}: {shown!r} ({exc})")
            continue
        if got is None:
            raise NodeError(f"{node.name}: {remote_file.source} still differs from its copy "
                            f"{target} after two copies")
        collected.artifacts.append(Artifact(str(target.relative_to(dest)),
                                            target.stat().st_size, got, node.name))
    return collected


def _copy_verified(sftp: Any, source: PurePosixPath, target: Path, digests: dict[str, str],
                   budget: Budget, what: str) -> str | None:
    """Copy a node file; its SHA-256 when it matches the node's, tried twice; else None."""
    expected = digests.get(str(source))
    if same_file_there(target, expected):
        return expected
    for attempt in range(2):
        if attempt:
            target.unlink(missing_ok=True)  # our own copy, which did not match
        with sftp.open(str(source), "rb") as handle:
            handle.prefetch()
            got = write_verified(target, _read(handle), budget, what)
        if got == expected:
            return got
    return None


def _exists(sftp: Any, path: PurePosixPath) -> bool:
    try:
        sftp.stat(str(path))
    except FileNotFoundError:
        return False
    return True


def _refused(exc: BaseException) -> bool:
    """A read the bucket refused (403: the reader's role not yet in effect), not a failure."""
    return isinstance(exc, PermissionError) or getattr(exc, "status_code", None) == 403


def _latest(bucket: CheckpointLayout, grant_s: float, first_wait_s: float = 5.0) -> int | None:
    """The newest complete step, the first read retried while the bucket refuses it, for up
    to ``grant_s`` (a role the program granted the deployer may take minutes to apply)."""
    deadline, wait = time.monotonic() + grant_s, first_wait_s
    while True:
        try:
            return bucket.latest()
        except Exception as exc:
            if not _refused(exc) or time.monotonic() + wait > deadline:
                raise
            time.sleep(wait)
            wait = min(wait * 2, 60.0)


def collect_checkpoint(bucket_checkpoints: str, dest: Path, budget: Budget | None = None,
                       storage_options: dict[str, Any] | None = None, grant_s: float = 0.0,
                       first_wait_s: float = 5.0) -> Collected:
    """Copy the newest complete checkpoint from the cluster's bucket (any fsspec URL or a
    directory) into ``dest/checkpoints/``, read with ``storage_options`` (the controller's
    credential), a refusal retried for ``grant_s``. Each copy must have the size the bucket
    lists, and its SHA-256 must match the bytes read from the bucket. Keys are names like any
    other: one that would leave ``dest`` is refused, as is a symlink in a local bucket."""
    budget = budget or Budget()
    collected = Collected()
    if "://" not in bucket_checkpoints and not Path(bucket_checkpoints).is_dir():
        return collected  # a local bucket the job wrote no checkpoint to (fsspec not loaded)
    bucket = CheckpointLayout(bucket_checkpoints, **(storage_options or {}))
    step = _latest(bucket, grant_s, first_wait_s)
    if step is None:
        return collected
    fs, source_dir = bucket.fs, bucket.step_dir(step)
    base = dest / CHECKPOINTS_DIR / source_dir.rsplit("/", 1)[-1]
    for source, info in sorted(fs.find(source_dir, detail=True).items()):
        key = source[len(source_dir) + 1:]
        if info.get("islink") or info.get("type") != "file":
            collected.refused.append(f"bucket: {key!r} (not a plain file)")
            continue
        try:
            target = local_target(dest, base, key.split("/"))
        except UnsafePathError as exc:
            collected.refused.append(f"bucket: {key!r} ({exc})")
            continue
        try:
            remote = open_regular(fs, source)
        except OSError:  # swapped for a FIFO, a device or a link since the listing
            collected.refused.append(f"bucket: {key!r} (not a plain file)")
            continue
        with remote:
            if target.exists() or target.is_symlink():  # a collection run again (a takeover)
                hashed = hashlib.sha256()
                for chunk in _read(remote):
                    hashed.update(chunk)
                if not same_file_there(target, hashed.hexdigest()):
                    collected.refused.append(f"bucket: {key!r} ({target} already exists; not "
                                             "written over)")
                    continue
                digest = hashed.hexdigest()
            else:
                digest = write_verified(target, _read(remote), budget, f"bucket: {key}")
        size = target.stat().st_size
        if size != info["size"] or _sha256(target) != digest:
            raise SortieError(f"bucket: {source} and its copy {target} differ")
        collected.artifacts.append(Artifact(str(target.relative_to(dest)), size, digest,
                                            "bucket"))
    return collected
