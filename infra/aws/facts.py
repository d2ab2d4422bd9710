"""What AWS is to sortie, besides its program: P3/P4d/P5 machines with their regions and prices, the
quotas a cluster counts against, the image an override may name, the names its IAM role and
bucket get, and what stays billed past the TTL."""

from __future__ import annotations

import re

from sortie.infra.cloud_facts import (
    PUBLIC_IPV4_USD_H,
    CloudFacts,
    ImageDriver,
    InstanceType,
    Quota,
    RegionZones,
    SpecFields,
    check_bucket_name,
    short_hash,
)
from sortie.infra.launch_errors import CAPACITY, IMAGE, PERMISSION, QUOTA, rule
from sortie.infra.prices import regional_prices

# AWS's Deep Learning AMIs come in two driver lines (DLAMI release notes,
# "supported_ec2_instances"): the "OSS Nvidia Driver" line lists G4dn, G5, G6, G6e, P4, P4de,
# P5…, not P3/P3dn; only the "Proprietary Nvidia Driver" line lists P3 and P3dn (V100). The
# default image is a name filter (the newest available match, never a deprecated one); `sortie
# plan` shows the filter each node boots; a launch whose filter finds no image stops before
# anything is created (`infra/aws/home.py`).
# The OSS line's current PyTorch AMIs are Ubuntu 24.04 (release notes, "Deep Learning OSS Nvidia
# Driver AMI GPU PyTorch 2.9 (Ubuntu 24.04) 20260103": supported_ec2_instances G4dn … P4, P4de,
# P5…; python_location /opt/pytorch/bin/python); no 2026 release of it names Ubuntu 22.04.
AWS_DLAMI_OSS = "Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.* (Ubuntu 24.04) *"
# (unverified: the Ubuntu release of the newest proprietary-driver PyTorch DLAMI; any matches)
AWS_DLAMI_PROPRIETARY = "Deep Learning Proprietary Nvidia Driver AMI GPU PyTorch * (Ubuntu *) *"
# The drivers of the two lines, as their names and release notes say (branches not pinned: the
# filter takes the newest release).
AWS_OSS_DRIVER = ImageDriver("open", None, "DLAMI release notes: the OSS Nvidia Driver line")
AWS_PROPRIETARY_DRIVER = ImageDriver("proprietary", None,
                                     "DLAMI release notes: the Proprietary Nvidia Driver line")
AWS_PRICES = "aws.amazon.com/ec2/pricing/on-demand, us-east-1 Linux; spot: typical, estimate"
AWS_IMAGE = re.compile(r"ami-[0-9a-f]{8}([0-9a-f]{9})?")
AWS_ELASTIC_IPS_DEFAULT = 5  # per region

# Regions that offer each family (a conservative subset of AWS's offering lists); any zone of
# the region may be asked for.
AWS_P3_REGIONS: RegionZones = {r: () for r in (
    "us-east-1", "us-east-2", "us-west-2", "ca-central-1", "eu-central-1", "eu-west-1",
    "eu-west-2", "ap-northeast-1", "ap-northeast-2", "ap-southeast-1", "ap-southeast-2")}
AWS_P3DN_REGIONS: RegionZones = {r: () for r in (
    "us-east-1", "us-west-2", "eu-west-1", "ap-northeast-1")}
AWS_P4D_REGIONS: RegionZones = {r: () for r in (
    "us-east-1", "us-east-2", "us-west-2", "eu-central-1", "eu-west-1", "ap-northeast-1",
    "ap-northeast-2")}
AWS_P4DE_REGIONS: RegionZones = {r: () for r in ("us-east-1", "us-west-2")}
# P5 (H100) and P5en (H200): us-east-1 is the region AWS's dated price list prices them in; the
# others are where AWS's P5 page offers them (unverified per region here: a launch there says).
AWS_P5_REGIONS: RegionZones = {r: () for r in ("us-east-1", "us-east-2", "us-west-2")}


# Prices in each region, with their source and date (`infra/prices.py`).
AWS_REGIONAL = regional_prices("aws")


# All-reduce across two p4d nodes at 2 GB: 77.9 GB/s bus bandwidth with 4 EFA (20.3 with one,
# 8.2 without EFA).
P4D_BUSBW = (77.9, "SkyPilot examples/aws_efa: 2 x p4d.24xlarge, all_reduce 2 GB, 4 EFA")
# No two-node all-reduce figure for P5/P5en is published that the gate could hold a cluster to:
# AWS's health-check suite's "conservative default" minimum (800 GB/s,
# aws-samples/awsome-distributed-training gpu-cluster-healthcheck) is not two-node busbw (its p4d
# minimum, 300, is four times SkyPilot's measured 77.9). The gate's relative rule applies.


def _machine(name: str, gpu: str, gpus: int, mem: int, vcpus: int, ram: int, efa: int,
             od: float, spot: float, regions: RegionZones,
             busbw: tuple[float, str] | None = None) -> InstanceType:
    v100 = gpu == "V100"
    return InstanceType(
        "aws", name, gpu, gpus, mem, vcpus, ram, "efa" if efa else None, efa,
        AWS_DLAMI_PROPRIETARY if v100 else AWS_DLAMI_OSS,
        AWS_PROPRIETARY_DRIVER if v100 else AWS_OSS_DRIVER, od, spot, regions, AWS_PRICES,
        image_line="AWS Deep Learning AMI, proprietary NVIDIA driver line (the one for P3/P3dn)"
        if v100 else "AWS Deep Learning AMI, OSS NVIDIA driver line",
        busbw_gbs=busbw[0] if busbw else None, busbw_source=busbw[1] if busbw else "",
        regional=AWS_REGIONAL.get(name, {}))


INSTANCE_TYPES = (
    _machine("p3.2xlarge", "V100", 1, 16, 8, 61, 0, 3.06, 0.92, AWS_P3_REGIONS),
    _machine("p3.8xlarge", "V100", 4, 16, 32, 244, 0, 12.24, 3.67, AWS_P3_REGIONS),
    _machine("p3.16xlarge", "V100", 8, 16, 64, 488, 0, 24.48, 7.34, AWS_P3_REGIONS),
    _machine("p3dn.24xlarge", "V100", 8, 32, 96, 768, 1, 31.212, 9.36, AWS_P3DN_REGIONS),
    _machine("p4d.24xlarge", "A100", 8, 40, 96, 1152, 4, 32.7726, 11.57, AWS_P4D_REGIONS,
             P4D_BUSBW),
    _machine("p4de.24xlarge", "A100", 8, 80, 96, 1152, 4, 40.9657, 14.34, AWS_P4DE_REGIONS,
             P4D_BUSBW),
    # GPUs, memory, vCPUs and EFA interfaces (one per network card): Karpenter's instance-type
    # reference (aws/karpenter-provider-aws website/.../instance-types.md @692ccdd, 2026-07-11:
    # p5 h100 81920 MiB x 8, efa 32; p5en h200 144384 MiB x 8, efa 16); prices: AWS's list of
    # 2026-07-20 (`prices.csv`); spot: a typical third of it, an estimate.
    _machine("p5.48xlarge", "H100", 8, 80, 192, 2048, 32, 55.04, 19.26, AWS_P5_REGIONS),
    _machine("p5en.48xlarge", "H200", 8, 141, 192, 2048, 16, 63.296, 22.15, AWS_P5_REGIONS),
)

NOT_BUILT = (
    ("p5e.48xlarge", "H200",
     "not in AWS's on-demand price list (us-east-1, 2026-07-20): AWS sells it through EC2 "
     "Capacity Blocks for ML, which sortie does not reserve; p5en.48xlarge is the H200 machine "
     "it builds"),
    ("p6-b200.48xlarge", "B200",
     "the DLAMI line and the EFA layout sortie boots are not verified here for B200 (8 EFA "
     "cards at 400 Gb/s, driver 570.133.20 or newer: NVIDIA's GPU Operator notes)"),
)


def iam_name_prefix(cluster: str) -> str:
    """The `name_prefix` of a cluster's IAM role and instance profile: IAM allows 38 characters
    for a prefix, so a long cluster name is cut. The sweep matches names on this same prefix and
    then on the cluster's tag."""
    return f"sortie-{cluster}-"[:38]


def bucket_prefix(cluster: str) -> str:
    """The `bucket_prefix` of a cluster's bucket: S3 allows 37 characters, so a long cluster
    name is cut and a hash of the whole name keeps it distinct. Buckets are swept by tag."""
    prefix = f"sortie-{cluster}-"
    if len(prefix) <= 37:
        return prefix
    return f"sortie-{cluster[:22].rstrip('-')}-{short_hash(cluster)}-"


def quotas(spec: SpecFields, on_demand: int, spot: int) -> list[Quota]:
    kind, region = spec.instance, spec.region
    console = "Service Quotas > Amazon EC2 > {code}"
    needed = []
    if on_demand:
        needed.append(Quota("Running On-Demand P instances", on_demand * kind.vcpus, "vCPUs",
                            region, None, console.format(code="L-417A185B")))
    if spot:
        needed.append(Quota("All P Spot Instance Requests", spot * kind.vcpus, "vCPUs", region,
                            None, console.format(code="L-7212CCBC")))
    if kind.network_cards > 1:  # each node's public address is an Elastic IP
        needed.append(Quota("EC2-VPC Elastic IPs", spec.nodes, "addresses", region,
                            AWS_ELASTIC_IPS_DEFAULT, console.format(code="L-0263D0A3")))
    return needed


def idle_after_ttl(spec: SpecFields) -> tuple[float, str]:
    """AWS terminates its nodes at the TTL but keeps their Elastic IPs (several network cards)."""
    if spec.instance.network_cards > 1:
        return round(spec.nodes * PUBLIC_IPV4_USD_H, 4), f"{spec.nodes} Elastic IPs"
    return 0.0, ""


# EC2's API error codes (docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html).
AWS_QUOTA_FIX = ("ask for more in Service Quotas > Amazon EC2 (`sortie plan --stack` lists what "
                 "this cluster needs), then run again")
LAUNCH_ERRORS = (
    rule(CAPACITY, r"Insufficient(Instance|Host)?Capacity"),
    rule(CAPACITY, r"\bUnsupported\b[^\n]*Availability Zone"),  # the zone lacks the type
    rule(CAPACITY, r"SpotMaxPriceTooLow"),
    rule(QUOTA, r"VcpuLimitExceeded|MaxSpotInstanceCountExceeded|InstanceLimitExceeded|"
                r"AddressLimitExceeded|VpcLimitExceeded|PlacementGroupLimitExceeded",
         AWS_QUOTA_FIX),
    rule(PERMISSION, r"UnauthorizedOperation|AccessDenied\w*|AuthFailure|OptInRequired",
         "the deployer lacks the permission the message names: grant it, then run again"),
    rule(IMAGE, r"InvalidAMIID\.\w+", "set sortie:image to an AMI of this region"),
)


FACTS = CloudFacts(
    bucket_scheme="s3",
    name="aws", sdk=("pulumi_aws", "boto3", "s3fs"),
    launch_errors=LAUNCH_ERRORS,
    component="AwsGpuCluster", instance_types=INSTANCE_TYPES, image_rule=AWS_IMAGE,
    image_kinds="an AMI id (ami-0123456789abcdef0)", gpu_profile="aws-p4d", quotas=quotas,
    check=check_bucket_name, idle_after_ttl=idle_after_ttl, not_built=NOT_BUILT)
