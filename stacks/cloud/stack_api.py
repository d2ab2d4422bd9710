"""What sortie needs of a Pulumi stack (`StackHandle`, `StackStore`): the real ones drive the
Pulumi CLI (`stacks/cloud/automation.py`), tests drive the same code through an in-repo double. And
the cluster spec a stack's `sortie:` config gives."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import psutil

from sortie.core.errors import SortieError, UsageError, first_line
from sortie.infra.cloud_home import Leftover, home
from sortie.infra.spec import (
    NAMESPACE,
    ClusterSpec,
    SpecError,
    estimate_cost,
    parse_spec,
)
from sortie.stacks.records import RecordStore

# Pulumi's own bookkeeping entries, not cloud resources.
BOOKKEEPING_TYPES = ("pulumi:pulumi:Stack", "pulumi:providers:", "sortie:")


class StackError(SortieError):
    """A Pulumi operation failed; the message is its last meaningful line."""


class StackLockedError(StackError):
    """Another Pulumi process holds the stack's lock (or held it, and died without releasing)."""

    def __init__(self, message: str, host: str | None = None, pid: int | None = None) -> None:
        super().__init__(message)
        self.host, self.pid = host, pid

    @property
    def stale(self) -> bool:
        """Safe to clear: the holder ran on this machine and is no longer running. A lock held
        from another machine is never cleared: its holder may still be working."""
        return self.host == socket.gethostname() and self.pid is not None \
            and not psutil.pid_exists(self.pid)


@dataclass(frozen=True)
class StackResource:
    urn: str
    type: str
    dependencies: tuple[str, ...] = ()  # URNs this resource depends on
    parent: str = ""  # the parent's URN (a part or the cluster component)

    @property
    def name(self) -> str:
        return self.urn.rsplit("::", 1)[-1]

    @property
    def is_cloud_resource(self) -> bool:
        return not self.type.startswith(BOOKKEEPING_TYPES)


class StackHandle(Protocol):
    """The stack operations a sortie needs. Each raises StackError on failure."""

    def up(self, config: dict[str, Any], replace: list[str] | None = None) -> dict[str, Any]:
        """Set the config, deploy, return the outputs (secrets in clear)."""
        ...

    def config(self) -> dict[str, Any]:
        """The config the last `up` set ({} for a new stack)."""
        ...

    def outputs(self) -> dict[str, Any]:
        """The outputs of the last `up` (secrets in clear), from the state backend."""
        ...

    def refresh(self, clear_pending_creates: bool = False) -> None:
        """Read every resource back from the cloud; optionally drop the pending creates an
        interrupted `up` left in the state (the tag sweep finds any that exist)."""
        ...

    def cancel(self) -> None:
        """Remove the stack's lock (`pulumi cancel`)."""
        ...

    def resources(self) -> list[StackResource]: ...

    def destroy(self, targets: list[str] | None = None) -> None: ...

    def remove(self) -> None:
        """Remove the (empty) stack from the state backend."""
        ...


class StackStore(Protocol):
    backend_url: str | None  # None: this controller's own file backend
    records: RecordStore  # sortie records beside the stacks' state

    def open(self, name: str) -> StackHandle:
        """Create the stack, or select it when it exists."""
        ...

    def names(self) -> list[str]: ...


Sweep = Callable[[ClusterSpec], list[Leftover]]
Zones = Callable[[ClusterSpec], list[str]]
RunningMachines = Callable[[ClusterSpec], list[str]]


def sweep_by_tags(spec: ClusterSpec) -> list[Leftover]:
    """Ask the cloud itself for every resource that still carries the cluster's tag. A sweep
    that cannot run (no SDK, no project or subscription, an API error) is itself a leftover: an
    unproven teardown never reads as "0 resources remain"."""
    try:
        return home(spec.cloud).leftovers(spec)
    except Exception as exc:  # any failure to ask leaves the teardown unproven
        label = "=".join(spec.sweep_tag)
        return [Leftover("unswept", f"{spec.cloud} resources tagged {label}",
                         f"the tag sweep failed ({first_line(exc)}); fix that and run "
                         f"`sortie down {spec.cluster}` again")]


def running_machines(spec: ClusterSpec) -> list[str]:
    """Ask the cloud which of the cluster's machines are not stopped (raises when it cannot)."""
    return home(spec.cloud).running_machines(spec)


def offered_zones(spec: ClusterSpec) -> list[str]:
    """Ask the cloud which zones offer the spec's instance type ([] where it cannot say)."""
    return home(spec.cloud).offered_zones(spec)


def spec_from_config(cluster_id: str, config: dict[str, Any]) -> ClusterSpec:
    """The cluster spec of a stack's `sortie:` config; a bad value is a one-line UsageError."""
    prefix = NAMESPACE + ":"
    values = {k[len(prefix):]: v for k, v in config.items() if k.startswith(prefix)}
    try:
        return parse_spec(values, cluster_id)
    except SpecError as exc:
        raise UsageError(str(exc)) from None


def usd_per_hour(spec: ClusterSpec) -> float:
    """The cluster's estimated $/h at its launch terms (spot or on-demand)."""
    return estimate_cost(spec).usd_per_hour(spec.spot)


