"""A cloud stack's outputs (declared by `infra/outputs.py`), validated and turned into the
inventory bootstrap uses. Outputs are untrusted input: every field is checked before anything
connects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    Field,
    IPvAnyAddress,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from sortie.core.errors import UsageError, first_field_error
from sortie.core.inventory import MAX_NODES, Inventory, Node
from sortie.infra.keys import fingerprint
from sortie.infra.spec import CloudName
from sortie.stacks.hosts import JobEnv, Program, UserName, WorkdirBase

# The one sortie variable a program may set: where the trainer asks for a preemption notice
# (the cloud's metadata service unless a program, or a test cloud, points it elsewhere).
PROGRAM_ENV = ("SORTIE_METADATA_URL",)


class NodeOutput(BaseModel):
    """One node in a cloud stack's `nodes` output (see infra/outputs.py)."""

    name: str = Field(pattern=r"^node-\d{1,3}$")  # at most 512 nodes
    public_address: IPvAnyAddress
    private_address: IPvAnyAddress
    host_key: str = Field(pattern=r"^ssh-ed25519 [A-Za-z0-9+/=]+$")
    host_key_fingerprint: str = Field(pattern=r"^SHA256:")
    spot: bool
    ssh_port: int = Field(default=22, ge=1, le=65535)
    workdir: WorkdirBase | None = None  # overrides the stack's workdir

    @model_validator(mode="after")
    def _fingerprint_is_the_keys(self) -> NodeOutput:
        if fingerprint(self.host_key) != self.host_key_fingerprint:
            raise ValueError(f"host_key_fingerprint {self.host_key_fingerprint} is not the "
                             "fingerprint of host_key")
        return self


class StackOutputs(BaseModel):
    """The outputs every cloud program exports; validated before anything connects."""

    cluster: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    cloud: CloudName
    # The same field types as a hosts file's: a user that reads as an ssh option
    # ("-oProxyCommand=..."), a python with a `;`, an env name that is shell are refused.
    ssh_user: UserName
    workdir: WorkdirBase
    python: Program
    gpus_per_node: int = Field(ge=0, le=64)
    nodes: list[NodeOutput] = Field(min_length=1, max_length=MAX_NODES)
    bucket_url: str = Field(pattern=r"^((s3|gs|az)://[^/\s]+|file:///\S+)$")
    train_env: dict[str, str] = Field(default_factory=dict)  # extra trainer environment
    # torchrun's rendezvous port on the head: a cloud cluster's machines are its own, so the
    # usual port; a program whose nodes share an address with others may give another.
    rdzv_port: int = Field(default=29400, ge=1024, le=65535)

    @field_validator("train_env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        """Names are identifiers, none of sortie's own but PROGRAM_ENV (a name goes into
        every node command line)."""
        others = {name: value for name, value in env.items() if name not in PROGRAM_ENV}
        TypeAdapter(JobEnv).validate_python(others)  # the hosts file's check
        return env

    @model_validator(mode="after")
    def _nodes_are_distinct(self) -> StackOutputs:
        """Two nodes with one name would get one rank; two at one address are one machine."""
        names = [node.name for node in self.nodes]
        endpoints = [(node.public_address, node.ssh_port) for node in self.nodes]
        if len(set(names)) < len(names):
            raise ValueError(f"nodes: {next(n for n in names if names.count(n) > 1)} appears "
                             "twice")
        if len(set(endpoints)) < len(endpoints):
            address, port = next(e for e in endpoints if endpoints.count(e) > 1)
            raise ValueError(f"nodes: two nodes at {address} port {port}")
        return self


def inventory_from_outputs(outputs: dict[str, Any], key_path: Path) -> Inventory:
    """Build the inventory bootstrap uses from a cloud stack's outputs.

    `key_path` is where the controller saved the `client_private_key` output (0600). A missing
    or malformed output is one error naming it."""
    try:
        stack = StackOutputs.model_validate(outputs)
    except ValidationError as exc:
        raise UsageError(f"stack output {first_field_error(exc)}") from None
    nodes = [Node(name=n.name, address=str(n.public_address), port=n.ssh_port,
                  user=stack.ssh_user, key_path=key_path, host_key=n.host_key,
                  gpus=stack.gpus_per_node, private_address=str(n.private_address),
                  workdir=n.workdir or stack.workdir, python=stack.python) for n in stack.nodes]
    # Checkpoints go to the cluster's bucket, so a replacement node resumes from them; the
    # trainer polls the cloud's preemption notice, so that a spot node's 30-120 s of warning
    # become a checkpoint.
    bucket = f"{stack.bucket_url.rstrip('/')}/{stack.cluster}"
    env = {"SORTIE_PREEMPTION_NOTICE": stack.cloud, **stack.train_env,
           "SORTIE_CHECKPOINT_URL": f"{bucket}/checkpoints"}
    return Inventory(cluster_id=stack.cluster, backend=stack.cloud, nodes=nodes, train_env=env,
                     rdzv_port=stack.rdzv_port)
