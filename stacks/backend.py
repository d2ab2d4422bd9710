"""The short interface every backend implements: the local sshd cluster and the Pulumi stacks.

The run engine (`sortie/engine/`) drives any backend the same way, so launch retries,
preemption recovery, collection and teardown proof are one piece of code:

    placements() -> up(cluster, nodes, placement) -> [lost_nodes() -> replace()]* -> down()

plus the record another controller reads to take a sortie over: its controller (with a
heartbeat), its job and its inventory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pydantic
from pydantic import BaseModel, ConfigDict, Field, computed_field

from sortie.core.errors import SortieError
from sortie.core.inventory import MAX_NODES, Expected, Inventory
from sortie.core.job import Job
from sortie.core.naming import NameTakenError  # noqa: F401 - a launch's error, with the rest
from sortie.core.progress import Reporter
from sortie.core.statefile import EpochSeconds
from sortie.infra.cloud_home import Leftover, SshWait

if TYPE_CHECKING:  # a type hint only
    from sortie.cost.launch_cost import LaunchCost
    from sortie.cost.price import Price


@dataclass(frozen=True)
class Placement:
    """Where one launch attempt asks for capacity. None keeps what the profile says."""

    zone: str | None = None
    spot: bool | None = None
    # Which of the backend's sites (`sortie run --gpu`: a machine type in a region, on a cloud,
    # cheapest first), and that site in words; one site: 0 and "".
    site: int = 0
    where: str = ""

    def describe(self) -> str:
        parts = [self.where, f"zone {self.zone}" if self.zone else "",
                 {True: "spot", False: "on-demand", None: ""}[self.spot]]
        return ", ".join(p for p in parts if p) or "default placement"


@dataclass(frozen=True)
class Lost:
    """What `lost_nodes` found: the nodes whose machine is gone (none: an empty list) and why
    ("machine gone"; a Slurm allocation's end in Slurm's terms: "time limit", "NODE_FAIL")."""

    nodes: list[str]
    why: str = "machine gone"

    def __bool__(self) -> bool:
        return bool(self.nodes)


class LaunchError(SortieError):
    """Not every node came up. The backend has already removed the partial cluster.
    ``moves_on``: whether another placement may succeed (a lack of capacity); a quota, a
    permission or an image would fail the same way in every zone, so the launch stops."""

    def __init__(self, message: str, moves_on: bool = True) -> None:
        super().__init__(message)
        self.moves_on = moves_on


@pydantic.dataclasses.dataclass
class Teardown:
    """What `down` removed, what it kept on purpose, and what it found still there. Serialised
    by pydantic (`--json`), ``clean`` included."""

    cluster_id: str = Field(serialization_alias="cluster")
    removed: int = 0
    unit: str = "resources"  # what `removed` counts: processes (local), resources (cloud)
    leftovers: list[Leftover] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # kept on purpose, e.g. an unverified bucket
    state_removed: bool = False
    detached: bool = False  # a cluster sortie did not create: its machines are left running
    # What the cluster's own accounting says it held (Slurm's `sacct`), where it keeps one.
    accounted_s: float | None = None
    accounted_by: str = "Slurm's accounting (sacct)"  # what says so
    said: str | None = None  # what detaching did, where it is not an attached cluster's


    @computed_field  # type: ignore[prop-decorator]
    @property
    def clean(self) -> bool:
        """Nothing left but what was kept on purpose."""
        return not self.leftovers and (self.state_removed or bool(self.kept))

    def summary(self) -> str:
        """"0 resources remain", or each leftover and how to remove it."""
        kept = f"; kept on purpose: {', '.join(self.kept)}" if self.kept else ""
        if self.clean and self.detached and self.said:
            return f"{self.cluster_id}: {self.said}"
        if self.clean and self.detached:
            return (f"{self.cluster_id}: detached (stopped {self.removed} {self.unit}, removed "
                    "sortie's workdir on every node); machines left running (not created by "
                    "sortie)")
        if self.clean:
            accounted = "" if self.accounted_s is None else \
                f"; held {self.accounted_s:.0f}s by {self.accounted_by}"
            return (f"{self.cluster_id}: removed {self.removed} {self.unit}; "
                    f"0 resources remain{kept}{accounted}")
        left = "; ".join(leftover.line() for leftover in self.leftovers) or "its state"
        return (f"teardown of {self.cluster_id} incomplete, {len(self.leftovers)} resources "
                f"remain: {left}{kept}; retry with `sortie down {self.cluster_id}`")


class HeldLimits(BaseModel):
    """What ends a held local cluster by itself, with no controller (its watchdog)."""

    model_config = ConfigDict(frozen=True)

    idle_s: float | None = Field(default=None, gt=0, le=1e9, allow_inf_nan=False)
    budget_s: float | None = Field(default=None, gt=0, le=1e9, allow_inf_nan=False)
    started: EpochSeconds = 0.0  # when the cluster started: the budget counts from it

    def text(self) -> str:
        said = [f"idle stop ({self.idle_s:g}s)"] if self.idle_s else []
        return " and ".join(said + (["its budget"] if self.budget_s else [])) or "nothing"


class Watchdog(Protocol):
    """Local nodes: a held cluster's limits (idle stop, budget) kept by a watchdog on this
    machine, started with it."""

    def up(self, cluster_id: str, nodes: int, placement: Placement | None = None,
           held: bool = False, watch: HeldLimits | None = None) -> Inventory: ...

    def start_watchdog(self, cluster_id: str) -> None:
        """Start it again (`sortie reap`, when it is gone)."""
        ...


class NodeTimers(Protocol):
    """A cloud's held clusters: their nodes power themselves off once idle (and at their TTL);
    `sortie reap` asks the cloud before it destroys the rest."""

    def idle_stop(self, minutes: int) -> None:
        """Arm the nodes of the next launch to power off once idle this long."""
        ...

    def machines_running(self, cluster_id: str) -> list[str]:
        """The cluster's machines the cloud says still run."""
        ...


class QueuedLaunch(Protocol):
    """A launch that waits in a scheduler's queue (Slurm): it says so while it waits."""

    def while_queued(self, say: Callable[[str], None]) -> None:
        """``say`` gets a line whenever the wait changes: the job, why it waits, when the
        scheduler expects it to start."""


class DetachedRun(Protocol):
    """A run handed to the scheduler whole (Slurm): its controller runs inside the allocation,
    so the shell that submitted it may end (`sortie run --detach`)."""

    def submit_detached(self, cluster_id: str, nodes: int, controller: list[str], cwd: Path,
                        log: Path) -> str:
        """Queue the allocation with ``controller`` (argv) as the batch job that drives it, run
        in ``cwd``, its output appended to ``log``; Slurm's job id."""
        ...


class SharedPorts(Protocol):
    """Nodes whose rendezvous port sortie chose on a machine others share (local nodes)."""

    def rendezvous_for_launch(self, inventory: Inventory) -> Inventory:
        """Before each launch: as it is, or with another port (saved) where it was taken."""


class Capabilities:
    """What a backend that asks for none of the capabilities above answers: a base for it."""

    def shared_ports(self) -> SharedPorts | None:
        return None

    @property
    def max_nodes(self) -> int:
        """The most nodes one of its clusters has (a local one's: fewer)."""
        return MAX_NODES

    def detached(self) -> DetachedRun | None:
        return None

    def watchdog(self) -> Watchdog | None:
        return None

    def node_timers(self) -> NodeTimers | None:
        return None

    def queued(self) -> QueuedLaunch | None:
        return None

    def launch_cost(self, nodes: int) -> LaunchCost | None:  # no list price (`Backend`)
        return None


class Backend(Protocol):
    """What the engine asks of every backend (read-only: a backend may say it more narrowly,
    a local cluster's ``instance_type`` is always None)."""

    @property
    def name(self) -> str:
        """"local", "aws", "gcp", "azure", "slurm", "attached"."""
        ...

    @property
    def preemption_notice_s(self) -> float:
        """After a preemption notice, how long the cloud may take to reclaim the machine (AWS
        gives two minutes' notice, GCP and Azure 30 s); 0 where nothing reclaims machines."""
        ...

    @property
    def ssh_wait(self) -> SshWait:
        """How long a new node may take to take SSH, and what it waits for (a cloud's: its
        boot and host-key grant, many minutes; local sshd: seconds)."""
        ...

    @property
    def instance_type(self) -> str | None:
        """The catalog's machine (the health gate's figures); None: local."""
        ...

    @property
    def wind_down_s(self) -> float:
        """About how long stopping a job and tearing the cluster down takes, while it still
        bills: a budget stops the job this much before it is spent."""
        ...

    @property
    def home(self) -> Path:
        """This controller's state ($SORTIE_HOME): the cost ledger is kept there."""
        ...

    @property
    def owner(self) -> str:
        """Whom its sorties are counted against (a cloud profile's `owner`; the user)."""
        ...

    @property
    def backend_url(self) -> str | None:
        """A shared state backend, where the cost ledger is kept too."""
        ...

    @property
    def profile(self) -> str | None:
        """The stack profile a cloud sortie launched from; None elsewhere."""
        ...

    # What the engine asks of a backend, never what it is:
    @property
    def detaches(self) -> bool:
        """`down` leaves the machines running: sortie did not create them."""
        ...

    def watchdog(self) -> Watchdog | None:
        """Where a watchdog on this machine keeps a held cluster's limits (local nodes): the
        backend as one; None where the nodes' own timers, the budget cut into the TTL, and
        `sortie reap` keep them."""
        ...

    def node_timers(self) -> NodeTimers | None:
        """Where the nodes power themselves off once idle (a cloud's): the backend as such."""
        ...

    def queued(self) -> QueuedLaunch | None:
        """Where a launch waits in a scheduler's queue (Slurm's): the backend as such."""
        ...

    def detached(self) -> DetachedRun | None:
        """Where a run may be handed to the scheduler whole, its controller inside the
        allocation (Slurm's `run --detach`): the backend's way to submit it."""
        ...

    def shared_ports(self) -> SharedPorts | None:
        """Where others may take the rendezvous port before a job starts (local nodes)."""
        ...

    def hold(self, cluster_id: str) -> None:
        """`sortie up`, once its cluster is ready: held by no controller from now on."""
        ...

    def launch_cost(self, nodes: int) -> LaunchCost | None:
        """What ``nodes`` machines cost at list prices, said before launch (None: no list
        price: local nodes, machines sortie did not create)."""
        ...

    def capped(self, max_usd: float, nodes: int, held: bool = False) -> Backend:
        """This backend with a budget the nodes enforce themselves (a cloud's TTL cut to what
        it buys at the worst rate; ``held``, with no controller to stop it: a Slurm
        allocation's time limit), this one left as it was; itself where the controller or a
        watchdog here enforces it."""
        ...

    def notional_price(self, nodes: int, held: str | None = None) -> Price | None:
        """A price with no list behind it (local nodes' $SORTIE_LOCAL_USD_PER_HOUR, to rehearse
        budgets; a ``held`` cluster's as fixed when it started); None where there is none."""
        ...

    def placements(self) -> list[Placement]:
        """The launch attempts in order, per the profile's policy (zones, then on-demand)."""
        ...

    def reserve(self, cluster_id: str) -> None:
        """Take the name for this launch, atomically, before anything is created: a second
        launch of the same name gets NameTakenError and must touch nothing (no `down`)."""
        ...

    def up(self, cluster_id: str, nodes: int, placement: Placement) -> Inventory:
        """Bring up every node or none: on failure remove what started and raise LaunchError."""
        ...

    def launched_price(self, cluster_id: str) -> tuple[float, str] | None:
        """The cluster's $/h and terms as launched (a fallback placement may change them from
        the estimate before launch); None: no list price, the caller's pricing stands."""
        ...

    def lost_nodes(self, inventory: Inventory) -> Lost:
        """Refresh: the nodes whose machine is gone, and why."""
        ...

    def replace(self, inventory: Inventory, lost: list[str]) -> Inventory:
        """Bring the cluster back to full size with new machines for the lost nodes."""
        ...

    def down(self, cluster_id: str, keep_bucket: bool = False) -> Teardown:
        """Remove everything of the cluster (but its bucket when asked) and prove it."""
        ...

    # What another controller needs to take a running sortie over (`sortie watch`, `reap`).

    def inventory(self, cluster_id: str) -> Inventory:
        """The nodes of a cluster that is up."""
        ...

    def state_dir(self, cluster_id: str) -> Path:
        """Where this controller keeps the cluster's state (a held cluster's sync list, its
        last run)."""
        ...

    def claim(self, cluster_id: str) -> None:
        """Record this process as the sortie's controller, with a fresh heartbeat; a no-op
        before the cluster exists or once teardown has begun."""
        ...

    def save_job(self, cluster_id: str, job: Job) -> None: ...

    def load_job(self, cluster_id: str) -> Job | None: ...


def starting(nodes: int, backend: Backend) -> str:
    """A launch's progress line: "Starting 2 aws nodes (aws-p4d)"."""
    return f"Starting {nodes} {backend.name} node{'' if nodes == 1 else 's'}" + \
        (f" ({backend.profile})" if backend.profile else "")


def launch(backend: Backend, cluster_id: str, nodes: int, failures: list[str],
           reporter: Reporter,
           failed_attempt: Callable[[float, float], None] = lambda start, end: None
           ) -> Inventory:
    """All or nothing, per placement in the backend's order while the failures are a lack of
    capacity; says why each attempt failed (and adds it to ``failures``; ``failed_attempt``
    gets when it started and ended)."""
    if (queued := backend.queued()) is not None:
        queued.while_queued(reporter.info)
    for attempt, placement in enumerate(backend.placements(), 1):
        started = time.perf_counter()
        try:
            return backend.up(cluster_id, nodes, placement)
        except LaunchError as exc:
            failed_attempt(started, time.perf_counter())
            reason = f"attempt {attempt} ({placement.describe()}): {exc}"
            failures.append(reason)
            reporter.note(f"launch failed ({reason}); the partial cluster was removed")
            if not exc.moves_on:
                raise LaunchError(f"launch stopped: {reason}", moves_on=False) from None
    raise LaunchError(f"no launch attempt brought up all {nodes} nodes: " + "; ".join(failures))


def expected_of(backend: Backend) -> Expected | None:
    """What the catalog says the backend's nodes have and do, which the health gate holds them
    to (None: no catalog machine, as local, attached and Slurm nodes; the catalog loads only
    for one that is)."""
    if backend.instance_type is None:
        return None
    from sortie.infra.catalog import expected

    return expected(backend.instance_type)
