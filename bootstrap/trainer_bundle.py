"""The bundled trainer as it is shipped to nodes: its tar, and its version (a hash of its
sources), which names its directory on a node (`node_layout.trainer_home`): an install never
changes files that a running job, or another node on the same file system, is reading."""

from __future__ import annotations

import functools
import hashlib
import io
import tarfile
from pathlib import Path

from sortie import trainer


def _sources() -> list[Path]:
    return sorted(Path(trainer.__file__).parent.glob("*.py"))


@functools.cache
def trainer_bundle() -> bytes:
    """The trainer package as a tar (``trainer/*.py``), built once and sent to every node.
    Uncompressed: it is a few tens of KB, and `tar -z` would start a gzip process on every
    node."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for source in _sources():
            tar.add(source, arcname=f"trainer/{source.name}")
    return buffer.getvalue()


@functools.cache
def trainer_manifest() -> str:
    """`sha256sum` lines of every file the bundle holds, as a node checks them (``sha256sum
    -c``): a trainer directory whose files differ from these is never run."""
    return "".join(f"{hashlib.sha256(source.read_bytes()).hexdigest()}  trainer/{source.name}\n"
                   for source in _sources())


@functools.cache
def trainer_version() -> str:
    """A hash of the trainer's sources (names and contents, not their times)."""
    digest = hashlib.sha256()
    for source in _sources():
        digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
