"""What a run is asked to do: the job, the cluster's shape, the limits, the launch cost."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from bootstrap import verified_copy
from sortie.engine.task import UserJob


@dataclass(frozen=True)
class RunRequest:
    nodes: int = 2
    procs_per_node: int = 2
    steps: int = 60
    trainer_args: tuple[str, ...] = ()
    run_id: str | None = None
    runs_dir: Path = Path("runs")
    ssh_timeout_s: float = 120.0
    ckpt_every: int = 20  # steps between checkpoints: the most a recovery can redo
    max_recoveries: int = 2  # lost-node recoveries before the sortie gives up
    max_artifact_bytes: int = verified_copy.DEFAULT_MAX_BYTES  # all nodes' files and the bucket's
    user_job: UserJob | None = None  # the user's own job; None: the bundled trainer
    # What the cluster costs at its launch terms, for the report (None: local, no cost).
    usd_per_hour: float | None = None
    pricing: str = ""


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
