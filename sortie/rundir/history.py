"""Every run this controller started, wherever its directory is: one small file per run in
``$SORTIE_HOME/history/``, written when the run starts (state ``running``) and again when it
ends (its outcome). `sortie runs` lists them; `logs`, `report` and `run RUN` find a run's
directory from its id here, from any directory.

A run is keyed by its id and its directory: two directories may each hold a run of one name
(`./runs/exp` in two projects), and both are listed. What the files say is read as untrusted
(another process, an older sortie, a hand edit): each is validated and capped, and one that
does not read is skipped, never fatal.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from sortie.core import statefile
from sortie.core.errors import SortieError, UsageError
from sortie.core.naming import NAME
from sortie.core.statefile import EpochSeconds
from sortie.rundir.result import RunResult
from sortie.stacks.records import Process

HISTORY = "history"
MAX_RUNS = 100_000  # read no more entries than this
MAX_ENTRY_BYTES = 16 << 10

# How a run ended (`outcome`), or "running" while its controller runs it ("queued" while it
# waits for its held cluster, `sortie exec`).
State = Literal["queued", "running", "succeeded", "failed", "interrupted", "budget", "hung",
                "cluster gone"]


class RunEntry(BaseModel):
    id: str = Field(pattern=f"^{NAME.pattern}$")
    kind: Literal["run", "exec"]  # a whole sortie, or a job on a held or attached cluster
    cluster: str = Field(pattern=f"^{NAME.pattern}$")  # a `run`'s cluster is named as the run
    backend: str = Field(max_length=40)
    job: str = Field(max_length=300)  # what ran, in a few words
    directory: str = Field(max_length=4096)  # absolute: runs/<id>/ as its controller saw it
    state: State
    started: EpochSeconds
    ended: EpochSeconds | None = None
    cost_usd: float | None = Field(default=None, ge=0, le=1e9, allow_inf_nan=False)
    controller: Process | None = None  # the process that runs it, while it runs

    @property
    def file_name(self) -> str:
        where = hashlib.sha256(self.directory.encode()).hexdigest()[:8]
        return f"{self.id}.{where}.json"

    def shown_state(self) -> str:
        """The state, with a running (or queued) entry whose controller is gone said as such (a
        controller killed before it could write how the run ended: `sortie watch` or `reap`
        takes such a sortie over). Another machine's controller is not ours to ask."""
        if self.state not in ("running", "queued") or self.controller is None:
            return self.state
        return "controller gone" if self.controller.here() and not self.controller.alive() \
            else self.state


def record(home: Path, entry: RunEntry) -> str | None:
    """Keep ``entry`` (replacing the same run's earlier one). Never raises: a run is not
    undone by its history line; returns why it was not kept. A run another controller took
    over (`watch`, `reap`) keeps the start its first controller wrote."""
    path = home / HISTORY / entry.file_name
    with contextlib.suppress(Exception):
        earlier = statefile.read_untrusted_model(RunEntry, path, MAX_ENTRY_BYTES)
        entry = entry.model_copy(update={"started": min(earlier.started, entry.started)})
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        statefile.write_text(path, entry.model_dump_json())
    except OSError as exc:
        return f"the run history could not be written ({exc.strerror or exc})"
    except SortieError as exc:
        return f"the run history could not be written ({exc})"
    return None


def read_history(home: Path) -> list[RunEntry]:
    """Every run kept, oldest first; unreadable entries skipped."""
    folder = home / HISTORY
    try:
        names = sorted(p for p in os.listdir(folder) if p.endswith(".json"))[:MAX_RUNS]
    except OSError:
        return []
    entries = []
    for name in names:
        try:
            entries.append(statefile.read_untrusted_model(RunEntry, folder / name,
                                                          MAX_ENTRY_BYTES))
        except Exception:  # noqa: BLE001,S112 - a bad entry is one run not listed
            continue
    return sorted(entries, key=lambda e: e.started)


def find_entry(home: Path, entry: RunEntry) -> RunEntry | None:
    """``entry`` as it is kept now (another process may have written it since)."""
    try:
        return statefile.read_untrusted_model(RunEntry, home / HISTORY / entry.file_name,
                                              MAX_ENTRY_BYTES)
    except Exception:  # noqa: BLE001 - gone or unreadable: not there
        return None


def find_run(home: Path, run_id: str, made: bool = True) -> RunEntry | None:
    """The newest run of id ``run_id`` whose directory is still there (``made`` False: made
    yet or not, a run just starting)."""
    found = [e for e in read_history(home)
             if e.id == run_id and (not made or Path(e.directory).is_dir())]
    return found[-1] if found else None


def run_directory(home: Path, run: str, runs_dir: Path, marker: str) -> Path:
    """``run``: a run directory's path (holding ``marker``), a run id in ``runs_dir``, or a
    run id in this controller's history; a UsageError naming RUN otherwise."""
    path = Path(run)
    if path.is_dir() and (path / marker).is_file():
        return path
    plain = "/" not in run and run not in (".", "..")
    if plain and (runs_dir / run).is_dir():
        return runs_dir / run
    entry = find_run(home, run) if plain else None
    if entry is not None:
        return Path(entry.directory)
    where = f"{path}: no {marker} there" if path.is_dir() else \
        f"no run directory {runs_dir / run}, none in the run history and no directory {path}"
    raise UsageError(f"RUN: {where} (`sortie runs` lists every run)")


def runs_dir_of(home: Path, run_id: str, runs_dir: Path) -> Path:
    """Where run ``run_id``'s directory is: ``runs_dir`` when it holds one, else the
    directory the run history names for it, else ``runs_dir``."""
    if (runs_dir / run_id).exists() or "/" in run_id:
        return runs_dir
    entry = find_run(home, run_id)
    return Path(entry.directory).parent if entry else runs_dir


def select(entries: list[RunEntry], cluster: str | None = None,
           state: str | None = None) -> list[RunEntry]:
    """The entries of one cluster, in one shown state."""
    return [e for e in entries
            if (cluster is None or e.cluster == cluster)
            and (state is None or e.shown_state() == state)]


def outcome(result: RunResult) -> State:
    """How ``result``'s run ended, in one word of `State`."""
    if result.trained:
        return "succeeded"
    return "interrupted" if result.interrupted else "budget" if result.budget_reached else \
        "cluster gone" if result.cluster_went else "hung" if result.hung else "failed"
