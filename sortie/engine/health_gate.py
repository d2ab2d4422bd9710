"""The health gate of a run (`bootstrap/health.py` does the checking): a small object with
narrow inputs — the run's level, where to say what it found, what the catalog says of the
instance type (its fabric, the figure `full` is held to) — handed a cluster's connections and
inventory. The driver decides what follows: before training a bad node is replaced (a
recovery) or, with no recovery left, the run stops there naming it (`refusal`); when a job
is silent, the gate finds the node it waits for (`hung_on`), or leaves it running."""

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

    def hung_on(self, conns: dict[str, NodeTransport], inventory: Inventory,
                silence: str) -> list[str]:
        """The nodes a silent job waits for: those the others cannot reach over the job's
        network, asked while it runs (a TCP connection each: nothing the job's traffic slows).
        None: the job is left running, said (a job may work without printing: loading data,
        compiling, an epoch with no line; stopping it lost that work), and asked again after
        as long a silence."""
        cut = unreachable(conns, inventory)
        if cut:
            self.reporter.note(f"{', '.join(cut)}: unreachable over the job's network")
        else:
            self.reporter.note(f"{silence.removeprefix('hung: ')}, yet every node reaches the "
                               "others over the job's network: left running (it may be working "
                               "without printing); asked again after as long a silence. Ctrl-C "
                               "stops it; --hang-timeout sets the silence, 0 never asks")
        return cut


def refusal(report: HealthReport, replaced: int, max_recoveries: int) -> SortieError:
    """No training on a bad node once no recovery is left to replace it."""
    why = (f"{replaced} replaced already" if max_recoveries else "nodes of a held or attached "
           "cluster are not replaced: fix or remove the node, or `sortie down` and `sortie up` "
           "again")
    return SortieError(f"{report.summary()}; not training on a bad node ({why})")
