"""Where sortie's files live on a node, in one place. Under the node's workdir (`Node.workdir`,
sortie's own directory there; `sortie-<NAME>/` under an attached host's base), which nodes that
share a file system (an NFS home, a Slurm cluster's) share too:

- ``job/``: the user's workdir as synced ($SORTIE_WORKDIR; `bootstrap/sync.py`);
- ``env/``: a user's job's Python environment where the node's Python is the controller's own
  (local and booted nodes, `bootstrap/job_env.py`);
- ``trainers/<version>/trainer/``: the bundled trainer, one directory per version
  (`bootstrap/trainer_bundle.py`), installed whole or not at all;
- ``nodes/<node>/``: what is the node's own: its setup's marker and log
  (`bootstrap/setup_cache.py`), and ``runs/<run-id>/``, one run (`bootstrap/train.py`):
  ``torchrun.log`` (the job's output; a relaunch appends), ``log_offset``, ``pid``,
  ``exit_code``, ``started`` (when the run first launched there: what the job writes after it is
  the run's, `bootstrap/job_outputs.py`), ``running`` (locked while the job runs:
  `bootstrap/cluster_lock.py`), the 0600
  secrets files its shells read and delete, and ``out/`` ($SORTIE_ARTIFACT_DIR: what is
  collected after the run).
"""

from __future__ import annotations

from sortie.bootstrap.trainer_bundle import trainer_version
from sortie.core.inventory import Node

JOB_DIR = "job"
JOB_ENV_DIR = "env"
TRAINERS_DIR = "trainers"
NODES_DIR = "nodes"
RUNS_DIR = "runs"
OUT_DIR = "out"
STARTED = "started"


def job_dir(node: Node) -> str:
    """Where the user's workdir lands on a node ($SORTIE_WORKDIR): beside sortie's own files."""
    return f"{node.workdir}/{JOB_DIR}"


def job_env_dir(node: Node) -> str:
    """A user's job's own Python environment on a node whose Python is sortie's."""
    return f"{node.workdir}/{JOB_ENV_DIR}"


def trainer_home(node: Node) -> str:
    """The directory the trainer package is imported from (PYTHONPATH): this version's."""
    return f"{node.workdir}/{TRAINERS_DIR}/{trainer_version()}"


def node_dir(node: Node) -> str:
    """The node's own files: never another node's, even on a file system they share."""
    return f"{node.workdir}/{NODES_DIR}/{node.name}"


def runs_dir(node: Node) -> str:
    return f"{node_dir(node)}/{RUNS_DIR}"


def run_dir(node: Node, run_id: str) -> str:
    return f"{runs_dir(node)}/{run_id}"


def artifact_dir(node: Node, run_id: str) -> str:
    """$SORTIE_ARTIFACT_DIR: the run's outputs, collected after it."""
    return f"{run_dir(node, run_id)}/{OUT_DIR}"


def started_marker(node: Node, run_id: str) -> str:
    """Written once, when the run first launches on the node: its time is the run's start."""
    return f"{run_dir(node, run_id)}/{STARTED}"
