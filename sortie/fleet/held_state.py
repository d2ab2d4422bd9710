"""What a held cluster's state says between commands: which run it runs now (`sortie logs NAME`
follows it), and whether `sortie down` has begun taking it away (an `exec` on it then says why
its job ended). Both are small files in the cluster's state directory."""

from __future__ import annotations

import os
from pathlib import Path

from sortie.core import naming, statefile

LAST_RUN_FILE = "last-run"  # the run id of the cluster's newest `exec`
GOING_FILE = "going"  # `sortie down` began taking the cluster away


def record_last_run(state: Path, run_id: str) -> None:
    """Say which run a held cluster runs now (or ran last), for `sortie logs NAME`."""
    statefile.write_text(state / LAST_RUN_FILE, run_id + "\n")


def last_run(state: Path) -> str | None:
    """The recorded run id; a state file is untrusted input: a regular file (never through a
    symlink), read no further than a name can be long, and a valid name, else None."""
    handle = statefile.open_regular(state / LAST_RUN_FILE)
    if handle is None:
        return None
    with handle:
        text = handle.read(128).decode(errors="replace").strip()
    return text if naming.NAME.fullmatch(text) else None


def mark_going(state: Path) -> None:
    """Say, before anything is stopped, that `sortie down` takes the held cluster whose state
    is ``state`` away: an `exec` running on it then says why its job ended (`went_during`)."""
    if state.is_dir():
        statefile.write_text(state / GOING_FILE, "")


def went_during(state: Path, since: float) -> bool:
    """Whether `sortie down` took the held cluster whose state is ``state`` away (or began to)
    after ``since``, a wall-clock time."""
    handle = statefile.open_regular(state / GOING_FILE)
    if handle is None:  # never marked, or the directory is gone (removed in one step)
        return not state.exists()
    with handle:  # an earlier `down` that left the cluster up (a node it could not reach)
        return os.fstat(handle.fileno()).st_mtime >= since
