"""What GCP is to sortie, besides its program: A2 and A3 machines with their regions, zones and
prices, the quotas a cluster counts against, the image an override may name, and the names its
nodes' service accounts get (they carry no labels: the sweep finds them by name)."""

from __future__ import annotations

import re

from sortie.infra.cloud_facts import (
    CloudFacts,
    ImageDriver,
    InstanceType,
    Quota,
    RegionZones,
    SpecError,
    SpecFields,
    check_bucket_name,
    short_hash,
)
from sortie.infra.launch_errors import CAPACITY, IMAGE, PERMISSION, QUOTA, rule
from sortie.infra.prices import regional_prices

# Google's Deep Learning VM family: the 2.7 / CUDA 12.8 / driver 570 family ended its patch
# support in April 2026 (Google's DLVM page, as the provider review read it); this newer family
# name follows Google's pattern (unverified here: the launch asks for it before anything is made,
# `infra/gcp/home.py`, and names a family that is gone or deprecated).
GCP_DLVM_A100 = ("projects/deeplearning-platform-release/global/images/family/"
                 "pytorch-2-9-cu129-ubuntu-2204-nvidia-580")
# The family names its driver branch; Google's DLVM page does not say which kernel modules.
GCP_DLVM_DRIVER = ImageDriver("unstated", 580, "the image family's name (nvidia-580)")
GCP_PRICES = "cloud.google.com/compute/gpus-pricing (a2 incl. GPUs), us-central1; spot: estimate"
# An image in the project, or another project's image or family, or its full URL.
GCP_IMAGE = re.compile(r"(https://www\.googleapis\.com/compute/v1/)?(projects/[a-z][-a-z0-9]{4,28}"
                       r"[a-z0-9]/global/images/(family/)?)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
GCP_PROJECT = re.compile(r"[a-z][-a-z0-9]{4,28}[a-z0-9]")
GCP_SERVICE_ACCOUNTS_DEFAULT = 100  # per project; every node has one of its own

# Regions that offer each family, with the zones that may be asked for (the program picks the
# first when none is set).
GCP_A2_REGIONS = {
    "us-central1": ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"),
    "us-east1": ("us-east1-b",),
    "us-west1": ("us-west1-b",),
    "europe-west4": ("europe-west4-a", "europe-west4-b"),
    "asia-northeast1": ("asia-northeast1-a", "asia-northeast1-c"),
}
# A3 High and A3 Mega (8 x H100): regions Google's price list of 2026-08-03 prices them in, a
# zone each (unverified per zone: Google's GPU regions-and-zones page lists where they are).
GCP_A3_HIGH_REGIONS: RegionZones = {
    "us-central1": ("us-central1-a",), "us-west1": ("us-west1-a",),
    "us-east4": ("us-east4-a",), "europe-west1": ("europe-west1-b",),
}
GCP_A3_MEGA_REGIONS: RegionZones = {
    "us-east4": ("us-east4-a",), "us-east5": ("us-east5-a",),
    "europe-west1": ("europe-west1-b",), "europe-west4": ("europe-west4-b",),
}
GCP_A2_ULTRA_REGIONS = {
    "us-central1": ("us-central1-a", "us-central1-c"),
    "us-east4": ("us-east4-c",),
    "europe-west4": ("europe-west4-a",),
}


GCP_REGIONAL = regional_prices("gcp")  # per region, with source and date (`infra/prices.py`)


def _machine(name: str, gpus: int, mem: int, vcpus: int, ram: int, od: float, spot: float,
             regions: RegionZones, gpu: str = "A100", fabric: str | None = None, nics: int = 0,
             busbw: tuple[float, str] | None = None) -> InstanceType:
    return InstanceType("gcp", name, gpu, gpus, mem, vcpus, ram, fabric, nics, GCP_DLVM_A100,
                        GCP_DLVM_DRIVER, od,
                        spot, regions, GCP_PRICES,
                        image_line="Google Deep Learning VM (PyTorch, NVIDIA driver)",
                        busbw_gbs=busbw[0] if busbw else None,
                        busbw_source=busbw[1] if busbw else "",
                        regional=GCP_REGIONAL.get(name, {}))


# Two A3 High nodes with GPUDirect-TCPX: 65-68 GB/s all-reduce bus bandwidth at 256 MB-2 GB
# (about 20 without it), SkyPilot examples/gcp_gpu_direct_tcpx.
A3_HIGH_BUSBW = (66.0, "SkyPilot examples/gcp_gpu_direct_tcpx: 2 x a3-highgpu-8g, TCPX")


INSTANCE_TYPES = (
    _machine("a2-highgpu-1g", 1, 40, 12, 85, 3.6730, 1.10, GCP_A2_REGIONS),
    _machine("a2-highgpu-2g", 2, 40, 24, 170, 7.3460, 2.20, GCP_A2_REGIONS),
    _machine("a2-highgpu-4g", 4, 40, 48, 340, 14.6920, 4.41, GCP_A2_REGIONS),
    _machine("a2-highgpu-8g", 8, 40, 96, 680, 29.3840, 8.82, GCP_A2_REGIONS),
    _machine("a2-megagpu-16g", 16, 40, 96, 1360, 55.7395, 16.72, GCP_A2_REGIONS),
    _machine("a2-ultragpu-1g", 1, 80, 12, 170, 5.0688, 1.52, GCP_A2_ULTRA_REGIONS),
    _machine("a2-ultragpu-2g", 2, 80, 24, 340, 10.1376, 3.04, GCP_A2_ULTRA_REGIONS),
    _machine("a2-ultragpu-4g", 4, 80, 48, 680, 20.2752, 6.08, GCP_A2_ULTRA_REGIONS),
    _machine("a2-ultragpu-8g", 8, 80, 96, 1360, 40.5504, 12.17, GCP_A2_ULTRA_REGIONS),
    # Google's "Create an A3 Mega, A3 High, or A3 Edge instance with GPUDirect enabled"
    # (compute/docs/gpus/gpudirect, read 2026-11-29): 208 vCPUs, 1872 GB, 8 x H100 80 GB; one
    # primary NIC and 4 (High, GPUDirect-TCPX) or 8 (Mega, GPUDirect-TCPXO) GPU NICs, each in
    # a VPC network of its own. Prices: Google's list of 2026-08-03 (`prices.csv`).
    _machine("a3-highgpu-8g", 8, 80, 208, 1872, 88.49, 50.61, GCP_A3_HIGH_REGIONS, "H100",
             "gpudirect-tcpx", 4, A3_HIGH_BUSBW),
    _machine("a3-megagpu-8g", 8, 80, 208, 1872, 92.9376, 23.28, GCP_A3_MEGA_REGIONS, "H100",
             "gpudirect-tcpxo", 8),
)

NOT_BUILT = (
    ("a3-ultragpu-8g", "H200",
     "A3 Ultra's RDMA network (8 ConnectX-7 NICs in an RoCE VPC network profile) is made with "
     "reservations and Cluster Director (Google: \"Create an AI-optimized instance\"); it is not "
     "in Google's on-demand price list of 2026-08-03, and sortie does not build it"),
    ("a4-highgpu-8g", "B200",
     "A4 (8 x B200) has the same RDMA network as A3 Ultra, made the same way; not in Google's "
     "on-demand price list of 2026-08-03, and sortie does not build it"),
)


def node_account_prefix(cluster: str) -> str:
    """What the GCP service accounts of a cluster's nodes (one per node) are named by, so that
    the sweep can find them (service accounts carry no labels): a readable prefix and a hash of
    the full name, so that `exp-lr-sweep-0001` and `-0002` never share one."""
    return f"sortie-{cluster[:12].rstrip('-')}-{short_hash(cluster)}-"


def node_account_id(cluster: str, index: int) -> str:
    """Node ``index``'s service account (6-30 characters: the index is at most 3 digits)."""
    return f"{node_account_prefix(cluster)}{index}"


def check(spec: SpecFields) -> None:
    check_bucket_name(spec)
    if spec.project is not None and not GCP_PROJECT.fullmatch(spec.project):
        raise SpecError(f"sortie:project: {spec.project[:80]!r} is not a GCP project id "
                        "(6-30 lowercase letters, digits and dashes)")


def quotas(spec: SpecFields, on_demand: int, spot: int) -> list[Quota]:
    kind, region = spec.instance, spec.region
    gpu = {"H100": "NVIDIA_H100_GPUS"}.get(kind.gpu_model) or (
        "NVIDIA_A100_80GB_GPUS" if kind.gpu_memory_gb == 80 else "NVIDIA_A100_GPUS")
    console = "IAM & Admin > Quotas, metric compute.googleapis.com/{metric}"
    needed = [Quota("GPUS_ALL_REGIONS", spec.nodes * kind.gpus, "GPUs", "all regions", None,
                    console.format(metric="gpus_all_regions"))]
    if on_demand:
        needed.append(Quota(gpu, on_demand * kind.gpus, "GPUs", region, None,
                            console.format(metric=gpu.lower())))
    if spot:
        needed.append(Quota(f"PREEMPTIBLE_{gpu}", spot * kind.gpus, "GPUs", region, None,
                            console.format(metric=f"preemptible_{gpu.lower()}")))
    # A3 counts against its GPUs' quota (no A3 CPU metric is documented: unverified).
    if kind.name.startswith("a2-"):
        needed.append(Quota("A2_CPUS", spec.nodes * kind.vcpus, "vCPUs", region, None,
                            console.format(metric="a2_cpus")))
    # Counted with the project's other accounts: the default is a project's whole allowance.
    needed.append(Quota("Service accounts", spec.nodes, "accounts", "the project",
                        GCP_SERVICE_ACCOUNTS_DEFAULT,
                        "IAM & Admin > Quotas, metric iam.googleapis.com/quota/"
                        "service-account-count"))
    return needed


# Compute Engine's errors (cloud.google.com/compute/docs/troubleshooting/
# troubleshooting-resource-availability; .../troubleshooting-vm-creation).
LAUNCH_ERRORS = (
    rule(CAPACITY, r"ZONE_RESOURCE_POOL_EXHAUSTED(_WITH_DETAILS)?|does not have enough "
                   r"resources available|STOCKOUT"),
    rule(QUOTA, r"QUOTA_EXCEEDED|Quota '[\w.-]+' exceeded",
         "ask for more in IAM & Admin > Quotas (`sortie plan --stack` lists what this cluster "
         "needs), then run again"),
    rule(PERMISSION, r"PERMISSION_DENIED|Required '[\w.]+' permission",
         "the deployer lacks the permission the message names: grant it, then run again"),
    rule(IMAGE, r"The resource '[^']*/images/[^']*' was not found",
         "set sortie:image to an image (or family) that exists"),
)


# GCP deletes the VMs and their boot disks at the TTL: nothing stays billed.
FACTS = CloudFacts(
    bucket_scheme="gs",
    name="gcp", sdk=("pulumi_gcp", "gcsfs", "google.auth", "requests"),
    launch_errors=LAUNCH_ERRORS,
    component="GcpGpuCluster", instance_types=INSTANCE_TYPES, image_rule=GCP_IMAGE,
    image_kinds="an image name, projects/P/global/images/[family/]NAME, or its "
                "https://www.googleapis.com/compute/v1/ URL",
    gpu_profile="gcp-a2", quotas=quotas, check=check, takes_project=True,
    not_built=NOT_BUILT)
