"""Proof of teardown: look for cloud resources that still carry a cluster's sortie tag.

A Pulumi refresh shows what the stack's state knows; this sweep asks the cloud itself, so it also
finds what the state lost (an interrupted `up`, a resource created outside it). Each leftover
comes with a command that removes it.

AWS: the Resource Groups Tagging API for regional resources (terminated instances, which it keeps
listing for a while, are skipped) plus IAM, which that API does not cover.
GCP: the APIs that own each kind (Compute, IAM, Storage), which answer with what exists now (Cloud
Asset Inventory lags by minutes): by label, and the kinds that take no labels (network,
subnetwork, firewall rules, placement policy, service account) by the names the program gives
them.
Azure: Resource Manager, resources and resource groups by tag.

A sweep that cannot run (no SDK, no project or subscription, an API error) is itself reported as
a leftover: an unproven teardown never reads as "0 resources remain".
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3

from infra.spec import TAG_CLUSTER, ClusterSpec, aws_iam_name_prefix, gcp_node_account_id
from stacks.backend import Leftover


class SweepUnavailable(Exception):
    """The sweep could not ask the cloud; the message says why, in one line."""

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
    try:
        if spec.cloud == "aws":
            return aws_leftovers(spec.cluster, spec.region)
        if spec.cloud == "gcp":
            return gcp_leftovers(spec.cluster, gcp_project(spec))
        return azure_leftovers(spec.cluster, azure_subscription())
    except Exception as exc:  # any failure to ask leaves the teardown unproven
        reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        label = f"{TAG_CLUSTER}={spec.cluster}"
        return [Leftover("unswept", f"{spec.cloud} resources tagged {label}",
                         f"the tag sweep failed ({reason}); fix that and run "
                         f"`sortie down {spec.cluster}` again")]


def _aws_kind_and_id(arn: str) -> tuple[str, str]:
    """"arn:aws:ec2:us-east-1:123:instance/i-0ab" -> ("ec2:instance", "i-0ab");
    "arn:aws:s3:::bucket" -> ("s3:bucket", "bucket")."""
    service, resource = arn.split(":")[2], arn.split(":", 5)[5]
    if service == "s3":
        return "s3:bucket", resource
    kind, _, ident = resource.partition("/")
    return f"{service}:{kind}", ident or kind


def aws_leftovers(cluster: str, region: str,
                  session: boto3.session.Session | None = None) -> list[Leftover]:
    """Every AWS resource tagged `sortie-cluster=<cluster>` that still exists. Credentials and
    endpoint come from the usual AWS settings (AWS_ENDPOINT_URL points it at a test server)."""
    session = session or boto3.session.Session(region_name=region)
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
    """IAM roles and instance profiles of the cluster: named with the program's own prefix
    (`aws_iam_name_prefix`, cut to IAM's 38 characters), and tagged with the cluster. IAM's list
    calls return no tags on real AWS ("a subset of the available attributes"), so the tags are
    read per resource: ListRoleTags, and GetInstanceProfile, which returns them in full."""
    iam, prefix = session.client("iam"), aws_iam_name_prefix(cluster)
    ours = {"Key": TAG_CLUSTER, "Value": cluster}
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


# -- GCP: the owning APIs (Compute, IAM, Storage) ----------------------------------------------

# Cloud Asset Inventory indexes a project minutes behind the owning APIs: just-deleted resources
# would show as leftovers and just-created ones be missed. Compute, IAM and Storage answer with
# what exists now, so the proof asks them.
GCP_APIS = {"compute": "https://compute.googleapis.com/compute/v1",
            "iam": "https://iam.googleapis.com/v1",
            "storage": "https://storage.googleapis.com/storage/v1"}
# Compute kinds: (leftover kind, collection, listed per zone/region (aggregated) or globally,
# found by label or, for kinds that take no labels, by the name the program gives them).
GCP_COMPUTE = (("compute:instance", "instances", "aggregated", "label"),
               ("compute:disk", "disks", "aggregated", "label"),
               ("compute:network", "networks", "global", "name"),
               ("compute:subnetwork", "subnetworks", "aggregated", "name"),
               ("compute:firewall", "firewalls", "global", "name"),
               ("compute:resourcePolicy", "resourcePolicies", "aggregated", "name"))
# How to remove each kind by hand.
GCP_REMOVE = {
    "compute:instance":
        "gcloud compute instances delete {name} --zone {location} --project {project} --quiet",
    "compute:disk":
        "gcloud compute disks delete {name} --zone {location} --project {project} --quiet",
    "compute:network": "gcloud compute networks delete {name} --project {project} --quiet",
    "compute:subnetwork": "gcloud compute networks subnets delete {name} "
                          "--region {location} --project {project} --quiet",
    "compute:firewall": "gcloud compute firewall-rules delete {name} --project {project} --quiet",
    "compute:resourcePolicy": "gcloud compute resource-policies delete {name} "
                              "--region {location} --project {project} --quiet",
    "storage:bucket": "gcloud storage rm --recursive gs://{name}",
    "iam:serviceAccount":
        "gcloud iam service-accounts delete {name} --project {project} --quiet",
}
# Pulumi names the unlabelled kinds "<cluster>-<logical name>-<random hex>" (see infra/gcp.py).
GCP_LOGICAL_NAMES = r"(network|subnet|ssh-ipv[46]|intra-cluster|placement)"


def gcp_project(spec: ClusterSpec) -> str:
    """The project the cluster lives in: the profile's, else the one the provider would use."""
    for project in (spec.project, os.environ.get("GOOGLE_PROJECT"),
                    os.environ.get("GOOGLE_CLOUD_PROJECT"),
                    os.environ.get("CLOUDSDK_CORE_PROJECT")):
        if project:
            return project
    import google.auth

    _, project = google.auth.default()
    if not project:
        raise SweepUnavailable("no GCP project: set sortie:project or GOOGLE_PROJECT")
    return project


def gcp_session() -> Any:
    """An HTTP session signed with the application default credentials."""
    import google.auth
    from google.auth.transport.requests import AuthorizedSession

    credentials, _ = google.auth.default(
        scopes=["https://www.googleapis.com/auth/cloud-platform"])
    return AuthorizedSession(credentials)


def _gcp_pages(session: Any, url: str, params: dict[str, str] | None = None
               ) -> Iterator[dict[str, Any]]:
    """Every page of a Google list call (pageToken paging); an error stops the sweep."""
    token = None
    while True:
        response = session.get(url, params={**(params or {}),
                                            **({"pageToken": token} if token else {})},
                                timeout=60)
        if response.status_code != 200:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text[:200]
            raise SweepUnavailable(f"{url}: HTTP {response.status_code}: {message}")
        body = response.json()
        yield body
        token = body.get("nextPageToken")
        if not token:
            return


def _last(url: str | None) -> str:
    return (url or "").rstrip("/").rsplit("/", 1)[-1]


def gcp_leftovers(cluster: str, project: str, session: Any = None,
                  apis: dict[str, str] | None = None) -> list[Leftover]:
    """Every GCP resource of the cluster that still exists in ``project``: those labelled
    `sortie-cluster=<cluster>`, the unlabelled kinds by name, its service account, its bucket."""
    session, apis = session or gcp_session(), apis or GCP_APIS
    named = re.compile(rf"{re.escape(cluster)}-{GCP_LOGICAL_NAMES}-[0-9a-f]+")

    def ours(item: dict[str, Any], match: str) -> bool:
        if match == "label":
            return (item.get("labels") or {}).get(TAG_CLUSTER) == cluster
        return bool(named.fullmatch(item.get("name", "")))

    def leftover(kind: str, ident: str, name: str, location: str = "") -> Leftover:
        return Leftover(kind, ident, GCP_REMOVE[kind].format(name=name, location=location,
                                                             project=project))

    found: list[Leftover] = []
    base = f"{apis['compute']}/projects/{project}"
    for kind, collection, listing, match in GCP_COMPUTE:
        url = f"{base}/aggregated/{collection}" if listing == "aggregated" else \
            f"{base}/global/{collection}"
        for page in _gcp_pages(session, url):
            groups = page.get("items", {})
            items = [item for group in groups.values() for item in group.get(collection, [])] \
                if listing == "aggregated" else groups
            found += [leftover(kind, item.get("selfLink", item["name"]), item["name"],
                               _last(item.get("zone") or item.get("region")))
                      for item in items if ours(item, match)]
    account = f"{gcp_node_account_id(cluster)}@"
    for page in _gcp_pages(session, f"{apis['iam']}/projects/{project}/serviceAccounts"):
        found += [leftover("iam:serviceAccount", item["name"], item["email"])
                  for item in page.get("accounts", []) if item["email"].startswith(account)]
    for page in _gcp_pages(session, f"{apis['storage']}/b", {"project": project}):
        found += [leftover("storage:bucket", f"gs://{item['name']}", item["name"])
                  for item in page.get("items", []) if ours(item, "label")]
    return found


# -- Azure: Resource Manager ---------------------------------------------------------------------


def azure_subscription() -> str:
    """The subscription the provider would use: ARM_SUBSCRIPTION_ID, else `az login`'s default."""
    for name in ("ARM_SUBSCRIPTION_ID", "AZURE_SUBSCRIPTION_ID"):
        if os.environ.get(name):
            return os.environ[name]
    profile = Path.home() / ".azure" / "azureProfile.json"
    if profile.is_file():  # written by the Azure CLI, with a byte order mark
        subscriptions = json.loads(profile.read_text(encoding="utf-8-sig")).get("subscriptions", [])
        for subscription in subscriptions:
            if subscription.get("isDefault"):
                return subscription["id"]
    raise SweepUnavailable("no Azure subscription: set ARM_SUBSCRIPTION_ID or run `az login`")


def azure_client(subscription_id: str) -> Any:
    try:
        from azure.identity import ClientSecretCredential, DefaultAzureCredential
        from azure.mgmt.resource.resources import ResourceManagementClient
    except ImportError:
        raise SweepUnavailable("azure-mgmt-resource or azure-identity is not installed") from None
    env = os.environ
    # The Pulumi provider's ARM_* service principal, which DefaultAzureCredential does not read.
    if env.get("ARM_CLIENT_ID") and env.get("ARM_CLIENT_SECRET") and env.get("ARM_TENANT_ID"):
        credential = ClientSecretCredential(env["ARM_TENANT_ID"], env["ARM_CLIENT_ID"],
                                            env["ARM_CLIENT_SECRET"])
    else:
        credential = DefaultAzureCredential()
    return ResourceManagementClient(credential, subscription_id)


def _azure_kind(resource_type: str) -> str:
    """"Microsoft.Compute/virtualMachines" -> "compute:virtualMachines"."""
    namespace, _, rest = resource_type.partition("/")
    return f"{namespace.rsplit('.', 1)[-1].lower()}:{rest}"


def azure_leftovers(cluster: str, subscription_id: str, client: Any = None) -> list[Leftover]:
    """Every Azure resource and resource group tagged `sortie-cluster=<cluster>`."""
    client = client or azure_client(subscription_id)
    tagged = f"tagName eq '{TAG_CLUSTER}' and tagValue eq '{cluster}'"
    groups = [Leftover("resources:resourceGroups", group.id,
                       f"az group delete --name {group.name} --yes")
              for group in client.resource_groups.list(filter=tagged)]
    resources = [Leftover(_azure_kind(resource.type), resource.id,
                          f"az resource delete --ids {resource.id}")
                 for resource in client.resources.list(filter=tagged)]
    return groups + resources
