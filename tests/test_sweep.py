"""Proof of teardown on AWS: the tag sweep against a real AWS API server (moto) on loopback."""

from __future__ import annotations

import json

import boto3

from infra.spec import TAG_CLUSTER
from stacks.sweep import aws_leftovers

REGION = "us-east-1"


def tagged(cluster: str) -> list[dict]:
    return [{"Key": TAG_CLUSTER, "Value": cluster}, {"Key": "sortie-run", "Value": cluster}]


def create_cluster_resources(cluster: str) -> dict[str, str]:
    """What an interrupted AWS sortie could leave: network, instance, bucket, IAM."""
    ec2, tags = boto3.client("ec2", region_name=REGION), tagged(cluster)

    def spec(kind: str) -> list[dict]:
        return [{"ResourceType": kind, "Tags": tags}]

    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16", TagSpecifications=spec("vpc"))["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.0.0/18",
                               TagSpecifications=spec("subnet"))["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName=f"sortie-{cluster}", Description="sortie",
                                      VpcId=vpc, TagSpecifications=spec("security-group"))
    instance = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1,
                                 SubnetId=subnet, TagSpecifications=spec("instance"))
    bucket = f"sortie-{cluster}-results"
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": tags})
    iam = boto3.client("iam")
    role = f"sortie-{cluster}-node"
    iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17",
                    "Statement": []}), Tags=tags)
    iam.create_instance_profile(InstanceProfileName=role, Tags=tags)
    return {"vpc": vpc, "subnet": subnet, "group": group["GroupId"], "bucket": bucket,
            "instance": instance["Instances"][0]["InstanceId"], "role": role}


def test_sweep_finds_every_leftover_of_one_cluster_and_says_how_to_remove_it(aws_endpoint):
    mine, other = create_cluster_resources("exp-1"), create_cluster_resources("exp-10")
    leftovers = aws_leftovers("exp-1", REGION)
    kinds = sorted(left.kind for left in leftovers)
    assert kinds == ["ec2:instance", "ec2:security-group", "ec2:subnet", "ec2:vpc",
                     "iam:instance-profile", "iam:role", "s3:bucket"]
    text = "\n".join(left.line() for left in leftovers)
    for ident in mine.values():
        assert ident in text
    assert not any(ident in text for ident in other.values() if ident not in mine.values())
    instance = next(left for left in leftovers if left.kind == "ec2:instance")
    assert instance.remove == (f"aws ec2 terminate-instances --region {REGION} "
                               f"--instance-ids {mine['instance']}")


def test_sweep_is_empty_once_everything_is_gone(aws_endpoint):
    made = create_cluster_resources("exp-2")
    ec2, iam = boto3.client("ec2", region_name=REGION), boto3.client("iam")
    ec2.terminate_instances(InstanceIds=[made["instance"]])  # still listed by the tagging API
    ec2.delete_security_group(GroupId=made["group"])
    ec2.delete_subnet(SubnetId=made["subnet"])
    ec2.delete_vpc(VpcId=made["vpc"])
    boto3.client("s3", region_name=REGION).delete_bucket(Bucket=made["bucket"])
    iam.delete_instance_profile(InstanceProfileName=made["role"])
    iam.delete_role(RoleName=made["role"])
    assert aws_leftovers("exp-2", REGION) == []
