"""The Azure program, run for real under Pulumi's mock runtime: the same invariants in Azure
terms."""

from __future__ import annotations

import base64
import ipaddress
from pathlib import Path

import fsspec
import pytest
import yaml

from sortie.infra.azure.mocks import AZURE_OFFLINE_PRINCIPAL
from sortie.infra.azure.names import BLOB_DATA_CONTRIBUTOR, BLOB_DATA_READER
from sortie.infra.azure.program import (
    KEY_VAULT_SECRETS_USER,
    SUBNET_CIDR,
    interconnect,
    python_setup_script,
)
from sortie.infra.azure.review import security_summary
from sortie.infra.cloud_init import HOST_KEY_SCRIPT, PYTHON_LINK
from sortie.infra.review import Evaluation
from sortie.infra.spec import TAG_CLUSTER, TAG_EXPIRES, TAG_OWNER, TAG_RUN, SpecError
from sortie.stacks.cloud.outputs import inventory_from_outputs
from tests.helpers import (
    evaluate_profile,
    evaluate_with,
    node_parts,
    sdk_accepts,
    starts_host_key_fetch,
    subtrees,
)

pytestmark = pytest.mark.unit

RULE = "azure-native:network:SecurityRule"
VM = "azure-native:compute:VirtualMachine"
NIC = "azure-native:network:NetworkInterface"
PUBLIC_IP = "azure-native:network:PublicIPAddress"
ACCOUNT = "azure-native:storage:StorageAccount"
ROLE = "azure-native:authorization:RoleAssignment"
SCHEDULE = "azure-native:devtestlab:GlobalSchedule"
IDENTITY = "azure-native:managedidentity:UserAssignedIdentity"
VAULT = "azure-native:keyvault:Vault"
SECRET = "azure-native:keyvault:Secret"
BASE = {"sortie:cloud": "azure", "sortie:region": "eastus",
        "sortie:instanceType": "Standard_ND96asr_v4",
        "sortie:sshAllowedCidrs": ["198.51.100.7/32"]}
CONTAINER_ID = ("/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/team/providers/"
                "Microsoft.Storage/storageAccounts/teamresults/blobServices/default/containers/"
                "runs")


def run(**settings) -> Evaluation:
    return evaluate_with(BASE, **settings)


def vms(evaluation: Evaluation) -> dict[str, dict]:
    return {r.state["tags"]["sortie-node"]: r.state for r in evaluation.of_type(VM)}


def by_id(evaluation: Evaluation, token: str) -> dict[str, dict]:
    """Resources of one type by their id (what other resources' references hold)."""
    return {r.id: r.state for r in evaluation.of_type(token)}


def custom_data(vm: dict) -> dict:
    return yaml.safe_load(base64.b64decode(vm["osProfile"]["customData"]))


@pytest.fixture(scope="module", params=["azure-nd-dev", "azure-nd96", "azure-ndh100"])
def profile(request) -> Evaluation:
    return evaluate_profile(request.param)


def test_one_resource_group_holds_everything(profile: Evaluation):
    group = profile.only("azure-native:resources:ResourceGroup").state
    assert group["resourceGroupName"] == f"sortie-{profile.spec.cluster}"
    assert group["location"] == profile.spec.region
    placed = [r for r in profile.resources if r.type.startswith("azure-native:")
              and r.type != "azure-native:resources:ResourceGroup" and r.type != ROLE]
    assert placed and all(r.state["resourceGroupName"] == group["name"] for r in placed)


def test_resources_sit_in_their_subtrees(profile: Evaluation):
    """Teardown keeps the Bucket subtree (and the group it needs) and recovery replaces a Node's
    machine: each part must hold exactly its own resources."""
    shared = {"azure-native:compute:AvailabilitySet"} if profile.spec.nodes > 1 and \
        not profile.spec.spot else set()
    assert subtrees(profile) == {
        "": {"azure-native:resources:ResourceGroup", "tls:index/privateKey:PrivateKey",
             "azure-native:compute:ProximityPlacementGroup", *shared},
        "Network": {"azure-native:network:VirtualNetwork", "azure-native:network:Subnet",
                    "azure-native:network:NetworkSecurityGroup", RULE},
        "Bucket": {ACCOUNT, "azure-native:storage:BlobServiceProperties", ROLE,
                   "azure-native:storage:BlobContainer", "azure-native:storage:ManagementPolicy"},
        "NodeAccess": {IDENTITY, ROLE, VAULT},
        "Node": {PUBLIC_IP, NIC, VM, SCHEDULE, SECRET, ROLE},
    }
    nodes = node_parts(profile)
    assert sorted(nodes) == [f"{profile.spec.cluster}-node-{i}" for i in range(profile.spec.nodes)]
    assert all(types.count(VM) == 1 for types in nodes.values())


def test_nsg_ssh_only_from_allowed_cidrs_intra_subnet_and_deny_the_rest(profile: Evaluation):
    rules = {r.name: r.state for r in profile.of_type(RULE)}
    nsg = profile.only("azure-native:network:NetworkSecurityGroup").state
    assert "securityRules" not in nsg  # rules are separate resources, none inline
    assert all(r["networkSecurityGroupName"] == nsg["name"] for r in rules.values())
    inbound = [r for r in rules.values() if r["direction"] == "Inbound"]
    assert len(inbound) == len(rules)
    ssh = [r for r in inbound if r["destinationPortRange"] == "22"]
    assert {r["sourceAddressPrefix"] for r in ssh} == set(profile.spec.ssh_allowed_cidrs)
    assert all(r["protocol"] == "Tcp" and r["access"] == "Allow" for r in ssh)
    assert all(ipaddress.ip_network(r["sourceAddressPrefix"]).prefixlen > 0 for r in ssh)
    (intra,) = [r for r in inbound if r["sourceAddressPrefix"] == SUBNET_CIDR]
    assert intra["destinationAddressPrefix"] == SUBNET_CIDR
    assert (intra["protocol"], intra["destinationPortRange"], intra["access"]) == ("*", "*",
                                                                                   "Allow")
    (deny,) = [r for r in inbound if r["access"] == "Deny"]
    assert (deny["sourceAddressPrefix"], deny["destinationPortRange"], deny["protocol"]) == (
        "*", "*", "*")
    allows = [r for r in inbound if r["access"] == "Allow"]
    assert len(allows) == len(ssh) + 1, "nothing else is allowed in"
    # Our deny must win over Azure's default AllowVnetInBound (65000), after our allows.
    assert max(r["priority"] for r in allows) < deny["priority"] <= 4096
    assert len({r["priority"] for r in inbound}) == len(inbound)
    subnet = profile.only("azure-native:network:Subnet").state
    assert subnet["addressPrefix"] == SUBNET_CIDR
    assert subnet["networkSecurityGroup"]["id"] == profile.only(
        "azure-native:network:NetworkSecurityGroup").id


def test_standard_static_ips_and_accelerated_nics(profile: Evaluation):
    addresses = by_id(profile, PUBLIC_IP)
    nics = [r.state for r in profile.of_type(NIC)]
    assert len(addresses) == len(nics) == profile.spec.nodes
    for address in addresses.values():
        assert address["sku"] == {"name": "Standard"}
        assert address["publicIPAllocationMethod"] == "Static"
    ip_ids = []
    for nic in nics:
        assert nic["enableAcceleratedNetworking"] is True
        (config,) = nic["ipConfigurations"]
        assert config["subnet"]["id"] == profile.only("azure-native:network:Subnet").id
        ip_ids.append(config["publicIPAddress"]["id"])
    assert sorted(ip_ids) == sorted(addresses)  # one address per node


def test_vms_share_one_proximity_placement_group(profile: Evaluation):
    group = profile.only("azure-native:compute:ProximityPlacementGroup")
    assert group.state["proximityPlacementGroupType"] == "Standard"
    assert all(vm["proximityPlacementGroup"]["id"] == group.id for vm in vms(profile).values())


def test_on_demand_nodes_share_an_availability_set_for_infiniband():
    """InfiniBand joins only VMs of one partition: Microsoft's comparison lists "Infiniband
    Networking: No (Flexible); Yes, single placement group only (Uniform); Yes (availability
    sets)". Before: a Flexible scale set, whose VMs get no shared InfiniBand."""
    evaluation = evaluate_profile("azure-nd96")
    assert not evaluation.of_type("azure-native:compute:VirtualMachineScaleSet")
    found = evaluation.only("azure-native:compute:AvailabilitySet")
    placement = evaluation.only("azure-native:compute:ProximityPlacementGroup")
    assert found.state["proximityPlacementGroup"] == {"id": placement.id}
    assert found.state["sku"] == {"name": "Aligned"}  # managed disks
    assert (found.state["platformFaultDomainCount"], found.state["platformUpdateDomainCount"]) \
        == (1, 1)
    for vm in vms(evaluation).values():
        assert vm["availabilitySet"] == {"id": found.id} and vm["priority"] == "Regular"
        assert "zones" not in vm, "an availability set takes no zone"
    assert "NCCL_IB_DISABLE" not in evaluation.outputs["train_env"]
    assert interconnect(evaluation.spec).startswith("InfiniBand (one availability set")
    zoned = run(nodes=2, spot=False, zone="2")  # the zone cannot apply to the set
    assert all("zones" not in vm for vm in vms(zoned).values())
    assert all("zones" not in ip.state for ip in zoned.of_type(PUBLIC_IP))
    assert "zone 2 not used" in interconnect(zoned.spec)


def test_spot_nodes_go_without_infiniband_and_say_so():
    """Spot VMs cannot join an availability set; a Uniform set would give up each node's own
    identity and host key. NCCL is told to use TCP rather than try the InfiniBand devices."""
    evaluation = run(spot=True, nodes=2, zone="2")
    assert not evaluation.of_type("azure-native:compute:AvailabilitySet")
    assert not evaluation.of_type("azure-native:compute:VirtualMachineScaleSet")
    assert [vm["priority"] for vm in vms(evaluation).values()].count("Spot") == 1
    assert all(vm["zones"] == ["2"] and "availabilitySet" not in vm
               for vm in vms(evaluation).values())
    assert evaluation.outputs["train_env"]["NCCL_IB_DISABLE"] == "1"
    assert interconnect(evaluation.spec).startswith("TCP (Spot VMs cannot join")
    single = evaluate_profile("azure-nd-dev")
    assert "NCCL_IB_DISABLE" not in single.outputs["train_env"]
    assert interconnect(single.spec) == "none (a single node)"


def grants_of(evaluation: Evaluation, role: str) -> list[dict]:
    return [g.state for g in evaluation.of_type(ROLE) if g.state["roleDefinitionId"].endswith(role)]


def test_each_node_has_an_identity_of_its_own_with_blob_data_on_this_account_only(
        profile: Evaluation):
    identities = {i.id: i.state for i in profile.of_type(IDENTITY)}
    grants = grants_of(profile, BLOB_DATA_CONTRIBUTOR)
    assert len(identities) == len(grants) == profile.spec.nodes
    # ... and the deployer reads the blobs (the controller collects with its credential)
    [deployer] = grants_of(profile, BLOB_DATA_READER)
    assert deployer["principalId"] == AZURE_OFFLINE_PRINCIPAL  # get_client_config's object id
    assert deployer["scope"] == profile.only(ACCOUNT).id
    assert len(profile.of_type(ROLE)) == 2 * profile.spec.nodes + 1, "no other grants"
    for grant in grants:
        assert grant["scope"] == profile.only(ACCOUNT).id  # the account, not group or sub
        subscription = grant["scope"].split("/")[2]
        assert grant["roleDefinitionId"] == (
            f"/subscriptions/{subscription}/providers/Microsoft.Authorization/roleDefinitions/"
            f"{BLOB_DATA_CONTRIBUTOR}")
        assert grant["principalType"] == "ServicePrincipal"
    assert sorted(g["principalId"] for g in grants) == sorted(
        i["principalId"] for i in identities.values())
    runs_as = []
    for vm in vms(profile).values():
        assert vm["identity"]["type"] == "UserAssigned"
        runs_as += list(vm["identity"]["userAssignedIdentities"])
    assert sorted(runs_as) == sorted(identities), "each VM its own identity, and only it"


def test_each_host_key_is_a_secret_only_its_own_node_may_read(profile: Evaluation):
    """Before: the host private key sat in each VM's custom data, readable by any process on
    the node (IMDS) and anyone who may read the VM. Now a secret per node in an RBAC-only vault,
    readable by that node's identity alone; custom data holds the public half and the fetch."""
    vault = profile.only(VAULT).state
    properties = vault["properties"]
    assert properties["enableRbacAuthorization"] is True
    assert properties["tenantId"] and properties["sku"] == {"family": "A", "name": "standard"}
    assert properties["softDeleteRetentionInDays"] == 7
    assert "enablePurgeProtection" not in properties, "purge protection would keep it 7 days"
    name = vault["vaultName"]
    assert 3 <= len(name) <= 24 and name.isalnum() and name == name.lower()
    secrets = {s.state["tags"]["sortie-node"]: s for s in profile.of_type(SECRET)}
    identities = {i.id: i.state for i in profile.of_type(IDENTITY)}
    readers = {g["scope"]: g for g in grants_of(profile, KEY_VAULT_SECRETS_USER)}
    assert len(secrets) == len(readers) == profile.spec.nodes
    keys = [k.state for k in profile.of_type("tls:index/privateKey:PrivateKey")]
    by_name = {n["name"]: n for n in profile.outputs["nodes"]}
    for node, vm in vms(profile).items():
        secret = secrets[node]
        assert secret.state["vaultName"] == name and secret.state["secretName"] == \
            f"host-key-{node}"
        host_key = next(k for k in keys if k["publicKeyOpenssh"].strip() ==
                        by_name[node]["host_key"])
        assert secret.state["properties"]["value"]["value"] == host_key["privateKeyOpenssh"]
        (identity,) = vm["identity"]["userAssignedIdentities"]
        reader = readers[secret.id]  # scoped to the one secret, not the vault
        assert secret.id.endswith(f"/vaults/{name}/secrets/host-key-{node}")
        assert reader["principalId"] == identities[identity]["principalId"]
        text = base64.b64decode(vm["osProfile"]["customData"]).decode()
        assert "PRIVATE KEY" not in text
        cloud_config = custom_data(vm)
        assert "ssh_keys" not in cloud_config
        files = {f["path"]: f["content"] for f in cloud_config["write_files"]}
        assert (f"python3 /opt/sortie/azure_host_key.py https://{name}.vault.azure.net/ "
                f"host-key-{node} {identities[identity]['clientId']}") in files[HOST_KEY_SCRIPT]
        assert by_name[node]["host_key"] in files[HOST_KEY_SCRIPT]
        assert "def host_private_key" in files["/opt/sortie/azure_host_key.py"]
        # sshd before the long setup: the fetch starts at boot, beside it, not behind it.
        assert starts_host_key_fetch(cloud_config)
        assert ["sh", HOST_KEY_SCRIPT] not in cloud_config["runcmd"]
    assert security_summary(profile).details["host private keys"] == (
        "Key Vault (RBAC), one secret per node, readable only by its node's own identity; the "
        "vault is purged at teardown")


def test_every_sortie_gets_a_vault_name_of_its_own():
    """A deleted vault keeps its name taken for days: the same cluster name made again must
    not ask for it."""
    first, second = run(cluster="exp"), run(cluster="exp")
    names = {e.only(VAULT).state["vaultName"] for e in (first, second)}
    assert len(names) == 2 and all(n.startswith("sortieexp") for n in names)


def test_the_summary_says_so_when_a_node_may_read_another_nodes_key():
    from dataclasses import replace

    evaluation = run(nodes=2)
    readers = [g for g in evaluation.of_type(ROLE)
               if g.state["roleDefinitionId"].endswith(KEY_VAULT_SECRETS_USER)]
    wrong = replace(readers[0], state={**readers[0].state,
                                       "principalId": readers[1].state["principalId"]})
    altered = replace(evaluation, resources=[wrong if r is readers[0] else r
                                             for r in evaluation.resources])
    assert security_summary(altered).details["host private keys"] == (
        "Key Vault, NOT limited to each node's own identity")
    assert "each its own host key" not in security_summary(altered).details[
        "node identities reach"]


def test_storage_private_tls12_https_versioned_expiring(profile: Evaluation):
    account = profile.only(ACCOUNT).state
    assert account["allowBlobPublicAccess"] is False
    assert account["minimumTlsVersion"] == "TLS1_2"
    assert account["enableHttpsTrafficOnly"] is True
    assert account["kind"] == "StorageV2"
    name = account["accountName"]
    assert 3 <= len(name) <= 24 and name.isalnum() and name == name.lower()
    container = profile.only("azure-native:storage:BlobContainer").state
    assert container["publicAccess"] == "None" and container["accountName"] == name
    service = profile.only("azure-native:storage:BlobServiceProperties").state
    assert service["isVersioningEnabled"] is True and service["accountName"] == name
    (rule,) = profile.only("azure-native:storage:ManagementPolicy").state["policy"]["rules"]
    days = profile.spec.bucket_expiry_days
    assert rule["enabled"] is True and rule["type"] == "Lifecycle"
    actions = rule["definition"]["actions"]
    assert actions["baseBlob"]["delete"]["daysAfterModificationGreaterThan"] == days
    assert actions["version"]["delete"]["daysAfterCreationGreaterThan"] == days


def test_vms_gen2_hpc_image_key_only_login_and_pinned_host_key(profile: Evaluation):
    publisher, offer, sku, version = profile.spec.instance.image.split(":")
    by_name = {n["name"]: n for n in profile.outputs["nodes"]}
    (client,) = [r.state for r in profile.of_type("tls:index/privateKey:PrivateKey")
                 if r.name.endswith("-client-key")]
    for name, vm in vms(profile).items():
        assert vm["hardwareProfile"]["vmSize"] == profile.spec.instance_type
        assert vm["storageProfile"]["imageReference"] == {
            "publisher": publisher, "offer": offer, "sku": sku, "version": version}
        # Gen2; the V100's own build keeps the proprietary driver (the other's cannot drive it)
        v100 = profile.spec.instance.gpu_model == "V100"
        assert (publisher, offer, sku) == ("microsoft-dsvm", "ubuntu-hpc",
                                           "2204-v100" if v100 else "2204")
        disk = vm["storageProfile"]["osDisk"]
        assert disk["deleteOption"] == "Delete" and disk["diskSizeGB"] == \
            profile.spec.root_volume_gb
        assert vm["networkProfile"]["networkInterfaces"][0]["deleteOption"] == "Delete"
        os_profile = vm["osProfile"]
        assert "adminPassword" not in os_profile and os_profile["adminUsername"] == "sortie"
        linux = os_profile["linuxConfiguration"]
        assert linux["disablePasswordAuthentication"] is True
        (key,) = linux["ssh"]["publicKeys"]
        assert key["path"] == "/home/sortie/.ssh/authorized_keys"
        assert key["keyData"] == client["publicKeyOpenssh"]
        cloud_config = custom_data(vm)
        assert by_name[name]["host_key"] in base64.b64decode(
            vm["osProfile"]["customData"]).decode()
        timer = next(f["content"] for f in cloud_config["write_files"]
                     if f["path"].endswith("sortie-ttl.timer"))
        assert f"OnBootSec={round(profile.spec.ttl_hours * 3600)}s" in timer
        # The HPC image has no PyTorch: cloud-init builds the venv the outputs point at, after
        # the TTL is armed.
        commands = cloud_config["runcmd"]
        assert commands.index(["bash", "/opt/sortie/setup-python.sh"]) > next(
            i for i, c in enumerate(commands) if "sortie-ttl.timer" in c)
        probe = commands[-2]  # after the setup: the venv it builds is what it links
        assert commands.index(["bash", "/opt/sortie/setup-python.sh"]) < len(commands) - 2
        assert "/opt/sortie/venv/bin/python3" in probe[-1] and PYTHON_LINK in probe[-1]
        assert profile.outputs["python"] == PYTHON_LINK


def test_spot_priority_eviction_delete_and_max_price(profile: Evaluation):
    for index, (name, vm) in enumerate(sorted(vms(profile).items())):
        if profile.spec.is_spot(index):
            assert vm["priority"] == "Spot", name
            assert vm["evictionPolicy"] == "Delete"
            assert vm["billingProfile"] == {"maxPrice": -1}  # up to the on-demand price
        else:
            assert vm["priority"] == "Regular", name
            assert "evictionPolicy" not in vm and "billingProfile" not in vm
    assert profile.spec.spot == any(n["spot"] for n in profile.outputs["nodes"])


def test_auto_shutdown_deallocates_each_vm_at_the_expiry(profile: Evaluation):
    schedules = [r.state for r in profile.of_type(SCHEDULE)]
    assert len(schedules) == profile.spec.nodes
    expiry = profile.spec.expires_at.strftime("%H%M")
    vm_names = {r.id: r.state["vmName"] for r in profile.of_type(VM)}
    for schedule in schedules:
        assert schedule["taskType"] == "ComputeVmShutdownTask" and schedule["status"] == "Enabled"
        assert schedule["dailyRecurrence"] == {"time": expiry}
        assert schedule["timeZoneId"] == "UTC"
        vm_name = vm_names.pop(schedule["targetResourceId"])
        assert schedule["name"] == f"shutdown-computevm-{vm_name}"  # the name Azure requires


def test_tags_on_everything_that_takes_them(profile: Evaluation):
    tagged = [r for r in profile.resources if sdk_accepts(r.type, "tags")]
    assert {r.type for r in tagged} >= {VM, NIC, PUBLIC_IP, ACCOUNT, SCHEDULE,
                                        "azure-native:resources:ResourceGroup"}
    for resource in tagged:
        tags = resource.state["tags"]
        assert tags[TAG_CLUSTER] == profile.spec.cluster, resource.name
        assert {TAG_RUN, TAG_OWNER, TAG_EXPIRES} <= tags.keys()


def test_outputs_build_an_inventory(profile: Evaluation, tmp_path: Path):
    outputs = profile.outputs
    account = profile.only(ACCOUNT).state["name"]
    assert outputs["cloud"] == "azure"
    assert outputs["bucket_url"] == f"az://sortie@{account}.blob.core.windows.net"
    inventory = inventory_from_outputs(outputs, tmp_path / "key")
    assert inventory.backend == "azure" and inventory.head.user == "sortie"
    assert len(inventory.nodes) == profile.spec.nodes
    assert all(n.gpus == 8 for n in inventory.nodes)
    addresses = {n.address for n in inventory.nodes} | {n.private_address
                                                         for n in inventory.nodes}
    assert len(addresses) == 2 * profile.spec.nodes
    # The trainer's fsspec URL names the account itself (adlfs reads it from the host).
    fs, root = fsspec.core.url_to_fs(inventory.train_env["SORTIE_CHECKPOINT_URL"], anon=True)
    assert fs.account_name == account
    assert root == f"sortie/{profile.spec.cluster}/checkpoints"


def test_spot_workers_keep_a_regular_head_and_a_price_cap():
    evaluation = run(nodes=3, spot=True, spotMaxPrice=9.5, zone="2",
                     sshAllowedCidrs=["198.51.100.0/24", "2001:db8::/48"])
    nodes = vms(evaluation)
    assert nodes["node-0"]["priority"] == "Regular"
    assert nodes["node-2"]["priority"] == "Spot"
    assert nodes["node-2"]["billingProfile"] == {"maxPrice": 9.5}
    assert all(vm["zones"] == ["2"] for vm in nodes.values())
    assert all(ip.state["zones"] == ["2"] for ip in evaluation.of_type(PUBLIC_IP))
    ssh = sorted(r.state["sourceAddressPrefix"] for r in evaluation.of_type(RULE)
                 if r.state["destinationPortRange"] == "22")
    assert ssh == ["198.51.100.0/24", "2001:db8::/48"]


def test_max_price_minus_one_means_up_to_on_demand():
    evaluation = run(spot=True, nodes=1, spotMaxPrice=-1)
    assert evaluation.spec.spot_max_price is None
    assert vms(evaluation)["node-0"]["billingProfile"] == {"maxPrice": -1}


def test_existing_container_is_left_alone_and_the_role_is_scoped_to_it():
    evaluation = run(bucketName=CONTAINER_ID)
    assert not evaluation.of_type(ACCOUNT) and "Bucket" not in subtrees(evaluation)
    assert not evaluation.of_type("azure-native:storage:ManagementPolicy")
    (grant,) = grants_of(evaluation, BLOB_DATA_CONTRIBUTOR)
    assert grant["scope"] == CONTAINER_ID
    assert grant["roleDefinitionId"].startswith(
        "/subscriptions/11111111-2222-3333-4444-555555555555/providers/")
    assert evaluation.outputs["bucket_url"] == "az://runs@teamresults.blob.core.windows.net"


def test_a_ttl_the_daily_auto_shutdown_cannot_cover_is_refused():
    """Before: a 48 h TTL got no auto-shutdown, so a VM that powered itself off at its TTL stayed
    allocated and billed."""
    with pytest.raises(SpecError, match=r"^sortie:ttlHours: at most 24 on Azure .*; got 48$"):
        run(ttlHours=48)
    evaluation = run(ttlHours=24)
    assert len(evaluation.of_type(SCHEDULE)) == evaluation.spec.nodes


def test_shared_key_access_is_off_and_nodes_sign_in_as_their_identity(profile: Evaluation):
    """Before: the storage account accepted account keys and SAS tokens."""
    assert profile.only(ACCOUNT).state["allowSharedKeyAccess"] is False
    # Each VM has one identity, which its tokens come from unnamed: one env serves all nodes.
    assert profile.outputs["train_env"]["AZURE_STORAGE_ANON"] == "false"
    assert security_summary(profile).details["shared-key access"] == "off"


@pytest.mark.parametrize("spot", [False, True])
def test_nccl_and_gloo_stay_on_eth0_not_ipoib(spot: bool):
    """The HPC image's IPoIB interfaces (`ib*`) come first in NCCL's and gloo's own choice;
    Microsoft's multi-node NCCL examples set NCCL_SOCKET_IFNAME=eth0."""
    env = run(spot=spot, nodes=2).outputs["train_env"]
    assert (env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"]) == ("eth0", "eth0")


def test_v100_nodes_get_a_pytorch_build_with_volta_kernels():
    assert "whl/cu126" in python_setup_script("V100")
    assert "whl/cu126" not in python_setup_script("A100")
    evaluation = run(instanceType="Standard_ND40rs_v2")
    setup = next(f["content"] for f in custom_data(vms(evaluation)["node-0"])["write_files"]
                 if f["path"] == "/opt/sortie/setup-python.sh")
    assert "whl/cu126" in setup and "adlfs" in setup
    # Pinned (issue 64: every boot installed the newest PyTorch, ~3 GB), and said while waited.
    from sortie.infra.azure.facts import AZURE_TORCH
    from sortie.infra.cloud_home import home

    assert f"torch=={AZURE_TORCH} " in setup.replace("\n", " ")
    assert all(f"torch=={AZURE_TORCH}" in python_setup_script(g) for g in ("V100", "A100"))
    assert f"then PyTorch {AZURE_TORCH} installed" in home("azure").ssh_wait.line()
    apt = [line for line in setup.splitlines() if "apt-get" in line]
    assert len(apt) == 2 and all("-o DPkg::Lock::Timeout=600" in line for line in apt), \
        "the image's own first-boot updates may hold the package lock"


def test_image_override_urn_or_resource_id():
    urn = run(image="microsoft-dsvm:ubuntu-hpc:2204:22.04.2025010101")
    assert vms(urn)["node-0"]["storageProfile"]["imageReference"]["version"] == \
        "22.04.2025010101"
    gallery = "/subscriptions/x/resourceGroups/img/providers/Microsoft.Compute/images/ours"
    assert vms(run(image=gallery))["node-0"]["storageProfile"]["imageReference"] == {
        "id": gallery}


@pytest.mark.parametrize(("settings", "key"), [
    ({"instanceType": "a2-highgpu-8g"}, "sortie:instanceType"),
    ({"region": "brazilsouth"}, "sortie:region"),
    ({"zone": "4"}, "sortie:zone"),
    ({"nodes": 0}, "sortie:nodes"),
    ({"sshAllowedCidrs": ["0.0.0.0/0"]}, "sortie:sshAllowedCidrs"),
    ({"spotMaxPrice": -0.5}, "sortie:spotMaxPrice"),
    ({"image": "ubuntu-hpc"}, "sortie:image"),
    ({"bucketName": "teamresults"}, "sortie:bucketName"),
    ({"project": "my-project"}, "sortie:project"),
    ({"ttlHours": 25}, "sortie:ttlHours"),
])
def test_bad_azure_profile_one_line_naming_the_key(settings, key):
    with pytest.raises(SpecError) as error:
        run(**settings)
    assert str(error.value).startswith(key + ":") and "\n" not in str(error.value)


def test_idle_stop_timer_when_held_with_idle_stop():
    for vm in vms(run(idleStopMinutes=5)).values():
        cloud_config = custom_data(vm)
        assert ["systemctl", "enable", "--now", "sortie-idle-stop.timer"] in \
            cloud_config["runcmd"]
        script = next(f["content"] for f in cloud_config["write_files"]
                      if f["path"] == "/opt/sortie/idle-stop.sh")
        assert "-ge 300 ]" in script
