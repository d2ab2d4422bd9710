"""Clusters sortie did not create (`sortie attach`): machines from a hosts file, or the nodes of
a Pulumi stack someone stood up with `pulumi up`. Sortie reaches, checks and uses them like its
own clusters (`exec`, `run --on`, `ssh`, `logs`) but never destroys them: `sortie down`
*detaches*. It stops sortie's processes on the nodes, removes the directory it made on each
(`bootstrap/preflight.py`), and forgets the cluster; the machines keep running.

State, ``$SORTIE_HOME/attached/<name>/``: ``attachment.json`` (where the cluster came from),
``inventory.json`` and ``known_hosts`` (every host key pinned), and for a stack's nodes the
stack's ``client_key`` (0600).
"""

from __future__ import annotations

import getpass
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pydantic
from pydantic import BaseModel

from sortie.bootstrap import ssh
from sortie.bootstrap.preflight import remove_workdir
from sortie.core import naming, statefile
from sortie.core.errors import SortieError
from sortie.core.inventory import INVENTORY_FILE, Inventory, Node
from sortie.infra.cloud_home import Leftover, SshWait
from sortie.stacks.backend import Capabilities, Lost, Placement, Teardown
from sortie.stacks.listing import RecordsInStateDir, Seen, SortieRow
from sortie.stacks.records import inventory_in

ATTACHMENT_FILE = "attachment.json"
PROBE_TIMEOUT_S = 2.0
DETACH_SSH_TIMEOUT_S = 15.0


class Attachment(BaseModel):
    """Where an attached cluster came from."""

    source: Literal["hosts file", "outputs file", "pulumi stack"]
    origin: str  # the file (absolute path), or the stack's name
    cwd: str | None = None  # a stack's Pulumi project directory
    attached_at: float
    usd_per_hour: float = 0.0  # a stack's machines at catalog prices; 0 where unknown
    stack_cluster: str | None = None  # the cluster a stack's outputs name: its tags' value

    def describe(self) -> str:
        where = f" in {self.cwd}" if self.cwd else ""
        return f"{self.source} {self.origin}{where}"


def reachable(node: Node, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the node's SSH port accepts a connection."""
    try:
        socket.create_connection((node.address, node.port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


@pydantic.dataclasses.dataclass(frozen=True)
class Forgotten:
    """`sortie down NAME --forget`: an attached cluster forgotten without touching its nodes
    (they are gone, or will never answer again)."""

    cluster: str
    unchecked: list[str]  # each node's sortie directory, which may remain: "node (addr): path"

    def summary(self) -> str:
        left = "; ".join(self.unchecked) or "(no inventory was recorded)"
        return (f"{self.cluster}: forgotten; nothing was done on its nodes (machines left "
                f"running, not created by sortie); sortie's directory may remain: {left}")


class AttachedBackend(Capabilities, RecordsInStateDir):
    """The backend of attached clusters: what a job needs of a backend, except that nothing is
    created, replaced or destroyed."""

    name = kind = "attached"
    preemption_notice_s = 0.0
    ssh_wait = SshWait(120, "the host's sshd (running already)")
    instance_type = None  # machines made elsewhere: no catalog figure holds for them
    wind_down_s = 3.0  # stop the job; nothing is torn down
    profile = None
    detaches = True

    def hold(self, cluster_id: str) -> None:  # held by whoever made it
        return None

    def notional_price(self, nodes: int, held: str | None = None) -> None:
        return None

    def capped(self, max_usd: float, nodes: int,
               held: bool = False) -> AttachedBackend:  # the driver enforces it
        return self
    backend_url = None

    def __init__(self, home: Path) -> None:
        self.home, self.owner = home, getpass.getuser()
        self.attached_dir = home / naming.ATTACHED

    def state_dir(self, cluster_id: str) -> Path:
        return naming.state_dir(self.attached_dir, cluster_id)

    def cluster_ids(self) -> list[str]:
        return naming.names_in(self.attached_dir)

    def inventory(self, cluster_id: str) -> Inventory:
        return inventory_in(self.state_dir(cluster_id),
                            f"{cluster_id}: its attach never finished (no inventory); "
                            f"`sortie down {cluster_id}` forgets it")

    def attachment(self, cluster_id: str) -> Attachment:
        return statefile.read_model(Attachment, self.state_dir(cluster_id) / ATTACHMENT_FILE)

    def record(self, cluster_id: str, inventory: Inventory, attachment: Attachment) -> None:
        """Remember an attached cluster once its preflight passed."""
        state = self.state_dir(cluster_id)
        inventory.save_state(state)
        statefile.write_json(state / ATTACHMENT_FILE, attachment.model_dump())

    def nodes_up(self, inventory: Inventory) -> int:
        with ThreadPoolExecutor(max(1, min(32, len(inventory.nodes)))) as pool:
            return sum(pool.map(reachable, inventory.nodes))

    def describe(self, name: str, now: float) -> Seen:
        """Its `status` row: up or degraded (a node does not accept SSH connections), where it
        came from; broken (an attach cut short, damaged state): `down NAME` forgets it."""
        row = SortieRow(name=name, backend="attached", state="broken", owner=getpass.getuser())
        try:
            attachment = self.attachment(name)
            inventory = self.inventory(name)
        except SortieError as exc:
            row.detail = str(exc)
            return Seen(row, self.kind)
        nodes_up = self.nodes_up(inventory)
        row.nodes, row.nodes_up = len(inventory.nodes), nodes_up
        row.age_s, row.source = round(now - attachment.attached_at), attachment.source
        row.priced(attachment.usd_per_hour)
        row.state = "up" if nodes_up == len(inventory.nodes) else "degraded"
        row.detail = (f"attached from {attachment.describe()}; not created by sortie, never "
                      f"destroyed by it (`sortie down {name}` detaches)")
        return Seen(row, self.kind)

    def held(self, seen: Seen) -> bool:
        return False  # used as it is, by whoever attached it: no controller, no cost line

    def backend(self, seen: Seen) -> AttachedBackend:
        return self

    # -- what a job needs of a backend ----------------------------------------------------------

    def placements(self) -> list[Placement]:
        return [Placement()]

    def reserve(self, cluster_id: str) -> None:
        raise SortieError(f"{cluster_id}: an attached cluster is made elsewhere; sortie does "
                          "not launch it (`sortie exec` runs a job on it)")

    def up(self, cluster_id: str, nodes: int, placement: Placement) -> Inventory:
        raise SortieError(f"{cluster_id}: an attached cluster is made elsewhere; sortie does "
                          "not create machines for it")

    def launched_price(self, cluster_id: str) -> tuple[float, str] | None:
        return None  # no list price: priced before launch, if at all

    def lost_nodes(self, inventory: Inventory) -> Lost:
        return Lost([node.name for node in inventory.nodes if not reachable(node)])

    def replace(self, inventory: Inventory, lost: list[str]) -> Inventory:
        raise SortieError(f"{', '.join(lost)} of {inventory.cluster_id} lost: the cluster is "
                          "attached, and sortie does not replace machines it did not create")

    def claim(self, cluster_id: str) -> None:
        """Nothing to claim: an attached cluster is held, and no controller owns it."""

    # -- detach ---------------------------------------------------------------------------------

    def down(self, cluster_id: str, keep_bucket: bool = False) -> Teardown:
        """Detach: on every node stop sortie's processes and remove sortie's workdir, then
        forget the cluster. The machines are left running; a node that cannot be cleaned is a
        leftover, and the cluster is remembered until a retry cleans it."""
        report = Teardown(cluster_id, unit="sortie processes", detached=True)
        state = self.state_dir(cluster_id)
        if not state.exists():
            report.state_removed = True
            return report
        try:
            inventory = Inventory.load(state / INVENTORY_FILE) \
                if (state / INVENTORY_FILE).is_file() else None
        except SortieError as exc:
            report.leftovers.append(Leftover(
                "attachment", str(state), f"its inventory is damaged ({exc}): remove the "
                f"sortie-{cluster_id} directories on its hosts by hand, then `rm -r {state}`"))
            return report
        if inventory is not None:
            cleaned = ssh.on_all(inventory.nodes, _clean)
            report.removed = sum(stopped for stopped, _left in cleaned)
            report.leftovers = [left for _stopped, left in cleaned if left is not None]
        if not report.leftovers:
            self.forget(cluster_id)
            report.state_removed = True
        return report

    def forget(self, cluster_id: str) -> None:
        naming.remove(self.state_dir(cluster_id), ignore_errors=True)

    def forget_unchecked(self, cluster_id: str) -> Forgotten:
        """Forget the cluster without reaching its nodes: for one whose nodes are gone, which
        `down` keeps for a retry that would never succeed."""
        try:
            nodes = self.inventory(cluster_id).nodes
        except SortieError:  # damaged or never written: there is nothing to name
            nodes = []
        self.forget(cluster_id)
        return Forgotten(cluster_id, [f"{n.name} ({n.address}): {n.workdir}" for n in nodes])


def _clean(node: Node) -> tuple[int, Leftover | None]:
    """(processes stopped, what is left on the node, if anything)."""
    by_hand = f"remove {node.workdir} on {node.address} by hand, or retry"
    try:
        conn = ssh.connect(node, DETACH_SSH_TIMEOUT_S)
    except (SortieError, *ssh.TRANSIENT_SSH_ERRORS) as exc:
        return 0, Leftover("node", f"{node.name} ({node.address})",
                           f"not reachable ({exc}): {by_hand}")
    try:
        stopped, left = remove_workdir(conn, node)
    finally:
        conn.close()
    return stopped, None if left is None else Leftover("node", node.name, f"{left}: {by_hand}")


if TYPE_CHECKING:  # mypy holds the class to what its kind's listing does (`stacks/listing.py`)
    from sortie.stacks.listing import LiveListing

    _conforms: type[LiveListing] = AttachedBackend
