"""Where sortie's files live on a node, in one place. Under the node's workdir (`Node.workdir`,
sortie's own directory there; `sortie-<NAME>/` under an attached host's base):

- ``job/``: the user's workdir as synced ($SORTIE_WORKDIR; `bootstrap/sync.py`);
- ``runs/<run-id>/``: one run (`bootstrap/train.py`): ``torchrun.log`` (the job's output; a
  relaunch appends), ``log_offset``, ``pid``, ``exit_code``, ``running`` (locked while the job
  runs: `bootstrap/cluster_lock.py`), the 0600 secrets files its shells read and delete, and
  ``out/`` ($SORTIE_ARTIFACT_DIR: what is collected after the run).
"""

from __future__ import annotations

from sortie.core.inventory import Node

JOB_DIR = "job"
RUNS_DIR = "runs"
OUT_DIR = "out"


def job_dir(node: Node) -> str:
    """Where the user's workdir lands on a node ($SORTIE_WORKDIR): beside sortie's own files."""
    return f"{node.workdir}/{JOB_DIR}"


def runs_dir(node: Node) -> str:
    return f"{node.workdir}/{RUNS_DIR}"


def run_dir(node: Node, run_id: str) -> str:
    return f"{runs_dir(node)}/{run_id}"


def artifact_dir(node: Node, run_id: str) -> str:
    """$SORTIE_ARTIFACT_DIR: the run's outputs, collected after it."""
    return f"{run_dir(node, run_id)}/{OUT_DIR}"
