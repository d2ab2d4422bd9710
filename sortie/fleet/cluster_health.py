"""`sortie check NAME`: the health gate on a held or attached cluster, on demand."""

from __future__ import annotations

from pathlib import Path

from sortie.bootstrap.choices import HealthLevel
from sortie.bootstrap.health import check_health
from sortie.bootstrap.health_report import HealthReport
from sortie.bootstrap.prepare import prepare
from sortie.fleet import registry
from sortie.stacks.backend import expected_of


def check_cluster(home: Path, name: str, level: HealthLevel,
                  ssh_timeout_s: float = 60.0) -> HealthReport:
    """Check every node of cluster NAME and the network across them (`bootstrap/health.py`);
    nothing is replaced or changed but the trainer sortie installs on its nodes."""
    backend, inventory = registry.held_cluster(home, name)
    with prepare(inventory, ssh_timeout_s) as conns:
        return check_health(conns, inventory, level, expected_of(backend))
