"""The job a sortie runs on its nodes, one model from the controller to the node: what bootstrap
launches there (the bundled trainer, the user's script under torchrun, or the user's shell), and
the record a backend keeps of it (``job.json``), enough for another controller to relaunch it
after a lost node (`sortie watch`, `reap`) without reading anything else the run wrote. Secrets
by name only: their values never leave the controller that has them.

A user's job in its stages, each persisted once:
1. asked: `Task` (`sortie/engine/task.py`), a task file with the command line's flags over it;
   ``runs/<id>/task.yaml`` is it as it ran, for the user to run again;
2. resolved: `UserJob` (there too), the task checked against the caller's machine: secrets'
   values read, the workdir's files chosen and hashed, the setup fingerprinted; memory only;
3. recorded: `Job`, here: what runs and what a relaunch needs (`Command`); the backend's
   ``job.json``, which a takeover reads back as a `UserJob` (`engine/job_files.recorded_user_job`);
4. ran: ``run.json`` (`sortie/rundir/run_file.py`), how it went.
Whether a job is the user's is `is_user_job`, whichever stage asks.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sortie.core.image_ref import RegistryAuth, image_ref
from sortie.core.naming import NAME
from sortie.core.userfile import check_env

# What runs a job of the user's own, said where a command or script was given in a wrong place
# (`sortie run python train.py`; after the `--`, where the bundled trainer's flags go).
COMMAND_HINT = ("A command of your own goes in --run (`--run 'python train.py --lr 3e-4'`), a "
                "script in --script (`--script train.py -- --lr 3e-4`).")


def is_user_job(script: str | None, run: str | None) -> bool:
    """Whether a job is the user's (their script, or their own line) rather than the bundled
    trainer: the one answer each stage gives (`Task.is_user_job`, `Job.is_user_job`)."""
    return bool(script or run)


class Command(BaseModel):
    """What a user's job runs on every node: their script under the torchrun line sortie
    writes, or their own shell line; the task's variables, and its secrets by name; what makes
    a node ready for it (the workdir synced, the setup run) and what comes back."""

    model_config = ConfigDict(frozen=True)

    script: str | None = None  # relative to the synced workdir
    script_args: tuple[str, ...] = ()
    run: str | None = None
    env: dict[str, str] = Field(default_factory=dict)  # no secrets
    secret_names: tuple[str, ...] = ()  # a controller taking over reads them from its env
    workdir: str | None = None  # absolute, as its first controller saw it: synced to the nodes
    setup: str | None = None  # once per node, skipped where a node has run it already...
    setup_fingerprint: str = ""  # ...with these inputs (`bootstrap/setup_cache.py`)
    artifacts: tuple[str, ...] = ()  # globs under the workdir, copied back and verified

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, workdir: str | None) -> str | None:
        """A record is read back by another controller (`watch`): its workdir, synced from,
        is an absolute, printable path, as the launch resolved it."""
        if workdir is not None and not (workdir.startswith("/") and workdir.isprintable()):
            raise ValueError(f"{workdir[:80]!r}: not an absolute path")
        return workdir

    @model_validator(mode="after")
    def _runs_something(self) -> Command:
        if not is_user_job(self.script, self.run):
            raise ValueError("a user's job runs a `script` or a `run` line")
        return self

    def describe(self, most: int = 200) -> str:
        """What runs, in a few words (the run report's header)."""
        text = (" ".join(["your script", self.script, *self.script_args]) if self.script
                else f"your command: {self.run}")
        return text if len(text) <= most else text[:most - 1] + "…"


class Job(BaseModel):
    model_config = ConfigDict(frozen=True)

    run_id: str = Field(pattern=f"^{NAME.pattern}$")  # a sortie name: it names runs/<id>/
    procs_per_node: int = Field(ge=1)
    runs_dir: str = "runs"  # where runs/<id>/ goes: absolute, as its first controller saw it
    command: Command | None = None  # the user's; None: the bundled trainer
    trainer_args: tuple[str, ...] = ()  # the bundled trainer's flags
    trainer_env: dict[str, str] = Field(default_factory=dict)  # its variables (`--env`), no secrets
    # The container image every rank runs in (`bootstrap/container.py`); by digest once pulled.
    # None: the node's own Python.
    image: str | None = None
    registry_auth: RegistryAuth | None = None  # its login (the password by name)
    setup_image: str | None = None  # what the setup made of it, where it has one
    overrides: tuple[str, ...] = ()  # the profile's --set its cluster was made with (`run.json`)

    _image = field_validator("image", "setup_image")(image_ref)

    @field_validator("trainer_env")
    @classmethod
    def _trainer_env(cls, env: dict[str, str]) -> dict[str, str]:
        check_env(env)  # a record is read back by another controller: names it may set
        return env

    @property
    def is_user_job(self) -> bool:
        return self.command is not None  # a Command runs the user's script or line
