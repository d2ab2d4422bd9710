"""The controller's side of collection: where a node's file may land, how it is written (never
over or through a file already there: ``O_EXCL | O_NOFOLLOW``), the byte budget all nodes and
the bucket share, and the manifest of what was copied with each file's SHA-256.

Every name comes from a node or a bucket and is untrusted: one plain path component each, and
every file inside the run's directory."""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

import pydantic

from sortie.bootstrap.choices import DEFAULT_MAX_BYTES
from sortie.core import statefile
from sortie.core.errors import SortieError
from sortie.core.sizes import human_bytes

# Where nodes' files land in runs/<id>/, apart from what the controller writes there: the outputs
# of the node that ran rank 0 (a user job: the head) in artifacts/, any other node's in
# nodes/<node>/, the torchrun logs in logs/<node>.log, the bucket's checkpoint in checkpoints/.
ARTIFACTS_DIR, NODES_DIR, LOGS_DIR, CHECKPOINTS_DIR = "artifacts", "nodes", "logs", "checkpoints"
CHUNK = 1 << 20
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@pydantic.dataclasses.dataclass(frozen=True)
class Artifact:
    """One verified file under the run's artifacts directory."""

    path: str  # relative to the artifacts directory
    bytes: int
    sha256: str
    node: str


class Manifest(pydantic.BaseModel):
    """``manifest.json``: every collected file with its size and SHA-256, as verified."""

    run_id: str
    algorithm: Literal["sha256"] = "sha256"
    files: list[Artifact]


def write_manifest(dest: Path, run_id: str, artifacts: list[Artifact]) -> None:
    statefile.write_text(dest / "manifest.json",
                         Manifest(run_id=run_id, files=artifacts).model_dump_json(indent=2),
                         statefile.RUN_FILE_MODE)


@dataclass
class Collected:
    """What one node (or the bucket) gave: verified files, and what was refused and why."""

    artifacts: list[Artifact] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # "node-0: 'out/link' (a symlink)"


class CollectLimitError(SortieError):
    """The run's artifacts are larger than the cap; the message says how to raise it."""


class UnsafePathError(SortieError):
    """A name that would place a file outside the run's directory."""


class Budget:
    """The bytes the whole collection may still copy, shared by every node and the bucket."""

    def __init__(self, limit: int = DEFAULT_MAX_BYTES) -> None:
        self.limit, self.used = limit, 0
        self._lock = threading.Lock()

    def take(self, count: int, what: str) -> None:
        with self._lock:
            if self.used + count > self.limit:
                raise CollectLimitError(
                    f"the artifacts exceed --max-artifacts {human_bytes(self.limit)} (at {what}); "
                    "nothing more was copied; raise --max-artifacts to collect them all")
            self.used += count


def is_plain_name(name: str) -> bool:
    """One path component that stays where it is joined: not empty, `.`, `..`, no `/`, no NUL."""
    return name not in ("", ".", "..") and "/" not in name and "\0" not in name


def local_target(dest: Path, base: Path, parts: Sequence[str]) -> Path:
    """``base/parts...`` for names a node or a bucket handed us, with its parent directories
    created; refused unless every part is a plain name and the parent resolves inside ``dest``
    (no symlinked directory on the way)."""
    bad = [part for part in parts if not is_plain_name(part)]
    if bad or not parts:
        raise UnsafePathError(f"{bad[0] if bad else ''!r} is not a plain file name")
    target = base.joinpath(*parts)
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.parent.resolve().is_relative_to(dest.resolve()):
        raise UnsafePathError(f"{target.parent} resolves outside {dest}")
    return target


def write_verified(target: Path, chunks: Iterable[bytes], budget: Budget, what: str) -> str:
    """Write ``chunks`` to a new file at ``target`` (never over an existing file, never through
    a symlink), charging the budget as bytes arrive; return their SHA-256."""
    digest = hashlib.sha256()
    try:
        fd = os.open(target, WRITE_FLAGS, 0o644)
    except FileExistsError:
        raise UnsafePathError(f"{target} already exists; not written over") from None
    except OSError as exc:  # ELOOP: a symlink sits where the file goes
        raise UnsafePathError(f"{target}: cannot create it ({exc.strerror})") from None
    with os.fdopen(fd, "wb") as out:
        for chunk in chunks:
            budget.take(len(chunk), what)
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _read(handle: IO[bytes]) -> Iterator[bytes]:
    yield from iter(lambda: handle.read(CHUNK), b"")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        for block in _read(handle):
            digest.update(block)
    return digest.hexdigest()


def same_file_there(target: Path, digest: str | None) -> bool:
    """Whether ``target`` is already a regular file with this SHA-256: a collection run again
    (a controller taking over one that died while collecting) keeps it as it is."""
    try:
        return digest is not None and stat.S_ISREG(target.lstat().st_mode) \
            and _sha256(target) == digest
    except OSError:
        return False
