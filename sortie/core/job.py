"""The job a sortie runs on its nodes, one model from the controller to the node: what bootstrap
launches there (the bundled trainer, the user's script under torchrun, or the user's shell), and
the record a backend keeps of it, enough for another controller to relaunch it after a lost node
(`sortie watch`, `reap`). Secrets by name only: their values never leave the controller that
has them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sortie.core.naming import NAME


class Job(BaseModel):
    model_config = ConfigDict(frozen=True)

    run_id: str = Field(pattern=f"^{NAME.pattern}$")  # a sortie name: it names runs/<id>/
    procs_per_node: int = Field(ge=1)
    trainer_args: tuple[str, ...] = ()  # the bundled trainer's flags (no script, no run)
    runs_dir: str = "runs"  # where runs/<id>/ goes: absolute, as its first controller saw it
    script: str | None = None  # the user's script, relative to the synced workdir
    script_args: tuple[str, ...] = ()
    run: str | None = None  # the user's shell, run on every node
    env: dict[str, str] = Field(default_factory=dict)  # the task's variables (no secrets)
    secret_names: tuple[str, ...] = ()  # a controller taking over reads them from its env

    @property
    def is_user_job(self) -> bool:
        return bool(self.script or self.run)
