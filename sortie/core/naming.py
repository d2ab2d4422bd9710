"""Sortie names, and the controller directories they name.

A sortie's name becomes a directory under ``$SORTIE_HOME`` (``clusters/<name>``,
``stacks/<name>``) that teardown later removes, so a name is checked before it touches the disk:
the same rule for `--name` and for every command that takes a NAME, matched in full (``re.match``
with ``$`` would let ``"abc\\n"`` through), and the directory must resolve inside its parent (no
``..``, no absolute path, no symlink out).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from sortie.core.errors import UsageError

# $SORTIE_HOME's directories: local clusters, cloud sorties, local buckets a teardown kept,
# clusters sortie did not create (`sortie attach`).
CLUSTERS, STACKS, KEPT, ATTACHED = "clusters", "stacks", "kept", "attached"
# The user's own stack profile directories, looked in before the shipped ones (`--profiles`).
PROFILES_ENV = "SORTIE_PROFILES"

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


TAKEN_FILE = "taken"  # in every state directory from its first instant: who took the name
ABANDONED_S = 300.0  # a half-made directory this old is a launch killed as it began


def take(parent: Path, name: str, files: dict[str, str] | None = None) -> Path:
    """Make ``parent/name``, a new sortie's state directory, with ``files`` already in it, in
    one atomic step (made aside, then renamed into place, which fails if a sortie has it):
    the name is this process's if it did (NameTakenError if not). A launch killed at any point
    leaves either no directory or a whole one; what a killed one made aside is cleared later
    (as is what a killed `remove` left)."""
    path = state_dir(parent, name)
    parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    for old in [*parent.glob(f".taking-{name}-*"), *parent.glob(f".removing-{name}-*")]:
        with contextlib.suppress(OSError):
            if time.time() - old.stat().st_mtime > ABANDONED_S:
                shutil.rmtree(old)
    aside = Path(tempfile.mkdtemp(dir=parent, prefix=f".taking-{name}-"))
    try:
        (aside / TAKEN_FILE).write_text(f"{os.getpid()} {time.time():.0f}\n")
        for file_name, text in (files or {}).items():
            (aside / file_name).write_text(text)
            os.chmod(aside / file_name, 0o600)
        os.rename(aside, path)  # onto a directory with anything in it: refused
    except OSError as exc:
        shutil.rmtree(aside, ignore_errors=True)
        if path.exists():
            raise NameTakenError(name) from None
        raise UsageError(f"--name {name!r}: cannot make {path} ({exc.strerror})") from None
    return path


def remove(path: Path, ignore_errors: bool = False) -> None:
    """Remove a state directory in one step that readers see: renamed aside (a dot name, which
    no listing shows) before its files go, so a reader finds the whole directory or none (an
    `exec` asking whether `sortie down` took its cluster away never sees it half gone). An
    OSError's filename names the directory left, unless ``ignore_errors``; what a killed call
    left aside, the next `take` of the name clears."""
    aside = path.with_name(f".removing-{path.name}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # gone already (another `down`)
    except OSError:
        if ignore_errors:
            return
        raise
    try:
        shutil.rmtree(aside)
    except OSError as exc:
        if not ignore_errors:
            raise OSError(exc.errno, exc.strerror, str(aside)) from exc
