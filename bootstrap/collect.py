"""Copy a run's artifacts and logs from the nodes to the controller, before teardown, and prove
each copy: its SHA-256 must match the node's file (a mismatched copy is made once more)."""

from __future__ import annotations

import hashlib
import shlex
import stat
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from fabric import Connection

from bootstrap.ssh import NodeError
from bootstrap.train import run_dir
from stacks.errors import SortieError
from stacks.inventory import Node


@dataclass(frozen=True)
class Artifact:
    """One verified file under the run's artifacts directory."""

    path: str  # relative to the artifacts directory
    bytes: int
    sha256: str
    node: str

    def to_json(self) -> dict:
        return asdict(self)


def _remote_files(conn: Connection, remote: PurePosixPath, local: Path
                  ) -> list[tuple[PurePosixPath, Path]]:
    """(node file, controller file) pairs under ``remote``, skipping unfinished writes."""
    try:
        entries = conn.sftp().listdir_attr(str(remote))
    except FileNotFoundError:
        return []
    found: list[tuple[PurePosixPath, Path]] = []
    for entry in entries:
        source, target = remote / entry.filename, local / entry.filename
        if stat.S_ISDIR(entry.st_mode or 0):
            found += _remote_files(conn, source, target)
        elif not entry.filename.endswith(".tmp"):  # an interrupted atomic write, never a result
            found.append((source, target))
    return found


def _remote_digests(conn: Connection, node: Node, files: list[PurePosixPath]) -> dict[str, str]:
    """SHA-256 of each node file, in one round trip."""
    if not files:
        return {}
    result = conn.run("sha256sum -- " + " ".join(shlex.quote(str(f)) for f in files))
    if not result.ok:
        raise NodeError(f"{node.name}: hashing the artifacts failed: {result.stderr.strip()}")
    digests = {}
    for line in result.stdout.splitlines():
        digest, _, name = line.partition("  ")
        digests[name] = digest
    return digests


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def collect(conn: Connection, node: Node, run_id: str, dest: Path,
            outputs_to: Path | None = None) -> list[Artifact]:
    """Copy the node's trainer outputs into ``outputs_to`` (default ``dest``) and its torchrun
    log to ``dest/logs``, verifying every file. Raises NodeError when a file still differs after
    a second copy.

    Rank 0 writes the outputs on whichever node the rendezvous placed it, so normally one node
    has them all; after a recovery an earlier rank 0's node may hold older ones too."""
    remote = PurePosixPath(run_dir(node, run_id))
    pairs = _remote_files(conn, remote / "out", outputs_to or dest)
    log = remote / "torchrun.log"
    if _exists(conn, log):  # absent when torchrun never started on this node
        pairs.append((log, dest / "logs" / f"{node.name}.log"))
    digests = _remote_digests(conn, node, [source for source, _ in pairs])
    sftp, verified = conn.sftp(), []
    for source, target in pairs:
        expected = digests[str(source)]
        target.parent.mkdir(parents=True, exist_ok=True)
        for _attempt in range(2):
            sftp.get(str(source), str(target))
            if _sha256(target) == expected:
                break
        else:
            raise NodeError(f"{node.name}: {source} still differs from its copy {target} "
                            "after two copies")
        verified.append(Artifact(str(target.relative_to(dest)), target.stat().st_size,
                                 expected, node.name))
    return verified


def _exists(conn: Connection, path: PurePosixPath) -> bool:
    try:
        conn.sftp().stat(str(path))
    except FileNotFoundError:
        return False
    return True


def collect_checkpoint(bucket_checkpoints: str, dest: Path) -> list[Artifact]:
    """Copy the newest complete checkpoint from the cluster's bucket (any fsspec URL or a
    directory) into ``dest/checkpoints/``. Each copy must have the size the bucket lists, and
    its SHA-256 must match the bytes read from the bucket."""
    from trainer.checkpoint import Checkpointer  # imports torch: only when collecting

    bucket = Checkpointer(bucket_checkpoints, rank=0, world_size=1)
    step = bucket.latest()
    if step is None:
        return []
    fs, source_dir = bucket.fs, bucket.step_dir(step)
    target_dir = dest / "checkpoints" / source_dir.rsplit("/", 1)[-1]
    target_dir.mkdir(parents=True, exist_ok=True)
    copied = []
    for source, info in sorted(fs.find(source_dir, detail=True).items()):
        target = target_dir / source[len(source_dir) + 1:]
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        with fs.open(source, "rb") as remote, tempfile.NamedTemporaryFile(
                dir=target.parent, delete=False) as local:
            for block in iter(lambda r=remote: r.read(1 << 20), b""):
                digest.update(block)
                local.write(block)
        Path(local.name).replace(target)
        if target.stat().st_size != info["size"] or _sha256(target) != digest.hexdigest():
            raise SortieError(f"bucket: {source} and its copy {target} differ")
        copied.append(Artifact(str(target.relative_to(dest)), info["size"], digest.hexdigest(),
                               "bucket"))
    return copied
