"""A task: the user's own job, as `sortie run task.yaml` / `sortie exec NAME task.yaml` read it.

    name: my-experiment          # the sortie's name (a new cluster's, and the run's)
    nodes: 2
    procs_per_node: 4            # default: GPUs per node, 1 without GPUs
    workdir: .                   # synced to every node; relative to this file
    setup: pip install -r requirements.txt   # once per node, cached by its inputs
    setup_inputs: [requirements.txt]
    image: nvcr.io/nvidia/pytorch:24.05-py3   # run in this image (default: the node's Python)
    script: train.py             # sortie writes the torchrun line ...
    args: [--epochs, "3"]
    # run: torchrun ... train.py # ... or the user writes it, from the SORTIE_* variables
    env: {WANDB_MODE: offline, DATA_DIR: null}   # null: from the caller's environment, as a secret
    secrets: [HF_TOKEN]          # names, read from the caller's environment, never recorded
    artifacts: ["outputs/*.pt"]  # globs under the workdir, copied back and verified
    max_cost: 40                 # a hard budget in dollars (--max-cost)
    stack: aws-p3-dev            # a cloud profile (default: the local backend)
    set: [nodes=4]               # --set overrides for the profile

Command-line flags override the file. A task file is untrusted input: its size is capped, names
are checked, and every path must stay inside the workdir. A bad field is one line naming it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sortie.bootstrap.setup_cache import setup_fingerprint
from sortie.bootstrap.workdir import (
    DEFAULT_MAX_BYTES,
    SyncPlan,
    file_digests,
    plan_sync,
    workdir_facts,
)
from sortie.core.errors import UsageError, first_field_error
from sortie.core.home import sortie_home
from sortie.core.image_ref import RegistryAuth, image_ref
from sortie.core.inventory import MAX_NODES
from sortie.core.job import COMMAND_HINT, Command, is_user_job
from sortie.core.naming import NAME, NAME_RULE
from sortie.core.userfile import (
    MAX_COMMAND_TEXT,
    check_env,
    command_text,
    env_name,
    parse_yaml,
    read_capped,
    user_path,
)
from sortie.engine.job_script import not_python, script_in_workdir
from sortie.trainer.config import FlagsError, check_flags

MAX_TASK_BYTES = 1 << 20
# The flags of `sortie run` that set a task's fields.
FLAGS = {"name": "--name", "nodes": "--nodes", "procs_per_node": "--procs-per-node",
         "workdir": "--workdir", "script": "--script", "run": "--run", "setup": "--setup",
         "env": "--env", "artifacts": "--artifact",
         "stack": "--stack", "overrides": "--set", "max_cost": "--max-cost", "image": "--image"}


def _inside(path: str, field: str) -> str:
    """A path or glob relative to the workdir that cannot leave it."""
    parts = PurePosixPath(path).parts
    if not path or path.startswith(("/", "~")) or ".." in parts or "\0" in path:
        raise ValueError(f"{path!r} must be a relative path inside the workdir ({field})")
    return path


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True,
                              allow_inf_nan=False)

    name: str | None = None
    nodes: int | None = Field(default=None, ge=1, le=MAX_NODES, strict=True)
    procs_per_node: int | None = Field(default=None, ge=1, le=64, strict=True)
    workdir: Path | None = None
    setup: str | None = None
    setup_inputs: tuple[str, ...] = ()
    image: str | None = None
    registry_auth: RegistryAuth | None = None
    script: str | None = None
    args: tuple[str, ...] = ()
    run: str | None = None
    env: dict[str, str | None] = Field(default_factory=dict)
    secrets: tuple[str, ...] = ()
    artifacts: tuple[str, ...] = ()
    max_cost: float | None = Field(default=None, ge=0.01, le=1e7)
    stack: str | None = None
    overrides: tuple[str, ...] = Field(default=(), alias="set")

    @field_validator("name")
    @classmethod
    def _sortie_name(cls, name: str | None) -> str | None:
        if name is not None and not NAME.fullmatch(name):
            raise ValueError(f"{name!r}: use {NAME_RULE}")
        return name

    _image = field_validator("image")(image_ref)

    @field_validator("env", mode="before")
    @classmethod
    def _env_values_as_text(cls, env: Any) -> Any:
        """YAML reads `PORT: 8080` as a number and `DEBUG: true` as a boolean; the
        environment holds text."""
        if not isinstance(env, Mapping):
            return env
        return {key: _as_text(value) for key, value in env.items()}

    @field_validator("args", mode="before")
    @classmethod
    def _args_as_text(cls, args: Any) -> Any:
        """`args: [--epochs, 2]`: YAML reads the 2 as a number; a command line holds text."""
        return [_as_text(arg) for arg in args] if isinstance(args, list | tuple) else args

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str | None]) -> dict[str, str | None]:
        check_env(env)
        return env

    @field_validator("run")
    @classmethod
    def _run_line(cls, run: str | None) -> str | None:
        return command_text(run, "run")

    @field_validator("setup")
    @classmethod
    def _setup_text(cls, setup: str | None) -> str | None:
        return command_text(setup, "setup")

    @field_validator("args")
    @classmethod
    def _args_fit(cls, args: tuple[str, ...]) -> tuple[str, ...]:
        if sum(len(arg) + 1 for arg in args) > MAX_COMMAND_TEXT:
            raise ValueError(f"over {MAX_COMMAND_TEXT >> 10} KiB together; put them in a file in "
                             "the workdir")
        return args

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(env_name(name) for name in names)

    @field_validator("script")
    @classmethod
    def _script_inside(cls, script: str | None) -> str | None:
        if script is not None and script.startswith("-"):  # torchrun would read an option
            raise ValueError(f"{script!r}: a script's name cannot start with a dash")
        return _inside(script, "script") if script is not None else None

    @field_validator("setup_inputs", "artifacts")
    @classmethod
    def _paths_inside(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_inside(path, "paths") for path in paths)

    @model_validator(mode="after")
    def _one_way_to_run(self) -> Task:
        if self.script and self.run:
            raise ValueError("give `script` (sortie writes the torchrun line) or `run` (you "
                             "write it), not both")
        if self.args and not self.script:
            raise ValueError("`args` go with `script`")
        if set(self.secrets) & set(self.env):
            raise ValueError("a name is in both `env` and `secrets`")
        if self.registry_auth and not self.image:
            raise ValueError("`registry_auth` logs in to the registry of an `image`: give one")
        return self

    @property
    def is_user_job(self) -> bool:
        """False: no `script` and no `run`, the bundled trainer runs."""
        return is_user_job(self.script, self.run)


def parse_task(data: Any, where: str) -> Task:
    """``data`` (a parsed task file, flags folded in) as a Task; one UsageError naming the
    first bad field otherwise."""
    if not isinstance(data, Mapping):
        raise UsageError(f"{where}: a task is a mapping of fields (name, nodes, script, ...)")
    try:
        return Task.model_validate(data)
    except ValidationError as exc:
        if exc.errors()[0]["type"] == "extra_forbidden":
            known = ", ".join(f.alias or name for name, f in Task.model_fields.items())
            field = ".".join(str(p) for p in exc.errors()[0]["loc"])
            raise UsageError(f"{where}: {field}: unknown field; fields: {known}") from None
        raise UsageError(f"{where}: {first_field_error(exc)}") from None


def _as_text(value: Any) -> Any:
    """A number or boolean of a task file as the text a user wrote for it (`true`, `2`, `0.5`);
    anything else as it is, for its field's validator."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, int | float) else value


def load_task(path: Path) -> Task:
    """A task file; its relative `workdir` is taken from the file's own directory."""
    data = parse_yaml(read_capped(path, MAX_TASK_BYTES, "; a task file names files, it does "
                                  "not hold them"), str(path), "task")
    if data is None:  # empty, or comments only: a file saved by mistake, not "all defaults"
        raise UsageError(f"{path}: empty (no fields): a task file names your job (`script` or "
                         "`run`) and its settings; `sortie run` without one runs the bundled "
                         "trainer")
    task = parse_task(data, str(path))
    if task.workdir is not None:
        given = str(task.workdir)
        if not given.startswith("~") and not task.workdir.is_absolute():
            given = str(path.parent.resolve() / task.workdir)
        try:
            workdir = user_path(given, "workdir")
        except UsageError as exc:
            raise UsageError(f"{path}: {exc}") from None
        task = task.model_copy(update={"workdir": workdir})
    return task


def with_flags(task: Task, where: str = "flags", **flags: Any) -> Task:
    """``task`` with the flags the user gave (None / empty: not given) in place of its fields,
    validated again as a whole (a flag can make the task invalid: `--script` with `run`);
    ``where`` names the task in an error."""
    given = {key: value for key, value in flags.items() if value not in (None, (), [])}
    try:  # a bad flag on its own is named as the flag
        Task.model_validate(given)
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = FLAGS.get(str(first["loc"][0]), str(first["loc"][0])) if first["loc"] else "flags"
        raise UsageError(f"{flag}: {first['msg'].removeprefix('Value error, ')}") from None
    if "env" in given:  # a variable at a time: the task's others stay
        given["env"] = {**task.env, **given["env"]}
    return parse_task({**task.model_dump(exclude_defaults=True), **given}, where)


def task_with_flags(task_file: Path | None, **flags: Any) -> Task:
    """The task of ``task_file`` (none: an empty one) with the command line's flags over it.
    Without a task file, `--script` alone syncs the current directory (`torchrun train.py`'s
    way: the script is found where you are)."""
    task = load_task(task_file) if task_file is not None else Task()
    if task_file is None and flags.get("script") and flags.get("workdir") is None:
        flags["workdir"] = Path.cwd()
    if flags.get("script") and (workdir := flags.get("workdir") or task.workdir):
        flags["script"] = script_in_workdir(flags["script"], Path(workdir))
    where = "flags" if task_file is None else f"{task_file} with flags"
    return with_flags(task, where, **flags)


def resolve_environment(task: Task, environ: Mapping[str, str] = os.environ
                        ) -> tuple[dict[str, str], dict[str, str]]:
    """(env, secrets) for the job's processes: `env` values, and each secret's value from the
    caller's environment. A required `env` value (null) is read from it too and passed like a
    secret (such values are often secrets by mistake: never recorded, never on a command line).
    A missing one is one UsageError naming it, before anything starts."""
    env = {name: value for name, value in task.env.items() if value is not None}
    for name, value in task.env.items():
        if value is None and name not in environ:
            raise UsageError(f"env.{name}: required (null in the task, or `--env {name}` "
                             f"without a value): set {name} in your environment")
    missing = [name for name in task.secrets if name not in environ]
    if missing:
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        raise UsageError(f"secrets: {', '.join(missing[:10])}{more} not set in your environment")
    passed = [*task.secrets, *(name for name, value in task.env.items() if value is None)]
    return env, {name: environ[name] for name in passed}


def registry_password(auth: RegistryAuth | None, environ: Mapping[str, str] = os.environ
                      ) -> str:
    """The password ``auth`` names, from the caller's environment ("" without ``auth``); where
    it is not set, a UsageError naming it."""
    if auth is None:
        return ""
    if auth.password not in environ:
        raise UsageError(f"registry_auth.password: {auth.password} not set in your environment")
    return environ[auth.password]


def image_fields(task: Task, environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """A run request's image fields from ``task``: the image and its registry's login, the
    password read now (a missing one refused before anything starts)."""
    return {"image": task.image, "registry_auth": task.registry_auth,
            "registry_password": registry_password(task.registry_auth, environ)}


@dataclass(frozen=True)
class UserJob:
    """A user's job resolved for launch (its second stage, `sortie/core/job.py`), before any
    resource exists: what runs and is recorded (`command`), its files chosen (and under the
    cap) and hashed, its secrets read from the caller. A takeover's is read from the record."""

    command: Command
    secrets: dict[str, str]  # values: held in memory only, never recorded
    files: SyncPlan | None
    rerun_setup: bool = False
    task: Task | None = None  # as asked, flags and arguments folded in; None: read from a record
    code: dict[str, Any] | None = None  # the workdir's content hash, git commit (`run.json`)
    file_digests: dict[str, str] | None = None  # each synced file's SHA-256 (`code.json`)

    @property
    def setup(self) -> str | None:
        return self.command.setup

    @property
    def setup_fingerprint(self) -> str:
        return self.command.setup_fingerprint

    @property
    def artifacts(self) -> tuple[str, ...]:
        return self.command.artifacts


def resolve_job(task: Task, passthrough: tuple[str, ...] = (), rerun_setup: bool = False,
                max_sync_bytes: int = DEFAULT_MAX_BYTES,
                environ: Mapping[str, str] = os.environ,
                own: Mapping[str, Path] | None = None) -> UserJob:
    """Everything a launch needs from ``task`` (flags folded in), checked now: a missing
    variable, an oversized workdir or a setup input outside it fails before anything starts.
    ``own``: sortie's directories by what they are (`plan_sync`: never synced)."""
    if passthrough and not task.script:
        raise UsageError("-- ARGS: arguments after `--` go to a `script`; a `run` line "
                         "writes its own")
    env, secrets = resolve_environment(task, environ)
    files = plan_sync(task.workdir, max_sync_bytes, own) if task.workdir else None
    if task.script and files and task.script not in files.files:
        raise UsageError(f"script: {task.script} is not among the files synced from "
                         f"{files.root} ({files.rules})")
    if task.script and files and (why := not_python(files.root / task.script, task.script)):
        raise UsageError(f"script: {why}")
    if (task.setup_inputs or task.artifacts or task.script) and not files:
        raise UsageError("workdir: `script`, `setup_inputs` and `artifacts` are paths in the "
                         "workdir; give one (--workdir DIR)")
    fingerprint = setup_fingerprint(task.setup or "", env, files, task.setup_inputs)
    # Arguments after `--` replace the task's `args` (a recorded task re-run with new ones
    # would otherwise run both: `--epochs 3 --epochs 5`).
    args = passthrough or task.args
    command = Command(script=task.script, script_args=args, run=task.run, env=env,
                      secret_names=tuple(secrets), setup=task.setup,
                      setup_fingerprint=fingerprint, artifacts=task.artifacts,
                      workdir=str(files.root) if files else None)
    digests = file_digests(files) if files else None  # each file read once, for both
    return UserJob(command=command, secrets=secrets, files=files, rerun_setup=rerun_setup,
                   task=task.model_copy(update={"args": args}),
                   code=workdir_facts(files, digests) if files else None,
                   file_digests=digests)


def own_dirs(runs_dir: Path) -> dict[str, Path]:
    """sortie's own directories by what they are: a workdir that holds them never syncs them."""
    return {"runs directory": runs_dir, "home": sortie_home()}


def job_for(task: Task, passthrough: tuple[str, ...] = (), rerun_setup: bool = False,
            max_sync_bytes: int = DEFAULT_MAX_BYTES,
            own: Mapping[str, Path] | None = None) -> UserJob | None:
    """The user's job, resolved (`resolve_job`); None for the bundled trainer, which takes none
    of a job's fields."""
    if task.is_user_job:
        return resolve_job(task, passthrough, rerun_setup, max_sync_bytes, own=own)
    try:  # the bundled trainer's flags: a typo found now, not on the nodes
        check_flags(list(passthrough))
    except FlagsError as exc:
        hint = (f". {COMMAND_HINT}" if passthrough[:1] and not passthrough[0].startswith("-")
                else "")
        raise UsageError(f"-- ARGS (the bundled trainer's): {exc}{hint}") from None
    extra = [field for field in ("workdir", "setup", "secrets", "artifacts")
             if getattr(task, field)]
    if extra:
        raise UsageError(f"{extra[0]}: give `script` or `run` to say what runs (without them "
                         "the bundled trainer runs, which takes no "
                         f"{', '.join(extra)})")
    return None


def trainer_environment(task: Task) -> dict[str, str]:
    """The bundled trainer's variables (`--env NCCL_DEBUG=INFO`), recorded with its job: values
    given, never read from the caller's environment (that is for secrets, a job of your own's)."""
    needed = [name for name, value in task.env.items() if value is None]
    if needed:
        raise UsageError(f"env.{needed[0]}: the bundled trainer takes a value (`--env "
                         f"{needed[0]}=VALUE`); one read from your environment goes to a job of "
                         "your own (`script` or `run`)")
    return {name: value for name, value in task.env.items() if value is not None}


def default_procs(gpus_per_node: int, user_job: bool) -> int:
    """Processes per node when none is asked for: one per GPU; without GPUs 1 for a user's
    job, 2 for the bundled trainer (two ranks per node show its data parallelism)."""
    return gpus_per_node or (1 if user_job else 2)
