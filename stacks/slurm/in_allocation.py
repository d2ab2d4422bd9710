"""The backend of a detached run's controller (`detached_run.py`): inside the allocation it
drives, as its batch job, on its first node. The allocation was queued and recorded when the
run was submitted; this controller takes the name over, reads the nodes Slurm gave, and runs
the sortie as `sortie run` does. What it cannot do from inside: ask for another allocation (a
node lost, a preemption, the time limit end the run, collected), or cancel its own (the
allocation ends as this process exits: `_release`)."""

from __future__ import annotations

import time
from pathlib import Path

from sortie.core import statefile
from sortie.core.errors import SortieError, UsageError
from sortie.core.inventory import Inventory
from sortie.stacks.backend import Placement, Teardown
from sortie.stacks.records import controller_files
from sortie.stacks.slurm.slurm_backend import SlurmBackend
from sortie.stacks.slurm.slurm_sites import Allocation, SlurmAsk, SlurmSite


class InAllocation(SlurmBackend):
    """Slurm job ``job_id``, the one this process runs in, as a sortie's allocation."""

    def __init__(self, home: Path, site: SlurmSite | None, ask: SlurmAsk, job_id: str) -> None:
        super().__init__(home, site, ask)
        self.job_id = job_id

    def reserve(self, cluster_id: str) -> None:
        """The name was taken when the run was submitted: this process is its controller."""
        allocation = self.allocation(cluster_id)
        if allocation is None or allocation.job_id != self.job_id:
            raise UsageError(f"--name: {cluster_id} is not the sortie of the allocation this "
                             f"controller runs in (Slurm job {self.job_id})")
        for name, text in controller_files().items():
            statefile.write_text(self.state_dir(cluster_id) / name, text)
        self.heartbeats.open(cluster_id)

    def up(self, cluster_id: str, nodes: int, placement: Placement) -> Inventory:
        allocation = self.allocation(cluster_id)
        assert allocation is not None  # (`reserve` read it)
        return self._hold(cluster_id, allocation)

    def replace(self, inventory: Inventory, lost: list[str]) -> Inventory:
        raise SortieError("a detached run has its one allocation: it is not replaced (its "
                          "last checkpoint is collected with its outputs)")

    def _release(self, cluster_id: str, allocation: Allocation, report: Teardown) -> bool:
        """Never cancelled from inside: the allocation ends as its batch job, this process,
        exits (`down` removes the rest: its workdir, its state); its time by sortie's clock."""
        report.removed = 1
        report.accounted_s = allocation.held_s(time.time())
        report.accounted_by = "sortie's clock (the allocation ends with its controller)"
        return True
