"""Sortie names, and the controller directories they name.

A sortie's name becomes a directory under ``$SORTIE_HOME`` (``clusters/<name>``,
``stacks/<name>``) that teardown later removes, so a name is checked before it touches the disk:
the same rule for `--name` and for every command that takes a NAME, matched in full (``re.match``
with ``$`` would let ``"abc\\n"`` through), and the directory must resolve inside its parent (no
``..``, no absolute path, no symlink out).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from bootstrap.errors import UsageError

# $SORTIE_HOME's directories: local clusters, cloud sorties, local buckets a teardown kept,
# clusters sortie did not create (`sortie attach`).
CLUSTERS, STACKS, KEPT, ATTACHED = "clusters", "stacks", "kept", "attached"

NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
NAME_RULE = "1-63 lowercase letters, digits and dashes, starting with a letter or digit"


def check_name(name: str, field: str = "--name") -> str:
    """``name`` if it is a valid sortie name, else a UsageError naming ``field``."""
    if not NAME.fullmatch(name):
        raise UsageError(f"{field} {name!r}: use {NAME_RULE}")
    return name


def state_dir(parent: Path, name: str, field: str = "NAME") -> Path:
    """``parent/name``, refusing a name that is not a sortie name or a directory that resolves
    anywhere but directly inside ``parent`` (a symlink planted there, say)."""
    path = parent / check_name(name, field)
    if path.is_symlink() or (path.exists() and path.resolve().parent != parent.resolve()):
        raise UsageError(f"{field} {name!r}: {path} is not a directory sortie made; "
                         "refusing to touch it")
    return path


def names_in(parent: Path) -> list[str]:
    """The sortie directories in ``parent``: real directories with valid names only."""
    if not parent.is_dir():
        return []
    return sorted(p.name for p in parent.iterdir()
                  if NAME.fullmatch(p.name) and p.is_dir() and not p.is_symlink())


class NameTakenError(UsageError):
    """Another sortie already has the name: this launch created nothing and touches nothing."""

    def __init__(self, name: str, where: str = "") -> None:
        super().__init__(f"--name {name!r}: a sortie of that name already exists{where}; "
                         "choose another name (`sortie status` lists them)")


ABANDONED_S = 300.0  # an empty state directory this old is a launch killed as it began


def take(parent: Path, name: str) -> Path:
    """Make ``parent/name``, a new sortie's state directory, in one atomic step: the name is
    this process's if it did (NameTakenError if it was there). An empty one left by a launch
    killed right after taking its name is taken back once it is ABANDONED_S old."""
    path = state_dir(parent, name)
    parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    for _attempt in range(2):
        try:
            path.mkdir(mode=0o700)
            return path
        except FileExistsError:
            try:
                abandoned = not any(path.iterdir()) and \
                    time.time() - path.stat().st_mtime > ABANDONED_S
                if abandoned:
                    path.rmdir()  # empty: nothing of anyone's is lost
                    continue
            except OSError:
                pass
            raise NameTakenError(name) from None
    raise NameTakenError(name)
