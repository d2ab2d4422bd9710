"""`sortie run --detach`: the run handed to the scheduler whole, its controller (this same `sortie
run`, less `--detach`) run inside the allocation once it starts (`stacks/slurm/detached_run.py`),
so that the shell that submitted it may end. What was asked is checked here first, as for any
run; `status`, `logs` and the run's directory then say how it goes."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from sortie.core.errors import UsageError
from sortie.engine.launch import refuse_used_run_dir
from sortie.stacks.backend import Backend

DETACH_FLAG = "--detach"


@dataclass(frozen=True)
class DetachedRun:
    """A run submitted whole: its id, its allocation's job id, where its controller writes."""

    run_id: str
    job_id: str
    controller_log: Path


def controller_argv(args: list[str], run_id: str) -> list[str]:
    """The command of the run's controller: ``args`` (this `sortie run`'s, as given) without
    --detach, named ``run_id`` (before a `--`: what follows it is the job's)."""
    split = args.index("--") if "--" in args else len(args)
    ours, theirs = [arg for arg in args[:split] if arg != DETACH_FLAG], args[split:]
    return [sys.executable, "-m", "sortie", *ours, "--name", run_id, *theirs]


def submit_detached(backend: Backend, nodes: int, run_id: str, runs_dir: Path,
                    args: list[str]) -> DetachedRun:
    """Queue the run on ``backend`` with its controller inside the allocation; UsageError
    where the backend cannot take a run whole (only Slurm's can)."""
    detached = backend.detached()
    if detached is None:
        raise UsageError(f"{DETACH_FLAG}: hands the run to a Slurm allocation (its controller "
                         f"runs in it): add --slurm NAME")
    if not args or args[0] != "run":
        raise UsageError(f"{DETACH_FLAG}: applies to `sortie run`")
    runs = runs_dir.resolve()
    refuse_used_run_dir(runs / run_id)
    runs.mkdir(parents=True, exist_ok=True)
    log = runs / f"{run_id}.controller.log"
    job_id = detached.submit_detached(run_id, nodes, controller_argv(args, run_id), Path.cwd(),
                                      log)
    return DetachedRun(run_id, job_id, log)
