"""A local node's processes as the kernel counts them: a cgroup (v2) of the node's own, which
everything the node starts stays in. A job that leaves its session, drops its tag, double-forks
and re-enters the host's network namespace is still found, killed and proven gone by it (the
fourth review: such a job survived `down`, which said "0 resources remain"). Only root makes
cgroups: elsewhere there is none, and a node's processes are found by their tag and tree.
A root job that moves itself out of its cgroup is not contained: the node is no machine of its
own (a booted node is, `booted/node.py`)."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
KILL_TIMEOUT_S = 10.0
RELEASE_TIMEOUT_S = 2.0  # an emptied cgroup, for its killed tasks to be released
JOIN_TIMEOUT_S = 10.0


@functools.cache  # (asked for every node's cgroup on every process listing)
def unified_hierarchy() -> Path | None:
    """Where cgroup v2 is mounted (alone, or beside v1 in a hybrid layout), if this process may
    make cgroups there."""
    for where in (CGROUP_ROOT / "unified", CGROUP_ROOT):
        if (where / "cgroup.controllers").is_file():
            return where if os.geteuid() == 0 and os.access(where, os.W_OK) else None
    return None


def joining(procs: Iterable[Path], command: list[str]) -> list[str]:
    """``command``, run by a shell that first moves itself into the cgroup of each of ``procs``
    (`cgroup.procs` files) and then becomes it. No Python runs between fork and exec: a
    `preexec_fn` runs the interpreter's fork handlers, and a Ctrl-C landing in logging's left
    its lock held and the controller hung (seen starting nodes)."""
    files = [str(path) for path in procs]
    if not files:
        return command
    script = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 1; shift; done; shift; exec "$@"'
    return ["sh", "-c", script, "sh", *files, "--", *command]


def wait_joined(process: subprocess.Popen[bytes], procs: Iterable[Path],
                timeout: float = JOIN_TIMEOUT_S) -> None:
    """Until ``process`` (started by `joining`) is in each cgroup of ``procs``, or has ended:
    from then on the cgroup holds everything it starts."""
    files, deadline = list(procs), time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        if all(process.pid in pids_in([path.parent]) for path in files):
            return
        time.sleep(0.005)


@dataclass(frozen=True)
class NodeCgroup:
    """The cgroup named ``name`` (``sortie-…``, a cluster's prefix and the node's index)."""

    name: str

    def __post_init__(self) -> None:
        if not self.name.startswith("sortie-") or "/" in self.name:
            raise ValueError(f"not a node's cgroup name: {self.name!r}")

    @property
    def path(self) -> Path | None:
        hierarchy = unified_hierarchy()
        return hierarchy / self.name if hierarchy else None

    def create(self) -> Path | None:
        """Make the cgroup; its `cgroup.procs` (what a child joins it by, `joining`), or None
        where there are no cgroups to make."""
        path = self.path
        if path is None:
            return None
        path.mkdir(exist_ok=True)
        return path / "cgroup.procs"

    def exists(self) -> bool:
        return self.path is not None and self.path.is_dir()

    def pids(self) -> set[int]:
        """Every process in the cgroup or below it."""
        return pids_in(self._groups())

    def kill(self) -> set[int]:
        """SIGKILL everything in it (`cgroup.kill`, which nothing can outrun by forking) and
        wait until the kernel has reaped them; the pids it held."""
        held = self.pids()
        spared = {os.getpid(), os.getppid()}  # a `sortie down` run on the node itself
        if held and self.path is not None and not held & spared:
            with contextlib.suppress(OSError):  # (a kernel before 5.14: one by one, below)
                (self.path / "cgroup.kill").write_text("1\n")
        deadline = time.monotonic() + KILL_TIMEOUT_S
        while (left := self.pids() - spared) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        return held - spared

    def remove(self) -> bool:
        """Remove it once empty (its children first), and what a container runtime made of
        its name in cgroup v1's hierarchies (podman's `--cgroups=split` puts a job's container
        under the node's cgroup in every hierarchy); True when it is gone."""
        hierarchy = unified_hierarchy()
        mirrors = [] if hierarchy is None else [
            top / self.name for top in CGROUP_ROOT.iterdir()
            if top != hierarchy and not top.is_symlink() and (top / self.name).is_dir()]
        remove_released(lambda: [*self._groups(), *below(mirrors)])
        return not self.exists()

    def _groups(self) -> list[Path]:
        """It and the cgroups below it, deepest first."""
        return below([self.path]) if self.path is not None and self.exists() else []


def remove_released(groups: Callable[[], list[Path]],
                    timeout: float = RELEASE_TIMEOUT_S) -> None:
    """Remove each of ``groups()`` (deepest first) that is empty. A killed task leaves
    cgroup.procs before the kernel lets its cgroup go (rmdir: EBUSY until it is reaped; seen
    once as a Ctrl-C's teardown leftover, gone a moment later): emptied cgroups are tried
    again until ``timeout``; one that still holds processes is not waited on."""
    deadline = time.monotonic() + timeout
    while True:
        for group in groups():
            with contextlib.suppress(OSError):
                group.rmdir()
        left = groups()
        if not left or pids_in(left) or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def pids_in(groups: Iterable[Path]) -> set[int]:
    """Every process in ``groups`` (each group's own, not those below it)."""
    found: set[int] = set()
    for group in groups:
        with contextlib.suppress(OSError, ValueError):
            found |= {int(pid) for pid in (group / "cgroup.procs").read_text().split()}
    return found


def below(tops: Iterable[Path]) -> list[Path]:
    """``tops`` and every cgroup below them, deepest first (as they are removed). A container's
    systemd makes and removes its own as it runs: a walk, which skips those gone meanwhile."""
    found = [Path(top) for group in tops for top, _dirs, _files in os.walk(group)]
    return sorted(found, key=lambda path: len(path.parts), reverse=True)
