"""Proof of teardown: look for cloud resources that still carry a cluster's sortie tag.

A Pulumi refresh shows what the stack's state knows; this sweep asks the cloud itself, so it also
finds what the state lost (an interrupted `up`, a resource created outside it). Each leftover
comes with a command that removes it.

AWS: the Resource Groups Tagging API for regional resources (terminated instances, which it keeps
listing for a while, are skipped) plus IAM, which that API does not cover.
"""

from __future__ import annotations

import boto3

from infra.spec import TAG_CLUSTER, ClusterSpec
from stacks.backend import Leftover

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
    "iam:role": "aws iam delete-role --role-name {id} (delete its inline policies first)",
    "iam:instance-profile": "aws iam delete-instance-profile --instance-profile-name {id}",
}


def leftovers(spec: ClusterSpec) -> list[Leftover]:
    """Every resource of the cloud that still carries the cluster's tag."""
    if spec.cloud == "aws":
        return aws_leftovers(spec.cluster, spec.region)
    # No GCP (Cloud Asset) or Azure (Resource Graph) sweep yet: say so rather than claim zero.
    label = f"{TAG_CLUSTER}={spec.cluster}"
    return [Leftover("unswept", f"{spec.cloud} resources labelled {label}",
                     f"no {spec.cloud} tag sweep in this version: check the console for {label}")]


def _aws_kind_and_id(arn: str) -> tuple[str, str]:
    """"arn:aws:ec2:us-east-1:123:instance/i-0ab" -> ("ec2:instance", "i-0ab");
    "arn:aws:s3:::bucket" -> ("s3:bucket", "bucket")."""
    service, resource = arn.split(":")[2], arn.split(":", 5)[5]
    if service == "s3":
        return "s3:bucket", resource
    kind, _, ident = resource.partition("/")
    return f"{service}:{kind}", ident or kind


def aws_leftovers(cluster: str, region: str) -> list[Leftover]:
    """Every AWS resource tagged `sortie-cluster=<cluster>` that still exists. Credentials and
    endpoint come from the usual AWS settings (AWS_ENDPOINT_URL points it at a test server)."""
    session = boto3.session.Session(region_name=region)
    tagging = session.client("resourcegroupstaggingapi")
    arns = [mapping["ResourceARN"]
            for page in tagging.get_paginator("get_resources").paginate(
                TagFilters=[{"Key": TAG_CLUSTER, "Values": [cluster]}])
            for mapping in page["ResourceTagMappingList"]]
    found = [_aws_kind_and_id(arn) + (arn,) for arn in arns]
    instance_ids = [ident for kind, ident, _ in found if kind == "ec2:instance"]
    gone = _terminated(session, instance_ids)
    leftovers = [Leftover(kind, arn, AWS_REMOVE.get(kind, "remove it in the AWS console")
                          .format(region=region, id=ident))
                 for kind, ident, arn in found if ident not in gone]
    return leftovers + _iam_leftovers(session, cluster)


def _terminated(session: boto3.session.Session, instance_ids: list[str]) -> set[str]:
    if not instance_ids:
        return set()
    reservations = session.client("ec2").describe_instances(InstanceIds=instance_ids)
    return {i["InstanceId"] for r in reservations["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] == "terminated"}


def _iam_leftovers(session: boto3.session.Session, cluster: str) -> list[Leftover]:
    """IAM roles and instance profiles are named `sortie-<cluster>-…` and tagged."""
    iam, prefix, found = session.client("iam"), f"sortie-{cluster}-", []
    for page in iam.get_paginator("list_roles").paginate():
        for role in page["Roles"]:
            tags = iam.list_role_tags(RoleName=role["RoleName"])["Tags"] \
                if role["RoleName"].startswith(prefix) else []
            if {"Key": TAG_CLUSTER, "Value": cluster} in tags:
                found.append(Leftover("iam:role", role["Arn"],
                                      AWS_REMOVE["iam:role"].format(id=role["RoleName"])))
    for page in iam.get_paginator("list_instance_profiles").paginate():
        for profile in page["InstanceProfiles"]:
            if profile["InstanceProfileName"].startswith(prefix) and \
                    {"Key": TAG_CLUSTER, "Value": cluster} in profile.get("Tags", []):
                found.append(Leftover("iam:instance-profile", profile["Arn"],
                                      AWS_REMOVE["iam:instance-profile"].format(
                                          id=profile["InstanceProfileName"])))
    return found
