"""A Slurm allocation as `sortie status` lists it: up, queued (a detached run's too), orphaned,
ended, or broken."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from sortie.core.errors import SortieError
from sortie.stacks.listing import Seen, SortieRow
from sortie.stacks.records import Controller
from sortie.stacks.slurm.detached_run import DETACHED_FILE
from sortie.stacks.slurm.slurm_sites import Allocation, GpuHourPrice


class Allocations(Protocol):
    """What a row is read from: the Slurm backend's records."""

    kind: str
    owner: str

    def allocation(self, cluster_id: str) -> Allocation | None: ...
    def controller(self, cluster_id: str) -> Controller | None: ...
    def state_dir(self, cluster_id: str) -> Path: ...
    def notional_price(self, nodes: int, held: str | None = None) -> GpuHourPrice | None: ...


def describe_allocation(backend: Allocations, name: str, now: float) -> Seen:
    """Its `status` row: up (the allocation runs), orphaned (its controller is gone: `sortie
    reap` adopts it), ended (Slurm ended it: `down NAME` clears it), queued, broken (damaged
    state)."""
    row = SortieRow(name=name, backend="slurm", state="broken", owner=backend.owner)
    try:
        allocation, controller = backend.allocation(name), backend.controller(name)
    except SortieError as exc:
        row.detail = str(exc)
        return Seen(row, backend.kind)
    if allocation is None:
        row.detail = "its allocation was never queued; `sortie down NAME` clears it"
        return Seen(row, backend.kind)
    state, left_s = allocation.queue.job_state(allocation.job_id)
    nodes = int(str(allocation.ask.get("nodes", 0)) or 0)
    row.nodes, row.age_s = nodes, round(now - allocation.started)
    row.nodes_up = nodes if state == "RUNNING" else 0
    row.state = {"RUNNING": "up", "PENDING": "queued"}.get(state, "ended" if not state
                                                          else state.lower())
    row.detail = f"Slurm job {allocation.job_id} on {allocation.site}"
    if controller is None and (backend.state_dir(name) / DETACHED_FILE).exists():
        row.detail += " (run --detach: its controller starts inside it)"
    # Its time limit (the partition's default where none was asked): the TTL of an allocation.
    row.ttl_left_s = round(left_s) if left_s is not None and state == "RUNNING" else None
    if controller is not None and controller.gone():
        row.state = "orphaned"
    try:
        if price := backend.notional_price(nodes, held=name):
            row.priced(price.usd_per_hour)
    except SortieError:  # the cluster was detached since: no price to count
        pass
    return Seen(row, backend.kind)
