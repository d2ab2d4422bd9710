"""A local cluster's `status` row: up, degraded (an sshd gone), expired (a booted cluster
powered off), orphaned (its controller gone) or broken, read from its state directory and its
nodes' listeners."""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Protocol

from sortie.core.errors import SortieError
from sortie.core.inventory import INVENTORY_FILE, Inventory
from sortie.core.statefile import CorruptStateError
from sortie.stacks.listing import Seen, SortieRow
from sortie.stacks.local.local_rehearsal import recorded_price
from sortie.stacks.machine.held_limits import describe_limits
from sortie.stacks.records import Controller

KIND = "local"


class LocalClusters(Protocol):
    """What the row reads: the local backend's records of its clusters, and their listeners."""

    def state_dir(self, cluster_id: str) -> Path: ...
    def controller(self, cluster_id: str) -> Controller | None: ...
    def inventory(self, cluster_id: str) -> Inventory: ...
    def listeners(self, cluster_id: str) -> list[str]: ...


def local_row(backend: LocalClusters, name: str, now: float) -> Seen:
    """The `status` row of ``backend``'s cluster ``name``."""
    row = SortieRow(name=name, backend=KIND, state="broken", owner=getpass.getuser())
    state, controller = backend.state_dir(name), None
    try:
        controller = backend.controller(name)
        inventory = backend.inventory(name)
    except CorruptStateError as exc:  # `down NAME` still cleans it
        row.detail = str(exc)
        return Seen(row, KIND)
    except SortieError as exc:  # no inventory: an `up` that never finished
        gone = controller is not None and controller.gone()
        row.state, row.detail = ("orphaned" if gone else "broken"), str(exc)
        return Seen(row, KIND)
    created = (state / INVENTORY_FILE).stat().st_mtime
    nodes_up = len(backend.listeners(name))
    row.nodes, row.nodes_up, row.age_s = len(inventory.nodes), nodes_up, round(now - created)
    row.state = "orphaned" if controller is not None and controller.gone() else \
        "up" if nodes_up == len(inventory.nodes) else \
        "expired" if nodes_up == 0 and inventory.booted else "degraded"  # (powered off)
    if price := recorded_price(state):
        row.priced(price.usd_per_hour)
    if controller is None:  # held: what ends it by itself, and whether that still holds
        describe_limits(state, row)
    if inventory.booted:  # a rehearsal's (its modules load only for one)
        from sortie.stacks.booted.cloud_rehearsal import described_rehearsal, load_plan
        if plan := load_plan(state):
            described_rehearsal(row, plan, created, now)
    return Seen(row, KIND)
