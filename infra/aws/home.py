"""Everything sortie's controller knows about AWS: preemption notice lead time, credentials,
the bucket, the zones that offer an instance type, and the tag sweep that proves a teardown
(with the command removing each leftover).

The sweep asks the Resource Groups Tagging API for regional resources (terminated instances,
which it keeps listing for a while, are skipped) plus IAM, which that API does not cover.
"""

from __future__ import annotations

from typing import Any

from sortie.infra.aws.facts import iam_name_prefix
from sortie.infra.cloud_home import Cloud, Leftover, SshWait
from sortie.infra.spec import TAG_CLUSTER, ClusterSpec

# How to remove each kind by hand, keyed by "<service>:<resource type>" from the ARN.
AWS_REMOVE = {
    "ec2:instance": "aws ec2 terminate-instances --region {region} --instance-ids {id}",
    "ec2:volume": "aws ec2 delete-volume --region {region} --volume-id {id}",
    "ec2:network-interface":
        "aws ec2 delete-network-interface --region {region} --network-interface-id {id}",
    "ec2:elastic-ip": "aws ec2 release-address --region {region} --allocation-id {id}",
    "ec2:launch-template":
        "aws ec2 delete-launch-template --region {region} --launch-template-id {id}",
    "ec2:placement-group": "aws ec2 delete-placement-group --region {region} --group-name {id}",
    "ec2:key-pair": "aws ec2 delete-key-pair --region {region} --key-pair-id {id}",
    "ec2:security-group": "aws ec2 delete-security-group --region {region} --group-id {id}",
    "ec2:subnet": "aws ec2 delete-subnet --region {region} --subnet-id {id}",
    "ec2:route-table": "aws ec2 delete-route-table --region {region} --route-table-id {id}",
    "ec2:internet-gateway": "aws ec2 detach-internet-gateway and delete-internet-gateway "
                            "--region {region} --internet-gateway-id {id}",
    "ec2:vpc": "aws ec2 delete-vpc --region {region} --vpc-id {id}",
    "s3:bucket": "aws s3 rb s3://{id} --force",
    "secretsmanager:secret": "aws secretsmanager delete-secret --region {region} --secret-id "
                             "{id} --force-delete-without-recovery",
    "iam:role": "aws iam delete-role --role-name {id} (delete its inline policies first)",
    "iam:instance-profile": "aws iam delete-instance-profile --instance-profile-name {id}",
}


def _aws_kind_and_id(arn: str) -> tuple[str, str]:
    """"arn:aws:ec2:us-east-1:123:instance/i-0ab" -> ("ec2:instance", "i-0ab");
    "arn:aws:s3:::bucket" -> ("s3:bucket", "bucket"); a secret is named by its whole ARN."""
    service, resource = arn.split(":")[2], arn.split(":", 5)[5]
    if service == "s3":
        return "s3:bucket", resource
    if service == "secretsmanager":  # "secret:<name>-<suffix>": a colon, not a slash
        return "secretsmanager:secret", arn
    kind, _, ident = resource.partition("/")
    return f"{service}:{kind}", ident or kind


def aws_leftovers(cluster: str, region: str, session: Any = None,
                  tag: tuple[str, str] | None = None) -> list[Leftover]:
    """Every AWS resource of the sortie that still exists: tagged with ``tag`` (its
    `sortie-id`; default `sortie-cluster=<cluster>`). Credentials and endpoint come from the
    usual AWS settings (AWS_ENDPOINT_URL points it at a test server)."""
    import boto3  # loads in a fraction of a second, but only a teardown needs it

    key, value = tag or (TAG_CLUSTER, cluster)
    session = session or boto3.session.Session(region_name=region)
    tagging = session.client("resourcegroupstaggingapi")
    arns = [mapping["ResourceARN"]
            for page in tagging.get_paginator("get_resources").paginate(
                TagFilters=[{"Key": key, "Values": [value]}])
            for mapping in page["ResourceTagMappingList"]]
    found = [_aws_kind_and_id(arn) + (arn,) for arn in arns]
    instance_ids = [ident for kind, ident, _ in found if kind == "ec2:instance"]
    gone = _terminated(session, instance_ids)
    leftovers = [Leftover(kind, arn, AWS_REMOVE.get(kind, "remove it in the AWS console")
                          .format(region=region, id=ident))
                 for kind, ident, arn in found if ident not in gone]
    return leftovers + _iam_leftovers(session, cluster, {"Key": key, "Value": value})


def aws_running(cluster: str, region: str, session: Any = None,
                tag: tuple[str, str] | None = None) -> list[str]:
    """The sortie's instances (by ``tag``) that EC2 says are not stopped: pending, running or
    stopping (a node's in-guest power-off stops it; its volume stays until destroyed)."""
    import boto3

    key, value = tag or (TAG_CLUSTER, cluster)
    session = session or boto3.session.Session(region_name=region)
    pages = session.client("ec2").get_paginator("describe_instances").paginate(Filters=[
        {"Name": f"tag:{key}", "Values": [value]},
        {"Name": "instance-state-name", "Values": ["pending", "running", "stopping"]}])
    return [i["InstanceId"] for page in pages for r in page["Reservations"]
            for i in r["Instances"]]


def _terminated(session: Any, instance_ids: list[str]) -> set[str]:
    if not instance_ids:
        return set()
    reservations = session.client("ec2").describe_instances(InstanceIds=instance_ids)
    return {i["InstanceId"] for r in reservations["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] == "terminated"}


def _iam_leftovers(session: Any, cluster: str, ours: dict[str, str]) -> list[Leftover]:
    """IAM roles and instance profiles of the cluster: named with the program's own prefix
    (`iam_name_prefix`, cut to IAM's 38 characters), and tagged with the cluster. IAM's list
    calls return no tags on real AWS ("a subset of the available attributes"), so the tags are
    read per resource: ListRoleTags, and GetInstanceProfile, which returns them in full."""
    iam, prefix = session.client("iam"), iam_name_prefix(cluster)
    found = []
    for page in iam.get_paginator("list_roles").paginate():
        for role in page["Roles"]:
            name = role["RoleName"]
            if name.startswith(prefix) and ours in iam.list_role_tags(RoleName=name)["Tags"]:
                found.append(Leftover("iam:role", role["Arn"],
                                      AWS_REMOVE["iam:role"].format(id=name)))
    for page in iam.get_paginator("list_instance_profiles").paginate():
        for profile in page["InstanceProfiles"]:
            name = profile["InstanceProfileName"]
            if name.startswith(prefix) and ours in iam.get_instance_profile(
                    InstanceProfileName=name)["InstanceProfile"].get("Tags", []):
                found.append(Leftover("iam:instance-profile", profile["Arn"],
                                      AWS_REMOVE["iam:instance-profile"].format(id=name)))
    return found




def offered_zones(spec: ClusterSpec, session: Any = None) -> list[str]:
    """The zones of the region that offer the instance type, by name: the program puts the
    subnet in the first (`infra/aws/program.py`), and a launch that finds no capacity there
    tries the next."""
    import boto3

    session = session or boto3.session.Session(region_name=spec.region)
    found = session.client("ec2").describe_instance_type_offerings(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": [spec.instance_type]}])
    return sorted(offering["Location"] for offering in found["InstanceTypeOfferings"])


def image_problems(spec: ClusterSpec, session: Any = None,
                   name_filter: str | None = None) -> list[str]:
    """The default image asked for as the program asks (`infra/aws/program.py`: Amazon's, x86_64,
    available, never deprecated, the newest match wins): a line when the region has none, so
    that the launch stops before anything is made. A profile's own `image` is not looked up."""
    if spec.image:
        return []
    import boto3

    wanted = name_filter or spec.instance.image
    session = session or boto3.session.Session(region_name=spec.region)
    found = session.client("ec2").describe_images(
        Owners=["amazon"], IncludeDeprecated=False,
        Filters=[{"Name": "name", "Values": [wanted]},
                 {"Name": "architecture", "Values": ["x86_64"]},
                 {"Name": "state", "Values": ["available"]}])["Images"]
    if found:
        return []
    return [f"sortie:instanceType {spec.instance_type}: no available Amazon image named "
            f"{wanted!r} in {spec.region} (set sortie:image to an AMI id that has an NVIDIA "
            f"driver for the {spec.instance.gpu_model})"]


def has_credentials() -> bool:
    import boto3
    from botocore.exceptions import BotoCoreError

    try:
        return boto3.session.Session().get_credentials() is not None
    except BotoCoreError:  # e.g. AWS_PROFILE names a profile that does not exist
        return False


CLOUD = Cloud(
    name="aws", preemption_notice_s=150.0, machine_type="aws:ec2/instance:Instance",
    ssh_wait=SshWait(1200, "boot (a p4d's alone often passes 2 min), the host key from Secrets "
                           "Manager (the nodes' grant is made once the instances run), the "
                           "Elastic IP"),
    bucket_kinds=("s3:bucket",), has_credentials=has_credentials,
    credentials_hint="no AWS credentials (set AWS_PROFILE or AWS_ACCESS_KEY_ID and "
                     "AWS_SECRET_ACCESS_KEY, or run `aws configure`)",
    leftovers=lambda spec: aws_leftovers(spec.cluster, spec.region, tag=spec.sweep_tag),
    offered_zones=offered_zones, preflight=image_problems,
    running_machines=lambda spec: aws_running(spec.cluster, spec.region, tag=spec.sweep_tag))
