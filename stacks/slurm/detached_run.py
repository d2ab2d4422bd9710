"""A run handed to Slurm whole (`sortie run --slurm NAME --detach`): the shell that submits it may
end. Its allocation's batch job is the run's controller, `sortie run` itself, started on the
allocation's first node once Slurm runs it (`in_allocation.py`: the backend it drives the
allocation it is in with); until then the sortie is listed as queued.

The controller's Python and the directory it was submitted from must be on the file system the
nodes share (a virtual environment there), as the nodes' own Python is. Such an allocation is
never requeued (`--no-requeue`): the controller in it would start again from nothing. A node
lost, a preemption or the time limit ends the run, collected; its checkpoints stay on the
shared disk for a run that resumes from them.
"""

from __future__ import annotations

import shlex
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from sortie.core import naming
from sortie.core.errors import UsageError
from sortie.stacks.backend import LaunchError
from sortie.stacks.slurm.hold_script import submit_allocation
from sortie.stacks.slurm.slurm_queue import SlurmQueue
from sortie.stacks.slurm.slurm_sites import Allocation, SlurmAsk, SlurmSite

IN_ALLOCATION = "SORTIE_IN_ALLOCATION"  # set by the batch job: the Slurm job its controller is in
DETACHED_FILE = "detached"  # in the state directory: submitted by `run --detach`


def controller_script(controller: list[str], cwd: Path, home: Path) -> str:
    """The batch job of a detached run: its controller, where it was submitted from. (Queued
    with `--export=ALL`: it is the `sortie run` the user typed, and reads what their shell
    holds, `--env NAME` and secrets; a site's SBATCH_EXPORT=NONE would start it with the
    account's login environment instead.)"""
    return (f"export {IN_ALLOCATION}=\"$SLURM_JOB_ID\" SORTIE_HOME={shlex.quote(str(home))}\n"
            f"cd {shlex.quote(str(cwd))} || exit 1\nexec {shlex.join(controller)}")


class DetachedSubmit:
    """`DetachedRun` on a Slurm cluster (`stacks/backend.py`): for the backend's ``site`` and
    ``ask``, its sorties' state in ``allocations``."""

    def __init__(self, home: Path, allocations: Path, site: SlurmSite | None,
                 ask: SlurmAsk) -> None:
        self.home, self.allocations, self.site, self.ask = home, allocations, site, ask

    def submit_detached(self, cluster_id: str, nodes: int, controller: list[str], cwd: Path,
                        log: Path) -> str:
        """Queue the allocation whose batch job is ``controller``; its job id. The name is
        taken here, with no controller yet (`status`: queued), and the allocation recorded."""
        site = self.site
        if site is None:
            raise UsageError("--detach: needs the Slurm cluster (--slurm NAME)")
        if site.login is not None:
            raise UsageError(f"--detach: {site.name} is reached over SSH: its controller would "
                             "run on the cluster, from the login node; run `sortie run "
                             "--detach` there")
        workdir, queue = Path(site.shared_dir) / f"sortie-{cluster_id}", SlurmQueue(None)
        state = naming.take(self.allocations, cluster_id, {DETACHED_FILE: ""})
        try:
            made = queue.own_dir(workdir)
            if made:
                raise LaunchError(f"{workdir}: not made on the login node: {made}")
            job_id = submit_allocation(
                queue, cluster_id, nodes, workdir, self.ask,
                script=controller_script(controller, cwd, self.home),
                batch_options=(f"--output={log}", "--open-mode=append", "--no-requeue",
                               "--export=ALL"))
        except Exception:  # nothing was queued: what was made here goes
            queue.on_login("rm", "-rf", "--", str(workdir))
            shutil.rmtree(state, ignore_errors=True)
            raise
        Allocation(site=site.name, job_id=job_id, workdir=str(workdir),
                   ask={**asdict(self.ask), "nodes": nodes}, started=time.time()).save(state)
        return job_id
