"""The local backend: a cluster of real OpenSSH daemons on loopback addresses.

Each node is an ``sshd`` run as the invoking user on its own address (127.0.1.1, 127.0.1.2, ...)
with its own host key, and a work directory that stands for its disk. Everything after
provisioning (Fabric over SSH, torchrun, collection, teardown) is the same code path as a cloud.

State lives in ``$SORTIE_HOME/clusters/<cluster-id>/`` (default ``~/.sortie``)::

    client_key, client_key.pub      the controller's key for this cluster (0600)
    authorized_keys, known_hosts    what sshd accepts / the pinned host keys
    inventory.json                  the Inventory bootstrap consumes
    nodes/node-<i>/                 sshd_config, host key, sshd.log, disk/ (the node's workdir)
    bucket/                         the "bucket": checkpoints every node reaches
    images                          the job images replaced nodes had pulled (node_images.py)
    process-tag, watch.json, ...    its processes' tag, a held cluster's limits (held_limits.py)

A lost node (its sshd gone: killed, or `reclaim`ed as a cloud reclaims a spot machine) is
replaced on the same address, with a new host key and an empty disk."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from sortie.core import naming
from sortie.core.errors import SortieError
from sortie.core.home import sortie_home
from sortie.core.inventory import Inventory, Node
from sortie.infra.cloud_home import Leftover, SshWait
from sortie.stacks.backend import Capabilities, LaunchError, Lost, Placement, Teardown
from sortie.stacks.listing import RecordsInStateDir, Seen
from sortie.stacks.local.local_rehearsal import (
    CAPACITY_ENV,
    NotionalPrice,
    capacity,
    notional_price,
    record_price,
    recorded_price,
)
from sortie.stacks.local.local_status import local_row
from sortie.stacks.local.processes import cluster_processes, node_cgroups
from sortie.stacks.machine.held_limits import (
    HeldLimits,
    draw_tag,
    hold_limits,
    start_watchdog,
    tag_of,
)
from sortie.stacks.machine.loopback import (
    LOCAL_MAX_NODES,
    find_sshd,
    is_listening,
    keygen,
    node_addresses,
    port_for_launch,
    rendezvous_port,
    signal_all,
    start_sshd,
    wait_gone,
)
from sortie.stacks.machine.node_cgroup import NodeCgroup
from sortie.stacks.machine.node_images import keep_listings, remove_images
from sortie.stacks.machine.node_network import (
    IFNAME,
    NAMESPACED_MAX_NODES,
    NodeNetwork,
    link_rates,
    network_mode,
    sftp_server,
)
from sortie.stacks.records import Heartbeats, controller_files, inventory_in

if TYPE_CHECKING:
    from sortie.stacks.booted.nodes import BootedNodes
    from sortie.stacks.listing import LiveListing

STOP_GRACE_S = 3.0
IMAGES_KEPT = "images"  # in the state: what replaced nodes listed of a job's images
WIND_DOWN_MAX_S = 10.0  # what a budget keeps for a local wind-down, however busy the machine


class LocalBackend(Capabilities, RecordsInStateDir):
    """Starts, repairs, lists and tears down local clusters under ``home/clusters``."""

    name = kind = "local"
    preemption_notice_s, detaches = 0.0, False
    ssh_wait = SshWait(120, "sshd to start")
    instance_type = profile = backend_url = None
    @property
    def wind_down_s(self) -> float:
        """The trainer's last checkpoint, collection, teardown: seconds here, on this machine's
        CPUs, so longer as it is busier (a budget stops the job this much early), up to a cap:
        on a loaded machine an uncapped reserve outgrew small budgets before any job ran."""
        return min(WIND_DOWN_MAX_S, 3.0 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))

    def __init__(self, home: Path | None = None,
                 rehearse: tuple[str, tuple[str, ...]] | None = None) -> None:
        """``rehearse``: a cloud profile and its `--set` overrides, whose program's nodes boot
        here (`booted/cloud_rehearsal.py`)."""
        self.home, self.rehearse = home or sortie_home(), rehearse
        if rehearse:
            self.profile = f"{rehearse[0]}, rehearsed"
        self.owner = getpass.getuser()
        self.clusters_dir = self.home / naming.CLUSTERS
        # A heartbeat must never write into a cluster that teardown is removing.
        self.heartbeats = Heartbeats()
        self._reserved = set[str]()  # names this process took (`reserve`) and has not used
        self.capacity = capacity()

    def state_dir(self, cluster_id: str) -> Path:
        return naming.state_dir(self.clusters_dir, cluster_id)

    @property
    def max_nodes(self) -> int:
        """Loopback's addresses, or a cluster network's (booted nodes, `netns`): as `_start`."""
        own_network = network_mode() == "netns" or self._boots()
        return NAMESPACED_MAX_NODES if own_network else LOCAL_MAX_NODES

    def _boots(self) -> bool:
        """Whether its nodes boot (a rehearsal's, or $SORTIE_LOCAL_NODES=booted): on a network
        of their own."""
        from sortie.stacks.booted.nodes import node_kind
        return bool(self.rehearse) or node_kind() == "booted"

    def notional_price(self, nodes: int, held: str | None = None) -> NotionalPrice | None:
        return recorded_price(self.state_dir(held)) if held else notional_price(nodes)

    def capped(self, max_usd: float, nodes: int,
               held: bool = False) -> LocalBackend:  # the driver, or the watchdog
        return self

    def cluster_ids(self) -> list[str]:
        return naming.names_in(self.clusters_dir)

    def inventory(self, cluster_id: str) -> Inventory:
        return inventory_in(self.state_dir(cluster_id),
                            f"no local cluster named {cluster_id!r} (see `sortie status`)")

    def describe(self, name: str, now: float) -> Seen:
        """Its `status` row: up, degraded (an sshd gone), orphaned (its controller gone), broken."""
        return local_row(self, name, now)

    def watchdog(self) -> LocalBackend:
        return self

    def shared_ports(self) -> LocalBackend:
        return self

    def rendezvous_for_launch(self, inventory: Inventory) -> Inventory:
        """(`loopback.port_for_launch`), saved where it moved."""
        moved = port_for_launch(inventory.head.private_address, inventory.rdzv_port)
        if moved == inventory.rdzv_port:
            return inventory
        inventory = inventory.model_copy(update={"rdzv_port": moved})
        inventory.save_state(self.state_dir(inventory.cluster_id))
        return inventory

    def start_watchdog(self, cluster_id: str) -> None:
        """Restart a held cluster's watchdog (`sortie reap`, when it is gone)."""
        start_watchdog(self.state_dir(cluster_id), cluster_id)

    def backend(self, seen: Seen) -> LocalBackend:
        return self

    # -- up -------------------------------------------------------------------------------------

    def placements(self) -> list[Placement]:
        return [Placement()]  # one machine: no zones, no spot market

    def reserve(self, cluster_id: str, held: bool = False) -> None:
        """The name is this process's once its state directory is in place (`naming.take`).
        Unless ``held``, it appears with this process as its controller: killed from then on,
        the cluster is an orphan `sortie reap` ends (without a controller it would read as
        held)."""
        naming.take(self.clusters_dir, cluster_id, {} if held else controller_files())
        self.heartbeats.open(cluster_id)
        self._reserved.add(cluster_id)

    def up(self, cluster_id: str, nodes: int, placement: Placement | None = None,
           held: bool = False, watch: HeldLimits | None = None) -> Inventory:
        """Start ``nodes`` sshd daemons, all or none: on failure, tear down what was started.
        The name is reserved first unless this process already did (NameTakenError, with
        nothing touched, when another sortie has it).

        Unless ``held`` (`sortie up`), the cluster belongs to this process: once it is gone,
        `sortie reap` tears the cluster down (the local stand-in for a cloud node's TTL). With
        ``watch`` a held cluster tears itself down once idle or out of budget (`idle_stop.py`)."""
        state = self.state_dir(cluster_id)
        sshd = find_sshd()  # (a launch that reserved the name first tears its state down)
        if cluster_id not in self._reserved:
            self.reserve(cluster_id, held)
        self._reserved.discard(cluster_id)
        try:
            inventory = self._start(cluster_id, state, nodes, sshd)
            if watch is not None:
                hold_limits(state, cluster_id, watch)
            return inventory
        except SortieError as exc:
            self.down(cluster_id)
            raise LaunchError(str(exc)) from None
        except BaseException:
            self.down(cluster_id)
            raise

    def _start(self, cluster_id: str, state: Path, count: int, sshd: str) -> Inventory:
        user, booted = getpass.getuser(), booted_nodes(state)
        (state / "bucket").mkdir()
        draw_tag(state)  # first: the image's unpack is the cluster's too (`down` stops it)
        if self._boots():
            booted.prepare(self.rehearse, cluster_id, count)  # (rehearsing: the program's key)
            self.preemption_notice_s, self.ssh_wait = booted.notice_s(), booted.ssh_wait()
        client_key = state / "client_key"
        public = client_key.with_suffix(".pub").read_text() if client_key.exists() else \
            keygen(client_key, f"sortie-{cluster_id}")
        (state / "authorized_keys").write_text(public.strip() + "\n")
        record_price(state, count)  # (a notional one, to rehearse budgets: fixed from now)
        if os.geteuid() == 0:
            # sshd started by root insists on its privilege-separation directory.
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        own_network = network_mode() == "netns" or booted.used()
        rates, network = link_rates(count), NodeNetwork(state)
        if own_network:
            network.create()
        members: list[Node] = []
        for index, address in enumerate(node_addresses(count)):
            if index >= self.capacity:
                raise SortieError(f"node-{index}: no capacity left ({CAPACITY_ENV}="
                                  f"{self.capacity})")
            members.append(self._start_node(cluster_id, state, index, address, sshd, user))
        inventory = Inventory(
            cluster_id=cluster_id, backend=self.name, nodes=members,
            rdzv_port=rendezvous_port(), booted=booted.used(), shared_python=True,
            # Traffic over loopback or each node's own link; GPUs hidden: several local "nodes"
            # never contend for one device (the local backend trains on CPU with gloo).
            train_env={**booted.train_env(), "GLOO_SOCKET_IFNAME": IFNAME if own_network else "lo",
                       "CUDA_VISIBLE_DEVICES": "",
                       "SORTIE_CHECKPOINT_URL": str(state / "bucket" / "checkpoints")},
        )
        if own_network:
            for index, rate in enumerate(rates):
                network.shape(index, rate_mbit=rate)
        inventory.save_state(state)
        return inventory

    def _start_node(self, cluster_id: str, state: Path, index: int, address: str, sshd: str,
                    user: str) -> Node:
        """A new machine: fresh disk, fresh host key, its own sshd (and its own link, where the
        cluster has its own network)."""
        node_dir = state / "nodes" / f"node-{index}"
        (node_dir / "disk").mkdir(parents=True)
        host_key = keygen(node_dir / "ssh_host_ed25519_key", f"{cluster_id}-node-{index}")
        network, private = NodeNetwork(state), address
        tag = f"{tag_of(state)}:node-{index}"
        if (booted := booted_nodes(state)).used():
            network.add_node(index)
            return booted.start(cluster_id, index, address, tag)
        cgroup = NodeCgroup(network.namespace(index)).create()  # (as root: None elsewhere)
        if network.exists():
            private = network.add_node(index)
            port = start_sshd(sshd, node_dir, address, state, user, tag=tag,
                              enter=network.enter_script(index), sftp=sftp_server() or "",
                              cgroup=cgroup)
        else:
            port = start_sshd(sshd, node_dir, address, state, user, tag=tag, cgroup=cgroup)
        return Node(name=f"node-{index}", address=address, port=port, user=user,
                    key_path=state / "client_key", host_key=host_key, gpus=0,
                    private_address=private, workdir=str(node_dir / "disk"),
                    python=sys.executable)

    # -- lost nodes -----------------------------------------------------------------------------

    def launched_price(self, cluster_id: str) -> tuple[float, str] | None:
        return None  # no list price: priced before launch, if at all

    def lost_nodes(self, inventory: Inventory) -> Lost:
        """Nodes whose sshd is gone: the local equivalent of a machine that no longer exists."""
        return Lost([n.name for n in inventory.nodes if not is_listening(n.address, n.port)])

    def reclaim(self, cluster_id: str, node: str) -> list[int]:
        """Take a node away at once, as a cloud reclaims a spot machine: SIGKILL its sshd and
        everything running on it. Returns the pids killed."""
        procs = self.processes(cluster_id, node)
        signal_all(procs, "kill")
        wait_gone(procs, STOP_GRACE_S)
        return [p.pid for p in procs]

    def replace(self, inventory: Inventory, lost: list[str]) -> Inventory:
        """New machines for the lost nodes: same name and address, new host key, empty disk."""
        state = self.state_dir(inventory.cluster_id)
        sshd, user = find_sshd(), getpass.getuser()
        nodes = list(inventory.nodes)
        for position, node in enumerate(nodes):
            if node.name not in lost:
                continue
            self.reclaim(inventory.cluster_id, node.name)  # whatever is left of the old one
            index = int(node.name.removeprefix("node-"))
            NodeCgroup(NodeNetwork(state).namespace(index)).remove()
            booted_nodes(state).stop(index)  # (a booted node's disk and cgroups)
            keep_listings(state / "nodes" / node.name / "disk", state / IMAGES_KEPT)
            shutil.rmtree(state / "nodes" / node.name)
            nodes[position] = self._start_node(inventory.cluster_id, state, index, node.address,
                                               sshd, user)
        repaired = inventory.model_copy(update={"nodes": nodes})
        if repaired.head.name in lost:  # the rendezvous store moves with the new head
            repaired = repaired.model_copy(
                update={"rdzv_port": rendezvous_port()})
        repaired.save_state(state)
        return repaired

    # -- down -----------------------------------------------------------------------------------

    def processes(self, cluster_id: str, node: str | None = None) -> list[psutil.Process]:
        return cluster_processes(self.state_dir(cluster_id), node)

    def listeners(self, cluster_id: str) -> list[str]:
        """Node addresses of this cluster that still accept connections."""
        with contextlib.suppress(SortieError):  # no inventory (yet, or any more): none
            return [f"{n.address}:{n.port}" for n in self.inventory(cluster_id).nodes
                    if is_listening(n.address, n.port)]
        return []

    def down(self, cluster_id: str, keep_bucket: bool = False) -> Teardown:
        """Stop every process of the cluster, prove none is left, remove its state. Idempotent.

        With ``keep_bucket`` the cluster's bucket moves to ``home/kept/<cluster>`` first."""
        report = Teardown(cluster_id, unit="processes")
        state = self.state_dir(cluster_id)
        self.heartbeats.close(cluster_id)
        if not state.exists():
            report.state_removed = True
            return report
        booted = booted_nodes(state)
        if booted.used():
            booted.stop()  # powered off, as a cloud's machines are, before anything is killed
        stopped: set[int] = set()
        for _round in range(3):  # a dying trainer may still spawn; sweep until nothing is found
            procs = self.processes(cluster_id)
            if not procs:
                break
            signal_all(procs, "terminate")
            alive = wait_gone(procs, STOP_GRACE_S)
            signal_all(alive, "kill")
            wait_gone(alive, STOP_GRACE_S)
            stopped.update(p.pid for p in procs)
        for group in node_cgroups(state):  # what left the nodes' sessions and tags
            stopped |= group.kill()
        # A job's containers (a killed node leaves its own), the images sortie pulled, then
        # the cgroups the containers were in.
        remove_images(cluster_id, sorted(state.glob("nodes/*/disk")), state / IMAGES_KEPT)
        for group in node_cgroups(state):
            group.remove()
        report.removed = len(stopped)
        if booted.used():
            booted.stop()  # what killed containers left: their disks and cgroups
        report.leftovers = [Leftover("process", str(p.pid), f"kill -9 {p.pid}")
                            for p in self.processes(cluster_id)]
        report.leftovers += [Leftover("listener", address, f"stop what listens on {address}")
                             for address in self.listeners(cluster_id)]
        report.leftovers += booted.leftovers()
        report.leftovers += [Leftover("cgroup", str(g.path), f"rmdir {g.path}")
                             for g in node_cgroups(state) if g.exists()]
        # Once each: a node's cgroup is named alike whether its node booted or ran sshd, and
        # both listings find it (a Ctrl-C's report named one cgroup twice).
        report.leftovers = list(dict.fromkeys(report.leftovers))
        if not report.leftovers:  # the nodes' network, once nothing runs in it
            report.leftovers += [Leftover("network namespace", name, f"ip netns del {name}")
                                 for name in NodeNetwork(state).destroy()]
        if keep_bucket and (state / "bucket").is_dir():
            kept = self.home / naming.KEPT / cluster_id
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(state / "bucket"), str(kept))
            report.kept.append(str(kept))
        if not report.leftovers:
            try:  # kept (keys, pids) while anything is left to stop
                naming.remove(state)
                report.state_removed = True
            except OSError as exc:  # something still writes there: named, never a traceback
                report.leftovers.append(Leftover("state", exc.filename,
                                                 f"rm -rf {exc.filename} ({exc.strerror})"))
        return report


def booted_nodes(state: Path) -> BootedNodes:
    """A cluster's booted nodes (none used unless it boots them): their modules load here,
    not for every command on a local cluster (`exec` never boots one)."""
    from sortie.stacks.booted.nodes import BootedNodes
    return BootedNodes(state)


if TYPE_CHECKING:  # mypy holds the class to what its kind's listing does (`stacks/listing.py`)
    _conforms: type[LiveListing] = LocalBackend
