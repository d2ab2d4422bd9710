"""What a health check found, as `run.json` keeps it and the terminal shows it: every node's row,
the links and the bandwidth, the nodes found bad (the gate itself is `health.py`, which loads
SSH: a command that only shows a report, `status` or `report`, need not)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from sortie.bootstrap.link_health import Link


class NodeHealth(BaseModel):
    node: str
    problems: list[str] = Field(default_factory=list)
    checks: dict[str, str] = Field(default_factory=dict)
    # Its best link out (it sends) and in (it receives): low only if it is slow that way.
    send_gbs: float | None = None
    recv_gbs: float | None = None


class HealthReport(BaseModel):
    """One check of a cluster: every node's row, the bandwidth, and the nodes found bad."""

    level: str
    nodes: list[NodeHealth]
    backend: str = "gloo"
    busbw_gbs: float | None = None
    # `full`: of the CPU time the all-reduce's threads wanted, the share they waited on run
    # queues for it, its most starved rank's (a crawl with most of it waited measured the
    # machine's load, not the network).
    collective_cpu_wait: float | None = None
    message_bytes: int = 0
    links: list[Link] = Field(default_factory=list)
    expected_busbw_gbs: float | None = None  # the catalog's figure for the instance type
    expected_source: str | None = None
    bad: dict[str, str] = Field(default_factory=dict)  # node -> why
    warnings: list[str] = Field(default_factory=list)  # the cluster as a whole
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.bad

    def summary(self) -> str:
        bw = f"bus bandwidth {self.busbw_gbs:.3g} GB/s ({self.backend})" \
            if self.busbw_gbs is not None else \
            f"slowest link {min(link.gbs for link in self.links):.3g} GB/s ({self.backend})" \
            if self.links else "no bandwidth measured"
        if self.ok:
            count = len(self.nodes)
            return f"health ({self.level}): {count} node{'s' if count != 1 else ''} healthy; {bw}"
        return f"health ({self.level}): " + "; ".join(
            f"{node}: {why}" for node, why in self.bad.items()) + f"; {bw}"
