"""A cloud stack's outputs (declared by `infra/outputs.py`), validated and turned into the
inventory bootstrap uses. Outputs are untrusted input: every field is checked before anything
connects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, IPvAnyAddress, ValidationError, model_validator

from bootstrap.errors import UsageError, first_field_error
from bootstrap.inventory import Inventory, Node
from infra.keys import fingerprint
from infra.spec import CloudName


class NodeOutput(BaseModel):
    """One node in a cloud stack's `nodes` output (see infra/outputs.py)."""

    name: str = Field(pattern=r"^node-\d+$")
    public_address: IPvAnyAddress
    private_address: IPvAnyAddress
    host_key: str = Field(pattern=r"^ssh-ed25519 [A-Za-z0-9+/=]+$")
    host_key_fingerprint: str = Field(pattern=r"^SHA256:")
    spot: bool
    ssh_port: int = Field(default=22, ge=1, le=65535)
    workdir: str | None = Field(default=None, pattern=r"^/")  # overrides the stack's workdir

    @model_validator(mode="after")
    def _fingerprint_is_the_keys(self) -> NodeOutput:
        if fingerprint(self.host_key) != self.host_key_fingerprint:
            raise ValueError(f"host_key_fingerprint {self.host_key_fingerprint} is not the "
                             "fingerprint of host_key")
        return self


class StackOutputs(BaseModel):
    """The outputs every cloud program exports; validated before anything connects."""

    cluster: str
    cloud: CloudName
    ssh_user: str = Field(min_length=1)
    workdir: str = Field(pattern=r"^/")
    python: str = Field(min_length=1)
    gpus_per_node: int = Field(ge=0)
    nodes: list[NodeOutput] = Field(min_length=1)
    bucket_url: str = Field(pattern=r"^((s3|gs|az)://[^/]+|file:///.+)")
    train_env: dict[str, str] = Field(default_factory=dict)  # extra trainer environment


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
    return Inventory(cluster_id=stack.cluster, backend=stack.cloud, nodes=nodes, train_env=env)
