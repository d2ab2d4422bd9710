"""Where checkpoints live and which are complete (see `trainer.checkpoint` for the layout).

Nothing here imports torch: the controller reads a bucket's checkpoints with it (collection)
without paying for torch's import.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import IO, Any

STEP_DIR = re.compile(r"step-(\d{8})$")
MAX_META_BYTES = 1 << 16  # meta.json: a step and a world size, tens of bytes
MAX_WORLD_SIZE = 1 << 16  # ranks whose done markers a checkpoint's completeness asks for


class NotRegularFileError(OSError):
    """A bucket's entry that is a FIFO, a device or a link: never opened as a file."""


def open_regular(fs: Any, path: str) -> IO[bytes]:
    """``path`` opened for reading only if it is a regular file. A bucket on a local disk is
    written by the nodes (untrusted): a FIFO there would block its reader forever, a link to
    /dev/zero feed it without end; opened without following a link and without blocking, then
    checked, a swap after a listing changes nothing. An object store holds only objects."""
    from fsspec.implementations.local import LocalFileSystem  # loaded where a bucket is read

    if not isinstance(fs, LocalFileSystem):
        return fs.open(path, "rb")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegularFileError(f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


class CheckpointLayout:
    """The step directories under a path or fsspec URL, and which of them are complete."""

    def __init__(self, url: str, **storage_options: Any) -> None:
        import fsspec

        self.fs, self.root = fsspec.core.url_to_fs(url, **storage_options)

    def step_dir(self, step: int) -> str:
        return f"{self.root.rstrip('/')}/step-{step:08d}"

    def _steps(self) -> list[int]:
        self.fs.invalidate_cache(self.root)  # object-store listings are cached; other ranks write
        if not self.fs.exists(self.root):
            return []
        names = (p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False))
        return sorted(int(m.group(1)) for m in map(STEP_DIR.match, names) if m)

    def _is_complete(self, step: int) -> bool:
        directory = self.step_dir(step)
        try:
            with open_regular(self.fs, f"{directory}/meta.json") as handle:
                meta = json.loads(handle.read(MAX_META_BYTES + 1)[:MAX_META_BYTES])
            world = meta["world_size"]
        except (OSError, ValueError, TypeError, KeyError):  # missing, or not one we wrote
            return False
        if type(world) is not int or not 0 < world <= MAX_WORLD_SIZE:
            return False
        return all(self.fs.exists(f"{directory}/done-rank{r:05d}") for r in range(world))

    def latest(self) -> int | None:
        """The step of the newest complete checkpoint, or None."""
        complete = [s for s in self._steps() if self._is_complete(s)]
        return complete[-1] if complete else None

