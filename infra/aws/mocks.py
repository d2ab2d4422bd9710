"""What AWS computes for the program's resources and lookups, offline (`infra/cloud_mocks.py`)."""

from __future__ import annotations

from typing import Any

from sortie.infra.cloud_mocks import Addresses, CloudMocks


def new_resource(token: str, name: str, inputs: dict[str, Any], state: dict[str, Any],
                 addresses: Addresses) -> str | None:
    resource_id = f"{name}-id"
    if token in ("aws:ec2/instance:Instance", "aws:ec2/eip:Eip"):
        state.update(publicIp=addresses.public_ip(), privateIp=addresses.private_ip(),
                     primaryNetworkInterfaceId=f"eni-{name}")
    elif token == "aws:s3/bucket:Bucket":
        state["bucket"] = resource_id = f"{inputs.get('bucketPrefix', 'sortie-')}offline"
    elif token == "aws:ec2/launchTemplate:LaunchTemplate":
        state["latestVersion"] = 1
    elif token == "aws:ec2/keyPair:KeyPair":
        state["keyName"] = f"{inputs.get('keyNamePrefix', '')}offline"
    resource = token.split(":")[1].split("/")[0]
    state.setdefault("arn", f"arn:aws:{resource}:::{state.get('bucket', resource_id)}")
    state.setdefault("name", name)
    return resource_id


def call(token: str, args: dict[str, Any]) -> dict[str, Any] | None:
    if token == "aws:ec2/getAmi:getAmi":
        return {"id": "ami-0offline0000000000", "name": "offline DLAMI",
                "rootDeviceName": "/dev/sda1", "architecture": "x86_64"}
    if token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
        # Offline, every zone offers every type: the real `up` asks the region.
        region = args.get("region", "us-east-1")
        zones = [f"{region}{letter}" for letter in "abc"]
        return {"id": region, "locations": zones, "locationTypes": ["availability-zone"] * 3,
                "instanceTypes": [args["filters"][0]["values"][0]] * 3}
    return None


MOCKS = CloudMocks(provider="aws", new_resource=new_resource, call=call)
