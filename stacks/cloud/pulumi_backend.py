"""Cloud sorties: one Pulumi stack per sortie, behind the backend interface (`stacks/backend.py`).

`PulumiBackend` builds a stack from a profile: `up` records the sortie and creates its resources,
`lost_nodes` refreshes and looks for missing machines, `replace` runs `up` again (replacing
machines that exist but are lost), `down` destroys, refreshes, sweeps the cloud by the sortie tags
and only then removes the stack and the record. Nodes and the bucket are found by the program's
subtrees (`infra/parts.py`: a node's machine under its Node component, the bucket's under Bucket).

Pulumi itself sits behind `StackHandle`, the few stack operations sortie uses: the real one drives
the Pulumi CLI (`stacks/cloud/automation.py`); tests, an in-repo double. State on the controller,
``$SORTIE_HOME/stacks/<name>/``: ``sortie.json`` (the `SortieRecord`, also kept beside Pulumi's
state), ``client_key`` (0600), ``inventory.json``, ``known_hosts``."""

from __future__ import annotations

import copy
import functools
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from sortie.core import naming, statefile
from sortie.core.errors import SortieError, first_line
from sortie.core.inventory import INVENTORY_FILE, Inventory
from sortie.core.job import Job
from sortie.cost.launch_cost import LaunchCost
from sortie.infra.cloud_home import Leftover
from sortie.infra.cloud_home import home as cloud_home
from sortie.infra.spec import (
    BUCKET,
    NAMESPACE,
    NODE,
    ClusterSpec,
    CostEstimate,
    launch_terms,
    node_part_name,
    part_type,
)
from sortie.stacks.backend import Capabilities, LaunchError, Lost, Placement, Teardown
from sortie.stacks.cloud.outputs import inventory_from_outputs
from sortie.stacks.cloud.sites import Site, cloud_launch_cost, launch_error
from sortie.stacks.cloud.stack_api import (
    RunningMachines,
    StackError,
    StackHandle,
    StackLockedError,
    StackResource,
    StackStore,
    Sweep,
    Zones,
    offered_zones,
    running_machines,
    spec_from_config,
    sweep_by_tags,
    usd_per_hour,
)
from sortie.stacks.cloud.teardown import Steps, purged, resources_under, swept, with_dependencies
from sortie.stacks.records import Controller, SortieRecord

T = TypeVar("T")
RECORD_FILE = "sortie.json"


class PulumiBackend(Capabilities):
    """A profile's cluster as one Pulumi stack per sortie."""

    detaches = False  # its limits: the nodes' timers, the TTL, `reap` (no watchdog)

    def node_timers(self) -> PulumiBackend:
        return self

    def notional_price(self, nodes: int, held: str | None = None) -> None:  # (`estimate`)
        return None

    def launch_cost(self, nodes: int) -> LaunchCost:
        return cloud_launch_cost(self.sites, nodes)

    def __init__(self, profile: str, config: dict[str, Any], stacks: StackStore,
                 home: Path, sweep: Sweep | None = None, retry_wait_s: float = 5.0,
                 spec: ClusterSpec | None = None, zones: Zones | None = None,
                 fallbacks: tuple[Site, ...] = (), running: RunningMachines | None = None
                 ) -> None:
        """``spec``: the profile's, when the caller has validated it already; ``sweep``,
        ``zones`` and ``running``: the cloud's tag sweep, zone lookup and machine states, or
        tests' stand-ins; ``fallbacks``: the sites tried when the profile's own have no room."""
        self.stacks, self.home, self.retry_wait_s = stacks, home, retry_wait_s
        self.sweep, self.zones = sweep or sweep_by_tags, zones or offered_zones
        self.running = running or running_machines
        first = Site(profile, config, spec or spec_from_config("profile-check", config))
        self.sites = (first, *fallbacks)  # (a bad profile fails first)
        self._use(first)
        # The last checkpoint, then destroy: instances end in minutes.
        self.backend_url, self.wind_down_s = self.stacks.backend_url, 180.0
        # A heartbeat must never write the record of a sortie that teardown is removing, and
        # the heartbeat thread's update and the driver's (the job) must not drop each other's.
        self._writing, self._closing = threading.RLock(), set[str]()
        self._sortie_ids: dict[str, str] = {}  # the names this process reserved: their ids

    def _use(self, site: Site) -> None:
        """Launch at ``site`` from now on (its cloud, machine and region; its profile's terms)."""
        self.site = site
        self.profile, self.config, self.spec = site.profile, site.config, site.spec
        self.name = self.spec.cloud
        self.cloud = cloud_home(self.name)
        self.preemption_notice_s, self.ssh_wait = self.cloud.preemption_notice_s, \
            self.cloud.ssh_wait
        self.instance_type: str | None = self.spec.instance_type
        self.owner = self.spec.owner

    def state_dir(self, cluster_id: str) -> Path:
        return naming.state_dir(self.home / naming.STACKS, cluster_id)

    def reserve(self, cluster_id: str) -> None:
        """Take the name: this controller's state directory for it, made atomically, and no
        sortie or stack of that name in the state backend (shared with other controllers).
        The launch gets a sortie id of its own, which tags every resource and the sweep."""
        state = naming.take(self.home / naming.STACKS, cluster_id)
        try:
            if self.exists(cluster_id):
                raise naming.NameTakenError(cluster_id, " in the state backend "
                                     f"({self.stacks.backend_url or 'this controller'})")
        except BaseException:
            shutil.rmtree(state)  # the directory this call just made, and nothing else yet
            raise
        with self._writing:
            self._closing.discard(cluster_id)
        self._sortie_ids[cluster_id] = f"{cluster_id}-{secrets.token_hex(4)}"

    # -- the record -----------------------------------------------------------------------------

    def record(self, cluster_id: str) -> SortieRecord | None:
        """What `up` recorded: this controller's copy, else the one in the state backend."""
        path = self.state_dir(cluster_id) / RECORD_FILE
        if path.is_file():
            return statefile.read_model(SortieRecord, path)
        return self.stacks.records.load(cluster_id)

    def _save(self, record: SortieRecord) -> None:
        with self._writing:
            if record.cluster in self._closing:
                return
            state = self.state_dir(record.cluster)
            state.mkdir(parents=True, exist_ok=True, mode=0o700)
            statefile.write_text(state / RECORD_FILE, record.model_dump_json(indent=2) + "\n")
            self.stacks.records.save(record)

    def _update(self, cluster_id: str, **changes: Any) -> None:
        with self._writing:  # read, change, write as one: no other update lands in between
            record = self.record(cluster_id)
            if record is not None:
                self._save(record.model_copy(update=changes))

    def claim(self, cluster_id: str) -> None:
        """Record this process as the sortie's controller, with a fresh heartbeat."""
        self._update(cluster_id, controller=Controller.me())

    def hold(self, cluster_id: str) -> None:
        """`sortie up --stack`: the cluster is up and now held, driven by no controller (its
        TTL still ends it); `sortie exec` runs jobs on it, `sortie down` destroys it."""
        self._update(cluster_id, controller=None, held=True)

    def save_job(self, cluster_id: str, job: Job) -> None:
        self._update(cluster_id, job=job)

    def load_job(self, cluster_id: str) -> Job | None:
        record = self.record(cluster_id)
        return record.job if record else None

    # -- up -------------------------------------------------------------------------------------

    def exists(self, cluster_id: str) -> bool:
        """A sortie or a stack of that name is already there (a launch must not take it over)."""
        return self.record(cluster_id) is not None or cluster_id in self.stacks.names()

    def capped(self, max_usd: float, nodes: int, held: bool = False) -> PulumiBackend:
        """Every site's node-side TTL no longer than what ``max_usd`` buys there: with the
        controller gone, the nodes still stop before the budget is spent."""
        return copy.copy(self)._resite([site.capped(max_usd, nodes) for site in self.sites])

    def idle_stop(self, minutes: int) -> None:
        """Arm the idle stop on every node (`sortie up --idle-stop`): a node powers itself off
        once nothing has run on it that long; `sortie reap` destroys the rest."""
        self._resite([site.setting("idleStopMinutes", minutes) for site in self.sites])

    def _resite(self, sites: list[Site]) -> PulumiBackend:
        """The sites, changed before launch; the first is where the launch starts."""
        self.sites = tuple(sites)
        self._use(self.sites[0])
        return self

    def launched_price(self, cluster_id: str) -> tuple[float, str] | None:
        """The cluster's $/h and terms as it was launched: a fallback to another site, or to
        on-demand, changes them from the estimate before launch."""
        record = self.record(cluster_id)
        if record is None:
            return None
        spot = bool(record.config.get(f"{NAMESPACE}:spot"))
        return record.usd_per_hour, launch_terms(spot, record.nodes)

    def estimate(self, nodes: int) -> CostEstimate:
        """What ``nodes`` of the profile's machines cost, before anything is launched."""
        return self.site.estimate(nodes)

    def placements(self) -> list[Placement]:
        """Each site's placements in turn (`Site.placements`; one site but with `--gpu`)."""
        return [replace(placement, site=index,
                        where=site.describe() if len(self.sites) > 1 else "")
                for index, site in enumerate(self.sites)
                for placement in site.placements(self._offered(site.spec))]

    def _offered(self, spec: ClusterSpec) -> list[str]:
        """The zones the cloud says offer the instance type; none when it cannot say (no
        credentials yet, an API refusal): the program then asks, and fails in one line."""
        try:
            return self.zones(spec)
        except Exception:
            return []

    def up(self, cluster_id: str, nodes: int, placement: Placement | None = None) -> Inventory:
        """One launch attempt. The name is reserved first unless this process did already; an
        existing record of another sortie (another id) is never taken over."""
        placement = placement or Placement()
        if self.sites[placement.site] is not self.site:  # a fallback site (`run --gpu`)
            self._use(self.sites[placement.site])
        if cluster_id not in self._sortie_ids:
            self.reserve(cluster_id)
        sortie_id = self._sortie_ids[cluster_id]
        existing = self.record(cluster_id)
        if existing is not None and existing.config.get(f"{NAMESPACE}:sortieId") != sortie_id:
            raise naming.NameTakenError(cluster_id, " (its record holds another sortie)")
        expires = datetime.now(timezone.utc) + timedelta(hours=self.spec.ttl_hours)
        config = {**self.config, f"{NAMESPACE}:nodes": nodes, f"{NAMESPACE}:sortieId": sortie_id,
                  # Fixed at launch: every later `up` (recovery) keeps the same tags and expiry.
                  f"{NAMESPACE}:expiresAt": expires.strftime("%Y-%m-%dT%H:%M:00Z")}
        if placement.zone is not None:
            config[f"{NAMESPACE}:zone"] = placement.zone
        if placement.spot is not None:
            config[f"{NAMESPACE}:spot"] = placement.spot
        spec = spec_from_config(cluster_id, config)
        # Recorded before anything exists: a controller killed during `up` leaves a sortie that
        # `status` shows and `reap` ends.
        self._save(SortieRecord(
            cluster=cluster_id, profile=self.profile, cloud=spec.cloud, region=spec.region,
            nodes=nodes, created=time.time(), expires_at=expires.timestamp(), config=config,
            usd_per_hour=usd_per_hour(spec), backend_url=self.stacks.backend_url,
            owner=spec.owner, controller=Controller.me()))
        stack = self.stacks.open(cluster_id)
        try:
            outputs = stack.up(config)
        except StackError as exc:
            self._destroy(stack, cluster_id)  # all or nothing: the partial cluster goes
            raise launch_error(spec.cloud, str(exc)) from None
        return self._inventory(cluster_id, outputs)

    def inventory(self, cluster_id: str) -> Inventory:
        """The nodes: this controller's copy, else built from the stack's outputs (another
        controller's sortie, from the shared state backend)."""
        path = self.state_dir(cluster_id) / INVENTORY_FILE
        if path.is_file():
            return Inventory.load(path)
        return self._inventory(cluster_id, self.stacks.open(cluster_id).outputs())

    def _inventory(self, cluster_id: str, outputs: dict[str, Any]) -> Inventory:
        state = self.state_dir(cluster_id)
        key_path = state / "client_key"
        key = outputs.pop("client_private_key", None)
        if not key:
            raise LaunchError("stack output client_private_key: missing")
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        statefile.write_text(key_path, key if key.endswith("\n") else key + "\n")
        inventory = inventory_from_outputs(outputs, key_path)
        inventory.save_state(state)
        return inventory

    # -- lost nodes -----------------------------------------------------------------------------

    def _machines(self, stack: StackHandle, inventory: Inventory) -> dict[str, StackResource]:
        """Each node's machine, by node name: the machine under the node's Node component."""
        resources = stack.resources()
        parts = {r.urn: r.name for r in resources if r.type == part_type(self.cloud.name, NODE)}
        in_part = {parts[r.parent]: r for r in resources
                   if r.type == self.cloud.machine_type and r.parent in parts}
        named = {node.name: node_part_name(inventory.cluster_id, node.name)
                 for node in inventory.nodes}
        return {node: in_part[part] for node, part in named.items() if part in in_part}

    def lost_nodes(self, inventory: Inventory) -> Lost:
        """Refresh the stack; a node whose machine the cloud no longer has is lost."""
        stack = self.stacks.open(inventory.cluster_id)
        stack.refresh()
        machines = self._machines(stack, inventory)
        return Lost([n.name for n in inventory.nodes if n.name not in machines])

    def replace(self, inventory: Inventory, lost: list[str]) -> Inventory:
        """`up` again: Pulumi re-creates machines the refresh found gone; machines that still
        exist but were lost (SSH dead, preemption notice) are replaced explicitly."""
        stack = self.stacks.open(inventory.cluster_id)
        machines = self._machines(stack, inventory)
        replace = [machines[name].urn for name in lost if name in machines]
        record = self.record(inventory.cluster_id)
        config = record.config if record else self.config
        return self._inventory(inventory.cluster_id, stack.up(config, replace=replace))

    # -- down -----------------------------------------------------------------------------------

    def _unlocked(self, stack: StackHandle, operation: Callable[[], T]) -> T:
        """Run a stack operation; if a stale lock (its holder died on this machine) stops it,
        clear the lock the way Pulumi documents (`pulumi cancel`) and run it once more."""
        try:
            return operation()
        except StackLockedError as exc:
            if not exc.stale:
                raise
            stack.cancel()
            return operation()

    def _destroy(self, stack: StackHandle, cluster_id: str,
                 targets: list[str] | None = None) -> None:
        """Destroy, retried: a cloud API may refuse once (a dependency still draining)."""
        retrying = Retrying(stop=stop_after_attempt(3), reraise=True,
                            wait=wait_exponential(multiplier=self.retry_wait_s, max=60),
                            retry=retry_if_exception_type(StackError))
        try:
            retrying(self._unlocked, stack, lambda: stack.destroy(targets))
        except StackError as exc:
            raise SortieError(f"destroying {cluster_id} failed 3 times: {exc}") from None

    def down(self, cluster_id: str, keep_bucket: bool = False) -> Teardown:
        """Destroy, then prove: a refresh shows 0 resources and a sweep of the cloud by the
        sortie tags finds none. With ``keep_bucket`` the bucket stays, in the stack.

        Every step is tried whatever the ones before it did (a locked stack, a pending create
        left by a controller killed during `up`): teardown always reaches the sweep, and says
        what it could not do."""
        report = Teardown(cluster_id)
        record = self.record(cluster_id)
        if record is None and cluster_id not in self.stacks.names():
            report.state_removed = True
            return report
        stack = self.stacks.open(cluster_id)
        step = Steps(report, lambda operation: self._unlocked(stack, operation))
        step("refresh", lambda: stack.refresh(clear_pending_creates=True), None)
        declared = step("reading the stack", stack.resources, list[StackResource]())
        before = [r for r in declared if r.is_cloud_resource]
        bucket = resources_under(declared, part_type(self.cloud.name, BUCKET))
        kept = with_dependencies(before, bucket) if keep_bucket else []
        doomed = [r.urn for r in before if r not in kept]
        if not kept:
            step("destroy", lambda: self._destroy(stack, cluster_id), None)
        elif doomed:
            step("destroy", lambda: self._destroy(stack, cluster_id, doomed), None)
        config = functools.partial(self._config_of, stack, record)  # read only if needed
        step("purging what the cloud keeps of deleted resources",
             lambda: purged(self.cloud, spec_from_config(cluster_id, config())), None)
        step("refresh", stack.refresh, None)
        remaining = [r for r in step("reading the stack", stack.resources, before)
                     if r.is_cloud_resource and r not in kept]
        report.removed = max(0, len(before) - len(kept) - len(remaining))
        report.leftovers += [Leftover(r.type, r.name, f"sortie down {cluster_id}")
                             for r in remaining]
        report.leftovers += [leftover for leftover in swept(
            self.sweep, cluster_id, config, f"; run `sortie down {cluster_id}` again")
            if not (kept and leftover.kind in self.cloud.bucket_kinds)]
        if kept:
            note = (f"the bucket ({len(kept)} resources) in stack {cluster_id}; "
                    f"`sortie down {cluster_id}` removes it")
            report.kept.append(note)
            self._update(cluster_id, kept=note, controller=None)
        elif not report.leftovers:
            step("stack rm", stack.remove, None)
        if not report.leftovers and not kept:
            with self._writing:
                self._closing.add(cluster_id)
            naming.remove(self.state_dir(cluster_id), ignore_errors=True)
            self.stacks.records.remove(cluster_id)
            report.state_removed = True
        return report

    def machines_running(self, cluster_id: str) -> list[str]:
        """The cluster's machines the cloud says are not stopped; SortieError if it can't say."""
        record = self.record(cluster_id)
        try:
            return self.running(spec_from_config(cluster_id, record.config if record else
                                                 self.config))
        except Exception as exc:  # an SDK or API error of any kind
            raise SortieError(f"cannot ask {self.name} whether its machines are stopped: "
                              f"{first_line(exc)}") from None

    def _config_of(self, stack: StackHandle, record: SortieRecord | None) -> dict[str, Any]:
        """The sortie's config as launched: its record's, else its stack's, else the profile's."""
        return record.config if record else (stack.config() or self.config)
