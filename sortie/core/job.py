"""The job a sortie runs on its nodes, one model from the controller to the node: what bootstrap
launches there (the bundled trainer, the user's script under torchrun, or the user's shell), and
the record a backend keeps of it, enough for another controller to relaunch it after a lost node
(`sortie watch`, `reap`). Secrets by name only: their values never leave the controller that
has them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sortie.core.image_ref import image_ref
from sortie.core.naming import NAME


class Command(BaseModel):
    """What a user's job runs on every node: their script under the torchrun line sortie
    writes, or their own shell line; the task's variables, and its secrets by name."""

    model_config = ConfigDict(frozen=True)

    script: str | None = None  # relative to the synced workdir
    script_args: tuple[str, ...] = ()
    run: str | None = None
    env: dict[str, str] = Field(default_factory=dict)  # no secrets
    secret_names: tuple[str, ...] = ()  # a controller taking over reads them from its env

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
    # The container image every rank runs in (`bootstrap/container.py`); by digest once pulled.
    # None: the node's own Python.
    image: str | None = None
    setup_image: str | None = None  # what the setup made of it, where it has one

    _image = field_validator("image", "setup_image")(image_ref)

    @property
    def is_user_job(self) -> bool:
        return self.command is not None
