"""Slurm: a sortie is an allocation on a cluster an ops team already runs.

`sortie attach NAME --slurm` records the cluster (`SlurmSite`): its Slurm commands run here, on
its login node, as the user who runs sortie (never root, no `sudo`), and the directory sorties
work in, on the file system the login node shares with its compute nodes. A sortie on it
(`sortie run --slurm NAME --partition P --nodes N`) is one batch job that holds the nodes
(`sbatch`, a script that only sleeps); every phase then runs inside it through `srun` job steps
(`bootstrap/srun.py`), never SSH to a compute node. Teardown is `scancel`, proven by `squeue`: the
job no longer holds anything. Bad input (a partition, account or QOS the cluster does not have,
more nodes than it has) is one line from `sbatch --test-only`, before anything is queued.

State, ``$SORTIE_HOME/slurm/<site>/site.json``; each sortie's, ``$SORTIE_HOME/allocations/<name>/``:
``allocation.json`` (its site, job id and request), ``inventory.json``, ``job.json``.
"""

from __future__ import annotations

import getpass
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

from sortie.bootstrap.ssh import on_all
from sortie.core import naming, statefile
from sortie.core.errors import SortieError, UsageError
from sortie.core.inventory import Inventory, Node, SrunRoute
from sortie.infra.cloud_home import Leftover, SshWait
from sortie.stacks.backend import Capabilities, LaunchError, Lost, Placement, Teardown
from sortie.stacks.listing import RecordsInStateDir, Seen
from sortie.stacks.records import (
    Heartbeats,
    controller_files,
    inventory_in,
)
from sortie.stacks.slurm.allocation_row import describe_allocation
from sortie.stacks.slurm.detached_run import DetachedSubmit
from sortie.stacks.slurm.hold_script import HOLD_SCRIPT, still_waiting, submit_allocation, taken
from sortie.stacks.slurm.slurm_network import free_port, node_facts
from sortie.stacks.slurm.slurm_queue import (
    NOT_NOW,
    SIGNAL_EARLY_S,
    SlurmQueue,
    flag_of,
    signal_lead_s,
    slurm_message,
)
from sortie.stacks.slurm.slurm_sites import (
    ALLOCATION_FILE,
    Allocation,
    GpuHourPrice,
    SlurmAsk,
    SlurmSite,
    SlurmSites,
    gpu_hour_price,
    held_time_limit,
    unpriced_note,
)

ALLOCATIONS = "allocations"
ENDING_FILE = "ending"  # `down` has begun: the allocation it ends is not one to resume


class SlurmBackend(Capabilities, RecordsInStateDir):
    """Allocations on one Slurm cluster, driven like any cluster sortie makes."""

    name = kind = "slurm"
    # A job that stopped for a preemption's SIGTERM (exit 75): Slurm requeues the allocation
    # once its partition's GraceTime is over (KillWait at least): as long as sortie waits.
    preemption_notice_s = 180.0
    ssh_wait = SshWait(60, "srun in the allocation", via="srun job steps (no SSH)")
    instance_type = None
    wind_down_s = 5.0
    backend_url = profile = None
    detaches = False  # (no watchdog, no node timers: its time limit, and `sortie reap`)

    def __init__(self, home: Path, site: SlurmSite | None = None,
                 ask: SlurmAsk | None = None, queue_timeout_s: float | None = None) -> None:
        self.home, self.owner = home, getpass.getuser()
        self.site, self.ask = site, ask or SlurmAsk()
        self.queue_timeout_s = queue_timeout_s  # None: it waits as long as it takes
        self.say: Callable[[str], None] | None = None  # while it waits (`while_queued`)
        self.allocations_dir = home / ALLOCATIONS
        self.heartbeats = Heartbeats()

    # -- what a launch is priced at: a partition's $ per GPU-hour, as the user set it -----------

    def notional_price(self, nodes: int, held: str | None = None) -> GpuHourPrice | None:
        """The allocation at its partition's $ per GPU-hour as attached (None: none set, or a
        partition without GPUs: counted at $0, and said before launch)."""
        site, ask = self.site, self.ask
        if held is not None and (allocation := self.allocation(held)) is not None:
            site, ask = SlurmSites(self.home).site(allocation.site), allocation.asked()
        return gpu_hour_price(site, ask, nodes) if site else None

    def price_note(self, nodes: int) -> str | None:
        """What is said before launch when the allocation has no price."""
        return unpriced_note(self.site, self.ask, nodes) if self.site else None

    @property
    def queue(self) -> SlurmQueue:
        """Slurm's commands on the login node of the cluster this launch is on."""
        return SlurmQueue(self.site.login if self.site else None)

    def capped(self, max_usd: float, nodes: int, held: bool = False) -> SlurmBackend:
        """A run's budget: its controller stops the job. A held allocation (`sortie up`) has
        none: its time limit is cut to what ``max_usd`` buys (`held_time_limit`)."""
        if not held or (price := self.notional_price(nodes)) is None:
            return self
        return SlurmBackend(self.home, self.site, replace(self.ask, time=held_time_limit(
            self.ask.time, price.usd_per_hour, max_usd, self.wind_down_s)),
            self.queue_timeout_s)

    # -- checked before anything is queued -------------------------------------------------------

    def check(self, nodes: int) -> str | None:
        """Slurm's own verdict on the request (`sbatch --test-only`), as a UsageError naming
        the flag and quoting Slurm; nothing is queued. What is only unavailable now (nodes
        drained, down or reserved, where the partition has enough) is no refusal: it is
        queued, and this says which nodes wait (the line returned)."""
        done = self.queue.slurm("sbatch", "--test-only", *self.ask.options(nodes), "--wrap",
                                HOLD_SCRIPT)
        if done.returncode == 0:
            return None
        message = slurm_message(done)
        if NOT_NOW.search(message):
            partition = self.ask.partition.split(",")[0] if self.ask.partition else \
                self.queue.default_partition()
            total, unavailable = self.queue.partition_nodes(partition)
            where = f"partition {partition}"
            if total < nodes:
                raise UsageError(f"--nodes: {nodes} asked, {where} has {total} in all")
            if unavailable:
                return (f"{len(unavailable)} of {where}'s {total} nodes unavailable now: "
                        f"{', '.join(unavailable[:8])}; queued until enough are back")
        raise UsageError(f"{flag_of(message)}: Slurm refused the allocation: {message}")

    # -- state -----------------------------------------------------------------------------------

    def state_dir(self, cluster_id: str) -> Path:
        return naming.state_dir(self.allocations_dir, cluster_id)

    def cluster_ids(self) -> list[str]:
        return naming.names_in(self.allocations_dir)

    def allocation(self, cluster_id: str) -> Allocation | None:
        path = self.state_dir(cluster_id) / ALLOCATION_FILE
        return statefile.read_model(Allocation, path) if path.is_file() else None

    def inventory(self, cluster_id: str) -> Inventory:
        return inventory_in(self.state_dir(cluster_id),
                            f"no Slurm allocation named {cluster_id!r} (see `sortie status`)")

    def describe(self, name: str, now: float) -> Seen:
        return describe_allocation(self, name, now)

    def backend(self, seen: Seen) -> SlurmBackend:
        return self

    def queued(self) -> SlurmBackend:
        return self

    def while_queued(self, say: Callable[[str], None]) -> None:  # (`up` waits in the queue)
        self.say = say

    def detached(self) -> DetachedSubmit:
        return DetachedSubmit(self.home, self.allocations_dir, self.site, self.ask)

    def placements(self) -> list[Placement]:
        return [Placement(where=f"Slurm {self.site.name if self.site else ''}".strip())]

    def reserve(self, cluster_id: str) -> None:
        """The name is this process's once its state directory is in place, with this process
        as its controller: killed from then on, the allocation is an orphan that `sortie reap`
        adopts (collects, then cancels)."""
        naming.take(self.allocations_dir, cluster_id, controller_files())
        self.heartbeats.open(cluster_id)

    def launched_price(self, cluster_id: str) -> tuple[float, str] | None:
        return None

    # -- up --------------------------------------------------------------------------------------

    def up(self, cluster_id: str, nodes: int, placement: Placement) -> Inventory:
        """Queue the allocation, wait until it runs, and read its nodes from Slurm."""
        if self.site is None:
            raise SortieError("a Slurm allocation needs its cluster (--slurm NAME)")
        workdir, queue = Path(self.site.shared_dir) / f"sortie-{cluster_id}", self.queue
        made = queue.own_dir(workdir)
        if made:
            raise LaunchError(f"{workdir}: not made on the login node: {made}")
        try:
            job_id = submit_allocation(queue, cluster_id, nodes, workdir, self.ask)
        except LaunchError:
            queue.on_login("rm", "-rf", "--", str(workdir))
            raise
        allocation = Allocation(site=self.site.name, job_id=job_id, workdir=str(workdir),
                                ask={**asdict(self.ask), "nodes": nodes}, started=time.time(),
                                login=self.site.login)
        self._record(cluster_id, allocation)
        return self._hold(cluster_id, allocation)

    def _record(self, cluster_id: str, allocation: Allocation) -> None:
        allocation.save(self.state_dir(cluster_id))

    def _hold(self, cluster_id: str, allocation: Allocation) -> Inventory:
        """Wait for the allocation to run; its inventory (saved). Ended, with its workdir, if
        it never runs."""
        nodes, job_id = int(str(allocation.ask["nodes"])), allocation.job_id
        try:
            hosts = allocation.queue.wait_running(
                job_id, nodes, self.queue_timeout_s, self.say,
                lambda: still_waiting(allocation.queue, allocation.workdir))
            taken(allocation.queue, allocation.workdir)
            restarts = allocation.queue.restarts(job_id)  # (requeued before it first ran)
            self._record(cluster_id, allocation.model_copy(update={"restarts": restarts,
                                                                   "ran_from": time.time()}))
            inventory = self._inventory(cluster_id, allocation, hosts)
        except UsageError:
            self.down(cluster_id)
            raise
        except SortieError as exc:
            self.down(cluster_id)
            # (one cluster, one placement: nowhere else to try)
            raise LaunchError(f"allocation {job_id}: {exc}", moves_on=False) from None
        inventory.save_state(self.state_dir(cluster_id))  # and its login's pinned key
        return inventory

    def _inventory(self, cluster_id: str, allocation: Allocation, hosts: list[str]
                   ) -> Inventory:
        """The allocation's nodes in Slurm's order (the first is rank 0 and hosts the
        rendezvous), each reached through srun, its address Slurm's NodeAddr."""
        job_id, workdir = allocation.job_id, allocation.workdir
        addresses = [allocation.queue.node_address(host) for host in hosts]
        # As recorded: `repair` replaces through a backend made from the records alone.
        site = self.site or SlurmSites(self.home).site(allocation.site)
        nodes = [Node(name=f"node-{i}", address=host, port=22, user=self.owner,
                      gpus=allocation.asked().gpus_per_node, private_address=address,
                      workdir=workdir, python=site.python,
                      srun=SrunRoute(job_id=job_id, host=host, login=allocation.login))
                 for i, (host, address) in enumerate(zip(hosts, addresses, strict=True))]
        facts = on_all(nodes, node_facts)
        # gloo and NCCL bind where each node's address is (else gloo takes 127.0.0.1), named
        # per node: sites name interfaces per node. Other sorties may share these nodes: the
        # rendezvous port is the allocation's own, free on every node.
        nodes = [node.model_copy(update={
                     "interface": fact.interface or None,
                     "srun": node.srun and node.srun.model_copy(update={"cpus": fact.cpus})})
                 for node, fact in zip(nodes, facts, strict=True)]
        port = free_port(job_id, set().union(*(fact.ports for fact in facts)))
        # Checkpoints on the shared disk: a new allocation (other nodes) resumes from them.
        env = {"SORTIE_CHECKPOINT_URL": f"{workdir}/checkpoints"}
        return Inventory(cluster_id=cluster_id, backend="slurm", nodes=nodes, train_env=env,
                         booted=False, rdzv_port=port)

    # -- lost nodes: the allocation is one piece -------------------------------------------------

    def lost_nodes(self, inventory: Inventory) -> Lost:
        """Every node once the allocation no longer runs or runs again (requeued: it is one
        piece; one being preempted is waited for), or once its time limit is as near as Slurm's
        signal comes (the job was told to stop). An allocation cancelled outside sortie is not
        resumed: said, and the run ends (collected)."""
        route = inventory.head.srun
        job_id, queue = (route.job_id, SlurmQueue(route.login)) if route else ("", self.queue)
        state, left_s = queue.settled_state(job_id)
        every = [node.name for node in inventory.nodes]  # (the allocation is one piece)
        if state != "RUNNING" and self._ending(inventory.cluster_id):
            raise SortieError(f"allocation {job_id} was ended by `sortie down`: not resumed")
        deadline = time.monotonic() + self.preemption_notice_s
        while state == "RUNNING" and queue.preempting(job_id) and time.monotonic() < deadline:
            time.sleep(1)  # in its grace time: Slurm requeues or ends it next
            state, left_s = queue.settled_state(job_id)
        allocation = self.allocation(inventory.cluster_id)
        # Requeued and already running again (the preempting job was quick): its steps died.
        if state == "RUNNING" and queue.restarts(job_id) > (allocation.restarts if allocation
                                                             else 0):
            state = "REQUEUED"
        if state == "RUNNING":
            limit = str(allocation.ask.get("time") or "") if allocation else ""
            if not limit or left_s is None or left_s > signal_lead_s(limit) + SIGNAL_EARLY_S:
                return Lost([])
            return Lost(every, f"time limit: {left_s:.0f}s left, Slurm signalled the job")
        ended = state if state == "REQUEUED" else queue.end_state(job_id)
        if ended == "CANCELLED":
            raise SortieError(f"allocation {job_id} was cancelled outside sortie (scancel): "
                              "not resumed")
        if ended in ("PENDING", "REQUEUED"):  # after a node failure or a preemption
            why = queue.requeued_why(job_id)
            return Lost(every, f"allocation {job_id} requeued by Slurm{f' ({why})' if why else ''}")
        return Lost(every, f"allocation {job_id} ended: {ended or state or 'gone'}")

    def _ending(self, cluster_id: str) -> bool:
        """Whether `down` has begun ending the allocation (or ended it)."""
        state = self.state_dir(cluster_id)
        return not state.is_dir() or (state / ENDING_FILE).exists()

    def replace(self, inventory: Inventory, lost: list[str]) -> Inventory:
        """A new allocation of the same shape for the whole cluster (its nodes may be others):
        the old one is ended first; the workdir on the shared disk, the checkpoints in it and
        the node names carry over, so the job resumes from its last checkpoint."""
        cluster_id = inventory.cluster_id
        old = self.allocation(cluster_id)
        if old is None:
            raise SortieError(f"{cluster_id}: its allocation record is gone")
        if old.queue.cancel(old.job_id):
            raise SortieError(f"allocation {old.job_id} does not end (`scancel {old.job_id}`)")
        ask = old.asked()
        # Not the nodes that failed (Slurm may not know yet): unless all were (a time limit).
        failed = [n.srun.host for n in inventory.nodes if n.name in lost and n.srun]
        exclude = failed if len(lost) < len(inventory.nodes) else []
        job_id = submit_allocation(old.queue, cluster_id, int(str(old.ask["nodes"])),
                                   Path(old.workdir), ask, exclude)
        renewed = old.model_copy(update={"job_id": job_id,
                                         "earlier": [*old.earlier, old.job_id],
                                         "held_before_s": old.held_s(time.time()),
                                         "ran_from": None})
        self._record(cluster_id, renewed)
        return self._hold(cluster_id, renewed)

    # -- down ------------------------------------------------------------------------------------

    def down(self, cluster_id: str, keep_bucket: bool = False) -> Teardown:
        """`scancel` the allocation, prove from `squeue` that it holds nothing, remove the
        sortie's workdir on the shared file system, then its state here."""
        report = Teardown(cluster_id, unit="allocation")
        state = self.state_dir(cluster_id)
        self.heartbeats.close(cluster_id)  # no heartbeat writes into it from now on
        if state.is_dir():  # its controller, if another, then does not resume it
            statefile.write_text(state / ENDING_FILE, "")
        try:
            allocation = self.allocation(cluster_id)
        except SortieError as exc:
            # Never `scancel --name`: another home's sortie of this name is this user's too.
            report.leftovers.append(Leftover(
                "allocation", str(state), f"damaged ({exc}): `squeue --me --name "
                f"sortie-{cluster_id} -o '%i %Z'` lists its job with its directory; `scancel` "
                "that job id, then `sortie down` again"))
            return report
        if allocation is not None:
            if not self._release(cluster_id, allocation, report):
                return report
            allocation.queue.on_login("rm", "-rf", "--", allocation.workdir)
        naming.remove(state, ignore_errors=True)
        report.state_removed = not state.exists()
        return report

    def _release(self, cluster_id: str, allocation: Allocation, report: Teardown) -> bool:
        """End the allocation, proven (`scancel`, then `squeue`), and count the time it held
        its nodes; False, with the leftover said, where it does not end."""
        left = allocation.queue.cancel(allocation.job_id)
        if left:
            report.leftovers.append(Leftover(
                "allocation", f"job {allocation.job_id}", f"still {left.lower()}: "
                f"`scancel {allocation.job_id}`, then `sortie down {cluster_id}`"))
            return False
        report.removed = 1
        report.accounted_s = allocation.queue.accounted_s([*allocation.earlier, allocation.job_id])
        if report.accounted_s is None:  # no accounting: its time running, never queued
            report.accounted_s = allocation.held_s(time.time())
            report.accounted_by = "sortie's clock (the cluster keeps no accounting)"
        return True


if TYPE_CHECKING:  # mypy holds the class to what its kind's listing does (`stacks/listing.py`)
    from sortie.stacks.listing import LiveListing

    _conforms: type[LiveListing] = SlurmBackend
