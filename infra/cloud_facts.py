"""What every cloud's folder says about itself (`infra/<cloud>/facts.py`, one `CloudFacts` each):
its machines with their regions and prices, the quotas a cluster counts against, its own rules
for a spec (image names, limits), what stays billed past the TTL, and its program's component.
Plain data and small functions: no cloud SDK is imported to read them."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import pydantic

from sortie.infra.launch_errors import LaunchErrorRule
from sortie.infra.prices import RegionPrice


class SpecFields(Protocol):
    """What a cloud's facts read of a cluster's spec (`infra/spec.py`'s SpecFields has them):
    the spec is built and checked from these facts, so they name only the fields, not its
    class (no circle between the two)."""

    region: str
    nodes: int
    ttl_hours: float
    root_volume_gb: int
    bucket_name: str | None
    project: str | None

    @property
    def instance(self) -> InstanceType: ...

PRICE_DATE = "2025-05"


@dataclass(frozen=True)
class GpuModel:
    """A GPU model and the NVIDIA driver branches that drive it."""

    name: str
    architecture: str
    compute_capability: tuple[int, int]
    first_branch: int  # the first data-center driver branch that supports it
    last_branch: int | None = None  # the last one, where NVIDIA has ended its support

    @property
    def open_modules(self) -> bool:
        """NVIDIA's open kernel modules drive Turing (7.5) and newer only."""
        return self.compute_capability >= (7, 5)


# Sources (docs/clouds.md, "GPUs and drivers"): NVIDIA's data-center driver support matrix (R580
# is the last branch for Maxwell, Pascal and Volta; CUDA 13 drops them) and its open-module
# README (Turing and newer).
GPU_MODELS = {
    "V100": GpuModel("V100", "Volta", (7, 0), first_branch=384, last_branch=580),
    "A100": GpuModel("A100", "Ampere", (8, 0), first_branch=450),
    # Hopper: CUDA 12.0's R525 is the first production branch with H100; H200 came with R550
    # (unverified: its first release's notes), both open-module GPUs.
    "H100": GpuModel("H100", "Hopper", (9, 0), first_branch=525),
    "H200": GpuModel("H200", "Hopper", (9, 0), first_branch=550),
}


@dataclass(frozen=True)
class ImageDriver:
    """The NVIDIA driver an image ships: its kernel modules and branch, as its maker says."""

    modules: str  # "open", "proprietary", or "unstated"
    branch: int | None  # None: the image's documentation does not pin one
    source: str


def driver_problem(gpu: str, driver: ImageDriver) -> str | None:
    """Why ``driver`` cannot drive ``gpu``, or None: a driver that cannot is a node whose
    `nvidia-smi` finds no GPU, found only after the bill has started."""
    model = GPU_MODELS.get(gpu)
    if model is None:
        return f"{gpu}: not in the GPU table (infra/cloud_facts.py GPU_MODELS)"
    if driver.modules != "proprietary" and not model.open_modules:
        return (f"{gpu} ({model.architecture}) needs NVIDIA's proprietary kernel modules; the "
                f"image's are {driver.modules} ({driver.source})")
    if driver.branch is not None and driver.branch < model.first_branch:
        return (f"{gpu} needs driver branch {model.first_branch} or newer; the image has "
                f"{driver.branch}")
    if driver.branch is not None and model.last_branch and driver.branch > model.last_branch:
        return (f"{gpu} is supported up to driver branch {model.last_branch}; the image has "
                f"{driver.branch}")
    return None


class SpecError(ValueError):
    """A bad setting in a stack profile; the message names the key."""


@dataclass(frozen=True)
class Price:
    """One machine's price in one region, and where the figure is from."""

    on_demand_usd_h: float
    spot_usd_h: float  # the region's where recorded, else typical: spot prices move daily
    source: str
    date: str
    region: str  # the region the on-demand figure is for: the asked one, else the reference


RegionZones = dict[str, tuple[str, ...]]  # a region -> its zones that offer a machine ((): any)


@dataclass(frozen=True)
class InstanceType:
    cloud: str
    name: str
    gpu_model: str
    gpus: int
    gpu_memory_gb: int  # per GPU
    vcpus: int
    ram_gb: int
    interconnect: str | None  # "efa", "infiniband", "gpudirect-tcpx(o)"; None: plain TCP
    # The fabric's interfaces: AWS EFA (one per network card), GCP A3 GPU NICs (a VPC each)
    network_cards: int
    image: str  # default image (AMI name filter, GCP image path, Azure URN)
    driver: ImageDriver  # the NVIDIA driver that image ships (`driver_problem` holds them)
    on_demand_usd_h: float
    spot_usd_h: float
    regions: RegionZones
    price_source: str
    price_date: str = PRICE_DATE
    image_line: str = ""  # what the default image is, in words (`sortie plan`, the README)
    # A published all-reduce bus bandwidth across two such nodes (GB/s) and where it is from:
    # the health gate's `full` check holds the cluster to half of it.
    busbw_gbs: float | None = None
    busbw_source: str = ""
    # Each fabric interface's rate (Gb/s; 0: unstated): the gate holds InfiniBand ports to it.
    fabric_gbps: int = 0
    # Prices per region (`infra/<cloud>/prices.csv`), each with its own source and date; a
    # region without a row is estimated at the reference figures, and `Price.region` says so.
    regional: dict[str, RegionPrice] = field(default_factory=dict)

    @property
    def reference_region(self) -> str:
        return next(iter(self.regions))

    def price(self, region: str) -> Price:
        """The price in ``region``: its own recorded figures, else the reference region's
        (recorded, else the catalog's reference figures). A row without a spot figure (the
        source has none) is given the reference's spot discount: an estimate, which its
        source says."""
        for where in (region, self.reference_region):
            if (found := self.regional.get(where)) is not None:
                spot = found.spot_usd_h if found.spot_usd_h is not None else round(
                    found.on_demand_usd_h * self.spot_usd_h / self.on_demand_usd_h, 4)
                return Price(found.on_demand_usd_h, spot, found.source, found.date, where)
        return Price(self.on_demand_usd_h, self.spot_usd_h, self.price_source, self.price_date,
                     self.reference_region)


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


def no_rules(_spec: SpecFields) -> None:
    """A cloud with no rules of its own beyond the shared ones."""


def nothing_idle(_spec: SpecFields) -> tuple[float, str]:
    """Nothing stays billed past the TTL."""
    return 0.0, ""


@dataclass(frozen=True)
class CloudFacts:
    name: str
    component: str  # the program's ComponentResource class, in `infra/<cloud>/program.py`
    instance_types: tuple[InstanceType, ...]
    image_rule: re.Pattern[str]  # what `sortie:image` may be
    image_kinds: str  # ... in words, for the error
    # (spec, on-demand nodes, spot nodes) -> what the cluster counts against
    quotas: Callable[[SpecFields, int, int], list[Quota]]
    gpu_profile: str  # the shipped stack profile a `--gpu` launch here starts from
    bucket_scheme: str  # its buckets' URL scheme (`cloud_init.STORE_DRIVERS`: their driver)
    # What the controller imports for this cloud (its program, bucket driver, teardown sweep):
    # installed by the extra named after the cloud (`pip install 'sortie[aws]'`).
    sdk: tuple[str, ...]
    check: Callable[[SpecFields], None] = no_rules  # raises SpecError naming the key
    takes_project: bool = False  # `sortie:project` (GCP's) means something here
    # ($/h, what) that stays billed once the nodes powered off at the TTL, until teardown
    idle_after_ttl: Callable[[SpecFields], tuple[float, str]] = nothing_idle
    # The launch errors it names by code: capacity moves a launch on, the rest stop it
    # (`infra/launch_errors.py`); an error no rule names stops it too.
    launch_errors: tuple[LaunchErrorRule, ...] = ()
    # Machines of this cloud that sortie does not build yet, each with why (the guide it would
    # follow, what is missing): `plan --gpu` says so, and a profile naming one is refused.
    not_built: tuple[tuple[str, str, str], ...] = ()  # (instance type, GPU model, why)


# What stays billed past the TTL, at list prices of PRICE_DATE: a public IPv4 address ($/h).
PUBLIC_IPV4_USD_H = 0.005


# An existing S3 or GCS bucket (S3 allows no underscore: the cloud refuses it at launch).
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")


def check_bucket_name(spec: SpecFields) -> None:
    """An existing bucket named by its plain name (S3, GCS)."""
    if spec.bucket_name is not None and (not BUCKET_NAME.fullmatch(spec.bucket_name)
                                         or ".." in spec.bucket_name):
        raise SpecError(f"sortie:bucketName: {spec.bucket_name[:80]!r} is not a bucket "
                        "name: 3-63 lowercase letters, digits, dots and dashes")


def short_hash(text: str) -> str:
    """Six hex digits of a name: keeps cut names of long clusters apart."""
    return hashlib.sha256(text.encode()).hexdigest()[:6]
