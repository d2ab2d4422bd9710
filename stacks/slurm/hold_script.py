"""The batch job that holds a sortie's nodes (`submit_allocation`), and how it knows its controller
still waits for it.

The job only holds the nodes (every phase runs in it as `srun` steps): its script sleeps, through
a preemption's SIGTERM too (ending then would cut the job's grace time to checkpoint). A
controller that dies while its allocation is queued would leave a job that later holds nodes for
nobody: so while the controller waits it touches ``.waiting`` in the allocation's directory on
the shared disk (each poll, `POLL_MAX_S` apart at most), and removes it once it has seen the job
run. A job that starts to find ``.waiting`` untouched for ORPHAN_AFTER_S ends itself, holding
nothing; one that finds it gone (its controller took it, or a requeue after) holds the nodes.
One that cannot enter its directory (removed while it was queued) ends too (`hold_script`).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from sortie.stacks.backend import LaunchError
from sortie.stacks.slurm.slurm_queue import POLL_MAX_S, SlurmQueue, signal_lead_s, slurm_message
from sortie.stacks.slurm.slurm_sites import SlurmAsk

WAITING = ".waiting"
# Several of the controller's polls missed (a slow login node over SSH): then it is gone.
ORPHAN_AFTER_S = int(4 * POLL_MAX_S + 5)
HOLD_SCRIPT = (
    "trap '' TERM\n"
    f"while [ -e {WAITING} ]; do\n"
    f"  touched=$(stat -c %Y {WAITING} 2>/dev/null) || break\n"
    f"  if [ $(( $(date +%s) - touched )) -gt {ORPHAN_AFTER_S} ]; then\n"
    "    echo 'sortie: the controller that queued this allocation stopped waiting for it: "
    "ending, holding nothing'; exit 0\n"
    "  fi\n"
    "  sleep 2\n"
    "done\n"
    "exec sleep infinity")


def hold_script(workdir: str) -> str:
    """HOLD_SCRIPT, first in ``workdir`` itself: a job whose directory was removed while it
    was queued is started by Slurm in /tmp instead (slurmstepd: "couldn't chdir ... going to
    /tmp"), where no mark says its controller waits: it ends, holding nothing, rather than
    hold the nodes for nobody until its time limit."""
    return (f"cd -- {shlex.quote(workdir)} 2>/dev/null || {{ echo 'sortie: the directory of this "
            "allocation is gone: ending, holding nothing'; exit 0; }\n" + HOLD_SCRIPT)


def still_waiting(queue: SlurmQueue, workdir: str) -> None:
    """Say to the queued allocation that its controller waits (touch ``.waiting``)."""
    queue.on_login("touch", "--", f"{workdir}/{WAITING}")


def taken(queue: SlurmQueue, workdir: str) -> None:
    """Say to the running allocation that its controller has it: it holds the nodes."""
    queue.on_login("rm", "-f", "--", f"{workdir}/{WAITING}")


def submit_allocation(queue: SlurmQueue, cluster_id: str, nodes: int, workdir: Path,
                      ask: SlurmAsk, exclude: Sequence[str] = (), script: str | None = None,
                      batch_options: Sequence[str] = ("--output=/dev/null",)) -> str:
    """Queue the job that holds a sortie's nodes, HOLD_SCRIPT with its controller marked as
    waiting (a detached run's: ``script``, its controller, and ``batch_options``, its output,
    requeue and environment); its id. With a time limit, Slurm
    signals the job `signal_lead_s` before it (the trainer checkpoints and stops: a new
    allocation resumes)."""
    signal = [f"--signal=TERM@{signal_lead_s(ask.time)}"] if ask.time else []
    if exclude:  # (with the user's own --exclude: one flag, sbatch keeps only the last)
        ask = replace(ask, exclude=",".join(filter(None, (ask.exclude, *exclude))))
    if script is None:
        still_waiting(queue, str(workdir))  # its controller waits for it
        script = hold_script(str(workdir))
    done = queue.slurm("sbatch", "--parsable", f"--job-name=sortie-{cluster_id}", *batch_options,
                       f"--chdir={workdir}", *signal, *ask.options(nodes), "--wrap", script)
    job_id = done.stdout.strip().split(";")[0]
    if done.returncode != 0 or not job_id.isdigit():
        raise LaunchError(f"sbatch refused the allocation: {slurm_message(done)}")
    return job_id
