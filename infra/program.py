"""The program itself: pick the cloud's component from the spec and export its outputs."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Protocol

import pulumi

from sortie.infra.clouds import facts, require_sdk
from sortie.infra.review import Evaluation, SecuritySummary
from sortie.infra.spec import ClusterSpec, SpecError, spec_from_pulumi_config

# Each cloud's folder (`infra/<cloud>/`): its program's component (named in its facts) and
# `interconnect`, its review's `security_summary`. Imported on use: a cloud's SDK is a slow import.


def _module(cloud: str, part: str) -> ModuleType:
    require_sdk(cloud)
    return importlib.import_module(f".{cloud}.{part}", __package__)


class ClusterComponent(Protocol):
    """Every cloud's component (a `pulumi.ComponentResource`): its outputs, the same keys on
    every cloud (`outputs.cluster_outputs`)."""

    @property
    def outputs(self) -> dict[str, Any]: ...


def declare_cluster(spec: ClusterSpec) -> ClusterComponent:
    """Declare the cluster and export its outputs (same shape on every cloud)."""
    component = getattr(_module(spec.cloud, "program"), facts(spec.cloud).component)
    cluster = component(spec.cluster, spec)
    for key, value in cluster.outputs.items():
        pulumi.export(key, value)
    return cluster


def main() -> None:
    """The Pulumi program: `pulumi up` (infra/__main__.py) and `sortie run --stack` (inline).
    A bad profile stops here with one line naming the key, before any resource is declared."""
    try:
        declare_cluster(spec_from_pulumi_config())
    except SpecError as exc:
        raise pulumi.RunError(str(exc)) from None


def describe_interconnect(spec: ClusterSpec) -> str:
    """How NCCL reaches the other nodes on this spec's cluster, in words."""
    return _module(spec.cloud, "program").interconnect(spec)


def summarize_security(evaluation: Evaluation) -> SecuritySummary:
    """The cloud's reading of its declared resources (who reaches SSH, is the bucket safe)."""
    return _module(evaluation.spec.cloud, "review").security_summary(evaluation)
