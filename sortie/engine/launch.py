"""`sortie run`: one whole sortie on a new cluster, torn down whatever happens. Launch is all or
nothing, tried per the backend's placements (zones, then on-demand), each failed attempt said
and put on the run's timeline."""

from __future__ import annotations

import os
import time
from pathlib import Path

from sortie.core import statefile
from sortie.core.errors import Interrupted, UsageError
from sortie.core.progress import Reporter
from sortie.cost.ledger import CostEntry, record_cost
from sortie.engine.driver import Driver
from sortie.engine.job_files import write_task
from sortie.engine.request import RunRequest, new_run_id
from sortie.rundir.result import RunResult
from sortie.stacks.backend import Backend
from sortie.stacks.records import heartbeat


def run_sortie(request: RunRequest, reporter: Reporter,
               backend: Backend | None = None) -> RunResult:
    """Run one whole sortie and tear it down whatever happens. Returns what happened;
    raises SortieError for failures before training and KeyboardInterrupt on a signal."""
    if backend is None:  # local nodes (loaded only then: a held cluster's job needs none)
        from sortie.stacks.local.local_backend import LocalBackend

        backend = LocalBackend()
    run_id = request.run_id or new_run_id()
    driver = Driver.to_launch(backend, reporter, request, run_id)
    result = driver.result
    refuse_used_run_dir(result.artifacts)
    # The name is this sortie's before anything is created or claimed; a launch that loses it
    # to another sortie stops here, touching nothing of the winner's (no claim, no `down`).
    backend.reserve(run_id)
    write_task(request, result)
    driver.remember()
    with heartbeat(lambda: backend.claim(run_id)):
        try:
            with driver.stoppable():
                driver.up()
                driver.bootstrap(f"Bootstrapping nodes: {backend.ssh_wait.via}, checks, "
                                 "trainer")
                driver.check_health()
                driver.ready_user_job()
                driver.train()
        finally:
            driver.finish()
            cost = run_cost(driver)
            # A launch refused before any node was held (a Slurm allocation refused while
            # queued) cost nothing and was no run: no line in the ledger.
            unkept = record_cost(backend.home, cost, backend.backend_url) \
                if driver.inventory is not None or cost.cost else None
            if unkept:
                reporter.note(unkept)
            if result.interrupted:  # replaces the interruption in flight, saying what it left
                down = [result.teardown.summary()] if result.teardown else []
                raise Interrupted(result.interrupted, [*down, *result.where_recorded()]) \
                    from None  # noqa: B012
    return result


def run_cost(driver: Driver) -> CostEntry:
    """The cost line of a whole sortie, from its launch to its teardown, at its launch terms."""
    request, backend = driver.request, driver.backend
    return CostEntry(name=driver.result.run_id, kind="run", backend=backend.name,
                     profile=backend.profile, owner=backend.owner,
                     nodes=request.nodes, usd_per_hour=request.pricing.usd_per_hour or 0.0,
                     terms=request.pricing.terms, started=driver.started_at,
                     ended=driver.ended_at or time.time(),  # (the summary's spend: the same)
                     accounted_s=teardown.accounted_s if (teardown := driver.result.teardown)
                     else None)


MAX_NAME = 63  # a sortie name's length (`core.naming.NAME`)


def free_run_id(runs_dir: Path, name: str) -> str:
    """A task file's ``name`` as a run id: itself while ``runs_dir`` has no run of that name,
    else the first free ``NAME-2``, ``NAME-3``, ... (a task file runs again as often as asked;
    only `--name` insists on its own)."""
    candidate, number = name, 1
    while (runs_dir / candidate).exists() or (runs_dir / candidate).is_symlink():
        number += 1
        candidate = f"{name[:MAX_NAME - len(str(number)) - 1]}-{number}"
    return candidate


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
