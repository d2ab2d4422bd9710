"""An in-repo double of a Pulumi stack (the `StackHandle` sortie uses), whose machines are real.

Each "machine" of a successful `up` is a real local node (sshd on loopback, from
`LocalBackend`), so bootstrap, torchrun, checkpoints in the bucket and collection run for real
on top of the cloud path's orchestration. What a cloud does is scripted:
- ``capacity``: machines each placement can still give, keyed by (zone, spot), and
  ``region_capacity`` by region; an `up` that needs more creates the network and the machines
  it can, then fails half-way, like Pulumi;
- ``fail_destroys``: how many `destroy` calls fail before one succeeds;
- ``launch_errors``: what each next `up` fails with after making the network (a quota, a
  permission: each cloud's own error text), before any capacity is asked;
- ``reclaim(node)``: the cloud takes a machine back (spot): it is gone, and a refresh sees it;
- ``die_during_up``: the controller killed mid-`up`, leaving a pending create and a stale lock.
``cloud`` is what exists in the cloud (by URN); the stack's state is ``state``.
"""

from __future__ import annotations

import getpass
import socket
import sys
from pathlib import Path
from typing import Any

from sortie.core.inventory import Inventory
from sortie.infra.cloud_home import Leftover
from sortie.infra.keys import fingerprint
from sortie.infra.parts import BUCKET, NETWORK, NODE, NODE_ACCESS, node_part_name, part_type
from sortie.stacks.cloud.pulumi_backend import PulumiBackend
from sortie.stacks.cloud.stack_api import StackError, StackLockedError, StackResource
from sortie.stacks.local.local_backend import LocalBackend
from sortie.stacks.profiles import apply_overrides, load_profile
from sortie.stacks.records import RecordStore

# What every `up` declares besides the machines: each kind's part (`infra/parts.py`, as the real
# program places it) and what it depends on (by kind).
BASE = {"aws:ec2/vpc:Vpc": (NETWORK, ()),
        "aws:ec2/subnet:Subnet": (NETWORK, ("aws:ec2/vpc:Vpc",)),
        "aws:ec2/securityGroup:SecurityGroup": (NETWORK, ("aws:ec2/vpc:Vpc",)),
        "aws:s3/bucket:Bucket": (BUCKET, ()),
        "aws:s3/bucketPolicy:BucketPolicy": (BUCKET, ("aws:s3/bucket:Bucket",)),
        "aws:iam/role:Role": (NODE_ACCESS, ()),
        "aws:iam/rolePolicy:RolePolicy": (NODE_ACCESS, ("aws:iam/role:Role",
                                                        "aws:s3/bucket:Bucket"))}
PART_NAMES = {NETWORK: "network", BUCKET: "bucket", NODE_ACCESS: "node-access"}
MACHINE = "aws:ec2/instance:Instance"
MACHINE_NEEDS = ("aws:ec2/subnet:Subnet", "aws:ec2/securityGroup:SecurityGroup",
                 "aws:iam/role:Role")
CLUSTER = "sortie:aws:GpuCluster"


class DoubleStack:
    def __init__(self, name: str, cloud: DoubleCloud) -> None:
        self.name, self.cloud = name, cloud
        self.state: dict[str, str] = {}  # urn -> type: what the stack's state knows
        self.dependencies: dict[str, tuple[str, ...]] = {}  # urn -> urns it depends on
        self.parents: dict[str, str] = {}  # urn -> its parent's urn
        self.settings: dict[str, Any] = {}  # the config of the last `up`
        self.inventory: Inventory | None = None
        self.calls: list[str] = []
        self.removed = False
        self.locked_by: tuple[str, int] | None = None  # (host, pid) of a lock's holder
        self.pending_creates: list[str] = []

    def _urn(self, chain: tuple[str, ...], name: str) -> str:
        return f"urn:pulumi:{self.name}::sortie::{'$'.join(chain)}::{name}"

    def _component(self, kind: str, name: str) -> str:
        """A component in the state (the cloud has no such thing): the cluster or one part."""
        chain = (CLUSTER,) if kind == CLUSTER else (CLUSTER, part_type("aws", kind))
        urn = self._urn(chain, name)
        self.state[urn], self.dependencies[urn] = chain[-1], ()
        self.parents[urn] = "" if kind == CLUSTER else self._urn((CLUSTER,), self.name)
        return urn

    def _part_of(self, kind: str) -> str:
        part = BASE[kind][0]
        return self._component(part, f"{self.name}-{PART_NAMES[part]}")

    def _resource_urn(self, kind: str) -> str:
        part = BASE[kind][0]
        return self._urn((CLUSTER, part_type("aws", part), kind), f"{self.name}-{_short(kind)}")

    def machine_urn(self, node: str) -> str:
        return self._urn((CLUSTER, part_type("aws", NODE), MACHINE),
                         node_part_name(self.name, node))

    def _create(self, urn: str, kind: str, parent: str, needs: tuple[str, ...]) -> None:
        self.state[urn] = self.cloud.resources[urn] = kind
        self.dependencies[urn] = tuple(self._resource_urn(k) for k in needs)
        self.parents[urn] = parent

    def _create_machine(self, node: str) -> None:
        self._component(CLUSTER, self.name)
        part = self._component(NODE, node_part_name(self.name, node))
        self._create(self.machine_urn(node), MACHINE, part, MACHINE_NEEDS)

    def up(self, config: dict[str, Any], replace: list[str] | None = None) -> dict[str, Any]:
        unknown = [urn for urn in replace or [] if urn not in self.state]
        if unknown:
            raise StackError(f"pulumi up: error: no such resource to replace: {unknown[0]}")
        self.calls.append("up" + (f" replace={len(replace)}" if replace else ""))
        self.settings = dict(config)
        nodes = int(config["sortie:nodes"])
        placement = (config.get("sortie:zone"), bool(config.get("sortie:spot")))
        self._component(CLUSTER, self.name)
        for kind, (_part, needs) in BASE.items():
            self._create(self._resource_urn(kind), kind, self._part_of(kind), needs)
        if self.inventory is None and self.cloud.launch_errors:
            raise StackError(f"pulumi up: error: {self.cloud.launch_errors.pop(0)}")
        if self.inventory is None:
            region = config.get("sortie:region")
            available = min(self.cloud.capacity.get(placement, nodes),
                            self.cloud.region_capacity.get(region, nodes))
            for index in range(min(available, nodes)):
                self._create_machine(f"node-{index}")
            if available < nodes:
                raise StackError(f"pulumi up: error: creating EC2 Instance (node-{available}): "
                                 f"InsufficientInstanceCapacity in {placement[0] or region}")
            self.inventory = self.cloud.local.up(self.name, nodes)
        else:  # re-create what the refresh found gone, replace what was asked
            missing = [n.name for n in self.inventory.nodes
                       if self.machine_urn(n.name) not in self.state]
            replaced = [n.name for n in self.inventory.nodes
                        if self.machine_urn(n.name) in (replace or [])]
            for name in missing + replaced:
                self._create_machine(name)
            self.inventory = self.cloud.local.replace(self.inventory, missing + replaced)
        return self._outputs()

    def _outputs(self) -> dict[str, Any]:
        inventory = self.inventory
        assert inventory is not None
        return {
            "cluster": self.name, "cloud": "aws", "ssh_user": getpass.getuser(),
            "workdir": "/unused", "python": sys.executable, "gpus_per_node": 0,
            "nodes": [{"name": n.name, "public_address": n.address,
                       "private_address": n.private_address, "host_key": n.host_key,
                       "host_key_fingerprint": fingerprint(n.host_key), "spot": True,
                       "ssh_port": n.port, "workdir": n.workdir} for n in inventory.nodes],
            "bucket_url": f"file://{Path(inventory.train_env['SORTIE_CHECKPOINT_URL']).parent}",
            "train_env": {**{k: v for k, v in inventory.train_env.items()
                             if k != "SORTIE_CHECKPOINT_URL"},
                          # The cloud's metadata service, where its preemption notices appear.
                          "SORTIE_METADATA_URL": self.cloud.metadata_url},
            "client_private_key": Path(inventory.nodes[0].key_path).read_text(),
            # Its machines are local nodes, whose head address other tests' clusters share.
            "rdzv_port": inventory.rdzv_port,
        }

    def config(self) -> dict[str, Any]:
        return dict(self.settings)

    def outputs(self) -> dict[str, Any]:
        self._check_lock()
        if self.inventory is None:
            raise StackError("pulumi stack output: error: the stack has no outputs")
        return self._outputs()

    def _check_lock(self) -> None:
        if self.locked_by:
            host, pid = self.locked_by
            raise StackLockedError(
                "pulumi refresh: error: the stack is currently locked by 1 lock(s); "
                f"created by ana@{host} (pid {pid})", host, pid)

    def refresh(self, clear_pending_creates: bool = False) -> None:
        self._check_lock()
        self.calls.append("refresh")
        if self.pending_creates and not clear_pending_creates:
            raise StackError("pulumi refresh: error: the stack has pending create operations")
        if clear_pending_creates:  # Pulumi forgets them; the cloud may still have them
            self.pending_creates = []
        self.state = {urn: kind for urn, kind in self.state.items()
                      if urn in self.cloud.resources or kind.startswith("sortie:")}

    def cancel(self) -> None:
        self.calls.append("cancel")
        self.locked_by = None

    def die_during_up(self, lock_pid: int) -> None:
        """The controller (and its Pulumi CLI) killed mid-`up`: a machine the cloud created but
        the state only knows as a pending create, and the stack's lock left behind."""
        urn = self.machine_urn("node-9")
        self.cloud.resources[urn] = MACHINE
        self.pending_creates.append(urn)
        self.locked_by = (socket.gethostname(), lock_pid)

    def resources(self) -> list[StackResource]:
        return [StackResource(urn, kind, self.dependencies[urn], self.parents[urn])
                for urn, kind in self.state.items()]

    def destroy(self, targets: list[str] | None = None) -> None:
        self._check_lock()
        self.calls.append("destroy")
        if self.cloud.fail_destroys > 0:
            self.cloud.fail_destroys -= 1
            raise StackError("pulumi destroy: error: deleting EC2 VPC: DependencyViolation")
        for urn in self.state:  # Pulumi's rule for a targeted destroy
            if targets is not None and urn not in targets and \
                    set(self.dependencies[urn]) & set(targets):
                raise StackError(f"pulumi destroy: error: {urn} depends on a targeted "
                                 "resource; use --target-dependents")
        for urn in list(self.state):
            if targets is None or urn in targets:
                del self.state[urn]
                self.cloud.resources.pop(urn, None)
        if not any(kind == MACHINE for kind in self.state.values()):
            keep = any(kind.startswith("aws:s3/") for kind in self.state.values())
            self.cloud.local.down(self.name, keep_bucket=keep)
            self.inventory = None

    def remove(self) -> None:
        if self.state:
            raise StackError("pulumi stack rm: error: the stack still has resources")
        self.calls.append("remove")
        self.removed = True
        self.cloud.stacks.pop(self.name, None)


class DoubleCloud:
    """A cloud and a state backend in one: the `StackStore` the backend opens stacks from."""

    backend_url = None
    # Nothing listens on the discard port: the trainer's notice polls fail fast (it says so once).
    metadata_url = "http://127.0.0.1:9"

    def __init__(self, home: Path) -> None:
        self.records = RecordStore(f"file://{home / 'double-state'}")  # beside the state
        self.local = LocalBackend(home / "double-machines")
        self.stacks: dict[str, DoubleStack] = {}
        self.resources: dict[str, str] = {}  # what exists in the cloud, urn -> type
        self.capacity: dict[tuple[str | None, bool], int] = {}
        self.region_capacity: dict[str, int] = {}  # machines each region can still give
        self.offered_zones: list[str] = []  # zones offering the type ([]: the program picks)
        self.fail_destroys = 0
        self.launch_errors: list[str] = []
        self.stopped: set[str] = set()  # machines (urns) powered off in the guest: they exist
        self.cannot_ask = False  # the machine-state API fails

    def backend(self, home: Path, *settings: str) -> PulumiBackend:
        """The real Pulumi backend of profile aws-p3-dev (plus ``settings``) on this double."""
        config = apply_overrides(load_profile("aws-p3-dev"), settings)
        return PulumiBackend("aws-p3-dev", config, self, home, sweep=self.sweep, retry_wait_s=0,
                             zones=lambda spec: list(self.offered_zones))

    def update_record(self, name: str, **changes: Any) -> None:
        """Change a sortie's record in the state backend (time passes, a controller dies)."""
        self.records.save(self.records.load(name).model_copy(update=changes))

    def open(self, name: str) -> DoubleStack:
        return self.stacks.setdefault(name, DoubleStack(name, self))

    def names(self) -> list[str]:
        return sorted(self.stacks)

    def reclaim(self, cluster: str, node: str) -> None:
        """The cloud takes a spot machine back."""
        self.local.reclaim(cluster, node)
        self.resources.pop(self.stacks[cluster].machine_urn(node))

    def power_off(self, cluster: str, node: str) -> None:
        """The node powers itself off (its idle stop): gone from the network, but the machine
        exists, stopped, until destroyed."""
        self.local.reclaim(cluster, node)
        self.stopped.add(self.stacks[cluster].machine_urn(node))

    def running(self, spec: Any) -> list[str]:
        """The cluster's machines that are not stopped, as the cloud's API says."""
        if self.cannot_ask:
            raise RuntimeError("DescribeInstances: RequestLimitExceeded")
        return [urn for urn, kind in self.resources.items()
                if f"::{spec.cluster}-" in urn and kind == "aws:ec2/instance:Instance"
                and urn not in self.stopped]

    def sweep(self, spec: Any) -> list[Leftover]:
        """What still exists in the cloud for the cluster, whether the state knows it or not:
        the taggable kinds, named as the AWS sweep names them."""
        return [Leftover(SWEEP_KINDS[kind], urn, "aws ... delete")
                for urn, kind in self.resources.items()
                if f"::{spec.cluster}-" in urn and kind in SWEEP_KINDS]


SWEEP_KINDS = {"aws:s3/bucket:Bucket": "s3:bucket", "aws:iam/role:Role": "iam:role",
               "aws:ec2/instance:Instance": "ec2:instance", "aws:ec2/vpc:Vpc": "ec2:vpc",
               "aws:ec2/subnet:Subnet": "ec2:subnet",
               "aws:ec2/securityGroup:SecurityGroup": "ec2:security-group"}


def _short(kind: str) -> str:
    """"aws:ec2/securityGroup:SecurityGroup" -> "securitygroup": a resource's logical name."""
    return kind.rsplit(":", 1)[-1].lower()
