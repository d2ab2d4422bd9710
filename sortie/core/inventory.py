"""The inventory: the contract between whoever makes a cluster and whoever bootstraps it.

A local cluster builds it from the sshd daemons it started; a cloud stack builds the same
structure from its Pulumi outputs (`stacks/cloud/outputs.py`). It is plain data and round-trips
through JSON.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from sortie.core import statefile
from sortie.core.userfile import ENV_NAME

INVENTORY_FILE = "inventory.json"
KNOWN_HOSTS_FILE = "known_hosts"  # beside it: every node's pinned host key


def _plain_text(value: str) -> str:
    """Text that goes into a node's command line: printable, no control characters."""
    if not value.isprintable():
        raise ValueError(f"{value[:80]!r} holds a character that is not printable")
    return value


def _node_path(value: str) -> str:
    if not (value == "~" or value.startswith("/")) or "/../" in f"{value}/":
        raise ValueError(f"{value[:80]!r} is not ~ or an absolute path that stays where it is")
    return _plain_text(value)


# A host name or address ssh accepts, never one that reads as an option ("-oProxyCommand").
HOST = re.compile(r"[A-Za-z0-9_.:\[\]%][A-Za-z0-9_.:\[\]%-]{0,252}")
HOST_KEY = re.compile(r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/]+={0,3}")
INTERFACE = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")  # a network interface's name (IFNAMSIZ)
# An absolute path a shell needs no quoting for (a hosts file's python and workdir, a node's
# workdir as the node reports it).
PLAIN_PATH = re.compile(r"(/[A-Za-z0-9_.@+-]+)+")

# The fields every maker of an inventory fills (a saved one is read back as untrusted): a name,
# address or user can never read as an option, a key is a key, a path is absolute.
NodeName = Annotated[str, Field(pattern=r"^node-\d{1,4}$")]
Address = Annotated[str, Field(pattern=f"^{HOST.pattern}$")]
LoginName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$")]
HostKey = Annotated[str, Field(pattern=f"^{HOST_KEY.pattern}$")]
NodePath = Annotated[str, AfterValidator(_node_path)]
NodeProgram = Annotated[str, AfterValidator(_plain_text), Field(pattern=r"^[^-\s]")]


def known_hosts_name(address: str, port: int) -> str:
    """A host's name as OpenSSH and paramiko write it in known_hosts."""
    return address if port == 22 else f"[{address}]:{port}"


# The most nodes of any cluster (a task, --nodes, a profile, a hosts file, a stack's outputs):
# one rule, checked before anything starts. A local cluster has fewer (`LOCAL_MAX_NODES`).
MAX_NODES = 512

class LoginHost(BaseModel):
    """A Slurm cluster's login node reached over SSH (its host key pinned, as an attached
    host's): where sortie runs Slurm's commands when the controller is not on it."""

    model_config = ConfigDict(frozen=True)

    address: Address
    port: int = Field(default=22, ge=1, le=65535)
    user: LoginName
    key_path: Path
    host_key: HostKey

    @property
    def known_hosts_name(self) -> str:
        return known_hosts_name(self.address, self.port)


class SrunRoute(BaseModel):
    """A node of a Slurm allocation: reached through `srun` from the login node, never over
    SSH (`bootstrap/srun.py`)."""

    model_config = ConfigDict(frozen=True)

    job_id: str = Field(pattern=r"^[0-9]{1,12}$")  # the allocation
    host: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # Slurm's name of the node
    login: LoginHost | None = None  # None: the controller runs on the login node itself
    # The allocation's CPUs on the node, which each step asks for (`--cpus-per-task`): a site
    # that binds a task to its cores gives a step one CPU otherwise. None: not read (Slurm's).
    cpus: int | None = Field(default=None, ge=1, le=100_000)


class Node(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: NodeName
    address: Address  # where the controller reaches SSH
    port: int = Field(ge=1, le=65535)
    user: LoginName
    # The controller's private key for this cluster, and the node's pinned public host key
    # ("ssh-ed25519 AAAA...", never trusted on first use): every node but a Slurm node has both.
    key_path: Path | None = None
    host_key: HostKey | None = None
    srun: SrunRoute | None = None  # a Slurm node: commands go through `srun` in its allocation
    gpus: int = Field(ge=0)
    private_address: Address  # what other nodes use to reach this one (rendezvous, collectives)
    workdir: NodePath  # the node's disk for the trainer, its logs and outputs
    python: NodeProgram = "python3"
    # The network interface that holds private_address there, where the backend found it:
    # gloo and NCCL bind there (its name may differ from node to node: eth-n1, eth-n2).
    interface: str | None = Field(default=None, pattern=f"^{INTERFACE.pattern}$")

    @model_validator(mode="after")
    def _reached_somehow(self) -> Node:
        if self.srun is None and (self.key_path is None or self.host_key is None):
            raise ValueError(f"{self.name}: an SSH node needs key_path and its pinned host_key")
        return self

    @property
    def known_hosts_name(self) -> str:
        return known_hosts_name(self.address, self.port)


class Inventory(BaseModel):
    model_config = ConfigDict(frozen=True)

    cluster_id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    backend: str  # "local", "aws", "gcp", "azure"
    nodes: list[Node] = Field(min_length=1)
    rdzv_port: int = Field(default=29400, ge=1, le=65535)  # torchrun's rendezvous store on the head
    # Extra environment for the trainer processes, e.g. which interface gloo should use.
    # (SORTIE_CHECKPOINT_URL: where checkpoints live that every node, and a replacement node,
    # reaches: the cluster's bucket, or a directory for the local backend.)
    train_env: dict[str, str] = Field(default_factory=dict)
    # Its nodes boot and set themselves up (cloud-init: host key, timers, Python) before they
    # are ready: a cloud's, an attached host's, a booted local node; not a local sshd process.
    booted: bool = True
    # Its nodes' Python is the controller's own environment (local and booted nodes): a user's
    # setup and job run in an environment of the cluster's own made from it, never in sortie's
    # (`bootstrap/job_env.py`).
    shared_python: bool = False

    @model_validator(mode="after")
    def _env_names(self) -> Inventory:
        bad = [name for name in self.train_env if not ENV_NAME.fullmatch(name)]
        if bad:
            raise ValueError(f"train_env: {bad[0][:80]!r} is not an environment variable name")
        return self

    @model_validator(mode="after")
    def _one_node_per_name(self) -> Inventory:
        """Every node command is addressed by name: two of one name would share one rank, one
        connection, one directory."""
        names = [node.name for node in self.nodes]
        if len(set(names)) < len(names):
            raise ValueError(f"nodes: {next(n for n in names if names.count(n) > 1)} twice")
        return self

    @property
    def head(self) -> Node:
        """The first node (rank 0): it hosts torchrun's rendezvous store."""
        return self.nodes[0]

    def node_rank(self, name: str) -> int:
        """A node's rank in torchrun's group: its place in the inventory."""
        return [n.name for n in self.nodes].index(name)

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        names = ", ".join(n.name for n in self.nodes)
        raise KeyError(f"no node named {name!r} in cluster {self.cluster_id} (nodes: {names})")

    def known_hosts(self) -> str:
        """known_hosts lines pinning every node's host key (a Slurm cluster's: its login
        node's, over SSH)."""
        pinned = [(n.known_hosts_name, n.host_key) for n in self.nodes if n.host_key]
        pinned += [(n.srun.login.known_hosts_name, n.srun.login.host_key) for n in self.nodes
                   if n.srun and n.srun.login]
        return "".join(f"{name} {key}\n" for name, key in dict.fromkeys(pinned))

    def save(self, path: Path) -> None:
        statefile.write_text(path, self.model_dump_json(indent=2) + "\n")

    def save_state(self, directory: Path) -> None:
        """A cluster's controller state: ``inventory.json`` and the pinned ``known_hosts``."""
        self.save(directory / INVENTORY_FILE)
        statefile.write_text(directory / KNOWN_HOSTS_FILE, self.known_hosts())

    @classmethod
    def load(cls, path: Path) -> Inventory:
        """The saved inventory; CorruptStateError (one line) when it is damaged."""
        return statefile.read_model(cls, path)


@dataclass(frozen=True)
class Expected:
    """What the catalog says a node of the instance type has and does (`infra/catalog.py`
    `expected`): the gate holds the cluster to it."""

    busbw: tuple[float, str] | None = None  # all-reduce GB/s across two nodes, and its source
    fabric: str | None = None  # "efa" or "infiniband": counted on every node
    devices: int = 0  # its EFA devices or InfiniBand ports
    gbps: int = 0  # each InfiniBand port's rate (0: unstated)
