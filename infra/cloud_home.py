"""The interface every cloud's home (`infra/<cloud>/home.py`) fills in, as SkyPilot's
`sky/provision/<cloud>/` does: what the controller knows about a cloud besides its Pulumi program
and its facts: credentials, zones, what the account lacks, and the teardown's proof (the tag
sweep and what it finds left, each with the command that removes it). Cloud SDKs are imported
only inside the functions that ask the cloud."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pydantic

if TYPE_CHECKING:  # the spec is built from the clouds' facts: only its type is needed here
    from sortie.infra.spec import ClusterSpec


@pydantic.dataclasses.dataclass(frozen=True)
class Leftover:
    """Something of a cluster that still exists after teardown, and how to remove it by hand."""

    kind: str  # "process", "listener", "ec2:instance", ...
    resource: str  # pid, address, ARN or resource id
    remove: str

    def line(self) -> str:
        return f"{self.kind} {self.resource}: {self.remove}"


@dataclass(frozen=True)
class SshWait:
    """How long a new node may take before it takes SSH, and what it does meanwhile (said while
    the controller waits): a cloud node boots, then fetches its host key, which its grant may
    not allow for minutes. SkyPilot waits up to 10 minutes (`wait_for_ssh`)."""

    seconds: float
    waiting_for: str
    via: str = "SSH (pinned host keys)"  # how the controller reaches a node, said in progress
    first_boot: str = ""  # what the node's first boot installs after that, and how long it takes

    def line(self) -> str:
        """"up to 20 min: boot, the host key from ...", said in the progress line."""
        minutes = self.seconds / 60
        said = f"up to {minutes:g} min: {self.waiting_for}" if minutes >= 1 else \
            f"up to {self.seconds:g} s: {self.waiting_for}"
        return f"{said}; then {self.first_boot}" if self.first_boot else said


class SweepUnavailable(Exception):
    """The sweep could not ask the cloud; the message says why, in one line."""


@dataclass(frozen=True)
class Cloud:
    name: str  # as in the spec's `cloud` ("aws")
    # Seconds between the spot preemption notice and the machine going away: how long a
    # recovery waits for the cloud to take a noticed machine before replacing it.
    preemption_notice_s: float
    # The Pulumi type of a node's machine, in its Node subtree (`infra/parts.py`): what a
    # recovery replaces, and whose absence after a refresh means the node is lost.
    machine_type: str
    # How long a new node may take to take SSH (boot, the host key fetched once its grant has
    # propagated), and what it waits for.
    ssh_wait: SshWait
    # What the sweep calls the resources of the Bucket subtree (and what they need): when the
    # results could not be verified on the controller, these stay, and are not leftovers.
    bucket_kinds: tuple[str, ...]
    has_credentials: Callable[[], bool]  # whether Pulumi's provider will find credentials
    credentials_hint: str  # what to set when it will not
    # Proof of teardown: every resource of the cluster the cloud itself still has, each with a
    # command that removes it; raises SweepUnavailable (or any API error) when it cannot ask.
    leftovers: Callable[[ClusterSpec], list[Leftover]]
    # The zones of the spec's region that offer its instance type, by name, for a profile that
    # names no zone: a launch tries each in turn (AWS asks the cloud, GCP reads the catalog). []
    # where zones do not decide capacity here (Azure: the availability set takes no zone).
    offered_zones: Callable[[ClusterSpec], list[str]] = lambda spec: []
    # What the account itself lacks for the program (an Azure resource provider not registered),
    # one line each with its fix; checked before anything is created. Raises when it cannot ask.
    preflight: Callable[[ClusterSpec], list[str]] = lambda spec: []
    # What the cloud keeps of the cluster's deleted resources (Azure's deleted Key Vault, with
    # the nodes' host keys in it), removed for good after the destroy, before the sweep.
    purge_deleted: Callable[[ClusterSpec], None] = lambda spec: None
    # The cluster's machines the cloud itself says are not stopped (pending, running,
    # stopping), by id: what a held cluster's idle stop is confirmed by before anything is
    # destroyed (a node that does not answer SSH from here may still be working). Raises
    # SweepUnavailable (or any API error) when it cannot ask.
    running_machines: Callable[[ClusterSpec], list[str]] = lambda spec: _cannot_ask(spec)
    # What fsspec needs besides a bucket's URL to read it from the controller with the
    # credential the program ran with ({}: the driver's own default chain finds it).
    storage_options: Callable[[], dict[str, Any]] = dict
    # Who can read a bucket the program made may take minutes to apply (an Azure role
    # assignment): how long the controller's first read retries a refusal.
    bucket_grant_s: float = 0.0


def _cannot_ask(spec: ClusterSpec) -> list[str]:
    raise SweepUnavailable(f"cannot ask {spec.cloud} whether its machines are stopped")


def bucket_access(url: str) -> tuple[dict[str, Any], float]:
    """(fsspec's storage options, seconds a refusal is retried) to read a cluster's bucket at
    ``url`` (its scheme a cloud's `CloudFacts.bucket_scheme`) from the controller; ({}, 0) for
    a path or a scheme of no cloud here."""
    if "://" not in url:  # a path (a local cluster's bucket): no cloud's facts loaded
        return {}, 0.0
    from sortie.infra.clouds import CLOUDS, facts

    clouds = {facts(cloud).bucket_scheme: cloud for cloud in CLOUDS}
    cloud = clouds.get(url.partition("://")[0])
    if cloud is None:
        return {}, 0.0
    found = home(cloud)
    return found.storage_options(), found.bucket_grant_s


def home(cloud: str) -> Cloud:
    """What the controller asks of one cloud (imported on first use; its SDK only when asked)."""
    return importlib.import_module(f".{cloud}.home", __package__).CLOUD
