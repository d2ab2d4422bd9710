"""Sortie names, and the controller directories they name.

A sortie's name becomes a directory under ``$SORTIE_HOME`` (``clusters/<name>``,
``stacks/<name>``) that teardown later removes, so a name is checked before it touches the disk:
the same rule for `--name` and for every command that takes a NAME, matched in full (``re.match``
with ``$`` would let ``"abc\\n"`` through), and the directory must resolve inside its parent (no
``..``, no absolute path, no symlink out).
"""

from __future__ import annotations

import re
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
