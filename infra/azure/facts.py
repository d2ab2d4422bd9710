"""What Azure is to sortie, besides its program: ND machines with their regions and prices, the
quotas a cluster counts against, the image and bucket an override may name, its TTL limit, and
what stays billed past the TTL (a deallocated VM keeps its disk and address)."""

from __future__ import annotations

import re

from sortie.infra.cloud_facts import (
    PUBLIC_IPV4_USD_H,
    CloudFacts,
    ImageDriver,
    InstanceType,
    Quota,
    RegionZones,
    SpecError,
    SpecFields,
)
from sortie.infra.launch_errors import CAPACITY, IMAGE, PERMISSION, QUOTA, rule
from sortie.infra.prices import regional_prices

# Azure HPC Ubuntu (publisher:offer:sku:version): a Gen2 image (the only kind ND sizes boot) with
# InfiniBand, NVIDIA drivers, CUDA and NCCL, but no PyTorch (the node's cloud-init installs it).
# Since 2026-03 its builds install NVIDIA's open kernel modules for every GPU but the V100, whose
# build (its own SKU) keeps the proprietary ones (Azure/azhpc-images,
# components/install_nvidiagpudriver.sh): the open modules cannot drive a V100.
AZURE_HPC_UBUNTU = "microsoft-dsvm:ubuntu-hpc:2204:latest"
AZURE_HPC_UBUNTU_V100 = "microsoft-dsvm:ubuntu-hpc:2204-v100:latest"
AZURE_HPC_DRIVERS = {
    AZURE_HPC_UBUNTU: ImageDriver("open", None, "azhpc-images install_nvidiagpudriver.sh"),
    AZURE_HPC_UBUNTU_V100: ImageDriver("proprietary", None,
                                       "azhpc-images install_nvidiagpudriver.sh (SKU V100)"),
}
# The PyTorch each node installs at first boot (the HPC image has none): pinned, so that every
# node of a cluster, and every cluster, runs the same build (before: the newest, whatever it
# was that day), within what the trainer supports (`pyproject.toml`: torch>=2.4,<2.14). 2.9 is
# the last release with a CUDA 12.6 build, which keeps Volta's kernels (pytorch/pytorch #157517).
AZURE_TORCH = "2.9.1"
AZURE_PRICES = "azure.microsoft.com/pricing/details/virtual-machines/linux, eastus; spot: estimate"
# Azure zones are "1" to "3" in these regions (unverified per size); no zone: Azure picks.
AZURE_ND_REGIONS: RegionZones = {r: ("1", "2", "3") for r in ("eastus", "southcentralus", "westus2",
                                                 "westeurope")}
# ND H100 v5 and ND H200 v5: the regions Azure's price list (2026-06-18) prices them in at the
# lowest figure, which its sizes pages list them in.
AZURE_NDH100_REGIONS: RegionZones = {r: ("1", "2", "3") for r in ("eastus", "eastus2", "westus2",
                                                                    "westus3", "southcentralus")}
AZURE_NDH200_REGIONS: RegionZones = {r: ("1", "2", "3") for r in ("eastus2", "westus2", "westus3",
                                                                    "centralus")}
# An image is a Marketplace URN or an image resource id; an existing bucket is a container's
# resource id (`az storage container show --query id`), because the nodes' role is scoped to it.
AZURE_IMAGE = re.compile(r"[\w.-]+:[\w.-]+:[\w.-]+:[\w.-]+|/subscriptions/[\w./-]+", re.ASCII)
AZURE_CONTAINER_ID = re.compile(
    r"/subscriptions/[^/]+/resourceGroups/[^/]+/providers/(?i:Microsoft\.Storage/storageAccounts)/"
    r"(?P<account>[a-z0-9]{3,24})/(?i:blobServices)/default/(?i:containers)/"
    r"(?P<container>[a-z0-9](?:[a-z0-9-]{1,61}[a-z0-9]))")
AZURE_MAX_TTL_HOURS = 24  # the auto-shutdown that deallocates a powered-off VM is daily
# A Premium SSD managed disk, $ per GB-month (about a P15's price per GB; a month is 730 h).
AZURE_PREMIUM_SSD_USD_GB_MONTH = 0.148
# Each ND size counts against its own family's vCPUs.
AZURE_FAMILIES = {"Standard_ND40rs_v2": "Standard NDSv2 Family vCPUs",
                  "Standard_ND96asr_v4": "Standard NDASv4_A100 Family vCPUs",
                  "Standard_ND96amsr_A100_v4": "Standard NDAMSv4_A100Family vCPUs",
                  "Standard_ND96isr_H100_v5": "Standard NDSH100v5 Family vCPUs",
                  "Standard_ND96isr_H200_v5": "Standard NDSH200v5 Family vCPUs"}


AZURE_REGIONAL = regional_prices("azure")  # per region, with source and date (`infra/prices.py`)


def _machine(name: str, gpu: str, mem: int, vcpus: int, ram: int, od: float, spot: float,
             regions: RegionZones, ib: tuple[int, int]) -> InstanceType:
    image = AZURE_HPC_UBUNTU_V100 if gpu == "V100" else AZURE_HPC_UBUNTU
    return InstanceType(
        "azure", name, gpu, 8, mem, vcpus, ram, "infiniband", ib[0], image,
        AZURE_HPC_DRIVERS[image], od, spot, regions, AZURE_PRICES, fabric_gbps=ib[1],
        image_line="Azure HPC Ubuntu (InfiniBand and NVIDIA drivers; PyTorch added at boot)",
        regional=AZURE_REGIONAL.get(name, {}))


INSTANCE_TYPES = (
    # InfiniBand (ports, Gb/s each), as the sizes pages say: NDv2 one 100 Gb/s EDR link; ND
    # A100 v4 eight 200 Gb/s HDR; ND H100 v5 / H200 v5 eight 400 Gb/s NDR.
    _machine("Standard_ND40rs_v2", "V100", 32, 40, 672, 22.032, 6.61, AZURE_ND_REGIONS, (1, 100)),
    _machine("Standard_ND96asr_v4", "A100", 40, 96, 900, 27.197, 8.16, AZURE_ND_REGIONS,
             (8, 200)),
    _machine("Standard_ND96amsr_A100_v4", "A100", 80, 96, 1900, 32.770, 9.83, AZURE_ND_REGIONS,
             (8, 200)),
    # MicrosoftDocs/azure-docs sizes/gpu-accelerated ndh100v5-series.md (96 vCPUs, 1900 GB, 8
    # H100 80 GB, 8 x 400 Gb/s NDR InfiniBand) and ndh200v5-series.md (96, 1850 GB, 8 H200
    # 141 GB); eastus's (H200: eastus2's) on-demand price of 2026-06-18. No bus bandwidth is
    # held: Azure's own health checks hold one node's 8-GPU all-reduce (16 GB) to 460 GB/s
    # (Azure/azurehpc-health-checks conf/nd96isr_h100_v5.conf), NVLink within a node, and none
    # across two nodes is published: the gate's relative rule applies.
    _machine("Standard_ND96isr_H100_v5", "H100", 80, 96, 1900, 98.32, 29.50,
             AZURE_NDH100_REGIONS, (8, 400)),
    _machine("Standard_ND96isr_H200_v5", "H200", 141, 96, 1850, 84.80, 25.44,
             AZURE_NDH200_REGIONS, (8, 400)),
)

NOT_BUILT = (
    ("Standard_ND128isr_NDR_GB200_v6", "GB200",
     "an Arm (Grace) machine in NVL72 racks: sortie's images and user data are x86-64 only"),
)


def check(spec: SpecFields) -> None:
    if spec.ttl_hours > AZURE_MAX_TTL_HOURS:
        raise SpecError(f"sortie:ttlHours: at most {AZURE_MAX_TTL_HOURS} on Azure (a VM "
                        "powered off from inside stays allocated and billed, and the "
                        "auto-shutdown that deallocates it is a daily schedule); got "
                        f"{spec.ttl_hours:g}")
    if spec.bucket_name is not None and not AZURE_CONTAINER_ID.fullmatch(spec.bucket_name):
        raise SpecError("sortie:bucketName: on Azure, give the blob container's resource "
                        "id (/subscriptions/…/storageAccounts/<account>/blobServices/default/"
                        "containers/<container>)")


def quotas(spec: SpecFields, on_demand: int, spot: int) -> list[Quota]:
    kind, region = spec.instance, spec.region
    console = "Subscription > Usage + quotas > Compute"
    needed = []
    if on_demand:
        needed += [Quota(AZURE_FAMILIES[kind.name], on_demand * kind.vcpus, "vCPUs", region,
                         None, console),
                   Quota("Total Regional vCPUs", on_demand * kind.vcpus, "vCPUs", region, None,
                         console)]
    if spot:
        needed.append(Quota("Total Regional Spot vCPUs", spot * kind.vcpus, "vCPUs", region,
                            None, console))
    return needed


def idle_after_ttl(spec: SpecFields) -> tuple[float, str]:
    """Azure deallocates its nodes at the TTL, keeping each one's OS disk and static public IP."""
    disk = spec.root_volume_gb * AZURE_PREMIUM_SSD_USD_GB_MONTH / 730
    return (round(spec.nodes * (disk + PUBLIC_IPV4_USD_H), 4),
            f"{spec.nodes} OS disks ({spec.root_volume_gb} GB Premium SSD) and static public IPs "
            "of the deallocated VMs")


# Azure's allocation and deployment errors (learn.microsoft.com: "Troubleshoot allocation
# failures", "Resolve errors for SKU not available", "Resolve quota errors").
LAUNCH_ERRORS = (
    rule(CAPACITY, r"(Zonal)?AllocationFailed|Overconstrained(Zonal)?AllocationRequest|"
                   r"SkuNotAvailable"),
    rule(QUOTA, r"QuotaExceeded|exceeding approved [\w ]+ quota",
         "ask for more in Subscription > Usage + quotas (`sortie plan --stack` lists what this "
         "cluster needs), then run again"),
    rule(PERMISSION, r"(Linked)?AuthorizationFailed",
         "the deployer lacks the role the message names: grant it, then run again"),
    rule(IMAGE, r"(Platform)?ImageNotFound", "set sortie:image to an image that exists"),
)


FACTS = CloudFacts(
    bucket_scheme="az",
    name="azure", sdk=("pulumi_azure_native", "adlfs", "azure.identity", "azure.mgmt.resource",
         "azure.mgmt.keyvault"),
    launch_errors=LAUNCH_ERRORS,
    component="AzureGpuCluster", instance_types=INSTANCE_TYPES,
    image_rule=AZURE_IMAGE,
    image_kinds="an image URN (publisher:offer:sku:version, a Gen2 image) or an image "
                "resource id",
    gpu_profile="azure-nd96", quotas=quotas, check=check, idle_after_ttl=idle_after_ttl,
    not_built=NOT_BUILT)
