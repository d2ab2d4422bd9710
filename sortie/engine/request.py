"""What a run is asked to do: what runs and on how many nodes (`RunRequest`), how far it may go
(`Limits`), and what its cluster costs (`Pricing`, `sortie/cost/price.py`)."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from sortie.bootstrap.choices import DEFAULT_COLLECT_BYTES, DEFAULT_MAX_BYTES, HealthLevel
from sortie.core.image_ref import RegistryAuth
from sortie.core.job import Job
from sortie.cost.price import Pricing
from sortie.engine.task import UserJob
from sortie.infra.cloud_home import SshWait
from sortie.stacks.backend import Backend


@dataclass(frozen=True)
class Limits:
    """How long a node may take to answer, how many lost nodes are replaced, how many bytes of
    artifacts come back, how nodes are checked before training and when a job is hung."""

    ssh_timeout_s: float | None = None  # a new node's SSH wait; None: its backend's
    max_recoveries: int = 2  # lost-node recoveries before the sortie gives up
    max_artifact_bytes: int = DEFAULT_MAX_BYTES  # all nodes' files and the bucket's
    health: HealthLevel = "quick"  # the health gate before training (`bootstrap/health.py`)
    hang_timeout_s: float = 600.0  # no new log line from any node this long: a hang
    max_cost_usd: float | None = None  # a hard budget, at the launch terms (`Pricing`)
    # What a user's job wrote in its workdir, collected without its `artifacts` naming it
    # (`bootstrap/job_outputs.py`); 0: none (--no-collect), each such file named instead.
    collect_new_bytes: int = DEFAULT_COLLECT_BYTES

    def ssh_wait(self, backend: Backend) -> SshWait:
        """How long a new node may take to take SSH: the backend's (a cloud node boots and
        fetches its host key: many minutes), unless these limits set it."""
        given = self.ssh_timeout_s
        return backend.ssh_wait if given is None else SshWait(given, "the node's sshd")


@dataclass(frozen=True)
class RunRequest:
    """What runs: the user's job (or the bundled trainer with its steps), on how many nodes and
    processes, under which run id and runs directory."""

    nodes: int = 2
    procs_per_node: int = 2
    steps: int = 60
    trainer_args: tuple[str, ...] = ()
    trainer_env: dict[str, str] = field(default_factory=dict)  # the bundled trainer's `--env`
    run_id: str | None = None  # a sortie name, checked where it came in (a task's `name`, --name)
    runs_dir: Path = Path("runs")
    ckpt_every: int = 20  # steps between checkpoints: the most a recovery can redo
    user_job: UserJob | None = None  # the user's own job; None: the bundled trainer
    limits: Limits = field(default_factory=Limits)
    pricing: Pricing = field(default_factory=Pricing)
    image: str | None = None  # the container image every rank runs in (`bootstrap/container.py`)
    registry_auth: RegistryAuth | None = None  # its registry's login, the task's
    registry_password: str = field(default="", repr=False)  # read from the caller: never kept
    repeats: Path | None = None  # the run whose `task.yaml` this one runs again (its directory)

    def job(self, run_id: str) -> Job:
        """What is recorded of the job: enough for another controller to relaunch it."""
        user = self.user_job
        trainer_args = () if user else ("--steps", str(self.steps), "--ckpt-every",
                                        str(self.ckpt_every), *self.trainer_args)
        return Job(run_id=run_id, procs_per_node=self.procs_per_node,
                   runs_dir=str(self.runs_dir.resolve()),
                   command=user.command if user else None, trainer_args=trainer_args,
                   trainer_env={} if user else dict(self.trainer_env),
                   image=self.image, registry_auth=self.registry_auth,
                   overrides=user.task.overrides if user and user.task else ())


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
