"""The program itself: pick the cloud's component from the spec and export its outputs."""

from __future__ import annotations

import pulumi

from infra.review import Evaluation, SecuritySummary
from infra.spec import NAMESPACE, ClusterSpec, SpecError

# Clouds whose component exists; the others are refused before any resource is declared.
IMPLEMENTED = ("aws",)


def declare_cluster(spec: ClusterSpec) -> pulumi.ComponentResource:
    """Declare the cluster and export its outputs (same shape on every cloud)."""
    if spec.cloud not in IMPLEMENTED:
        raise SpecError(f"{NAMESPACE}:cloud: the {spec.cloud} program is not written yet; "
                        f"implemented: {', '.join(IMPLEMENTED)}")
    from infra.aws import AwsGpuCluster  # imported here: each cloud's SDK is a slow import

    cluster = AwsGpuCluster(spec.cluster, spec)
    for key, value in cluster.outputs.items():
        pulumi.export(key, value)
    return cluster


def summarize_security(evaluation: Evaluation) -> SecuritySummary:
    """The cloud's reading of its declared resources (who reaches SSH, is the bucket safe)."""
    from infra.aws import security_summary

    return security_summary(evaluation)
