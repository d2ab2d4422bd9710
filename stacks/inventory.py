"""The inventory: what every backend returns and bootstrap consumes.

A local cluster builds it from the sshd daemons it started; a cloud stack builds the same
structure from its Pulumi outputs (`inventory_from_outputs`). It is plain data and round-trips
through JSON.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, IPvAnyAddress, ValidationError

from stacks import statefile
from stacks.errors import UsageError

INVENTORY_FILE = "inventory.json"


class Node(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    address: str  # where the controller reaches SSH
    port: int = Field(ge=1, le=65535)
    user: str
    key_path: Path  # the controller's private key for this cluster
    host_key: str  # pinned public host key, "ssh-ed25519 AAAA..."; never trusted on first use
    gpus: int = Field(ge=0)
    private_address: str  # what other nodes use to reach this one (rendezvous, collectives)
    workdir: str  # the node's disk for the trainer, its logs and outputs
    python: str = "python3"

    @property
    def known_hosts_name(self) -> str:
        """The host name as OpenSSH and paramiko write it in known_hosts."""
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"


class Inventory(BaseModel):
    model_config = ConfigDict(frozen=True)

    cluster_id: str
    backend: str  # "local", "aws", "gcp", "azure"
    nodes: list[Node] = Field(min_length=1)
    rdzv_port: int = Field(default=29400, ge=1, le=65535)  # c10d rendezvous store on the head
    # Extra environment for the trainer processes, e.g. which interface gloo should use.
    train_env: dict[str, str] = Field(default_factory=dict)
    # Where checkpoints live that every node (and a replacement node) reaches: a bucket URL, or a
    # directory for the local backend. Kept when collection fails so nothing is lost.
    bucket_url: str | None = None

    @property
    def head(self) -> Node:
        """The first node: it hosts the c10d rendezvous store."""
        return self.nodes[0]

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        names = ", ".join(n.name for n in self.nodes)
        raise KeyError(f"no node named {name!r} in cluster {self.cluster_id} (nodes: {names})")

    def known_hosts(self) -> str:
        """known_hosts lines pinning every node's host key."""
        return "".join(f"{n.known_hosts_name} {n.host_key}\n" for n in self.nodes)

    def save(self, path: Path) -> None:
        statefile.write_text(path, self.model_dump_json(indent=2) + "\n")

    def save_state(self, directory: Path) -> None:
        """A cluster's controller state: ``inventory.json`` and the pinned ``known_hosts``."""
        self.save(directory / INVENTORY_FILE)
        statefile.write_text(directory / "known_hosts", self.known_hosts())

    @classmethod
    def load(cls, path: Path) -> Inventory:
        """The saved inventory; CorruptStateError (one line) when it is damaged."""
        return statefile.read_model(cls, path)


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


class StackOutputs(BaseModel):
    """The outputs every cloud program exports; validated before anything connects."""

    cluster: str
    cloud: Literal["aws", "gcp", "azure"]
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
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise UsageError(f"stack output {field}: {first['msg']}") from None
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
                     bucket_url=bucket)
