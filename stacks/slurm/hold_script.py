"""The batch job that holds a sortie's nodes, and how it knows its controller still waits for it.

The job only holds the nodes (every phase runs in it as `srun` steps): its script sleeps, through
a preemption's SIGTERM too (ending then would cut the job's grace time to checkpoint). A
controller that dies while its allocation is queued would leave a job that later holds nodes for
nobody: so while the controller waits it touches ``.waiting`` in the allocation's directory on
the shared disk (each poll, `POLL_MAX_S` apart at most), and removes it once it has seen the job
run. A job that starts to find ``.waiting`` untouched for ORPHAN_AFTER_S ends itself, holding
nothing; one that finds it gone (its controller took it, or a requeue after) holds the nodes.
"""

from __future__ import annotations

from sortie.stacks.slurm.slurm_queue import POLL_MAX_S, SlurmQueue

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


def still_waiting(queue: SlurmQueue, workdir: str) -> None:
    """Say to the queued allocation that its controller waits (touch ``.waiting``)."""
    queue.on_login("touch", "--", f"{workdir}/{WAITING}")


def taken(queue: SlurmQueue, workdir: str) -> None:
    """Say to the running allocation that its controller has it: it holds the nodes."""
    queue.on_login("rm", "-f", "--", f"{workdir}/{WAITING}")
