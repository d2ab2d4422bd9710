"""The cloud quotas a cluster needs, so that a user can ask for them before the first launch
(`sortie plan` lists them). A new account's GPU quotas are often 0, and a launch that hits one
fails after the network and bucket were made.

Quota names are the ones the clouds' quota pages show; the defaults given are the documented
ones for a new account, where a cloud documents one (otherwise None: look it up).
"""

from __future__ import annotations

import pydantic

from infra.spec import ClusterSpec

# Azure: each ND size counts against its own family's vCPUs.
AZURE_FAMILIES = {"Standard_ND40rs_v2": "Standard NDSv2 Family vCPUs",
                  "Standard_ND96asr_v4": "Standard NDASv4_A100 Family vCPUs",
                  "Standard_ND96amsr_A100_v4": "Standard NDAMSv4_A100Family vCPUs"}
AWS_ELASTIC_IPS_DEFAULT = 5  # per region
GCP_SERVICE_ACCOUNTS_DEFAULT = 100  # per project; every node has one of its own


@pydantic.dataclasses.dataclass(frozen=True)
class Quota:
    name: str  # as the cloud's quota page names it
    needed: int
    unit: str  # "vCPUs", "GPUs", "addresses"
    scope: str  # the region, or "all regions"
    default: int | None  # a new account's documented limit, if there is one
    how: str  # where to ask for more

    @property
    def over_default(self) -> bool:
        return self.default is not None and self.needed > self.default


def quotas_needed(spec: ClusterSpec) -> list[Quota]:
    """What the cluster counts against, at most: a spot worker may fall back to on-demand, so
    it counts against both."""
    spot = sum(spec.is_spot(i) for i in range(spec.nodes))
    on_demand = spec.nodes if spec.spot_fallback_on_demand else spec.nodes - spot
    return {"aws": _aws, "gcp": _gcp, "azure": _azure}[spec.cloud](spec, on_demand, spot)


def _aws(spec: ClusterSpec, on_demand: int, spot: int) -> list[Quota]:
    kind, region = spec.instance, spec.region
    console = "Service Quotas > Amazon EC2 > {code}"
    quotas = []
    if on_demand:
        quotas.append(Quota("Running On-Demand P instances", on_demand * kind.vcpus, "vCPUs",
                            region, None, console.format(code="L-417A185B")))
    if spot:
        quotas.append(Quota("All P Spot Instance Requests", spot * kind.vcpus, "vCPUs", region,
                            None, console.format(code="L-7212CCBC")))
    if kind.network_cards > 1:  # each node's public address is an Elastic IP
        quotas.append(Quota("EC2-VPC Elastic IPs", spec.nodes, "addresses", region,
                            AWS_ELASTIC_IPS_DEFAULT, console.format(code="L-0263D0A3")))
    return quotas


def _gcp(spec: ClusterSpec, on_demand: int, spot: int) -> list[Quota]:
    kind, region = spec.instance, spec.region
    gpu = "NVIDIA_A100_80GB_GPUS" if kind.gpu_memory_gb == 80 else "NVIDIA_A100_GPUS"
    console = "IAM & Admin > Quotas, metric compute.googleapis.com/{metric}"
    quotas = [Quota("GPUS_ALL_REGIONS", spec.nodes * kind.gpus, "GPUs", "all regions", None,
                    console.format(metric="gpus_all_regions"))]
    if on_demand:
        quotas.append(Quota(gpu, on_demand * kind.gpus, "GPUs", region, None,
                            console.format(metric=gpu.lower())))
    if spot:
        quotas.append(Quota(f"PREEMPTIBLE_{gpu}", spot * kind.gpus, "GPUs", region, None,
                            console.format(metric=f"preemptible_{gpu.lower()}")))
    quotas.append(Quota("A2_CPUS", spec.nodes * kind.vcpus, "vCPUs", region, None,
                        console.format(metric="a2_cpus")))
    # Counted with the project's other accounts: the default is a project's whole allowance.
    quotas.append(Quota("Service accounts", spec.nodes, "accounts", "the project",
                        GCP_SERVICE_ACCOUNTS_DEFAULT,
                        "IAM & Admin > Quotas, metric iam.googleapis.com/quota/"
                        "service-account-count"))
    return quotas


def _azure(spec: ClusterSpec, on_demand: int, spot: int) -> list[Quota]:
    kind, region = spec.instance, spec.region
    console = "Subscription > Usage + quotas > Compute"
    quotas = []
    if on_demand:
        quotas += [Quota(AZURE_FAMILIES[kind.name], on_demand * kind.vcpus, "vCPUs", region,
                         None, console),
                   Quota("Total Regional vCPUs", on_demand * kind.vcpus, "vCPUs", region, None,
                         console)]
    if spot:
        quotas.append(Quota("Total Regional Spot vCPUs", spot * kind.vcpus, "vCPUs", region,
                            None, console))
    return quotas
