"""Every sortie this controller can see, and what each one needs: status, teardown, reap.

- local clusters: ``$SORTIE_HOME/clusters/<name>/`` (`LocalBackend`);
- buckets a teardown kept because their artifacts were not verified: ``$SORTIE_HOME/kept/<name>/``
  (local) or the record's ``kept`` (cloud);
- cloud sorties this controller launched: ``$SORTIE_HOME/stacks/<name>/sortie.json``;
- cloud sorties in a shared state backend, whichever controller launched them: their records
  beside Pulumi's state (`--backend-url`);
- clusters sortie did not create, attached with `sortie attach`: ``$SORTIE_HOME/attached/<name>/``
  (`AttachedBackend`), never destroyed, never reaped.

A damaged state file or a stack that cannot be read is one row ("broken", with the reason),
never an error for the whole command: one bad sortie never stops the others from being listed,
torn down or reaped.
"""

from __future__ import annotations

import getpass
import os
import shutil
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bootstrap import statefile
from bootstrap.errors import SortieError, UsageError, first_line
from bootstrap.inventory import INVENTORY_FILE, KNOWN_HOSTS_FILE, Inventory
from bootstrap.statefile import CorruptStateError
from infra.spec import MAX_NODES, CostEstimate
from sortie.attached import AttachedBackend, Forgotten
from stacks import naming
from stacks.backend import Backend, Leftover, Teardown
from stacks.local import LOCAL_MAX_NODES, LocalBackend
from stacks.profiles import apply_overrides, load_profile
from stacks.pulumi_backend import (
    NAMESPACE,
    RECORD_FILE,
    PulumiBackend,
    StackHandle,
    StackStore,
    Sweep,
    destroy_stack,
    spec_from_config,
    sweep_by_tags,
    usd_per_hour,
)
from stacks.records import SortieRecord

# Row states: up, degraded (a node is down), orphaned (its controller is gone), expired (past its
# TTL), kept (only its bucket is left, on purpose), broken (an interrupted start, damaged state).
REAPED_STATES = ("orphaned", "expired")


class SortieRow(BaseModel):
    """One line of `sortie status`."""

    name: str
    backend: str  # local, aws, gcp, azure, attached
    nodes: int = 0
    nodes_up: int | None = None  # None: not probed (clouds)
    age_s: int = 0
    state: str = "up"
    usd_so_far: float = 0.0
    usd_per_hour: float = 0.0  # what it costs now: its machines while they run (0 locally)
    owner: str = "unknown"  # a cloud profile's `owner`; else the user who made or attached it
    ttl_left_s: int | None = None
    detail: str | None = None  # why broken; what is kept, and where
    # "this controller"; "state backend": launched by another controller; for an attached
    # cluster where it came from: "hosts file", "outputs file", "pulumi stack".
    source: str = "this controller"


@dataclass(frozen=True)
class CloudAccess:
    """How to reach the clouds: the state backend (--backend-url) and, for tests, the stack
    store and tag sweep to use instead of the real Pulumi CLI and cloud APIs."""

    backend_url: str | None = None
    stacks: StackStore | None = None
    sweep: Sweep | None = None


DEFAULT_ACCESS = CloudAccess()  # this controller's own backend, the real CLI and sweeps


@dataclass
class Seen:
    """A sortie and how to act on it."""

    row: SortieRow
    # "local", "kept" (a local kept bucket), "cloud" (ours), "elsewhere" (another controller's),
    # "attached" (not created by sortie)
    kind: str
    record: SortieRecord | None = None


# -- what there is --------------------------------------------------------------------------------


def _local(home: Path, now: float) -> list[Seen]:
    backend = LocalBackend(home)
    return [_local_one(backend, name, now) for name in backend.cluster_ids()] + \
        [_kept_one(home, name, now) for name in naming.names_in(home / naming.KEPT)]


def _local_one(backend: LocalBackend, name: str, now: float) -> Seen:
    row = SortieRow(name=name, backend="local", state="broken", owner=getpass.getuser())
    try:
        controller = backend.controller(name)
        inventory = backend.inventory(name)
    except CorruptStateError as exc:  # `down NAME` still cleans it
        row.detail = str(exc)
        return Seen(row, "local")
    except SortieError as exc:  # no inventory: an `up` that never finished
        gone = controller is not None and controller.gone()
        row.state, row.detail = ("orphaned" if gone else "broken"), str(exc)
        return Seen(row, "local")
    created = (backend.state_dir(name) / INVENTORY_FILE).stat().st_mtime
    nodes_up = len(backend.listeners(name))
    row.nodes, row.nodes_up, row.age_s = len(inventory.nodes), nodes_up, round(now - created)
    row.state = "orphaned" if controller is not None and controller.gone() else \
        "up" if nodes_up == len(inventory.nodes) else "degraded"
    return Seen(row, "local")


def _kept_one(home: Path, name: str, now: float) -> Seen:
    path = home / naming.KEPT / name
    return Seen(SortieRow(
        name=name, backend="local", state="kept", age_s=round(now - path.stat().st_mtime),
        detail=f"its bucket (checkpoints) at {path}; `sortie down {name}` removes it"), "kept")


def _attached(home: Path, now: float) -> list[Seen]:
    backend = AttachedBackend(home)
    return [_attached_one(backend, name, now) for name in backend.cluster_ids()]


def _attached_one(backend: AttachedBackend, name: str, now: float) -> Seen:
    row = SortieRow(name=name, backend="attached", state="broken", owner=getpass.getuser())
    try:
        attachment = backend.attachment(name)
        inventory = backend.inventory(name)
    except SortieError as exc:  # an attach cut short, damaged state: `down NAME` forgets it
        row.detail = str(exc)
        return Seen(row, "attached")
    nodes_up = backend.nodes_up(inventory)
    row.nodes, row.nodes_up = len(inventory.nodes), nodes_up
    row.age_s, row.source = round(now - attachment.attached_at), attachment.source
    row.usd_so_far = round(attachment.usd_per_hour * row.age_s / 3600, 2)
    row.usd_per_hour = attachment.usd_per_hour
    row.state = "up" if nodes_up == len(inventory.nodes) else "degraded"
    row.detail = (f"attached from {attachment.describe()}; not created by sortie, never "
                  f"destroyed by it (`sortie down {name}` detaches)")
    return Seen(row, "attached")


def cloud_row(record: SortieRecord, now: float, source: str = "this controller") -> SortieRow:
    age, ttl_left = now - record.created, record.expires_at - now
    state = "kept" if record.kept else "expired" if ttl_left <= 0 else \
        "orphaned" if record.controller and record.controller.gone(now) else "up"
    running = state in ("up", "orphaned")  # an expired node has powered itself off
    return SortieRow(name=record.cluster, backend=record.cloud, nodes=record.nodes,
                     age_s=round(age), state=state,
                     usd_so_far=round(record.usd_per_hour * age / 3600, 2),
                     usd_per_hour=record.usd_per_hour if running else 0.0,
                     owner=record.owner, ttl_left_s=round(max(0.0, ttl_left)),
                     detail=record.kept or (_held(record.cluster, state) if record.held else None),
                     source=source)


def _held(name: str, state: str) -> str:
    if state == "expired":
        return (f"held with `sortie up`, past its TTL: its nodes have shut down; `sortie down "
                f"{name}` (or `sortie reap`) destroys the rest")
    return (f"held with `sortie up`: `sortie exec {name}` runs jobs on it; `sortie down {name}` "
            "destroys it, else its TTL ends it")


def _cloud(home: Path, now: float) -> list[Seen]:
    stacks = home / naming.STACKS
    return [_cloud_one(stacks, name, now) for name in naming.names_in(stacks)
            if (stacks / name / RECORD_FILE).is_file()]


def _cloud_one(stacks: Path, name: str, now: float) -> Seen:
    try:
        record = statefile.read_model(SortieRecord, stacks / name / RECORD_FILE)
    except (SortieError, OSError) as exc:
        return Seen(SortieRow(name=name, backend="cloud", state="broken", detail=str(exc)),
                    "cloud")
    return Seen(cloud_row(record, now), "cloud", record)


def _elsewhere(stacks: StackStore, known: set[str], now: float) -> list[Seen]:
    """The sorties in a state backend this controller does not know: from their records (or,
    for a stack launched before records, from its config). Per stack, an error is a row."""
    seen = []
    for name in stacks.names():
        if name in known or not naming.NAME.fullmatch(name):
            continue
        try:
            record = stacks.records.load(name) or _record_from_config(stacks, name)
        except Exception as exc:  # a wrong passphrase, a damaged record: this one sortie
            seen.append(Seen(SortieRow(name=name, backend="cloud", state="broken",
                                       detail=first_line(exc), source="state backend"),
                             "elsewhere"))
            continue
        if record is not None:
            seen.append(Seen(cloud_row(record, now, "state backend"), "elsewhere", record))
    return seen


def _record_from_config(stacks: StackStore, name: str) -> SortieRecord | None:
    """A stack without a record: a sortie only if `sortie run` set its expiry."""
    config = stacks.open(name).config()
    if not config.get(f"{NAMESPACE}:expiresAt"):
        return None
    spec = spec_from_config(name, config)
    assert spec.expires_at is not None
    expires = spec.expires_at.timestamp()
    return SortieRecord(cluster=name, profile="(from the state backend)", cloud=spec.cloud,
                        region=spec.region, nodes=spec.nodes,
                        created=expires - spec.ttl_hours * 3600, expires_at=expires,
                        usd_per_hour=usd_per_hour(spec), config=config,
                        backend_url=stacks.backend_url)


def survey(home: Path, access: CloudAccess | None = None) -> list[Seen]:
    """Every sortie: this controller's; with ``access``, also the others in the state backend
    (--backend-url, or this controller's own when it has one and the Pulumi CLI is here)."""
    from stacks.automation import backend_stacks

    now = time.time()
    seen = _local(home, now) + _cloud(home, now) + _attached(home, now)
    if access is None:
        return seen
    stacks = access.stacks or backend_stacks(home, access.backend_url)
    if stacks is not None:
        seen += _elsewhere(stacks, {s.row.name for s in seen}, now)
    return seen


class OwnerTotal(BaseModel):
    """One owner's share of the fleet."""

    owner: str
    sorties: int
    nodes: int
    usd_per_hour: float


class Fleet(BaseModel):
    """`sortie status`: every sortie, and what is running costs per hour, by owner."""

    sorties: list[SortieRow]
    owners: list[OwnerTotal]  # the most expensive first
    usd_per_hour: float  # everything running


def status(home: Path, access: CloudAccess = DEFAULT_ACCESS) -> Fleet:
    """What `sortie status` shows: the state backend's other sorties only when asked for
    (--backend-url): listing a backend needs the Pulumi CLI."""
    asked = access.backend_url is not None or access.stacks is not None
    return fleet([seen.row for seen in survey(home, access if asked else None)])


def fleet(rows: list[SortieRow]) -> Fleet:
    """The rows, and the estimated $/h of everything running, in all and by owner."""
    by_owner: dict[str, list[SortieRow]] = defaultdict(list)
    for row in rows:
        by_owner[row.owner].append(row)
    owners = [OwnerTotal(owner=owner, sorties=len(owned), nodes=sum(r.nodes for r in owned),
                         usd_per_hour=round(sum(r.usd_per_hour for r in owned), 4))
              for owner, owned in by_owner.items()]
    owners.sort(key=lambda total: (-total.usd_per_hour, total.owner))
    return Fleet(sorties=rows, owners=owners,
                 usd_per_hour=round(sum(row.usd_per_hour for row in rows), 4))


# -- acting on one --------------------------------------------------------------------------------


def _kind_named(home: Path, name: str) -> str | None:
    """Which of this controller's sorties NAME is ("local", "kept", "cloud", "attached"), if
    any: from the state directories alone, without reaching any node."""
    if name in LocalBackend(home).cluster_ids():
        return "local"
    if name in naming.names_in(home / naming.KEPT):
        return "kept"
    if (naming.state_dir(home / naming.STACKS, name) / RECORD_FILE).is_file():
        return "cloud"
    if name in AttachedBackend(home).cluster_ids():
        return "attached"
    return None


def refuse_taken(home: Path, name: str, field: str) -> None:
    """A new sortie's (or attached cluster's) NAME must be a sortie name that no sortie of this
    controller has: a usage error naming ``field`` otherwise, before anything is made."""
    naming.check_name(name, field)
    if _kind_named(home, name) is not None:
        raise UsageError(f"{field}: a sortie named {name!r} exists (see `sortie status`)")


def find(home: Path, name: str) -> Seen:
    """The sortie NAME of this controller; a NAME that is not a sortie name, or names none, is a
    usage error before anything is touched."""
    naming.check_name(name, "NAME")
    kind, now = _kind_named(home, name), time.time()
    if kind == "local":
        return _local_one(LocalBackend(home), name, now)
    if kind == "kept":
        return _kept_one(home, name, now)
    if kind == "cloud":
        return _cloud_one(home / naming.STACKS, name, now)
    if kind == "attached":
        return _attached_one(AttachedBackend(home), name, now)
    raise UsageError(f"NAME: no sortie named {name!r} (see `sortie status`)")


def backend_for(home: Path, seen: Seen, access: CloudAccess = DEFAULT_ACCESS) -> Backend:
    """The backend that made a sortie: local, or the stack it was launched on; for an attached
    cluster, the one that detaches it."""
    if seen.kind == "local":
        return LocalBackend(home)
    if seen.kind == "attached":
        return AttachedBackend(home)
    if seen.record is None:
        raise SortieError(f"{seen.row.name}: {seen.row.detail}")
    return backend_for_record(home, seen.record, access)


def backend_for_record(home: Path, record: SortieRecord,
                       access: CloudAccess = DEFAULT_ACCESS) -> PulumiBackend:
    """The backend of a cloud sortie, from its record (launched here or elsewhere)."""
    from stacks.automation import AutomationStacks, require_cloud_tools

    stacks = access.stacks
    if stacks is None:
        require_cloud_tools(record.cloud, f"tear down {record.cluster}")
        stacks = AutomationStacks(home, access.backend_url or record.backend_url)
    return PulumiBackend(record.profile, record.config, stacks, home, sweep=access.sweep)


def backend_for_profile(profile: str, config: dict[str, Any], home: Path,
                        backend_url: str | None = None) -> PulumiBackend:
    """The real backend for a profile, after checking the CLI and credentials are there."""
    from stacks.automation import AutomationStacks, require_cloud_ready, require_cloud_tools

    spec = spec_from_config("profile-check", config)  # a bad profile is named first
    require_cloud_tools(spec.cloud, f"run stack {profile}")
    require_cloud_ready(spec, f"run stack {profile}")
    return PulumiBackend(profile, config, AutomationStacks(home, backend_url), home, spec=spec)


@dataclass(frozen=True)
class LaunchTarget:
    """Where `sortie run` or `sortie up` launches, and the cluster shape it defaults to there."""

    backend: LocalBackend | PulumiBackend
    nodes: int
    procs_per_node: int  # the bundled trainer's default
    gpus_per_node: int = 0
    max_nodes: int = MAX_NODES

    def node_count(self, asked: int | None) -> int:
        """How many nodes to launch: ``asked`` (the task's, or --nodes), else the default; more
        than the backend can make is a UsageError, before anything starts."""
        count = asked or self.nodes
        if count > self.max_nodes:
            raise UsageError(f"nodes: {count}: a {self.backend.name} cluster has at most "
                             f"{self.max_nodes}")
        return count

    def cost(self, nodes: int) -> LaunchCost | None:
        """What ``nodes`` machines cost, shown before launch (None: local nodes cost nothing)."""
        return cluster_cost(self.backend, nodes)


def cluster_cost(backend: object, nodes: int) -> LaunchCost | None:
    """What ``nodes`` machines of a cloud backend cost (None: not a cloud sortie's)."""
    if not isinstance(backend, PulumiBackend):
        return None
    spec = backend.spec
    return LaunchCost(profile=backend.profile, nodes=nodes, instance_type=spec.instance_type,
                      spot=spec.spot, on_demand_fallback=spec.spot and spec.spot_fallback_on_demand,
                      estimate=backend.estimate(nodes))


@dataclass(frozen=True)
class LaunchCost:
    """A cloud cluster's estimated compute cost at launch, and its TTL's worst case."""

    profile: str
    nodes: int
    instance_type: str
    spot: bool
    on_demand_fallback: bool  # spot may fall back to on-demand, at its price
    estimate: CostEstimate

    @property
    def usd_per_hour(self) -> float:
        return self.estimate.usd_per_hour(self.spot)

    @property
    def terms(self) -> str:
        return "spot workers, on-demand head" if self.spot and self.nodes > 1 else \
            "spot" if self.spot else "on-demand"

    def line(self) -> str:
        terms = self.terms
        fallback = (f" (${self.estimate.on_demand_usd_h:,.2f}/h if it falls back to on-demand)"
                    if self.on_demand_fallback else "")
        ttl = self.estimate.ttl_hours
        return (f"{self.profile}: {self.nodes} x {self.instance_type}, {terms}: estimated "
                f"${self.usd_per_hour:,.2f}/h{fallback}; the {ttl:g} h TTL caps it at "
                f"${self.usd_per_hour * ttl:,.2f} (compute only, prices of "
                f"{self.estimate.price_date})")


def launch_target(home: Path, profile: str | None, overrides: tuple[str, ...] = (),
                  backend_url: str | None = None, name: str | None = None) -> LaunchTarget:
    """A stack profile's cloud (its nodes, one process per GPU), else local sshd nodes (2x2).
    A NAME already taken (here, or by a stack in the state backend) is refused first."""
    if name is not None:
        refuse_taken(home, name, "--name")
    if profile is None:
        if overrides:
            raise UsageError("--set: applies to a stack profile; add --stack PROFILE")
        return LaunchTarget(LocalBackend(home), nodes=2, procs_per_node=2,
                            max_nodes=LOCAL_MAX_NODES)
    backend = backend_for_profile(profile, apply_overrides(load_profile(profile), overrides),
                                  home, backend_url)
    if name is not None and backend.exists(name):
        raise UsageError(f"--name: stack {name!r} exists in the state backend (see `sortie "
                         "status --backend-url`)")
    gpus = backend.spec.instance.gpus
    return LaunchTarget(backend, backend.spec.nodes, max(1, gpus), gpus)


def to_take_over(home: Path, name: str) -> Backend:
    """The backend of sortie NAME, which `watch` takes over: only one whose controller is gone."""
    seen = find(home, name)
    if seen.row.state not in REAPED_STATES:
        raise UsageError(f"NAME: sortie {name!r} is {seen.row.state}: only a sortie whose "
                         "controller is gone can be taken over")
    return backend_for(home, seen)


def to_tear_down(home: Path, name: str | None) -> list[Seen]:
    """NAME (an unknown or invalid NAME stops here), or with None every sortie of this
    controller but kept buckets, which are removed only when named."""
    if name is not None:
        return [find(home, name)]
    return [seen for seen in survey(home) if seen.row.state != "kept"
            and seen.kind != "elsewhere"]


HeldBackend = LocalBackend | AttachedBackend | PulumiBackend


def held_cluster(home: Path, name: str, access: CloudAccess = DEFAULT_ACCESS
                 ) -> tuple[HeldBackend, Inventory]:
    """Cluster NAME, held with `sortie up` (local or `--stack`) or attached, and up, for `exec`
    and `run --on`. A sortie that a `run` (or another controller) drives is refused: its job
    is not ours to replace."""
    seen = find(home, name)
    driven = UsageError(f"NAME: {name!r} is a sortie `sortie run` drives, not a cluster held "
                        "with `sortie up`")
    if seen.kind not in ("local", "attached", "cloud"):
        raise UsageError(f"NAME: {name!r} is not a cluster held with `sortie up` or attached "
                         "with `sortie attach`")
    if seen.kind == "cloud" and not (seen.record and seen.record.held):
        raise driven
    if seen.kind == "local" and LocalBackend(home).controller(name) is not None:
        raise driven
    if seen.row.state != "up" and seen.kind == "attached":
        raise SortieError(f"NAME: {name!r} is {seen.row.state}: {seen.row.nodes_up} of "
                          f"{seen.row.nodes} nodes accept SSH connections")
    if seen.row.state != "up":
        why = seen.row.detail or "see `sortie status`"
        raise UsageError(f"NAME: {name!r} is {seen.row.state} ({why}); `sortie down {name}` "
                         "and `sortie up` again")
    backend = backend_for(home, seen, access)
    assert isinstance(backend, HeldBackend)
    return backend, backend.inventory(name)


LAST_RUN_FILE = "last-run"  # in a held cluster's state: the run id of its newest `exec`
LIVE_KINDS = ("local", "cloud", "attached")  # sorties whose nodes are there to read


def state_of(home: Path, seen: Seen) -> Path:
    """Where this controller keeps the state of a sortie it found."""
    parent = {"local": naming.CLUSTERS, "attached": naming.ATTACHED}.get(seen.kind,
                                                                         naming.STACKS)
    return naming.state_dir(home / parent, seen.row.name)


def record_last_run(state: Path, run_id: str) -> None:
    """Say which run a held cluster runs now (or ran last), for `sortie logs NAME`."""
    statefile.write_text(state / LAST_RUN_FILE, run_id + "\n")


def live_run(home: Path, name: str) -> tuple[str, str] | None:
    """(cluster, run id) whose logs are on the nodes for NAME: a sortie's own run, a held
    cluster's newest `exec`, or an `exec`'s run id on the held cluster that runs it; None when
    NAME is neither (its logs may have been collected into the runs directory)."""
    try:
        seen = find(home, name)
    except UsageError:
        seen = None
    if seen is not None and seen.kind in LIVE_KINDS:
        return name, _last_run(state_of(home, seen)) or name
    for other in survey(home):
        if other.kind in LIVE_KINDS and _last_run(state_of(home, other)) == name:
            return other.row.name, name
    return None


GOING_FILE = "going"  # in a held cluster's state: `sortie down` began taking it away


def mark_going(home: Path, seen: Seen) -> None:
    """Say, before anything is stopped, that `sortie down` takes held cluster NAME away: an
    `exec` running on it then says why its job ended (`went_during`)."""
    state = state_of(home, seen)
    if seen.kind in LIVE_KINDS and state.is_dir():
        statefile.write_text(state / GOING_FILE, "")


def went_during(state: Path, since: float) -> bool:
    """Whether `sortie down` took the held cluster whose state is ``state`` away (or began to)
    after ``since``, a wall-clock time."""
    if not state.exists():
        return True
    handle = statefile.open_regular(state / GOING_FILE)
    if handle is None:
        return False
    with handle:  # an earlier `down` that left the cluster up (a node it could not reach)
        return os.fstat(handle.fileno()).st_mtime >= since


def _last_run(state: Path) -> str | None:
    """The recorded run id; a state file is untrusted input: a regular file (never through a
    symlink), read no further than a name can be long, and a valid name, else None."""
    handle = statefile.open_regular(state / LAST_RUN_FILE)
    if handle is None:
        return None
    with handle:
        text = handle.read(128).decode(errors="replace").strip()
    return text if naming.NAME.fullmatch(text) else None


def running_nodes(home: Path, name: str | None) -> tuple[Inventory, Path]:
    """(inventory, pinned known_hosts) of a sortie, for commands that reach its nodes; NAME may
    be left out when exactly one sortie runs."""
    if name is None:
        up = [seen for seen in survey(home) if seen.kind != "kept"]
        if len(up) != 1:
            names = ", ".join(seen.row.name for seen in up)
            raise UsageError("NAME: " + ("no sortie is running" if not up else
                             f"several sorties run ({names}); name one"))
        seen = up[0]
    else:
        seen = find(home, name)
    state = state_of(home, seen)
    if seen.kind == "kept" or not (state / INVENTORY_FILE).is_file():
        raise UsageError(f"NAME: sortie {seen.row.name!r} has no nodes (see `sortie status`)")
    return Inventory.load(state / INVENTORY_FILE), state / KNOWN_HOSTS_FILE


def teardown(home: Path, seen: Seen, access: CloudAccess = DEFAULT_ACCESS) -> Teardown:
    """Tear one sortie down; a failure is this sortie's report, never an exception."""
    try:
        if seen.kind == "kept":
            path = naming.state_dir(home / naming.KEPT, seen.row.name)
            shutil.rmtree(path)
            return Teardown(seen.row.name, removed=1, unit="kept buckets", state_removed=True)
        mark_going(home, seen)
        return backend_for(home, seen, access).down(seen.row.name)
    except SortieError as exc:
        return Teardown(seen.row.name, leftovers=[Leftover("sortie", seen.row.name, str(exc))])


def user_stack(name: str, cwd: Path, stacks: StackStore | None = None) -> StackHandle:
    """The user's own stack NAME (of the Pulumi project in ``cwd``), or ``stacks``' in tests."""
    from stacks.automation import user_stack as automation_stack

    return stacks.open(name) if stacks is not None else automation_stack(name, cwd)


def forget_attached(home: Path, name: str) -> Forgotten:
    """`sortie down NAME --forget`: forget an attached cluster, touching none of its nodes.
    Only an attached one: sortie's own clusters are torn down, with proof."""
    if find(home, name).kind != "attached":
        raise UsageError(f"--forget: {name!r} is not attached (`sortie down {name}` tears a "
                         "sortie's own cluster down, with proof)")
    return AttachedBackend(home).forget_unchecked(name)


def destroy_attached_stack(home: Path, name: str, access: CloudAccess = DEFAULT_ACCESS
                           ) -> list[Teardown]:
    """`sortie down NAME --destroy-stack`: detach NAME, then destroy the Pulumi stack it was
    attached from, with proof. Only for a stack attach, and only when asked."""
    seen = find(home, name)
    if seen.kind != "attached":
        raise UsageError(f"--destroy-stack: {name!r} is not attached (`sortie down {name}` "
                         "tears a sortie's own cluster down)")
    backend = AttachedBackend(home)
    attachment = backend.attachment(name)
    if attachment.source != "pulumi stack" or attachment.cwd is None:
        raise UsageError(f"--destroy-stack: {name!r} was attached from a {attachment.source}, "
                         "not a Pulumi stack: sortie never destroys machines it did not create")
    stack = user_stack(attachment.origin, Path(attachment.cwd), access.stacks)
    mark_going(home, seen)
    detached = backend.down(name)
    destroyed = destroy_stack(stack, attachment.stack_cluster or attachment.origin,
                              access.sweep or sweep_by_tags)
    if destroyed.clean and not detached.clean:  # its machines are gone: nothing left on them
        backend.forget(name)
        detached = Teardown(name, removed=detached.removed, unit=detached.unit, detached=True,
                            state_removed=True)
    return [detached, destroyed]
