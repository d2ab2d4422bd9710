"""Proof of teardown on AWS: the tag sweep against a real AWS API server (moto) on loopback."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest

from sortie.infra.aws.home import aws_leftovers
from sortie.infra.spec import TAG_CLUSTER, TAG_ID, parse_spec

pytestmark = pytest.mark.e2e

REGION = "us-east-1"


def tagged(cluster: str, sortie_id: str | None = None) -> list[dict]:
    return [{"Key": TAG_CLUSTER, "Value": cluster}, {"Key": "sortie-run", "Value": cluster},
            {"Key": TAG_ID, "Value": sortie_id or cluster}]


def create_cluster_resources(cluster: str, sortie_id: str | None = None) -> dict[str, str]:
    """What an interrupted AWS sortie could leave: network, instance, bucket, IAM. With
    ``sortie_id``, names carry it too (two sorties of one name in one account)."""
    ec2, tags = boto3.client("ec2", region_name=REGION), tagged(cluster, sortie_id)
    unique = sortie_id or cluster

    def spec(kind: str) -> list[dict]:
        return [{"ResourceType": kind, "Tags": tags}]

    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16", TagSpecifications=spec("vpc"))["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.0.0/18",
                               TagSpecifications=spec("subnet"))["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName=f"sortie-{unique}", Description="sortie",
                                      VpcId=vpc, TagSpecifications=spec("security-group"))
    instance = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1,
                                 SubnetId=subnet, TagSpecifications=spec("instance"))
    bucket = f"sortie-{unique}-results"
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": tags})
    iam = boto3.client("iam")
    role = f"sortie-{cluster}-node-{unique[-8:]}"
    iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17",
                    "Statement": []}), Tags=tags)
    iam.create_instance_profile(InstanceProfileName=role, Tags=tags)
    secret = boto3.client("secretsmanager", region_name=REGION).create_secret(
        Name=f"sortie-{unique}-host-key-node-0", SecretString="a host key", Tags=tags)
    return {"vpc": vpc, "subnet": subnet, "group": group["GroupId"], "bucket": bucket,
            "instance": instance["Instances"][0]["InstanceId"], "role": role,
            "secret": secret["ARN"]}


def test_sweep_finds_every_leftover_of_one_cluster_and_says_how_to_remove_it(aws_endpoint):
    mine, other = create_cluster_resources("exp-1"), create_cluster_resources("exp-10")
    leftovers = aws_leftovers("exp-1", REGION)
    kinds = sorted(left.kind for left in leftovers)
    assert kinds == ["ec2:instance", "ec2:security-group", "ec2:subnet", "ec2:vpc",
                     "iam:instance-profile", "iam:role", "s3:bucket", "secretsmanager:secret"]
    text = "\n".join(left.line() for left in leftovers)
    for ident in mine.values():
        assert ident in text
    assert not any(ident in text for ident in other.values() if ident not in mine.values())
    instance = next(left for left in leftovers if left.kind == "ec2:instance")
    assert instance.remove == (f"aws ec2 terminate-instances --region {REGION} "
                               f"--instance-ids {mine['instance']}")
    secret = next(left for left in leftovers if left.kind == "secretsmanager:secret")
    assert secret.remove == (f"aws secretsmanager delete-secret --region {REGION} --secret-id "
                             f"{mine['secret']} --force-delete-without-recovery")


def test_two_sorties_of_one_name_never_sweep_each_other(aws_endpoint):
    """Before: the sweep matched `sortie-cluster=exp`, so two controllers (two homes) that both
    ran `--name exp` in one account listed each other's live resources as leftovers, with
    delete commands. Now each launch has its own sortie id, and the sweep matches that."""
    from sortie.stacks.cloud.stack_api import sweep_by_tags as sweep

    mine = create_cluster_resources("exp", "exp-0a1b2c3d")
    theirs = create_cluster_resources("exp", "exp-9f8e7d6c")
    base = {"cloud": "aws", "region": REGION, "instanceType": "p3.2xlarge",
            "sshAllowedCidrs": ["203.0.113.0/24"]}
    found = sweep(parse_spec({**base, "sortieId": "exp-0a1b2c3d"}, "exp"))
    text = "\n".join(left.line() for left in found)
    assert len(found) == 8 and all(ident in text for ident in mine.values())
    assert not any(ident in text for ident in theirs.values())


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
    boto3.client("secretsmanager", region_name=REGION).delete_secret(
        SecretId=made["secret"], ForceDeleteWithoutRecovery=True)
    assert aws_leftovers("exp-2", REGION) == []


# -- GCP and Azure: the real SDK clients against in-repo doubles of the two list APIs -----------

PROJECT, SUBSCRIPTION = "sortie-test", "00000000-0000-0000-0000-000000000001"


def spec_for(profile: str, cluster: str, **settings: object):
    from sortie.infra.spec import parse_spec
    from sortie.stacks.profiles import load_profile

    values = {key.split(":", 1)[1]: value for key, value in load_profile(profile).items()}
    return parse_spec({**values, "cluster": cluster, **settings}, cluster)


def gcp_apis(double) -> dict:
    """Where the sweep finds Compute, IAM, Storage and Secret Manager: all on the double."""
    return {"compute": f"{double.endpoint}/compute/v1", "iam": f"{double.endpoint}/v1",
            "storage": f"{double.endpoint}/storage/v1",
            "secretmanager": f"{double.endpoint}/secretmanager/v1",
            "serviceusage": f"{double.endpoint}/serviceusage/v1",
            "orgpolicy": f"{double.endpoint}/v2"}


def gcp_session():
    """Stands in for the credentials: the APIs only need a bearer token here."""
    import requests

    session = requests.Session()
    session.headers["Authorization"] = "Bearer test-token"
    return session


def gcp_sweep(double, cluster: str):
    from sortie.infra.gcp.home import gcp_leftovers

    return gcp_leftovers(cluster, PROJECT, session=gcp_session(), apis=gcp_apis(double))


def azure_client_for(double, client_type=None):
    """The real Resource Manager client (or ``client_type``, e.g. Key Vault's) on the double."""
    from azure.core.pipeline.policies import SansIOHTTPPolicy
    from azure.mgmt.resource.resources import ResourceManagementClient

    class StaticToken(SansIOHTTPPolicy):
        """Stands in for the credential: Resource Manager only needs a bearer token here."""

        def on_request(self, request):
            request.http_request.headers["Authorization"] = "Bearer test-token"

    return (client_type or ResourceManagementClient)(
        object(), SUBSCRIPTION, base_url=double.endpoint, authentication_policy=StaticToken(),
        polling_interval=0)


def key_vault_client_for(double):
    from azure.mgmt.keyvault import KeyVaultManagementClient

    return azure_client_for(double, KeyVaultManagementClient)


def add_gcp_cluster(double, cluster: str, sortie_id: str | None = None) -> dict[str, str]:
    """What a two-node GCP sortie creates (one node shown where it repeats): labelled
    instance, disk, bucket and host-key secrets; unlabelled network, subnetwork, firewall rules,
    placement policy and the nodes' service accounts, named by the program (and, a sortie with
    an id, saying it in their description; Pulumi's random suffixes differ by sortie)."""
    from sortie.infra.gcp.facts import node_account_id

    labels = {TAG_CLUSTER: cluster, "sortie-run": cluster, TAG_ID: sortie_id or cluster}
    zone, region = "us-central1-a", "us-central1"
    note = f"sortie-id={sortie_id}" if sortie_id else ""
    hex7 = (sortie_id or "0f1e2d3c4b5a6978")[-7:]

    def add(kind: str, name: str, location: str = "", labelled: dict | None = None) -> str:
        return double.add(PROJECT, kind, name, location, labelled,
                          description="" if labelled else note)

    def email(index: int) -> str:
        return f"{node_account_id(cluster, index)}@{PROJECT}.iam.gserviceaccount.com"

    return {
        "instance": add("compute:instance", f"sortie-{cluster}-node-0", zone,
                        {**labels, "sortie-node": "node-0"}),
        "disk": add("compute:disk", f"sortie-{cluster}-node-0", zone, labels),
        "bucket": add("storage:bucket", f"{cluster}-bucket-{hex7}", labelled=labels),
        "network": add("compute:network", f"{cluster}-network-{hex7}"),
        "subnet": add("compute:subnetwork", f"{cluster}-subnet-{hex7}", region),
        "ssh": add("compute:firewall", f"{cluster}-ssh-ipv4-{hex7}"),
        "intra": add("compute:firewall", f"{cluster}-intra-cluster-{hex7}"),
        "placement": add("compute:resourcePolicy", f"{cluster}-placement-{hex7}", region),
        "account": add("iam:serviceAccount", email(0)),
        "account-1": add("iam:serviceAccount", email(1)),
        "secret": add("secretmanager:secret", f"sortie-{cluster}-host-key-node-0",
                      labelled={**labels, "sortie-node": "node-0"}),
        "secret-1": add("secretmanager:secret", f"sortie-{cluster}-host-key-node-1",
                        labelled={**labels, "sortie-node": "node-1"}),
    }


def test_gcp_sweep_finds_every_leftover_of_one_cluster_and_says_how_to_remove_it():
    """Asked of the owning APIs. Before: Cloud Asset Inventory, minutes behind them."""
    from sortie.infra.gcp.facts import node_account_id
    from tests.cloud_api_doubles import GcpApisDouble, serving

    with serving(GcpApisDouble(), needs_token=True) as double:
        mine = add_gcp_cluster(double, "exp-1")
        others = {**add_gcp_cluster(double, "exp-10"), **{
            f"x-{k}": v for k, v in add_gcp_cluster(double, "exp").items()}}
        double.add(PROJECT, "compute:network", "default")
        leftovers = gcp_sweep(double, "exp-1")
    assert sorted(left.resource for left in leftovers) == sorted(mine.values())
    assert not set(others.values()) & {left.resource for left in leftovers}
    by_kind = {left.kind: left.remove for left in leftovers}
    assert sorted(by_kind) == ["compute:disk", "compute:firewall", "compute:instance",
                               "compute:network", "compute:resourcePolicy", "compute:subnetwork",
                               "iam:serviceAccount", "secretmanager:secret", "storage:bucket"]
    assert by_kind["compute:instance"] == ("gcloud compute instances delete sortie-exp-1-node-0 "
                                           f"--zone us-central1-a --project {PROJECT} --quiet")
    assert by_kind["compute:subnetwork"].endswith(f"--region us-central1 --project {PROJECT} "
                                                  "--quiet")
    removals = {left.remove for left in leftovers}
    for index in (0, 1):
        account = node_account_id("exp-1", index)
        assert (f"gcloud iam service-accounts delete {account}@{PROJECT}.iam.gserviceaccount.com "
                f"--project {PROJECT} --quiet") in removals
        assert (f"gcloud secrets delete sortie-exp-1-host-key-node-{index} --project {PROJECT} "
                "--quiet") in removals
    assert by_kind["storage:bucket"] == "gcloud storage rm --recursive gs://exp-1-bucket-b5a6978"
    paths = {path for path, _ in double.requests}
    assert f"/compute/v1/projects/{PROJECT}/aggregated/instances" in paths
    assert f"/v1/projects/{PROJECT}/serviceAccounts" in paths and "/storage/v1/b" in paths
    assert f"/secretmanager/v1/projects/{PROJECT}/secrets" in paths
    assert any("pageToken" in query for _, query in double.requests), "every page was read"


def test_gcp_sweep_of_one_sortie_never_lists_another_of_the_same_name():
    """Two sorties named `exp` in one project (two controllers): the labelled kinds by the
    sortie id, the unlabelled ones by name and the id in their description."""
    from sortie.infra.gcp.home import gcp_leftovers
    from tests.cloud_api_doubles import GcpApisDouble, serving

    with serving(GcpApisDouble(), needs_token=True) as double:
        mine = add_gcp_cluster(double, "exp", "exp-0a1b2c3d")
        theirs = add_gcp_cluster(double, "exp", "exp-9f8e7d6c")
        leftovers = gcp_leftovers("exp", PROJECT, session=gcp_session(), apis=gcp_apis(double),
                                  tag=(TAG_ID, "exp-0a1b2c3d"))
    # Each of mine once; none of theirs (the same names, where GCP names are the program's,
    # would show as a second entry).
    assert sorted(left.resource for left in leftovers) == sorted(mine.values())
    assert not {left.resource for left in leftovers} & (set(theirs.values()) - set(mine.values()))


def test_gcp_sweep_sees_a_deletion_at_once():
    """What the owning API no longer has is no leftover: no index to wait for."""
    from tests.cloud_api_doubles import GcpApisDouble, serving

    with serving(GcpApisDouble(), needs_token=True) as double:
        add_gcp_cluster(double, "exp-2")
        assert len(gcp_sweep(double, "exp-2")) == 12
        double.resources.clear()  # the stack's destroy returned
        assert gcp_sweep(double, "exp-2") == []


def add_azure_cluster(double, cluster: str) -> dict[str, str]:
    tags = {TAG_CLUSTER: cluster, "sortie-run": cluster}
    group = f"sortie-{cluster}"
    add = double.add
    return {
        "group": add(SUBSCRIPTION, "Microsoft.Resources/resourceGroups", group, group, tags),
        "vm": add(SUBSCRIPTION, "Microsoft.Compute/virtualMachines", "node-0", group,
                  {**tags, "sortie-node": "node-0"}),
        "nic": add(SUBSCRIPTION, "Microsoft.Network/networkInterfaces", "node-0-nic", group, tags),
        "ip": add(SUBSCRIPTION, "Microsoft.Network/publicIPAddresses", "node-0-ip", group, tags),
        "storage": add(SUBSCRIPTION, "Microsoft.Storage/storageAccounts", "sortiex1", group, tags),
    }


def test_azure_sweep_finds_every_leftover_of_one_cluster_and_says_how_to_remove_it():
    from sortie.infra.azure.home import azure_leftovers
    from tests.cloud_api_doubles import AzureResourceManagerDouble, serving

    with serving(AzureResourceManagerDouble(), needs_token=True) as double:
        mine, other = add_azure_cluster(double, "exp-1"), add_azure_cluster(double, "exp-10")
        leftovers = azure_leftovers("exp-1", SUBSCRIPTION, client=azure_client_for(double),
                                    vaults=key_vault_client_for(double))
    assert sorted(left.resource for left in leftovers) == sorted(mine.values())
    assert not set(other.values()) & {left.resource for left in leftovers}
    by_kind = {left.kind: left.remove for left in leftovers}
    assert sorted(by_kind) == ["compute:virtualMachines", "network:networkInterfaces",
                               "network:publicIPAddresses", "resources:resourceGroups",
                               "storage:storageAccounts"]
    assert by_kind["resources:resourceGroups"] == "az group delete --name sortie-exp-1 --yes"
    assert by_kind["compute:virtualMachines"] == f"az resource delete --ids {mine['vm']}"
    filters = {q["$filter"][0] for _, q in double.requests if "$filter" in q}
    assert filters == {"tagName eq 'sortie-cluster' and tagValue eq 'exp-1'"}
    assert any("skiptoken" in q for _, q in double.requests)  # the second page was read


def test_azure_teardown_purges_the_clusters_deleted_vault_and_the_sweep_counts_one_kept():
    """A destroyed Key Vault is kept, the nodes' host keys in it, and its name stays taken:
    the sweep counts it as a leftover (with its purge command) until teardown purges it. Only
    the cluster's own are purged."""
    from sortie.infra.azure.home import azure_leftovers, purge_deleted_vaults
    from tests.cloud_api_doubles import AzureResourceManagerDouble, serving

    with serving(AzureResourceManagerDouble(), needs_token=True) as double:
        mine = double.delete_vault(SUBSCRIPTION, "sortieexp1a1b2c3d4e5f6",
                                   {TAG_CLUSTER: "exp-1"})
        theirs = [double.delete_vault(SUBSCRIPTION, f"other{i}", tags)
                  for i, tags in enumerate(({TAG_CLUSTER: "exp-10"}, {}, {TAG_CLUSTER: "exp-1x"}))]
        resources, vaults = azure_client_for(double), key_vault_client_for(double)
        [kept] = azure_leftovers("exp-1", SUBSCRIPTION, client=resources, vaults=vaults)
        assert kept.kind == "keyvault:deletedVaults" and kept.resource == mine
        assert kept.remove == "az keyvault purge --name sortieexp1a1b2c3d4e5f6 --location eastus"
        purge_deleted_vaults("exp-1", SUBSCRIPTION, vaults=vaults)
        assert azure_leftovers("exp-1", SUBSCRIPTION, client=resources, vaults=vaults) == []
        assert [v["id"] for v in double.deleted_vaults] == theirs, "nobody else's is purged"
    purges = [path for path, _ in double.requests if path.endswith("/purge")]
    assert purges == [f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.KeyVault/locations/"
                      "eastus/deletedVaults/sortieexp1a1b2c3d4e5f6/purge"]


def test_a_sweep_that_cannot_ask_the_cloud_never_reads_as_clean(monkeypatch):
    """An API refusal, a missing subscription or project: one "unswept" leftover saying why."""
    from sortie.infra.azure import home as azure
    from sortie.infra.gcp import home as gcp
    from sortie.stacks.cloud.stack_api import sweep_by_tags as sweep
    from tests.cloud_api_doubles import AzureResourceManagerDouble, GcpApisDouble, serving

    for name in ("ARM_SUBSCRIPTION_ID", "AZURE_SUBSCRIPTION_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")
    [unswept] = sweep(spec_for("azure-nd-dev", "exp-1"))
    assert unswept.kind == "unswept"
    assert "no Azure subscription: set ARM_SUBSCRIPTION_ID" in unswept.remove
    assert "sortie down exp-1" in unswept.remove

    monkeypatch.setenv("ARM_SUBSCRIPTION_ID", SUBSCRIPTION)
    with serving(AzureResourceManagerDouble(fail_with=403), needs_token=True) as double:
        monkeypatch.setattr(azure, "azure_client", lambda _sub: azure_client_for(double))
        monkeypatch.setattr(azure, "key_vault_client", lambda _sub: key_vault_client_for(double))
        [refused] = sweep(spec_for("azure-nd-dev", "exp-1"))
    assert refused.kind == "unswept" and "refused by the double" in refused.remove

    with serving(GcpApisDouble(fail_with=403), needs_token=True) as double:
        monkeypatch.setattr(gcp, "gcp_session", gcp_session)
        monkeypatch.setattr(gcp, "GCP_APIS", gcp_apis(double))
        [refused] = sweep(spec_for("gcp-a2-dev", "exp-1", project=PROJECT))
    assert refused.kind == "unswept" and "403" in refused.remove
    assert "\n" not in refused.line()


def test_gcp_sweep_of_one_sweep_run_never_lists_its_sibling_account():
    from tests.cloud_api_doubles import GcpApisDouble, serving

    with serving(GcpApisDouble(), needs_token=True) as double:
        sibling = add_gcp_cluster(double, "experiment-lr-sweep-0001")
        leftovers = gcp_sweep(double, "experiment-lr-sweep-0002")
    assert leftovers == [], sibling["account"]


def without_list_tags(session: boto3.session.Session) -> boto3.session.Session:
    """IAM's list calls on real AWS return no tags (moto's do): strip them, so the sweep must
    ask the per-resource tag calls, as it must on AWS."""
    def strip(parsed, **_kwargs):
        for entry in parsed.get("InstanceProfiles", []) + parsed.get("Roles", []):
            entry.pop("Tags", None)

    for operation in ("ListInstanceProfiles", "ListRoles"):
        session.events.register(f"after-call.iam.{operation}", strip)
    return session


def test_aws_sweep_finds_iam_of_long_cluster_names_as_real_aws_lists_them(aws_endpoint):
    """Before: instance profiles were matched on the tags of the list call (empty on AWS), and
    on the full `sortie-<cluster>-` prefix while the program cuts names to 38 characters."""
    from sortie.infra.aws.facts import iam_name_prefix

    iam = boto3.client("iam")
    clusters = [f"a-forty-character-cluster-name-for-iam-{end}" for end in "xy"]
    for cluster in clusters:  # the same 38-character prefix: only the tags tell them apart
        name = iam_name_prefix(cluster) + cluster[-1] + "20261122abcdef"
        iam.create_role(RoleName=name, AssumeRolePolicyDocument="{}", Tags=tagged(cluster))
        iam.create_instance_profile(InstanceProfileName=name, Tags=tagged(cluster))
    session = without_list_tags(boto3.session.Session(region_name=REGION))
    found = aws_leftovers(clusters[0], REGION, session=session)
    assert sorted(left.kind for left in found) == ["iam:instance-profile", "iam:role"]
    assert all(left.resource.endswith(iam_name_prefix(clusters[0]) + "x20261122abcdef")
               for left in found)
    assert len(iam_name_prefix(clusters[0])) == 38


def test_a_launch_without_a_zone_tries_each_zone_that_offers_the_type(aws_endpoint):
    """The real zone lookup against the AWS API server: the zones offering the type, by name,
    become the launch attempts (the program's subnet takes the first)."""
    from sortie.stacks.cloud.pulumi_backend import PulumiBackend
    from sortie.stacks.profiles import load_profile

    no_stacks = SimpleNamespace(backend_url=None)  # placements never open a stack
    backend = PulumiBackend("aws-p4d", load_profile("aws-p4d"), no_stacks, Path("unused"))
    assert backend.spec.zone is None and not backend.spec.spot
    offered = boto3.client("ec2", region_name=REGION).describe_instance_type_offerings(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": ["p4d.24xlarge"]}])["InstanceTypeOfferings"]
    zones = sorted(o["Location"] for o in offered)
    assert len(zones) > 1
    assert [p.describe() for p in backend.placements()] == [f"zone {zone}" for zone in zones]


def test_an_azure_subscription_without_a_provider_is_named_before_anything_is_made(
        monkeypatch):
    """azure-native does not register resource providers: a subscription without
    Microsoft.DevTestLab fails the auto-shutdown schedule half-way. The real Resource Manager
    client asks the double, and the launch stops in one line naming the command."""
    from sortie.core.errors import UsageError
    from sortie.infra.azure import home as azure
    from sortie.stacks.cloud.automation import require_cloud_ready
    from sortie.stacks.cloud.stack_api import spec_from_config
    from sortie.stacks.profiles import load_profile
    from tests.cloud_api_doubles import AzureResourceManagerDouble, serving

    monkeypatch.setenv("ARM_SUBSCRIPTION_ID", SUBSCRIPTION)
    spec = spec_from_config("edge", load_profile("azure-nd96"))
    double = AzureResourceManagerDouble()
    double.unregistered = ("Microsoft.DevTestLab",)
    with serving(double, needs_token=True):
        client = azure_client_for(double)
        assert azure.unregistered_providers(SUBSCRIPTION, client) == ["Microsoft.DevTestLab"]
        monkeypatch.setattr(azure, "azure_client", lambda subscription: client)
        with pytest.raises(UsageError) as refused:
            require_cloud_ready(spec, "run stack azure-nd96")
        double.unregistered = ()
        require_cloud_ready(spec, "run stack azure-nd96")  # all registered: no complaint
        # A Contributor may create everything but the nodes' role assignments: before, `up`
        # failed half-way on the first of them.
        double.permissions = [{"actions": ["*"], "notActions": [
            "Microsoft.Authorization/*/Delete", "Microsoft.Authorization/*/Write",
            "Microsoft.Authorization/elevateAccess/Action"]}]
        with pytest.raises(UsageError) as contributor:
            require_cloud_ready(spec, "run stack azure-nd96")
        double.permissions += [{"actions": ["*/read", "Microsoft.Authorization/*"],
                                "notActions": []}]  # and User Access Administrator
        require_cloud_ready(spec, "run stack azure-nd96")
    message = str(refused.value)
    assert message == (f"cannot run stack azure-nd96: resource provider Microsoft.DevTestLab "
                       f"is not registered in subscription {SUBSCRIPTION} (run `az provider "
                       "register --namespace Microsoft.DevTestLab`); nothing was created")
    asked = {path for path, _ in double.requests}
    assert f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute" in asked
    assert str(contributor.value) == (
        f"cannot run stack azure-nd96: the signed-in identity may not assign roles in "
        f"subscription {SUBSCRIPTION} (Microsoft.Authorization/roleAssignments/write: Owner, "
        "or User Access Administrator), which the program does for each node's identity; "
        "nothing was created")


def test_a_gcp_project_without_secret_manager_is_named_before_anything_is_made(monkeypatch):
    """Secret Manager (the nodes' host keys) is off in a new project: `pulumi up` would fail
    half-way. The real session asks Service Usage (on the double), and the launch stops in one
    line naming the command; a check that cannot ask passes the launch on."""
    from sortie.core.errors import UsageError
    from sortie.infra.gcp import home as gcp
    from sortie.stacks.cloud.automation import require_cloud_ready
    from tests.cloud_api_doubles import GcpApisDouble, serving

    spec = spec_for("gcp-a2", "edge", project=PROJECT)
    monkeypatch.setattr(gcp, "gcp_session", gcp_session)
    with serving(GcpApisDouble(), needs_token=True) as double:
        double.disabled = ("secretmanager.googleapis.com",)
        monkeypatch.setattr(gcp, "GCP_APIS", gcp_apis(double))
        with pytest.raises(UsageError) as refused:
            require_cloud_ready(spec, "run stack gcp-a2")
        double.disabled = ()
        require_cloud_ready(spec, "run stack gcp-a2")  # all enabled: no complaint
        asked = {path.rsplit("/", 1)[-1] for path, _ in double.requests if "services/" in path}
    assert asked == set(gcp.GCP_SERVICES)
    assert str(refused.value) == (
        f"cannot run stack gcp-a2: service secretmanager.googleapis.com is not enabled in "
        f"project {PROJECT} (run `gcloud services enable secretmanager.googleapis.com "
        f"--project {PROJECT}`); nothing was created")
    with serving(GcpApisDouble(fail_with=403), needs_token=True) as double:
        monkeypatch.setattr(gcp, "GCP_APIS", gcp_apis(double))
        require_cloud_ready(spec, "run stack gcp-a2")


def test_a_region_without_the_driver_image_is_named_before_anything_is_made(aws_endpoint):
    """P3 boots the proprietary-driver DLAMI line (the OSS line lists no P3). The real lookup,
    asked as the program asks, against the AWS API server (which has no DLAMI): one line naming
    the filter, before anything is created; a filter that matches, or the profile's own image,
    passes."""
    from sortie.core.errors import UsageError
    from sortie.infra.aws import home as aws
    from sortie.infra.aws.facts import AWS_DLAMI_PROPRIETARY
    from sortie.stacks.cloud.automation import require_cloud_ready

    spec = spec_for("aws-p3-dev", "edge")
    assert spec.instance.image == AWS_DLAMI_PROPRIETARY
    with pytest.raises(UsageError) as refused:
        require_cloud_ready(spec, "run stack aws-p3-dev")
    assert str(refused.value) == (
        f"cannot run stack aws-p3-dev: sortie:instanceType p3.2xlarge: no available Amazon "
        f"image named {AWS_DLAMI_PROPRIETARY!r} in {spec.region} (set sortie:image to an AMI id "
        "that has an NVIDIA driver for the V100); nothing was created")
    assert aws.image_problems(spec, name_filter="Deep Learning AMI Ubuntu Linux - *") == []
    own = spec_for("aws-p3-dev", "edge", image="ami-0123456789abcdef0")
    require_cloud_ready(own, "run stack aws-p3-dev")  # not looked up: the profile's own


def test_a_gcp_image_family_gone_or_deprecated_and_os_login_are_named_before_anything_is_made(
        monkeypatch):
    """The boot image's family is asked as the boot disk asks (its newest image), and an
    organisation policy requiring OS Login (which ignores the cluster's SSH key) is read: each
    is one line before anything is created; a policy the deployer may not read is passed over."""
    from sortie.core.errors import UsageError
    from sortie.infra.gcp import home as gcp
    from sortie.stacks.cloud.automation import require_cloud_ready
    from tests.cloud_api_doubles import GcpApisDouble, serving

    spec = spec_for("gcp-a2", "edge", project=PROJECT)
    family = spec.instance.image.rsplit("/", 1)[-1]
    monkeypatch.setattr(gcp, "gcp_session", gcp_session)
    with serving(GcpApisDouble(), needs_token=True) as double:
        monkeypatch.setattr(gcp, "GCP_APIS", gcp_apis(double))
        require_cloud_ready(spec, "run stack gcp-a2")  # the family answers: no complaint
        double.families = {}
        with pytest.raises(UsageError) as gone:
            require_cloud_ready(spec, "run stack gcp-a2")
        double.families = {family: "DEPRECATED"}
        with pytest.raises(UsageError) as deprecated:
            require_cloud_ready(spec, "run stack gcp-a2")
        double.families, double.os_login = None, True
        with pytest.raises(UsageError) as os_login:
            require_cloud_ready(spec, "run stack gcp-a2")
        assert gcp.image_problems(spec_for("gcp-a2", "edge", project=PROJECT,
                                           image="my-image")) == [], "the profile's own image"
    assert str(gone.value) == (
        f"cannot run stack gcp-a2: sortie:instanceType a2-highgpu-8g: no image in family "
        f"{spec.instance.image} (set sortie:image to an image with an NVIDIA driver for the "
        "A100); nothing was created")
    assert f"the newest image of family {spec.instance.image} is deprecated" in \
        str(deprecated.value)
    assert str(os_login.value) == (
        f"cannot run stack gcp-a2: project {PROJECT} requires OS Login (organisation policy "
        "constraints/compute.requireOsLogin), which ignores the cluster's SSH key: use a "
        "project without that policy; nothing was created")


# -- Whether a held cluster's machines are stopped (its idle stop), asked of each cloud ---------


def test_aws_says_which_of_the_clusters_instances_still_run(aws_endpoint):
    from sortie.infra.aws.home import aws_running

    mine, other = create_cluster_resources("idle-1"), create_cluster_resources("idle-10")
    assert aws_running("idle-1", REGION) == [mine["instance"]]
    boto3.client("ec2", region_name=REGION).stop_instances(InstanceIds=[mine["instance"]])
    assert aws_running("idle-1", REGION) == [], "stopped in the guest: not running"
    assert aws_running("idle-10", REGION) == [other["instance"]]


def test_gcp_says_which_of_the_clusters_instances_still_run():
    from sortie.infra.gcp.home import gcp_running
    from tests.cloud_api_doubles import GcpApisDouble, serving

    with serving(GcpApisDouble()) as double:
        labels = {TAG_CLUSTER: "idle-1"}
        up = double.add(PROJECT, "compute:instance", "idle-1-node-0", "us-central1-a", labels)
        double.add(PROJECT, "compute:instance", "idle-1-node-1", "us-central1-a", labels,
                   status="TERMINATED")
        double.add(PROJECT, "compute:instance", "idle-10-node-0", "us-central1-a",
                   {TAG_CLUSTER: "idle-10"})
        running = gcp_running("idle-1", PROJECT, session=gcp_session(), apis=gcp_apis(double))
        assert running == [up]


def test_azure_says_which_of_the_clusters_vms_still_run():
    from sortie.infra.azure.home import azure_running
    from tests.cloud_api_doubles import AzureResourceManagerDouble, serving

    with serving(AzureResourceManagerDouble(), needs_token=True) as double:
        mine = add_azure_cluster(double, "idle-1")
        client = azure_client_for(double)
        assert azure_running("idle-1", SUBSCRIPTION, client=client) == [mine["vm"]]
        double.power[mine["vm"]] = "PowerState/stopped"  # powered off in the guest
        assert azure_running("idle-1", SUBSCRIPTION, client=client) == []
