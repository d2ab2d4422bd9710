"""What a Slurm lab's users see of this machine: its file system, except that the directories on
the way to what they run (this controller's Python, its checkout) are ones they may enter, and
the lab's own files stay in sight through them.

A site keeps its Python on a shared disk every user reads; this machine's may sit under a
directory only root enters (`/root/.pyenv`), and so may the lab's own directory (in root's
`$SORTIE_HOME`, `/root/.sortie`: covered too, the lab's daemons found none of their files). The
lab's daemons and its login node then run in a mount namespace of their own (held by a process
that only sleeps) where each such directory is covered by an empty one that others may enter (a
tmpfs, mode 0711), with only the ways down bound back: nothing on this machine changes, and
nothing else of that directory shows.
"""

from __future__ import annotations

import shlex
import stat
from collections.abc import Iterable
from pathlib import Path


def closed_ways(paths: Iterable[Path], kept: Iterable[Path] = ()
                ) -> list[tuple[Path, list[str]]]:
    """(a directory others may not enter, the entries under it on the way) for every such
    directory on the way to ``paths``, outermost first; where one of them holds a path of
    ``kept``, the way down to it too (no other directory is covered for its sake)."""
    found: dict[Path, list[str]] = {}

    def way_down(path: Path, cover: bool) -> None:
        parts = path.resolve().parts
        for depth in range(1, len(parts) - 1):
            here = Path(*parts[:depth + 1])
            if here in found or (cover and not here.stat().st_mode & stat.S_IXOTH):
                entries = found.setdefault(here, [])
                if parts[depth + 1] not in entries:
                    entries.append(parts[depth + 1])

    for path in paths:
        way_down(path, cover=True)
    for path in kept:
        way_down(path, cover=False)
    return sorted(found.items(), key=lambda item: len(item[0].parts))


def view_script(ways: list[tuple[Path, list[str]]], staging: Path) -> str:
    """Shell commands, run as root in a new mount namespace, that open ``ways``: each
    directory's entries bound aside, the directory covered, the entries bound back."""
    lines = [f"mkdir -p {shlex.quote(str(staging))}"]
    for index, (directory, entries) in enumerate(ways):
        kept = []
        for number, entry in enumerate(entries):
            aside = shlex.quote(str(staging / f"{index}-{number}"))
            below = shlex.quote(str(directory / entry))
            make = "mkdir" if (directory / entry).is_dir() else "touch"  # (a bind needs its kind)
            lines += [f"{make} {aside}", f"mount --bind {below} {aside}"]
            kept.append((make, aside, below))
        lines.append(f"mount -t tmpfs -o mode=0711 sortie-lab-view {shlex.quote(str(directory))}")
        for make, aside, below in kept:
            lines += [f"{make} {below}", f"mount --bind {aside} {below}"]
    return "\n".join(lines)
