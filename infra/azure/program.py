"""`AzureGpuCluster`: an Azure ND cluster, its network, storage and access, as one component with
the subtrees of `infra/parts.py` (Network, Bucket, NodeAccess, one Node per node).

The same bar as AWS and GCP, in Azure terms (asserted by tests/test_azure_program.py):
- everything lives in one resource group per cluster, so teardown has one boundary;
- the subnet's NSG lets SSH in only from `sshAllowedCidrs`, lets nodes reach each other on every
  port, and denies all other inbound traffic ahead of Azure's default allow rules;
- each node has a user-assigned identity of its own, holding Storage Blob Data Contributor on this
  cluster's storage account and Key Vault Secrets User on that node's host key alone (a secret
  in the cluster's RBAC-only Key Vault) and nothing else; the account allows no public blobs and
  no shared-key (account key, SAS) access, only Entra ID over HTTPS and TLS 1.2+, keeps versions
  and expires blobs; no private key is in custom data;
- VMs boot a Gen2 HPC image, take only the program's SSH key (no password), run workers on Spot
  (eviction: Delete) when asked, and carry a TTL twice: the cloud-init timer powers the node off,
  and, because a VM powered off from inside is still allocated and billed on Azure, an
  auto-shutdown schedule deallocates it at the expiry time (a daily schedule: the spec refuses a
  TTL over 24 h on Azure).

Multi-node interconnect (`node_layout`): InfiniBand reaches only VMs of one partition.
Microsoft's orchestration-modes comparison lists "Infiniband Networking: No (Flexible); Yes,
single placement group only (Uniform); Yes (availability sets)". On-demand nodes are VMs of one
availability set (one fault and update domain) in one proximity placement group: they get
InfiniBand, and NCCL finds the devices itself (the HPC image has the drivers). Spot VMs cannot
join an availability set, and a Uniform scale set (one model for every VM, all Spot or all
Regular) would give up each node's own identity and host key: a cluster with Spot nodes is
stand-alone VMs in the placement group, with NCCL told to use TCP (`NCCL_IB_DISABLE=1`) rather
than try devices it cannot use. An availability set takes no zone: a profile's zone is not used
for it. `sortie plan` says which layout a profile gets.

Key Vault keeps a deleted vault, secrets and all, for its retention days (7 at least) and keeps
its name taken: the vault's name is new for every sortie, and teardown purges the deleted vault
(`infra/azure/home.py`). Its secrets are left to go with the vault: azure-native deletes a
secret through the vault's data plane, which an RBAC vault refuses to a subscription's owner.

Unverified here (no Azure account): the PyTorch wheel index that still builds V100 kernels, and
how long a node identity's new role on its secret takes to apply (up to 10 minutes, the docs
say: the node retries its fetch for 30)."""

from __future__ import annotations

import base64
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_tls as tls
from pulumi_azure_native import (
    authorization,
    compute,
    devtestlab,
    keyvault,
    managedidentity,
    network,
    resources,
    storage,
)

from sortie.infra.azure.facts import AZURE_CONTAINER_ID, AZURE_TORCH
from sortie.infra.azure.names import (
    BLOB_DATA_CONTRIBUTOR,
    BLOB_DATA_READER,
    image_reference,
    key_vault_name,
    role_definition_id,
    storage_account_name,
)
from sortie.infra.outputs import cluster_outputs, node_cloud_init, node_output, ssh_keys
from sortie.infra.parts import BUCKET, NETWORK, NODE, NODE_ACCESS, Part, node_part_name
from sortie.infra.spec import ClusterSpec, SpecError

SSH_USER = "sortie"
WORKDIR = "/home/sortie/sortie"
VENV = "/opt/sortie/venv"  # built by cloud-init: the HPC image has no PyTorch
PYTHONS = (f"{VENV}/bin/python3",)  # the probe links it once the setup has built it
VNET_CIDR, SUBNET_CIDR = "10.42.0.0/16", "10.42.0.0/18"
CONTAINER = "sortie"
# The HPC images configure IPoIB: NCCL's bootstrap and socket transport, and gloo, would pick an
# `ib*` interface first. Microsoft's NCCL examples pin them to the VM's Ethernet.
SOCKET_ON_ETH0 = {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}
KEY_VAULT_SECRETS_USER = "4633458b-17de-408a-b874-0445c86b69e6"
# What fetches the node's host key at boot (its source is written to the node as it is).
HOST_KEY_FETCHER = ("/opt/sortie/azure_host_key.py",
                    Path(__file__).with_name("host_key.py").read_text())
VAULT_RETENTION_DAYS = 7  # the least Azure takes; teardown purges the vault anyway
# NSG priorities: lower wins. The deny rule sits last among ours, still ahead of Azure's defaults
# (AllowVnetInBound at 65000 would otherwise admit anything from the virtual network).
SSH_PRIORITY, INTRA_PRIORITY, DENY_PRIORITY = 100, 1000, 4096


def python_setup_script(gpu_model: str) -> str:
    """The node's trainer environment, PyTorch pinned (`AZURE_TORCH`). V100 needs a CUDA 12.6
    build: PyTorch's builds for CUDA 12.8 and later dropped sm_70."""
    index = "cu126" if gpu_model == "V100" else "cu128"
    return ("#!/bin/bash\nset -euo pipefail\n"
            # The image's own first-boot updates may hold the package lock for minutes.
            "apt-get -o DPkg::Lock::Timeout=600 update -q\n"
            "DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "
            "python3-venv\n"
            f"python3 -m venv {VENV}\n"
            f"{VENV}/bin/pip install -q --index-url https://download.pytorch.org/whl/{index} "
            f"torch=={AZURE_TORCH}\n"
            f"{VENV}/bin/pip install -q numpy fsspec adlfs\n")


@dataclass(frozen=True)
class NodeLayout:
    """How a cluster's VMs are grouped, which decides whether InfiniBand joins them."""

    kind: str  # "one VM", "availability set", "stand-alone VMs"
    infiniband: bool  # between the nodes
    why: str


def node_layout(spec: ClusterSpec) -> NodeLayout:
    """The layout a spec gets (see the top)."""
    if spec.nodes == 1:
        return NodeLayout("one VM", False, "a single node")
    if any(spec.is_spot(index) for index in range(spec.nodes)):
        return NodeLayout("stand-alone VMs", False, (
            "Spot VMs cannot join an availability set, and a Uniform scale set would give up "
            "each node's own identity and host key: NCCL over TCP (NCCL_IB_DISABLE=1); "
            "spot: false gets InfiniBand"))
    zone = f"; zone {spec.zone} not used (an availability set takes none)" if spec.zone else ""
    return NodeLayout("availability set", True, "one availability set in a proximity placement "
                      f"group: its VMs share an InfiniBand partition{zone}")


def interconnect(spec: ClusterSpec) -> str:
    """Between the nodes, in words, for `sortie plan`."""
    layout = node_layout(spec)
    if spec.nodes == 1:
        return "none (a single node)"
    return f"{'InfiniBand' if layout.infiniband else 'TCP'} ({layout.why})"


class AzureGpuCluster(pulumi.ComponentResource):
    """One sortie's Azure cluster. `outputs` has the cloud-neutral shape of `infra.outputs`."""

    def __init__(self, name: str, spec: ClusterSpec,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("sortie:azure:GpuCluster", name, None, opts)
        self.spec = spec
        self.tags = spec.sortie_tags()
        self._child = pulumi.ResourceOptions(parent=self)
        group = resources.ResourceGroup(f"{name}-rg", resource_group_name=f"sortie-{spec.cluster}",
                                        location=spec.region, tags=self.tags, opts=self._child)
        # Every resource below lives in the cluster's group and region.
        self._in_group = {"resource_group_name": group.name, "location": spec.region}

        subnet = self._network(name)
        bucket_url, bucket_scope = self._storage(name, group)
        client_key, host_keys = ssh_keys(name, spec.nodes, self)
        identities, vault = self._node_access(name, bucket_scope, client_key)
        placement = compute.ProximityPlacementGroup(
            f"{name}-placement", proximity_placement_group_type="Standard", tags=self.tags,
            opts=self._child, **self._in_group)
        self.layout = node_layout(spec)
        availability_set = None
        if self.layout.infiniband:  # InfiniBand spans the VMs of one availability set
            availability_set = compute.AvailabilitySet(
                f"{name}-availability-set", availability_set_name=f"sortie-{spec.cluster}",
                platform_fault_domain_count=1, platform_update_domain_count=1,
                sku={"name": "Aligned"},  # managed disks
                proximity_placement_group={"id": placement.id}, tags=self.tags,
                opts=self._child, **self._in_group)
        nodes = [self._node(name, i, subnet, identities[i], vault, placement, availability_set,
                            client_key, host_keys[i]) for i in range(spec.nodes)]

        # Shared-key access is off on the account: the nodes' checkpoint writes (adlfs) sign in
        # with Entra ID as the node's identity, never anonymously. A VM with one user-assigned
        # identity gets its tokens without naming it, so one environment serves every node.
        self.outputs = cluster_outputs(
            spec, nodes, ssh_user=SSH_USER, workdir=WORKDIR,
            bucket_url=bucket_url, client_key=client_key,
            train_env={"AZURE_STORAGE_ANON": "false", **SOCKET_ON_ETH0,
                       **({"NCCL_IB_DISABLE": "1"} if spec.nodes > 1 and
                          not self.layout.infiniband else {})})
        self.register_outputs(self.outputs)

    def _node_access(self, name: str, bucket_scope: pulumi.Input[str],
                     client_key: tls.PrivateKey
                     ) -> tuple[list[managedidentity.UserAssignedIdentity], keyvault.Vault]:
        """An identity per node, each with blob data access on this cluster's storage only, and
        the vault of the nodes' host keys (each node is granted its own key with the node)."""
        spec, part = self.spec, Part(self, "azure", NODE_ACCESS, f"{name}-node-access")
        identities = []
        for index in range(spec.nodes):
            node_name = f"node-{index}"
            identity = managedidentity.UserAssignedIdentity(
                f"{name}-{node_name}-identity", resource_name_=f"sortie-{spec.cluster}-{node_name}",
                tags={**self.tags, "sortie-node": node_name}, opts=part.child, **self._in_group)
            self._grant(f"{name}-{node_name}-blob-access", identity, bucket_scope,
                        BLOB_DATA_CONTRIBUTOR, f"sortie {spec.cluster} {node_name}: read and "
                        "write results", part.child)
            identities.append(identity)
        tenant = authorization.get_client_config_output(
            opts=pulumi.InvokeOutputOptions(parent=part)).tenant_id
        vault = keyvault.Vault(
            f"{name}-vault", vault_name=client_key.public_key_openssh.apply(
                lambda key: key_vault_name(spec.cluster, key)),
            properties={"tenant_id": tenant, "sku": {"family": "A", "name": "standard"},
                        "enable_rbac_authorization": True,  # roles decide who reads what
                        "soft_delete_retention_in_days": VAULT_RETENTION_DAYS,
                        "enabled_for_deployment": False,
                        "enabled_for_template_deployment": False},
            tags=self.tags, opts=part.child, **self._in_group)
        part.done({"client_ids": [identity.client_id for identity in identities],
                   "vault": vault.name})
        return identities, vault

    def _grant(self, name: str, identity: managedidentity.UserAssignedIdentity,
               scope: pulumi.Input[str], role: str, description: str,
               opts: pulumi.ResourceOptions) -> authorization.RoleAssignment:
        # principal_type set: Azure need not look up a principal that may not have replicated.
        return authorization.RoleAssignment(
            name, principal_id=identity.principal_id, principal_type="ServicePrincipal",
            scope=scope, role_definition_id=pulumi.Output.from_input(scope).apply(
                lambda at: role_definition_id(at, role)),
            description=description, opts=opts)

    def _network(self, name: str) -> network.Subnet:
        part = Part(self, "azure", NETWORK, f"{name}-network")
        child, group_name = part.child, self._in_group["resource_group_name"]
        vnet = network.VirtualNetwork(f"{name}-vnet", tags=self.tags, opts=child,
                                      address_space={"address_prefixes": [VNET_CIDR]},
                                      **self._in_group)
        nsg = network.NetworkSecurityGroup(f"{name}-nsg", tags=self.tags, opts=child,
                                           **self._in_group)

        def rule(rule_name: str, priority: int, access: str, protocol: str, source: str,
                 destination: str, ports: str, description: str) -> None:
            network.SecurityRule(
                f"{name}-{rule_name}", resource_group_name=group_name,
                network_security_group_name=nsg.name, priority=priority, direction="Inbound",
                access=access, protocol=protocol, source_address_prefix=source,
                source_port_range="*", destination_address_prefix=destination,
                destination_port_range=ports, description=description, opts=child)

        for i, cidr in enumerate(self.spec.ssh_allowed_cidrs):
            rule(f"ssh-{i}", SSH_PRIORITY + i, "Allow", "Tcp", cidr, "*", "22",
                 "SSH from an allowed network")
        rule("intra-cluster", INTRA_PRIORITY, "Allow", "*", SUBNET_CIDR, SUBNET_CIDR, "*",
             "all traffic among cluster nodes (NCCL)")
        rule("deny-inbound", DENY_PRIORITY, "Deny", "*", "*", "*", "*",
             "nothing else inbound, ahead of Azure's default allow rules")
        subnet = network.Subnet(f"{name}-subnet", resource_group_name=group_name,
                                virtual_network_name=vnet.name, address_prefix=SUBNET_CIDR,
                                network_security_group={"id": nsg.id}, opts=child)
        part.done({"subnet_id": subnet.id})
        return subnet

    def _storage(self, name: str, group: resources.ResourceGroup
                 ) -> tuple[pulumi.Output[str], pulumi.Input[str]]:
        """The results bucket's URL and the scope the nodes' role is granted on."""
        spec, group_name = self.spec, self._in_group["resource_group_name"]
        if spec.bucket_name:  # an existing container: not ours, no settings are changed on it
            found = AZURE_CONTAINER_ID.fullmatch(spec.bucket_name)
            if found is None:  # (the spec checked it: `facts.check_bucket_name`)
                raise SpecError(f"bucketName: {spec.bucket_name!r} is not a container's ID")
            existing = f"az://{found['container']}@{found['account']}.blob.core.windows.net"
            return pulumi.Output.from_input(existing), spec.bucket_name
        part = Part(self, "azure", BUCKET, f"{name}-bucket")
        child = part.child
        account = storage.StorageAccount(
            f"{name}-storage", account_name=group.id.apply(
                lambda group_id: storage_account_name(spec.cluster, group_id)),
            kind="StorageV2", sku={"name": "Standard_LRS"}, allow_blob_public_access=False,
            minimum_tls_version="TLS1_2", enable_https_traffic_only=True,
            allow_shared_key_access=False,  # account keys and SAS off: Entra ID only
            tags=self.tags, opts=child, **self._in_group)
        on_account = {"resource_group_name": group_name, "account_name": account.name}
        storage.BlobServiceProperties(f"{name}-blob-versioning", blob_services_name="default",
                                      is_versioning_enabled=True, opts=child, **on_account)
        storage.BlobContainer(f"{name}-container", container_name=CONTAINER,
                              public_access="None", opts=child, **on_account)
        days = spec.bucket_expiry_days
        storage.ManagementPolicy(
            f"{name}-expiry", management_policy_name="default", opts=child, **on_account,
            policy={"rules": [{
                "name": "sortie-expiry", "enabled": True, "type": "Lifecycle",
                "definition": {
                    "filters": {"blob_types": ["blockBlob"]},
                    "actions": {
                        "base_blob": {"delete": {"days_after_modification_greater_than": days}},
                        "version": {"delete": {"days_after_creation_greater_than": days}}}}}]})
        # Whoever runs the program gets read access to the blobs: an account without shared
        # keys gives its creator no data access ("you must explicitly assign yourself an Azure
        # role"), and the controller collects the results with the deployer's own credential.
        deployer = authorization.get_client_config_output(
            opts=pulumi.InvokeOutputOptions(parent=part)).object_id
        authorization.RoleAssignment(
            f"{name}-deployer-blob-read", principal_id=deployer, scope=account.id,
            role_definition_id=account.id.apply(lambda at: role_definition_id(at,
                                                                               BLOB_DATA_READER)),
            description=f"sortie {spec.cluster}: the deployer collects the results", opts=child)
        url = pulumi.Output.concat("az://", CONTAINER, "@", account.name, ".blob.core.windows.net")
        part.done({"url": url})
        return url, account.id

    def _node(self, name: str, index: int, subnet: network.Subnet,
              identity: managedidentity.UserAssignedIdentity, vault: keyvault.Vault,
              placement: compute.ProximityPlacementGroup,
              availability_set: compute.AvailabilitySet | None, client_key: tls.PrivateKey,
              host_key: tls.PrivateKey) -> pulumi.Output[dict[str, Any]]:
        spec, node_name = self.spec, f"node-{index}"
        part = Part(self, "azure", NODE, node_part_name(name, node_name))
        child = part.child
        vm_name = f"{spec.cluster}-{node_name}"
        tags = {**self.tags, "sortie-node": node_name}
        zones = [spec.zone] if spec.zone and availability_set is None else None
        address = network.PublicIPAddress(
            f"{name}-{node_name}-ip", sku={"name": "Standard"}, zones=zones,
            public_ip_allocation_method="Static", tags=tags, opts=child, **self._in_group)
        nic = network.NetworkInterface(
            f"{name}-{node_name}-nic", enable_accelerated_networking=True, tags=tags, opts=child,
            ip_configurations=[{"name": "primary", "primary": True, "subnet": {"id": subnet.id},
                                "private_ip_allocation_method": "Dynamic",
                                "public_ip_address": {"id": address.id}}],
            **self._in_group)
        setup = ("/opt/sortie/setup-python.sh", python_setup_script(spec.instance.gpu_model))
        fetch, key_ready = self._host_key_secret(name, node_name, part, identity, vault, host_key)
        custom_data = node_cloud_init(host_key, fetch, spec, PYTHONS,
                                      (HOST_KEY_FETCHER, setup), (("bash", setup[0]),)).apply(
            lambda text: base64.b64encode(text.encode()).decode())
        spot = spec.is_spot(index)
        vm = compute.VirtualMachine(
            f"{name}-{node_name}", vm_name=vm_name,
            hardware_profile={"vm_size": spec.instance_type},
            storage_profile={
                "image_reference": image_reference(spec.image or spec.instance.image),
                "os_disk": {"create_option": "FromImage", "delete_option": "Delete",
                            "disk_size_gb": spec.root_volume_gb,
                            "managed_disk": {"storage_account_type": "Premium_LRS"}}},
            os_profile={
                "computer_name": vm_name, "admin_username": SSH_USER, "custom_data": custom_data,
                "linux_configuration": {
                    "disable_password_authentication": True,
                    "ssh": {"public_keys": [{
                        "path": f"/home/{SSH_USER}/.ssh/authorized_keys",
                        "key_data": client_key.public_key_openssh}]}}},
            network_profile={"network_interfaces": [{"id": nic.id, "primary": True,
                                                     "delete_option": "Delete"}]},
            identity={"type": "UserAssigned", "user_assigned_identities": [identity.id]},
            proximity_placement_group={"id": placement.id}, zones=zones,
            # Joined at creation (a VM cannot join later): a replacement joins it too.
            availability_set={"id": availability_set.id} if availability_set else None,
            priority="Spot" if spot else "Regular",
            eviction_policy="Delete" if spot else None,
            # -1: pay up to the on-demand price, never evicted for price.
            billing_profile={"max_price": spec.spot_max_price or -1} if spot else None,
            tags=tags, opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
                delete_before_replace=True, depends_on=key_ready)),  # vm_name is fixed
            **self._in_group)
        self._auto_shutdown(part, name, node_name, vm_name, vm, tags)
        node = node_output(node_name, address.ip_address,
                           nic.ip_configurations.apply(lambda c: c[0].private_ip_address),
                           host_key, spot=spot)
        part.done({"node": node})
        return node

    def _host_key_secret(self, name: str, node_name: str, part: Part,
                         identity: managedidentity.UserAssignedIdentity, vault: keyvault.Vault,
                         host_key: tls.PrivateKey
                         ) -> tuple[pulumi.Output[str], list[pulumi.Resource]]:
        """The node's host private key as a vault secret only its own identity may read: the
        command that fetches it at boot, and what must exist before the node."""
        value: pulumi.Output[str] = pulumi.Output.secret(host_key.private_key_openssh)
        secret = keyvault.Secret(
            f"{name}-{node_name}-host-key", secret_name=f"host-key-{node_name}",
            vault_name=vault.name, resource_group_name=self._in_group["resource_group_name"],
            properties={"value": value,
                        "content_type": "OpenSSH private key"},
            tags={**self.tags, "sortie-node": node_name}, opts=pulumi.ResourceOptions.merge(
                part.child, pulumi.ResourceOptions(retain_on_delete=True)))  # see the top
        grant = self._grant(f"{name}-{node_name}-host-key-access", identity, secret.id,
                            KEY_VAULT_SECRETS_USER, f"sortie {self.spec.cluster} {node_name}: "
                            "its own SSH host key", part.child)
        fetch = pulumi.Output.all(vault.properties.vault_uri, identity.client_id).apply(
            lambda v: "python3 " + shlex.join([HOST_KEY_FETCHER[0], v[0],
                                               f"host-key-{node_name}", v[1]]))
        return fetch, [secret, grant]

    def _auto_shutdown(self, part: Part, name: str, node_name: str, vm_name: str,
                       vm: compute.VirtualMachine, tags: dict[str, str]) -> None:
        """Deallocate the VM at the expiry time (second safety net, beside the TTL timer)."""
        spec = self.spec
        if spec.expires_at is None:  # (the spec keeps the TTL within the daily schedule)
            return
        devtestlab.GlobalSchedule(
            f"{name}-{node_name}-auto-shutdown", name=f"shutdown-computevm-{vm_name}",
            task_type="ComputeVmShutdownTask", status="Enabled", target_resource_id=vm.id,
            daily_recurrence={"time": spec.expires_at.strftime("%H%M")}, time_zone_id="UTC",
            notification_settings={"status": "Disabled"}, tags=tags, opts=part.child,
            **self._in_group)
