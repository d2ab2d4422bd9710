"""The Slurm clusters attached to allocate on (`sortie attach NAME --slurm`), as `sortie status`
lists them and `sortie down NAME` detaches one: the record is forgotten, nothing on the cluster
is touched. One in use by an allocation of this controller stays until that is down (its
allocation needs the record to reach Slurm)."""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import TYPE_CHECKING

from sortie.core import naming
from sortie.core.errors import SortieError
from sortie.infra.cloud_home import Leftover
from sortie.stacks.backend import Teardown
from sortie.stacks.listing import SITE_STATE, Seen, SortieRow
from sortie.stacks.slurm.slurm_backend import SlurmBackend
from sortie.stacks.slurm.slurm_sites import SlurmSites


class SlurmSiteListing:
    """Each attached Slurm cluster: one `status` row, detached by `down NAME`."""

    kind = "slurm-site"

    def __init__(self, home: Path) -> None:
        self.home, self.sites = home, SlurmSites(home)

    def cluster_ids(self) -> list[str]:
        return self.sites.names()

    def state_dir(self, cluster_id: str) -> Path:
        return naming.state_dir(self.sites.directory, cluster_id)

    def users(self, name: str) -> list[str]:
        """This controller's allocations on it (a damaged one's record is left out)."""
        allocations, used = SlurmBackend(self.home), []
        for allocation_name in allocations.cluster_ids():
            try:
                allocation = allocations.allocation(allocation_name)
            except SortieError:
                continue
            if allocation is not None and allocation.site == name:
                used.append(allocation_name)
        return used

    def describe(self, name: str, now: float) -> Seen:
        row = SortieRow(name=name, backend="slurm", state="broken", owner=getpass.getuser())
        try:
            site = self.sites.site(name)
        except SortieError as exc:  # `down NAME` still forgets it
            row.detail = str(exc)
            return Seen(row, self.kind)
        used = self.users(name)
        login = f"{site.login.user}@{site.login.address}" if site.login else "this machine"
        row.state, row.age_s = SITE_STATE, round(max(0.0, now - site.attached_at))
        row.detail = (f"Slurm cluster to allocate on (`sortie run --slurm {name}`), its login "
                      f"node {login}, sorties' work in {site.shared_dir}; "
                      + (f"allocations on it: {', '.join(used)}" if used else
                         f"`sortie down {name}` detaches it (nothing on the cluster touched)"))
        return Seen(row, self.kind)

    def backend(self, seen: Seen) -> SlurmSiteListing:
        return self

    def down(self, cluster_id: str, keep_bucket: bool = False) -> Teardown:
        """Forget the cluster's record; refused (as leftovers) while an allocation uses it."""
        report = Teardown(cluster_id, unit="Slurm cluster records", detached=True)
        used = self.users(cluster_id)
        if used:
            report.leftovers = [Leftover("allocation", name, f"on {cluster_id}: `sortie down "
                                         f"{name}` first") for name in used]
            return report
        naming.remove(self.state_dir(cluster_id), ignore_errors=True)
        report.state_removed = not self.state_dir(cluster_id).exists()
        report.removed = int(report.state_removed)
        report.said = ("detached: its record is forgotten; nothing on the Slurm cluster was "
                       "touched")
        return report


if TYPE_CHECKING:  # mypy holds the class to what its kind's listing does (`stacks/listing.py`)
    from sortie.stacks.listing import Listing

    _conforms: type[Listing] = SlurmSiteListing
