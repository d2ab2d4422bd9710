"""What a cloud's folder answers for a rehearsal (`sortie run --stack PROFILE --rehearse`): its
program's nodes boot here as containers (`stacks/booted/nodes.py`) with the user data the program
declares, and reach stand-ins for the cloud's own services at the addresses and names the cloud
uses. `infra/<cloud>/rehearsal.py` fills in `CloudRehearsal`:

- where a node's user data is in the resources its program declares, and which secret holds its
  host key (the fetch command in that user data names it);
- the image's side of a node: its login user (a cloud's agent makes it from the key pair), where
  its torch environment lives (the controller's is bound there), the names it resolves to the
  stand-ins;
- the stand-ins' answers, as the cloud's documentation gives them: the metadata service
  (identity, credentials or tokens, the spot notice) and the secret store, each checking what
  the cloud checks (a token, a header, the node's own identity). Plain functions of a request:
  the stacks layer runs the servers.

What a rehearsal cannot prove is said in the README: the Pulumi engine and the provider are
mocked, a GPU is not there, the bucket is a shared directory.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sortie.infra.review import Evaluation

METADATA_ADDRESS = "169.254.169.254"  # every cloud's link-local metadata service


@dataclass(frozen=True)
class Asked:
    """One HTTP request a node made to a stand-in (headers by lower-case name)."""

    method: str
    path: str  # with its query
    headers: Mapping[str, str]
    body: bytes = b""

    def json(self) -> Any:
        try:
            return json.loads(self.body or b"null")
        except ValueError:
            return None


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes = b""
    content_type: str = "text/plain"

    @classmethod
    def of_json(cls, status: int, data: Any, content_type: str = "application/json") -> Answer:
        return cls(status, json.dumps(data).encode(), content_type)


@dataclass
class NodeSide:
    """What the stand-ins of one node know and keep: who the node is, its own secret, and the
    state a rehearsal changes (a spot notice posted, the grant not yet in effect)."""

    cluster: str
    node: str  # node-0
    instance_id: str
    region: str
    secret_id: str  # the node's own host-key secret, as its fetch command names it
    secret_value: str
    identity: dict[str, str] = field(default_factory=dict)  # cloud-specific: a client id...
    instance_type: str = ""  # the profile's (p5.48xlarge), as the metadata service says it
    tokens: set[str] = field(default_factory=set)  # handed out by the metadata service
    notice: bool = False  # a spot notice is posted
    grant_ready: bool = True  # the node's identity may read its secret (propagated)


@dataclass(frozen=True)
class CloudRehearsal:
    cloud: str
    login_user: str  # made by the cloud's agent from the key pair
    python_home: str  # where the image has its torch environment (a venv or conda prefix)
    notice_s: float  # the documented warning before a spot machine is taken
    grant_s: float  # the documented time a new role grant takes to apply (the key's fetch)
    # (evaluation, node name) -> the user data its machine is handed
    user_data: Callable[[Evaluation, str], str]
    # (evaluation, node name) -> the id its fetch command asks the secret store for
    secret_id: Callable[[Evaluation, str], str]
    # (evaluation, node name) -> cloud-specific identity facts (empty: none)
    identity: Callable[[Evaluation, str], dict[str, str]]
    # evaluation -> the host names the node resolves to the stand-ins (metadata, secret store)
    hostnames: Callable[[Evaluation], tuple[str, ...]]
    metadata: Callable[[Asked, NodeSide], Answer]  # port 80
    secret_store: Callable[[Asked, NodeSide], Answer]  # port 443 (TLS)


def rehearsal(cloud: str) -> CloudRehearsal:
    """The rehearsal answers of one cloud (imported on first use; no cloud SDK)."""
    return importlib.import_module(f".{cloud}.rehearsal", __package__).REHEARSAL


def resource_named(evaluation: Evaluation, token: str, name: str) -> dict[str, Any]:
    """The state of the one ``token`` resource named ``name`` (a KeyError if none)."""
    for resource in evaluation.of_type(token):
        if resource.name == name:
            return dict(resource.state)
    raise KeyError(f"no {token} named {name}")

