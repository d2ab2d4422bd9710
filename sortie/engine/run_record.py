"""A run's record: ``run.json`` and ``report.html`` in its directory once it is over, and its line
in the controller's run history from its start (`rundir/history.py`)."""

from __future__ import annotations

import contextlib

from sortie.bootstrap.checks import NodeFacts
from sortie.core.inventory import Inventory
from sortie.core.job import Job
from sortie.core.progress import Reporter
from sortie.engine.request import RunRequest
from sortie.rundir import history
from sortie.rundir.metrics import loss_sparkline, metrics_path, read_metrics
from sortie.rundir.report import REPORT_FILE, write_report
from sortie.rundir.result import RunResult
from sortie.rundir.run_file import RunSetup, started_at, write_run_file
from sortie.stacks.backend import Backend
from sortie.stacks.records import Process


def run_setup(backend: Backend, request: RunRequest, job: Job, inventory: Inventory | None,
              started: float, node_facts: dict[str, NodeFacts]) -> RunSetup:
    """What a run was: its backend, its job as recorded, the nodes' facts as checked."""
    user = request.user_job
    return RunSetup(
        backend=backend.name, profile=backend.profile, procs_per_node=request.procs_per_node,
        gpus_per_node=min((n.gpus for n in inventory.nodes), default=0) if inventory else 0,
        job=user.command.describe() if user else "bundled trainer",
        started_at=started_at(started), usd_per_hour=request.pricing.usd_per_hour,
        pricing=request.pricing.terms,
        node_facts={name: facts.model_dump() for name, facts in node_facts.items()},
        code=user.code if user else None,
        setup_fingerprint=user.setup_fingerprint if user and user.setup else None,
        overrides=job.overrides)


def record_run(setup: RunSetup, result: RunResult, reporter: Reporter, ran: bool) -> None:
    """``run.json`` and ``report.html`` in the run's directory, whether the job succeeded
    or failed (``ran``: anything may have run on the nodes); a report that cannot be written is
    noted, never raised (the sortie itself is over)."""
    if not (ran or result.artifacts.is_dir()):
        return  # nothing ran (a launch that failed): no run directory, no report
    try:
        result.artifacts.mkdir(parents=True, exist_ok=True)
        result.report = result.artifacts / REPORT_FILE  # run.json names it
        written = write_run_file(setup, result)
        metrics = read_metrics(metrics_path(result.artifacts))  # once, for both
        write_report(result.artifacts, metrics, written)
        result.loss_sparkline = loss_sparkline(metrics)
    except Exception as exc:  # a plot or a file system error: the run's result stands
        result.report, result.report_error = None, f"{type(exc).__name__}: {exc}"[:300]
        reporter.note(f"the run report could not be written: {result.report_error}")
        with contextlib.suppress(Exception):
            write_run_file(setup, result)  # without the report it names


def remember_run(backend: Backend, request: RunRequest, result: RunResult, reporter: Reporter,
                 started: float, ended: float | None = None,
                 waiting: history.State | None = None) -> None:
    """This run in the controller's history (`rundir/history.py`): ``running`` from its
    start (or ``waiting``'s state: queued), its outcome once ``ended``; the cost at the launch
    terms while it ran. A history that cannot be written is noted, never raised."""
    user, rate = request.user_job, request.pricing.usd_per_hour
    entry = history.RunEntry(
        id=result.run_id, kind="exec" if result.cluster else "run",
        cluster=result.cluster or result.run_id, backend=backend.name,
        job=user.command.describe() if user else "bundled trainer",
        directory=str(result.artifacts.resolve()),
        state=history.outcome(result) if ended else waiting or "running",
        started=started, ended=ended,
        cost_usd=round(rate * max(0.0, ended - started) / 3600, 4) if rate and ended else None,
        controller=Process.me() if ended is None else None)
    unkept = history.record(backend.home, entry)
    if unkept:
        reporter.note(unkept)
