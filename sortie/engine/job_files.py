"""What a user's job leaves beside its artifacts in ``runs/<id>/``: ``task.yaml``, the task as it
ran (`sortie run` of it runs the job again, and a controller taking the sortie over reads it).
Which code ran, on which nodes, and how it ended are in ``run.json`` with every run's."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from sortie.bootstrap.setup_cache import setup_fingerprint
from sortie.bootstrap.workdir import plan_sync
from sortie.core import statefile
from sortie.core.errors import UsageError
from sortie.core.job import Job
from sortie.core.statefile import RUN_FILE_MODE
from sortie.engine.request import RunRequest
from sortie.engine.task import UserJob, load_task, own_dirs, task_record
from sortie.rundir.result import RunResult

TASK_RECORD = "task.yaml"


def write_task(request: RunRequest, result: RunResult) -> None:
    """``task.yaml``, written before anything starts: a failed run has it too."""
    user = request.user_job
    if user is not None and user.task is not None:
        result.artifacts.mkdir(parents=True, exist_ok=True)
        statefile.write_text(result.artifacts / TASK_RECORD,
                             task_record(user.task, request.nodes, request.procs_per_node),
                             RUN_FILE_MODE)


def recorded_user_job(job: Job, environ: Mapping[str, str] = os.environ,
                      relaunch: bool = True) -> UserJob | None:
    """The user's job of a sortie another controller launched, for a takeover (None: the
    bundled trainer). What runs, and with which variables, is the sortie's own record; its
    workdir, setup and artifacts are in the ``task.yaml`` its first controller wrote.

    With ``relaunch`` (`sortie watch`, which may replace a lost node and start the job again)
    the secrets must be in this controller's environment and the workdir still there; without
    (`reap`, which only collects and tears down) neither is needed."""
    command = job.command
    if command is None:
        return None
    missing = [name for name in command.secret_names if name not in environ]
    if relaunch and missing:
        raise UsageError(f"secrets: {', '.join(missing)} not set in your environment: a "
                         "relaunch after a lost node needs them")
    path = Path(job.runs_dir) / job.run_id / TASK_RECORD
    try:
        task = load_task(path) if path.is_file() else None
    except UsageError:
        if relaunch:
            raise
        task = None  # reap still collects the run's logs and tears down
    files = None
    if relaunch and task and task.workdir:
        # Its size was accepted at launch: no cap now. A replaced node gets the workdir as it
        # is now; edit it while a sortie runs and that node runs the edit.
        files = plan_sync(task.workdir, max_bytes=1 << 62,
                          own=own_dirs(Path(job.runs_dir)))
    setup = task.setup if task else None
    return UserJob(
        command=command,
        secrets={name: environ[name] for name in command.secret_names if name in environ},
        files=files, setup=setup,
        setup_fingerprint=setup_fingerprint(setup or "", command.env, files,
                                            task.setup_inputs if task and files else ()),
        artifacts=task.artifacts if task else (), task=task)
