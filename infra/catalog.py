"""The instance catalog: which GPU machines sortie launches, where, and what they cost.

Prices are public list prices (Linux, on-demand) for one region per cloud, with the date they were
recorded and where they come from; spot figures are typical prices, which move daily. They are for
estimates before launch (`sortie plan`), never for billing. Refresh them when they age.
"""

from __future__ import annotations

from dataclasses import dataclass

# Default images per cloud and GPU generation: an AMI name filter (the newest available match,
# never a deprecated one), a GCP image, an Azure URN. AWS's Deep Learning AMIs come in two driver
# lines (DLAMI release notes, "supported_ec2_instances"): the "OSS Nvidia Driver" line lists G4dn,
# G5, G6, G6e, P4, P4de, P5…, not P3/P3dn; only the "Proprietary Nvidia Driver" line lists P3 and
# P3dn (V100). `sortie plan` shows the filter each node boots; a launch whose filter finds no
# image stops before anything is created (`stacks/clouds/aws.py`).
AWS_DLAMI_OSS = "Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.* (Ubuntu 22.04) *"
# (unverified: the Ubuntu release of the newest proprietary-driver PyTorch DLAMI; any matches)
AWS_DLAMI_PROPRIETARY = "Deep Learning Proprietary Nvidia Driver AMI GPU PyTorch * (Ubuntu *) *"
# Google's Deep Learning VM family: the 2.7 / CUDA 12.8 / driver 570 family ended its patch
# support in April 2026 (Google's DLVM page, as the provider review read it); this newer family
# name follows Google's pattern (unverified here: the launch asks for it before anything is made,
# `stacks/clouds/gcp.py`, and names a family that is gone or deprecated).
GCP_DLVM_A100 = ("projects/deeplearning-platform-release/global/images/family/"
                 "pytorch-2-9-cu129-ubuntu-2204-nvidia-580")
# Azure HPC Ubuntu (publisher:offer:sku:version): a Gen2 image (the only kind ND sizes boot) with
# InfiniBand, NVIDIA drivers, CUDA and NCCL, but no PyTorch (the node's cloud-init installs it).
AZURE_HPC_UBUNTU = "microsoft-dsvm:ubuntu-hpc:2204:latest"

AWS_PRICES = "aws.amazon.com/ec2/pricing/on-demand, us-east-1 Linux; spot: typical, estimate"
GCP_PRICES = "cloud.google.com/compute/gpus-pricing (a2 incl. GPUs), us-central1; spot: estimate"
AZURE_PRICES = "azure.microsoft.com/pricing/details/virtual-machines/linux, eastus; spot: estimate"
PRICE_DATE = "2025-05"

# Regions that offer each family (a conservative subset of the clouds' offering lists), with the
# zones that may be asked for (a GCP program picks the first when none is set). An empty tuple:
# any zone of the region.
AWS_P3_REGIONS = {r: () for r in ("us-east-1", "us-east-2", "us-west-2", "ca-central-1",
                                  "eu-central-1", "eu-west-1", "eu-west-2", "ap-northeast-1",
                                  "ap-northeast-2", "ap-southeast-1", "ap-southeast-2")}
AWS_P3DN_REGIONS = {r: () for r in ("us-east-1", "us-west-2", "eu-west-1", "ap-northeast-1")}
AWS_P4D_REGIONS = {r: () for r in ("us-east-1", "us-east-2", "us-west-2", "eu-central-1",
                                   "eu-west-1", "ap-northeast-1", "ap-northeast-2")}
AWS_P4DE_REGIONS = {r: () for r in ("us-east-1", "us-west-2")}
GCP_A2_REGIONS = {
    "us-central1": ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"),
    "us-east1": ("us-east1-b",),
    "us-west1": ("us-west1-b",),
    "europe-west4": ("europe-west4-a", "europe-west4-b"),
    "asia-northeast1": ("asia-northeast1-a", "asia-northeast1-c"),
}
GCP_A2_ULTRA_REGIONS = {
    "us-central1": ("us-central1-a", "us-central1-c"),
    "us-east4": ("us-east4-c",),
    "europe-west4": ("europe-west4-a",),
}
# Azure zones are "1" to "3" in these regions (unverified per size); no zone: Azure picks.
AZURE_ND_REGIONS = {r: ("1", "2", "3") for r in ("eastus", "southcentralus", "westus2",
                                                 "westeurope")}


@dataclass(frozen=True)
class InstanceType:
    cloud: str
    name: str
    gpu_model: str
    gpus: int
    gpu_memory_gb: int  # per GPU
    vcpus: int
    ram_gb: int
    interconnect: str | None  # "efa", "infiniband" or None (plain TCP between nodes)
    network_cards: int  # AWS: EFA interfaces, one per network card (0 = no EFA)
    image: str  # default image (AMI name filter, GCP image path, Azure URN)
    on_demand_usd_h: float
    spot_usd_h: float
    regions: dict[str, tuple[str, ...]]
    price_source: str
    price_date: str = PRICE_DATE

    @property
    def image_line(self) -> str:
        """What the default image is, in words, for `sortie plan` and the README."""
        if self.image == AWS_DLAMI_PROPRIETARY:
            return "AWS Deep Learning AMI, proprietary NVIDIA driver line (the one for P3/P3dn)"
        if self.image == AWS_DLAMI_OSS:
            return "AWS Deep Learning AMI, OSS NVIDIA driver line"
        if self.cloud == "gcp":
            return "Google Deep Learning VM (PyTorch, NVIDIA driver)"
        return "Azure HPC Ubuntu (InfiniBand and NVIDIA drivers; PyTorch added at boot)"


def _aws(name: str, gpu: str, gpus: int, mem: int, vcpus: int, ram: int, efa: int,
         od: float, spot: float, regions: dict[str, tuple[str, ...]]) -> InstanceType:
    image = AWS_DLAMI_PROPRIETARY if gpu == "V100" else AWS_DLAMI_OSS
    return InstanceType("aws", name, gpu, gpus, mem, vcpus, ram, "efa" if efa else None, efa,
                        image, od, spot, regions, AWS_PRICES)


def _gcp(name: str, gpus: int, mem: int, vcpus: int, ram: int, od: float, spot: float,
         regions: dict[str, tuple[str, ...]]) -> InstanceType:
    return InstanceType("gcp", name, "A100", gpus, mem, vcpus, ram, None, 0, GCP_DLVM_A100, od,
                        spot, regions, GCP_PRICES)


def _azure(name: str, gpu: str, mem: int, vcpus: int, ram: int, od: float, spot: float,
           regions: dict[str, tuple[str, ...]]) -> InstanceType:
    return InstanceType("azure", name, gpu, 8, mem, vcpus, ram, "infiniband", 0,
                        AZURE_HPC_UBUNTU, od, spot, regions, AZURE_PRICES)


CATALOG: dict[str, InstanceType] = {t.name: t for t in (
    _aws("p3.2xlarge", "V100", 1, 16, 8, 61, 0, 3.06, 0.92, AWS_P3_REGIONS),
    _aws("p3.8xlarge", "V100", 4, 16, 32, 244, 0, 12.24, 3.67, AWS_P3_REGIONS),
    _aws("p3.16xlarge", "V100", 8, 16, 64, 488, 0, 24.48, 7.34, AWS_P3_REGIONS),
    _aws("p3dn.24xlarge", "V100", 8, 32, 96, 768, 1, 31.212, 9.36, AWS_P3DN_REGIONS),
    _aws("p4d.24xlarge", "A100", 8, 40, 96, 1152, 4, 32.7726, 11.57, AWS_P4D_REGIONS),
    _aws("p4de.24xlarge", "A100", 8, 80, 96, 1152, 4, 40.9657, 14.34, AWS_P4DE_REGIONS),
    _gcp("a2-highgpu-1g", 1, 40, 12, 85, 3.6730, 1.10, GCP_A2_REGIONS),
    _gcp("a2-highgpu-2g", 2, 40, 24, 170, 7.3460, 2.20, GCP_A2_REGIONS),
    _gcp("a2-highgpu-4g", 4, 40, 48, 340, 14.6920, 4.41, GCP_A2_REGIONS),
    _gcp("a2-highgpu-8g", 8, 40, 96, 680, 29.3840, 8.82, GCP_A2_REGIONS),
    _gcp("a2-megagpu-16g", 16, 40, 96, 1360, 55.7395, 16.72, GCP_A2_REGIONS),
    _gcp("a2-ultragpu-1g", 1, 80, 12, 170, 5.0688, 1.52, GCP_A2_ULTRA_REGIONS),
    _gcp("a2-ultragpu-2g", 2, 80, 24, 340, 10.1376, 3.04, GCP_A2_ULTRA_REGIONS),
    _gcp("a2-ultragpu-4g", 4, 80, 48, 680, 20.2752, 6.08, GCP_A2_ULTRA_REGIONS),
    _gcp("a2-ultragpu-8g", 8, 80, 96, 1360, 40.5504, 12.17, GCP_A2_ULTRA_REGIONS),
    _azure("Standard_ND40rs_v2", "V100", 32, 40, 672, 22.032, 6.61, AZURE_ND_REGIONS),
    _azure("Standard_ND96asr_v4", "A100", 40, 96, 900, 27.197, 8.16, AZURE_ND_REGIONS),
    _azure("Standard_ND96amsr_A100_v4", "A100", 80, 96, 1900, 32.770, 9.83, AZURE_ND_REGIONS),
)}


def instance_types(cloud: str) -> list[str]:
    """The catalog's instance type names for one cloud."""
    return [t.name for t in CATALOG.values() if t.cloud == cloud]
