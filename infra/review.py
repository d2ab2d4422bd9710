"""What a cluster program declared, as data a reviewer (or a test) can read: `sortie plan`
prints it, the tests assert on it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pydantic
from pydantic import computed_field

from sortie.infra.spec import ClusterSpec, placeholder_sources, too_wide_for_ssh


@dataclass(frozen=True)
class DeclaredResource:
    urn: str
    type: str  # the type token, e.g. "aws:ec2/vpc:Vpc"
    name: str
    parent: str  # the parent's URN ("" for the stack's direct children)
    state: dict[str, Any]  # inputs plus the mock's outputs, camelCase as the engine sees them
    id: str = ""  # what other resources' references hold
    depends_on: tuple[str, ...] = ()  # URNs it waits for (references and `depends_on`)
    # The inputs alone, as the program declared them, every secret value redacted: what a
    # reviewer or a policy tool reads (`sortie plan --json`).
    inputs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Evaluation:
    spec: ClusterSpec
    resources: list[DeclaredResource]
    outputs: dict[str, Any]

    def of_type(self, token: str) -> list[DeclaredResource]:
        return [r for r in self.resources if r.type == token]

    def only(self, token: str) -> DeclaredResource:
        """The one resource of type `token` (an AssertionError if there are none or several)."""
        found = self.of_type(token)
        assert len(found) == 1, f"expected one {token}, found {len(found)}"
        return found[0]


@pydantic.dataclasses.dataclass
class SecuritySummary:
    """What a reviewer asks before `pulumi up`, read from the declared resources."""

    ssh_from: list[str]  # CIDRs that reach port 22
    intra_cluster: bool  # members may reach each other on all ports
    bucket_managed: bool  # False: an existing bucket, left as it is
    bucket_public: bool
    bucket_encrypted: bool
    bucket_versioned: bool
    bucket_tls_only: bool
    details: dict[str, str] = field(default_factory=dict)  # cloud-specific extras

    @computed_field  # type: ignore[prop-decorator]
    @property
    def world_ssh(self) -> bool:
        """SSH open to the internet, or more of it than a /8 (IPv6: a /32)."""
        return any(too_wide_for_ssh(c) for c in self.ssh_from)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def placeholder_ssh(self) -> list[str]:
        """SSH sources in a documentation range (a profile's example): no controller is there,
        and `sortie run` refuses them."""
        return placeholder_sources(self.ssh_from)
