"""Where this controller keeps its state."""

from __future__ import annotations

import os
from pathlib import Path

from sortie.core import statefile
from sortie.core.errors import UsageError
from sortie.core.userfile import user_path

HOME_ENV = "SORTIE_HOME"


def sortie_home() -> Path:
    """Where this controller keeps its state: $SORTIE_HOME (default ~/.sortie), made absolute
    once (a relative one would name another directory from every other directory), and a
    directory or not yet there; a UsageError naming SORTIE_HOME otherwise."""
    given = os.environ.get(HOME_ENV)
    if given is None:
        return Path.home() / ".sortie"
    if not given.strip() or not given.isprintable():
        raise UsageError(f"{HOME_ENV}: {given!r} is not a directory name; unset it for "
                         "~/.sortie")
    if not given.startswith("~") and not os.path.isabs(given):  # (`~/state` is not relative)
        # Each command would read it from its own working directory: `sortie down` from
        # another directory would find no sortie, while its nodes run.
        raise UsageError(f"{HOME_ENV}: {given[:100]!r} is relative, and every command would "
                         "find another home from another directory: give an absolute path "
                         f"(\"$PWD/{given[:60]}\")")
    home = user_path(given, HOME_ENV)
    existing = statefile.first_existing(home)
    if not existing.is_dir():
        raise UsageError(f"{HOME_ENV}: {existing} is not a directory"
                         + (f" (so {home} cannot be one)" if existing != home else ""))
    return home


def setting(env: str, choices: tuple[str, ...]) -> str:
    """A setting this controller reads from the environment: one of ``choices`` (unset or
    empty: the first, the default); a UsageError naming the variable otherwise."""
    value = os.environ.get(env, "") or choices[0]
    if value not in choices:
        rest = " or ".join(choices[1:])
        raise UsageError(f"{env}: {value!r}: use {choices[0]} (the default) or {rest}")
    return value
