"""Where checkpoints live and which are complete (see `trainer.checkpoint` for the layout).

Nothing here imports torch: the controller reads a bucket's checkpoints with it (collection)
without paying for torch's import.
"""

from __future__ import annotations

import json
import re

import fsspec

STEP_DIR = re.compile(r"step-(\d{8})$")


class CheckpointLayout:
    """The step directories under a path or fsspec URL, and which of them are complete."""

    def __init__(self, url: str) -> None:
        self.fs, self.root = fsspec.core.url_to_fs(url)

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
            meta = json.loads(self.fs.cat_file(f"{directory}/meta.json"))
        except FileNotFoundError:
            return False
        return all(self.fs.exists(f"{directory}/done-rank{r:05d}")
                   for r in range(meta["world_size"]))

    def latest(self) -> int | None:
        """The step of the newest complete checkpoint, or None."""
        complete = [s for s in self._steps() if self._is_complete(s)]
        return complete[-1] if complete else None

