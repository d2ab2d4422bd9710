"""A run's record, once it is over: ``run.json`` and ``report.html`` in its directory."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from sortie.rundir.metrics import loss_sparkline, metrics_path, read_metrics
from sortie.rundir.report import REPORT_FILE, write_report
from sortie.rundir.run_file import RunFile, write_run_file

if TYPE_CHECKING:  # the driver hands itself over
    from sortie.engine.driver import Driver


def record_run(driver: Driver) -> None:
    """``run.json`` and ``report.html`` in the run's directory, whether the job succeeded
    or failed; a report that cannot be written is noted, never raised (the sortie itself is
    over)."""
    result, request, inventory = driver.result, driver.request, driver.inventory
    if not (driver.launched or result.artifacts.is_dir()):
        return  # nothing ran (a launch that failed): no run directory, no report
    user = driver.user_job
    task = user.task if user else None

    def run_file() -> RunFile:
        return write_run_file(
            result, backend=driver.backend.name, profile=driver.backend.profile,
            procs_per_node=request.procs_per_node,
            gpus_per_node=min((n.gpus for n in inventory.nodes), default=0)
            if inventory else 0, job=user.command.describe() if user else "bundled trainer",
            started_at=driver.started_at, usd_per_hour=request.pricing.usd_per_hour,
            pricing=request.pricing.terms,
            node_facts={name: facts.model_dump() for name, facts in driver.node_facts.items()},
            code=user.code if user else None,
            setup_fingerprint=user.setup_fingerprint if user and user.setup else None,
            overrides=task.overrides if task else ())

    try:
        result.artifacts.mkdir(parents=True, exist_ok=True)
        result.report = result.artifacts / REPORT_FILE  # run.json names it
        written = run_file()
        metrics = read_metrics(metrics_path(result.artifacts))  # once, for both
        write_report(result.artifacts, metrics, written)
        result.loss_sparkline = loss_sparkline(metrics)
    except Exception as exc:  # a plot or a file system error: the run's result stands
        result.report, result.report_error = None, f"{type(exc).__name__}: {exc}"[:300]
        driver.reporter.note(f"the run report could not be written: {result.report_error}")
        with contextlib.suppress(Exception):
            run_file()  # without the report it names
