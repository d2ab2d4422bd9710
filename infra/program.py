"""The program itself: pick the cloud's component from the spec and export its outputs."""

from __future__ import annotations

import importlib

import pulumi

from infra.review import Evaluation, SecuritySummary
from infra.spec import ClusterSpec, SpecError, spec_from_pulumi_config

# Each cloud's module: its component class, its `security_summary` and `interconnect`. Imported
# on use: each cloud's SDK is a slow import.
COMPONENTS = {"aws": ("infra.aws", "AwsGpuCluster"), "gcp": ("infra.gcp", "GcpGpuCluster"),
              "azure": ("infra.azure", "AzureGpuCluster")}


def declare_cluster(spec: ClusterSpec) -> pulumi.ComponentResource:
    """Declare the cluster and export its outputs (same shape on every cloud)."""
    module, component = COMPONENTS[spec.cloud]
    cluster = getattr(importlib.import_module(module), component)(spec.cluster, spec)
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
    module, _ = COMPONENTS[spec.cloud]
    return importlib.import_module(module).interconnect(spec)


def summarize_security(evaluation: Evaluation) -> SecuritySummary:
    """The cloud's reading of its declared resources (who reaches SSH, is the bucket safe)."""
    module, _ = COMPONENTS[evaluation.spec.cloud]
    return importlib.import_module(module).security_summary(evaluation)
