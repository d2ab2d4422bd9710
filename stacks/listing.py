"""How a backend shows its sorties to `sortie status`, `down`, `reap` and the rest: every kind of
sortie this controller keeps (local clusters, kept buckets, cloud stacks, attached clusters) is
listed and described by the module that makes it, behind one short interface (`Listing`);
`sortie.fleet.registry` asks each in turn. A new backend is one module and one line there.

A damaged state file is one row ("broken", with the reason), never an error: one bad sortie
never stops the others from being listed, torn down or reaped."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from sortie.core.job import Job
from sortie.stacks.backend import Backend, Teardown
from sortie.stacks.records import (
    CONTROLLER_FILE,
    Controller,
    Heartbeats,
    SortieRecord,
    controller_in,
    job_in,
    save_job_in,
)

# Row states: up, degraded (a node is down), orphaned (its controller is gone), expired (past its
# TTL), kept (only its bucket is left, on purpose), broken (an interrupted start, damaged state),
# attached (a Slurm cluster to allocate on).
REAPED_STATES = ("orphaned", "expired")
SITE_STATE = "attached"  # a Slurm cluster attached to allocate on: nothing of it runs for us


class SortieRow(BaseModel):
    """One line of `sortie status`."""

    name: str
    backend: str  # local, cloud, attached, slurm; "<cloud> rehearsal" (booted here)
    nodes: int = 0
    nodes_up: int | None = None  # None: not probed (clouds)
    age_s: int = 0
    state: str = "up"
    usd_so_far: float = 0.0
    usd_per_hour: float = 0.0  # what it costs now: its machines while they run (locally: 0,
    # or the notional price it started with)
    owner: str = "unknown"  # a cloud profile's `owner`; else the user who made or attached it
    ttl_left_s: int | None = None
    detail: str | None = None  # why broken; what is kept, and where
    # A held cluster with limits (idle stop, a budget) that nothing enforces now: its watchdog
    # is gone; `sortie reap` restarts it.
    unwatched: bool = False
    idle_stop_s: float | None = None  # held with `--idle-stop`: ends itself idle this long
    # "this controller"; "state backend": launched by another controller; for an attached
    # cluster where it came from: "hosts file", "outputs file", "pulumi stack".
    source: str = "this controller"
    profile: str | None = None  # the stack profile it was launched (or rehearsed) from
    # A rehearsal (its nodes booted here): what its cloud would charge for it, at $0 here.
    rehearsal_usd_per_hour: float | None = None

    def priced(self, usd_per_hour: float) -> None:
        """Costing ``usd_per_hour`` for its whole age: its $/h now and its $ so far."""
        self.usd_per_hour = usd_per_hour
        self.usd_so_far = round(usd_per_hour * self.age_s / 3600, 2)

    @property
    def spend(self) -> tuple[str, float]:
        """Whose it is and what it has cost so far: what its owner's budget counts."""
        return self.owner, self.usd_so_far


@dataclass
class Seen:
    """A sortie and how to act on it."""

    row: SortieRow
    # "local", "kept" (a local kept bucket), "cloud" (ours), "elsewhere" (another controller's),
    # "attached" (not created by sortie)
    kind: str
    record: SortieRecord | None = None


class Listing(Protocol):
    """One kind of sortie in this controller's state (``$SORTIE_HOME/<its folder>/<name>/``)."""

    kind: str

    def cluster_ids(self) -> list[str]:
        """The names of this kind's sorties, from their state directories alone."""
        ...

    def describe(self, name: str, now: float) -> Seen:
        """Its row: state, nodes, age, cost; "broken" with the reason when its state is
        damaged (never an exception)."""
        ...

    def state_dir(self, cluster_id: str) -> Path: ...

    def backend(self, seen: Seen) -> Removable:
        """What acts on it: the backend that made it (for a cloud sortie, from its record)."""
        ...


class LiveListing(Listing, Protocol):
    """A kind of sortie with nodes (local, cloud, attached, Slurm): its backend runs jobs."""

    def backend(self, seen: Seen) -> Backend: ...

    def held(self, seen: Seen) -> bool:
        """Held with `sortie up`: no controller drives it (`exec` and `run --on` may use it)."""
        ...


class Removable(Protocol):
    def down(self, cluster_id: str, keep_bucket: bool = False) -> Teardown:
        """Remove it, with proof (or detach it, for clusters sortie did not create)."""
        ...


class RecordsInStateDir:
    """What a backend whose sorties' records are files in their own folders shares (local,
    Slurm, attached): its controller and heartbeat, the job it runs, whether it is held."""

    heartbeats: Heartbeats

    def state_dir(self, cluster_id: str) -> Path:
        raise NotImplementedError

    def claim(self, cluster_id: str) -> None:
        """Record this process as the sortie's controller, with a fresh heartbeat (at launch,
        then every HEARTBEAT_S, and by `sortie watch` taking over)."""
        self.heartbeats.beat(cluster_id, self.state_dir(cluster_id))

    def controller(self, cluster_id: str) -> Controller | None:
        """The controller the sortie belongs to; None once held (`sortie up`)."""
        return controller_in(self.state_dir(cluster_id))

    def hold(self, cluster_id: str) -> None:
        """`sortie up`, once its cluster is ready: held by no controller from now on (until
        `sortie down`, or what ends it by itself)."""
        (self.state_dir(cluster_id) / CONTROLLER_FILE).unlink(missing_ok=True)

    def held(self, seen: Seen) -> bool:
        return self.controller(seen.row.name) is None

    def save_job(self, cluster_id: str, job: Job) -> None:
        save_job_in(self.state_dir(cluster_id), job)

    def load_job(self, cluster_id: str) -> Job | None:
        return job_in(self.state_dir(cluster_id))
