"""The health gate of a run (`bootstrap/health.py` does the checking): a small object with
narrow inputs — the run's level, where to say what it found, what the catalog says of the
instance type (its fabric, the figure `full` is held to) — handed a cluster's connections and
inventory. The driver decides what follows: before training a bad node is replaced (a
recovery) or, with no recovery left, the run stops there naming it (`refusal`); when a job
hangs, the gate finds the node it waits for (`hung_on`)."""

from __future__ import annotations

from dataclasses import dataclass

from sortie.bootstrap.choices import HealthLevel
from sortie.bootstrap.health import check_health, unreachable
from sortie.bootstrap.health_report import HealthReport
from sortie.bootstrap.transport import NodeTransport
from sortie.core.errors import SortieError
from sortie.core.inventory import Expected, Inventory
from sortie.core.progress import Reporter


@dataclass(frozen=True)
class HealthGate:
    level: HealthLevel
    reporter: Reporter
    expected: Expected | None = None  # what the catalog says of the instance type

    def check(self, conns: dict[str, NodeTransport], inventory: Inventory,
              level: HealthLevel | None = None) -> HealthReport:
        """One check of the cluster (at ``level``, else the gate's), said as it ends."""
        report = check_health(conns, inventory, level or self.level, self.expected)
        for warning in report.warnings:
            self.reporter.note(f"health: {warning}")
        (self.reporter.info if report.ok else self.reporter.note)(report.summary())
        return report

    def hung_on(self, conns: dict[str, NodeTransport], inventory: Inventory) -> list[str]:
        """The nodes a hung job waits for: those the others cannot reach over the job's
        network, else those with a slow link (the gate's network test, unless it is off)."""
        cut = unreachable(conns, inventory)
        if cut:
            self.reporter.note(f"{', '.join(cut)}: unreachable over the job's network")
            return cut
        if self.level == "off":
            return []
        return list(self.check(conns, inventory, "quick").bad)


def refusal(report: HealthReport, replaced: int, max_recoveries: int) -> SortieError:
    """No training on a bad node once no recovery is left to replace it."""
    why = (f"{replaced} replaced already" if max_recoveries else "nodes of a held or attached "
           "cluster are not replaced: fix or remove the node, or `sortie down` and `sortie up` "
           "again")
    return SortieError(f"{report.summary()}; not training on a bad node ({why})")
