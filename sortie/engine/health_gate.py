"""The health gate in a run (`bootstrap/health.py` does the checking): before training, a bad
node is replaced, counted as a recovery, or, where no recovery is left (a held or attached
cluster has none), the run stops there naming it; when a job hangs, the node it waits for is
found."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from bootstrap.health import HealthLevel, HealthReport, check_health, unreachable
from infra.catalog import expected_busbw
from sortie.core.errors import SortieError
from sortie.rundir.result import HEALTH_REASON, Recovery

if TYPE_CHECKING:
    from sortie.engine.driver import Driver


def checked(driver: Driver, level: HealthLevel) -> HealthReport:
    """One check of the driver's cluster, said as it ends."""
    assert driver.inventory is not None
    report = check_health(driver.conns, driver.inventory, level,
                          expected_busbw(driver.backend.instance_type))
    for warning in report.warnings:
        driver.reporter.note(f"health: {warning}")
    (driver.reporter.info if report.ok else driver.reporter.note)(report.summary())
    return report


def gate(driver: Driver) -> None:
    """Check until every node is healthy, replacing bad ones while recoveries are left."""
    limits = driver.request.limits
    if limits.health == "off" or driver.inventory is None:
        return
    while True:
        with driver.phase("health", f"Health check ({limits.health}): each node, then the "
                                    "network across them") as end:
            report = checked(driver, limits.health)
            end.ok = report.ok
        driver.result.health = report
        if report.ok:
            return
        bad, done = list(report.bad), len(driver.result.recoveries)
        if done >= limits.max_recoveries:
            why = (f"{done} replaced already" if limits.max_recoveries else "nodes of a held or "
                   "attached cluster are not replaced: fix or remove the node, or `sortie down` "
                   "and `sortie up` again")
            raise SortieError(f"{report.summary()}; not training on a bad node ({why})")
        failed_at = time.perf_counter()
        with driver.phase("recover", f"Replacing {', '.join(bad)}: {HEALTH_REASON}"):
            driver.replace_nodes(bad, ready=False)
        driver.result.recoveries.append(Recovery(lost=bad, reason=HEALTH_REASON,
                                                 failed_at_step=None, failed_at=failed_at,
                                                 step_s=0.0))


def hung_on(driver: Driver) -> list[str]:
    """The nodes a hung job waits for: those the others cannot reach over the job's network,
    else those with a slow link (the gate's network test, unless the gate is off)."""
    assert driver.inventory is not None
    cut = unreachable(driver.conns, driver.inventory)
    if cut:
        driver.reporter.note(f"{', '.join(cut)}: unreachable over the job's network")
        return cut
    if driver.request.limits.health == "off":
        return []
    return list(checked(driver, "quick").bad)
