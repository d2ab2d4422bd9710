"""`sortie run`: one whole sortie on a new cluster, torn down whatever happens. Launch is all or
nothing, tried per the backend's placements (zones, then on-demand), each failed attempt said
and put on the run's timeline."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from sortie.core import statefile
from sortie.core.errors import UsageError
from sortie.core.inventory import Inventory
from sortie.core.naming import check_name
from sortie.core.progress import Reporter
from sortie.engine.driver import Driver
from sortie.engine.job_files import write_task
from sortie.engine.request import RunRequest, new_run_id
from sortie.rundir.result import RunResult
from stacks.backend import Backend, LaunchError
from stacks.local import LocalBackend
from stacks.records import Job, heartbeat


def run_sortie(request: RunRequest, reporter: Reporter,
               backend: Backend | None = None) -> RunResult:
    """Run one whole sortie and tear it down whatever happens. Returns what happened;
    raises SortieError for failures before training and KeyboardInterrupt on a signal."""
    backend = backend or LocalBackend()
    run_id = check_name(request.run_id) if request.run_id else new_run_id()
    result = RunResult(run_id=run_id, nodes=request.nodes,
                       ranks=request.nodes * request.procs_per_node,
                       artifacts=request.runs_dir / run_id)
    refuse_used_run_dir(result.artifacts)
    # The name is this sortie's before anything is created or claimed; a launch that loses it
    # to another sortie stops here, touching nothing of the winner's (no claim, no `down`).
    backend.reserve(run_id)
    job = job_record(request, run_id)
    driver = Driver(backend, reporter, request, result, job)
    write_task(request, result)
    with heartbeat(lambda: backend.claim(run_id)):
        try:
            with driver.phase("up", f"Starting {request.nodes} {backend.name} nodes"):
                driver.inventory = launch(backend, run_id, request.nodes,
                                          result.launch_failures, reporter,
                                          driver.timeline_retry)
            backend.save_job(run_id, job)
            driver.bootstrap("Bootstrapping nodes: SSH (pinned host keys), checks, trainer")
            driver.ready_user_job()
            driver.train()
        finally:
            driver.finish()
    return result


def refuse_used_run_dir(path: Path) -> None:
    """A new run never writes into an earlier run's directory (its summary, metrics and
    checkpoints would mix into this run's report), and its directory can be made: found out
    before launch, not when the artifacts arrive."""
    if path.exists() or path.is_symlink():
        raise UsageError(f"--name {path.name!r}: {path} already holds an earlier run; choose "
                         "another name, or move that directory away")
    existing = statefile.first_existing(path)
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--runs-dir {path.parent}: cannot be made ({existing} is not a "
                         "directory this user can write in)")


def job_record(request: RunRequest, run_id: str) -> Job:
    """What is recorded of the job: enough for another controller to relaunch it."""
    runs_dir = str(request.runs_dir.resolve())
    user = request.user_job
    if user is None:
        return Job(run_id=run_id, procs_per_node=request.procs_per_node, runs_dir=runs_dir,
                   trainer_args=("--steps", str(request.steps), "--ckpt-every",
                                 str(request.ckpt_every), *request.trainer_args))
    return Job(run_id=run_id, procs_per_node=request.procs_per_node, runs_dir=runs_dir,
               script=user.script, script_args=user.script_args, run=user.run, env=user.env,
               secret_names=tuple(user.secrets))


def launch(backend: Backend, cluster_id: str, nodes: int, failures: list[str],
           reporter: Reporter,
           failed_attempt: Callable[[float, float], None] = lambda start, end: None
           ) -> Inventory:
    """All or nothing, per placement in the backend's order; says why each attempt failed (and
    adds it to ``failures``; ``failed_attempt`` gets when it started and ended)."""
    for attempt, placement in enumerate(backend.placements(), 1):
        started = time.perf_counter()
        try:
            return backend.up(cluster_id, nodes, placement)
        except LaunchError as exc:
            failed_attempt(started, time.perf_counter())
            reason = f"attempt {attempt} ({placement.describe()}): {exc}"
            failures.append(reason)
            reporter.note(f"launch failed ({reason}); the partial cluster was removed")
    raise LaunchError(f"no launch attempt brought up all {nodes} nodes: " + "; ".join(failures))
