"""What a cloud's folder answers for the offline evaluation (`offline.py`: `sortie plan` and the
tests run the real program under Pulumi's mock runtime), as its facts and home answer for the
rest: `infra/<cloud>/mocks.py` fills in `CloudMocks` with what that cloud computes for the
resources its program declares (addresses, ids, names) and the lookups it makes."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class Addresses(Protocol):
    """Documentation addresses, handed out one at a time (offline: no cloud assigns them)."""

    def public_ip(self) -> str: ...

    def private_ip(self) -> str: ...


def no_lookups(token: str, args: dict[str, Any]) -> dict[str, Any] | None:
    """A cloud whose program looks nothing up."""
    return None


@dataclass(frozen=True)
class CloudMocks:
    provider: str  # the Pulumi provider's token prefix: "aws", "gcp", "azure-native"
    # (token, Pulumi name, inputs, state, addresses): fills in ``state`` (the inputs, as given)
    # with what the cloud computes; returns the resource's id when it is not "<name>-id".
    new_resource: Callable[[str, str, dict[str, Any], dict[str, Any], Addresses], str | None]
    # (token, arguments) -> what a lookup (an invoke) answers; None: not this cloud's
    call: Callable[[str, dict[str, Any]], dict[str, Any] | None] = no_lookups


def mocks(cloud: str) -> CloudMocks:
    """The offline answers of one cloud (imported on first use; they import no cloud SDK)."""
    return importlib.import_module(f".{cloud}.mocks", __package__).MOCKS
