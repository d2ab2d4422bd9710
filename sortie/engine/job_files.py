"""What a user's job leaves beside its artifacts in ``runs/<id>/``: ``task.yaml``, the task as it
ran (`sortie run` of it runs the job again; a controller taking the sortie over reads the
backend's record instead: `recorded_user_job`), and the code it ran: ``code.json`` (every synced
file's SHA-256) and ``code/``, a copy of the synced files when they fit in CODE_COPY_MAX.
`sortie run runs/<id>/task.yaml` then runs that code (`reproduce`): the workdir as it is when it
still holds it, else the copy; without a copy, it says which files differ before anything
starts. Which code ran, on which nodes, and how it ended are in ``run.json`` with every run's."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import pydantic
import yaml

from sortie.bootstrap.workdir import IGNORE_FILE, SyncPlan, file_digest, file_digests, plan_sync
from sortie.core import statefile
from sortie.core.errors import UsageError
from sortie.core.job import Job
from sortie.core.progress import some_of
from sortie.core.statefile import RUN_FILE_MODE
from sortie.engine.request import RunRequest
from sortie.engine.task import Task, UserJob, own_dirs
from sortie.rundir.result import RunResult

TASK_RECORD = "task.yaml"
CODE_RECORD = "code.json"
CODE_DIR = "code"
CODE_COPY_MAX = 64 << 20  # the synced files a run keeps a copy of, at most


class CodeRecord(pydantic.BaseModel):
    """``code.json``: the synced workdir of a run, file by file."""

    workdir: str
    files: dict[str, str]  # name -> SHA-256 (a symlink: of its target's name)
    copied: bool  # whether ``code/`` holds them


def task_record(task: Task, nodes: int, procs_per_node: int) -> str:
    """`runs/<id>/task.yaml`: the task as it ran, flags folded in, so that `sortie run` of
    this file runs it again (under a new id: the name is left out). Secrets by name only;
    `env` as written in the task, required values (null) still read from the environment."""
    ran = task.model_copy(update={"name": None, "nodes": nodes, "procs_per_node": procs_per_node,
                                  "workdir": task.workdir.expanduser().resolve()
                                  if task.workdir else None})
    document = ran.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    return "# the task as it ran; `sortie run` this file to run it again\n" + \
        yaml.safe_dump(document, sort_keys=False)


def write_task(request: RunRequest, result: RunResult) -> None:
    """``task.yaml`` and the code the job runs (`write_code`), written before anything starts:
    a failed run has them too."""
    user = request.user_job
    if user is not None and user.task is not None:
        result.artifacts.mkdir(parents=True, exist_ok=True)
        statefile.write_text(result.artifacts / TASK_RECORD,
                             task_record(user.task, request.nodes, request.procs_per_node),
                             RUN_FILE_MODE)
        if user.files is not None:
            write_code(user.files, result.artifacts, user.file_digests)


def record_image(request: RunRequest, result: RunResult, image: str) -> None:
    """``task.yaml`` again, its `image` by the digest its tag named when the run pulled it: a
    re-run of the file runs the same image."""
    user = request.user_job
    if user is not None and user.task is not None:
        statefile.write_text(result.artifacts / TASK_RECORD,
                             task_record(user.task.model_copy(update={"image": image}),
                                         request.nodes, request.procs_per_node), RUN_FILE_MODE)


def write_code(plan: SyncPlan, run_dir: Path, digests: dict[str, str] | None = None) -> None:
    """``code.json`` (each synced file's SHA-256: ``digests`` when read already) and, when the
    files fit in CODE_COPY_MAX, a copy of them in ``code/`` (modes and symlinks kept)."""
    copied = plan.bytes <= CODE_COPY_MAX
    record = CodeRecord(workdir=str(plan.root), copied=copied,
                        files=digests if digests is not None else file_digests(plan))
    if copied:
        for name in plan.files:
            target = run_dir / CODE_DIR / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(plan.root / name, target, follow_symlinks=False)
        # Its own rules: every file here is sent (git's would see a gitignored runs/ and
        # send none of them).
        rules = run_dir / CODE_DIR / IGNORE_FILE
        rules.parent.mkdir(parents=True, exist_ok=True)  # (an empty workdir: none copied)
        if not rules.exists():
            rules.write_text("# the code a run ran, kept by sortie: every file is sent\n")
    statefile.write_text(run_dir / CODE_RECORD, record.model_dump_json(), RUN_FILE_MODE)


def repeated_run(task_file: Path | None) -> Path | None:
    """The run directory whose recorded task ``task_file`` is (`sortie run runs/<id>/task.yaml`
    runs it again), or None."""
    if task_file is None or task_file.name != TASK_RECORD or \
            not (task_file.parent / CODE_RECORD).is_file():
        return None
    return task_file.parent


def kept_code(run_dir: Path) -> Path | None:
    """``code/``, the copy of the code a run ran, when ``run_dir`` has a whole one."""
    try:
        record = statefile.read_untrusted_model(CodeRecord, run_dir / CODE_RECORD,
                                                max_bytes=64 << 20)
    except Exception:  # noqa: BLE001 - no record, or one that cannot be read: no copy
        return None
    copy = run_dir / CODE_DIR
    return copy.resolve() if record.copied and copy.is_dir() else None


def reproduce(task_file: Path | None, task: Task, workdir_given: bool,
              own: Mapping[str, Path]) -> tuple[Task, str | None]:
    """A run's recorded task (``runs/<id>/task.yaml``) runs the code that run ran: its workdir
    when that still holds the same files, else the copy the run kept (said in the returned
    line); without a copy, a UsageError naming the files that differ, before anything starts.
    Any other task, or a workdir given on the command line, is run as it is."""
    if task_file is None or workdir_given or task.workdir is None or \
            task_file.name != TASK_RECORD or not (task_file.parent / CODE_RECORD).is_file():
        return task, None
    record_file = task_file.parent / CODE_RECORD
    try:
        record = statefile.read_untrusted_model(CodeRecord, record_file, max_bytes=64 << 20)
    except Exception as exc:  # noqa: BLE001 - a record that cannot be read is said
        raise UsageError(f"{record_file}: not a code record sortie can read ({exc})") from None
    run_id = task_file.parent.name
    differ = _differences(record, task.workdir, own)
    if not differ:
        return task, None
    shown = some_of(differ)
    copy = task_file.parent / CODE_DIR
    if record.copied and copy.is_dir():
        return task.model_copy(update={"workdir": copy.resolve()}), (
            f"workdir {task.workdir} differs from the code run {run_id} ran ({shown}): running "
            f"that code, kept in {copy}")
    raise UsageError(f"workdir: {task.workdir} differs from the code run {run_id} ran ({shown}) "
                     f"and the run kept no copy (over {CODE_COPY_MAX >> 20} MiB): restore those "
                     f"files, or give --workdir {task.workdir} to run the code as it is now")


def _differences(record: CodeRecord, workdir: Path, own: Mapping[str, Path]) -> list[str]:
    """The files that differ between the recorded code and ``workdir`` now: "train.py
    (changed)", "new.py (new)", "old.py (gone)"."""
    try:
        plan = plan_sync(workdir, max_bytes=1 << 62, own=own)
    except UsageError:
        return [f"{workdir} (unreadable now)"]
    now = set(plan.files)
    changed = [f"{name} (changed)" for name in sorted(now & record.files.keys())
               if file_digest(plan, name) != record.files[name]]
    return [*changed, *(f"{name} (new)" for name in sorted(now - record.files.keys())),
            *(f"{name} (gone)" for name in sorted(record.files.keys() - now))]


def recorded_user_job(job: Job, environ: Mapping[str, str] = os.environ,
                      relaunch: bool = True) -> UserJob | None:
    """The user's job of a sortie another controller launched, for a takeover (None: the
    bundled trainer), from the sortie's own record alone: what runs, its variables, setup and
    artifacts are in ``job.command``.

    With ``relaunch`` (`sortie watch`, which may replace a lost node and start the job again)
    the secrets must be in this controller's environment and the code still there; without
    (`reap`, which only collects and tears down) neither is needed."""
    command = job.command
    if command is None:
        return None
    missing = [name for name in command.secret_names if name not in environ]
    if relaunch and missing:
        raise UsageError(f"secrets: {', '.join(missing)} not set in your environment: a "
                         "relaunch after a lost node needs them")
    files = None
    if relaunch and command.workdir:
        # A replaced node runs the code the others run: the copy the run kept, else (a
        # workdir over CODE_COPY_MAX) the workdir as it is now. Its size was accepted at launch.
        code = kept_code(Path(job.runs_dir) / job.run_id) or Path(command.workdir)
        files = plan_sync(code, max_bytes=1 << 62, own=own_dirs(Path(job.runs_dir)))
    return UserJob(command=command, files=files,
                   secrets={name: environ[name] for name in command.secret_names
                            if name in environ})
