"""`sortie repair NAME`: mend a held cluster without `down` and `up`. Its lost nodes (the
machine gone, SSH dead) and, when every node answers, those the health gate names are
replaced the way a run replaces a lost node (`Backend.replace`: a Slurm allocation gets a new
one), bootstrapped and checked again. An attached cluster's hosts are not sortie's: they are
named, never touched. A job running on the cluster is never repaired under: cancel it first."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sortie.bootstrap.choices import HealthLevel
from sortie.bootstrap.health import check_health
from sortie.bootstrap.health_report import HealthReport
from sortie.bootstrap.prepare import prepare
from sortie.core.errors import SortieError, UsageError
from sortie.core.inventory import Inventory
from sortie.core.progress import Reporter, phase
from sortie.engine import held_jobs
from sortie.engine.recovery import reachable
from sortie.engine.request import Limits
from sortie.fleet import registry
from sortie.stacks.backend import Backend, expected_of


@dataclass
class Repaired:
    """What `repair` found and did: each replaced node and why; the health check after."""

    cluster: str
    replaced: dict[str, str] = field(default_factory=dict)
    health: HealthReport | None = None

    def summary(self) -> str:
        if not self.replaced:
            return f"{self.cluster}: every node is up and healthy; nothing to repair"
        by_why: dict[str, list[str]] = {}
        for node, why in self.replaced.items():
            by_why.setdefault(why, []).append(node)
        nodes = ", ".join(f"{', '.join(named)} ({why})" for why, named in by_why.items())
        after = self.health.summary() if self.health else "not checked"
        return f"{self.cluster}: replaced {nodes}; {after}"


def repair_cluster(home: Path, name: str, reporter: Reporter, level: HealthLevel = "quick",
                   ssh_timeout_s: float | None = None) -> Repaired:
    """Replace cluster NAME's lost or unhealthy nodes, then check it whole again."""
    backend, inventory = registry.held_cluster(home, name, degraded=True)
    running = [entry.id for entry, state in held_jobs.jobs(home, name) if state == "running"]
    if running:
        raise UsageError(f"NAME: job {running[-1]} runs on {name}: `sortie cancel {name}` it "
                         "first (a repair replaces machines under it)")
    wait = Limits(ssh_timeout_s=ssh_timeout_s).ssh_wait(backend)
    with phase(reporter, f"Looking for lost nodes of {name}"):
        lost = backend.lost_nodes(inventory)
        why = {node: lost.why for node in lost.nodes}
        why |= {node.name: "SSH dead" for node in inventory.nodes
                if node.name not in why and not reachable(node)}
    repaired = Repaired(name)
    if not why:
        repaired.health = _checked(backend, inventory, level, wait.seconds, reporter)
        why = dict(repaired.health.bad)
        if not why:
            return repaired
    if backend.detaches:  # an attached cluster: its hosts are someone else's
        named = ", ".join(f"{node} ({reason})" for node, reason in why.items())
        raise SortieError(f"{name} is attached: {named}; sortie never replaces hosts it did not "
                          f"make (mend them, then `sortie check {name}`; `sortie down {name} "
                          "--forget` lets the cluster go)")
    with phase(reporter, f"Replacing {', '.join(why)} of {name}"):
        inventory = backend.replace(inventory, list(why))
    repaired.replaced = why
    repaired.health = _checked(backend, inventory, level, wait.seconds, reporter,
                               [n.name for n in inventory.nodes if n.name in why])
    return repaired


def _checked(backend: Backend, inventory: Inventory, level: HealthLevel, ssh_wait_s: float,
             reporter: Reporter, new: list[str] | None = None) -> HealthReport:
    """Every node reached and checked (``new`` ones bootstrapped first), then the gate."""
    title = f"Bootstrapping {', '.join(new)}, then checking" if new else "Checking"
    with phase(reporter, f"{title} every node and the network across them ({level})"), \
            prepare(inventory, ssh_wait_s) as conns:
        return check_health(conns, inventory, level, expected_of(backend))
