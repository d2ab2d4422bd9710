"""Everything sortie's controller knows about Azure: preemption notice lead time,
credentials, the resource providers a subscription must have registered, the bucket (a storage
account in the cluster's resource group), and the sweep that proves a teardown: Resource
Manager, resources and resource groups by tag, and Key Vault's deleted vaults.

A deleted Key Vault is kept, secrets and all, for its retention days and keeps its name taken:
the nodes' host keys would outlive the cluster. Teardown purges the cluster's deleted vaults
(`purge_deleted_vaults`), and the sweep counts any it finds as a leftover.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
from pathlib import Path
from typing import Any

from sortie.infra.azure.facts import AZURE_TORCH
from sortie.infra.cloud_home import Cloud, Leftover, SshWait, SweepUnavailable
from sortie.infra.spec import TAG_CLUSTER, ClusterSpec


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


def _credential() -> Any:
    from azure.identity import ClientSecretCredential, DefaultAzureCredential

    env = os.environ
    # The Pulumi provider's ARM_* service principal, which DefaultAzureCredential does not read.
    if env.get("ARM_CLIENT_ID") and env.get("ARM_CLIENT_SECRET") and env.get("ARM_TENANT_ID"):
        return ClientSecretCredential(env["ARM_TENANT_ID"], env["ARM_CLIENT_ID"],
                                      env["ARM_CLIENT_SECRET"])
    return DefaultAzureCredential()


def azure_client(subscription_id: str) -> Any:
    from azure.mgmt.resource.resources import ResourceManagementClient

    return ResourceManagementClient(_credential(), subscription_id)


def key_vault_client(subscription_id: str) -> Any:
    from azure.mgmt.keyvault import KeyVaultManagementClient

    return KeyVaultManagementClient(_credential(), subscription_id)


def _azure_kind(resource_type: str) -> str:
    """"Microsoft.Compute/virtualMachines" -> "compute:virtualMachines"."""
    namespace, _, rest = resource_type.partition("/")
    return f"{namespace.rsplit('.', 1)[-1].lower()}:{rest}"


def deleted_vaults(cluster: str, vaults: Any, tag: tuple[str, str] | None = None) -> list[Any]:
    """The deleted (kept) Key Vaults that were the sortie's, by their tags (``tag``: its
    `sortie-id`; default `sortie-cluster=<cluster>`)."""
    key, value = tag or (TAG_CLUSTER, cluster)
    return [vault for vault in vaults.vaults.list_deleted()
            if ((vault.properties and vault.properties.tags) or {}).get(key) == value]


def purge_deleted_vaults(cluster: str, subscription_id: str, vaults: Any = None,
                         tag: tuple[str, str] | None = None) -> None:
    """Remove for good the sortie's deleted Key Vaults (the program never enables purge
    protection, which would forbid it)."""
    vaults = vaults or key_vault_client(subscription_id)
    for vault in deleted_vaults(cluster, vaults, tag):
        vaults.vaults.begin_purge_deleted(vault.name, vault.properties.location).result()


def azure_leftovers(cluster: str, subscription_id: str, client: Any = None,
                    vaults: Any = None, tag: tuple[str, str] | None = None) -> list[Leftover]:
    """Every Azure resource and resource group tagged with ``tag`` (the sortie's `sortie-id`;
    default `sortie-cluster=<cluster>`), and every deleted Key Vault that was the sortie's."""
    client = client or azure_client(subscription_id)
    vaults = vaults or key_vault_client(subscription_id)
    key, value = tag or (TAG_CLUSTER, cluster)
    tagged = f"tagName eq '{key}' and tagValue eq '{value}'"
    groups = [Leftover("resources:resourceGroups", group.id,
                       f"az group delete --name {group.name} --yes")
              for group in client.resource_groups.list(filter=tagged)]
    resources = [Leftover(_azure_kind(resource.type), resource.id,
                          f"az resource delete --ids {resource.id}")
                 for resource in client.resources.list(filter=tagged)]
    kept = [Leftover("keyvault:deletedVaults", vault.id, f"az keyvault purge --name "
                     f"{vault.name} --location {vault.properties.location}")
            for vault in deleted_vaults(cluster, vaults, tag)]
    return groups + resources + kept


AZURE_COMPUTE_API = "2024-07-01"
AZURE_STOPPED = ("PowerState/stopped", "PowerState/deallocated")


def azure_running(cluster: str, subscription_id: str, client: Any = None,
                  tag: tuple[str, str] | None = None) -> list[str]:
    """The sortie's virtual machines (by tag) whose instance view is not stopped: an in-guest
    power-off leaves a VM `PowerState/stopped`, still billed until deallocated or deleted."""
    from azure.core.rest import HttpRequest

    client = client or azure_client(subscription_id)
    key, value = tag or (TAG_CLUSTER, cluster)
    tagged = f"tagName eq '{key}' and tagValue eq '{value}'"
    running = []
    for resource in client.resources.list(filter=tagged):
        if resource.type != "Microsoft.Compute/virtualMachines":
            continue
        response = client.send_request(HttpRequest(
            "GET", f"{resource.id}/instanceView?api-version={AZURE_COMPUTE_API}"))
        if response.status_code != 200:
            raise SweepUnavailable(f"{resource.id}/instanceView: HTTP {response.status_code}")
        codes = {status.get("code") for status in response.json().get("statuses", [])}
        if not codes & set(AZURE_STOPPED):
            running.append(resource.id)
    return running


# The resource providers the program's resources belong to: azure-native does not register them,
# and `pulumi up` fails half-way on one that is not (`MissingSubscriptionRegistration`).
AZURE_PROVIDERS = ("Microsoft.Compute", "Microsoft.Network", "Microsoft.Storage",
                   "Microsoft.ManagedIdentity", "Microsoft.DevTestLab", "Microsoft.KeyVault")


def unregistered_providers(subscription_id: str, client: Any = None) -> list[str]:
    """The providers of `AZURE_PROVIDERS` the subscription has not registered."""
    client = client or azure_client(subscription_id)
    return [namespace for namespace in AZURE_PROVIDERS
            if (client.providers.get(namespace).registration_state or "").lower()
            != "registered"]


# The program assigns each node identity its roles (blob data, its own host key): the deployer
# needs this action (Owner, or User Access Administrator), or `pulumi up` fails half-way.
ROLE_ASSIGNMENT_WRITE = "Microsoft.Authorization/roleAssignments/write"


def caller_permissions(subscription_id: str, client: Any = None) -> list[dict[str, Any]]:
    """What the signed-in identity may do in the subscription (Resource Manager's
    `permissions` call: one entry per role it holds there, actions and notActions)."""
    from azure.core.rest import HttpRequest

    client = client or azure_client(subscription_id)
    response = client.send_request(HttpRequest(
        "GET", f"/subscriptions/{subscription_id}/providers/Microsoft.Authorization/permissions",
        params={"api-version": "2022-04-01"}))
    if response.status_code != 200:
        raise SweepUnavailable(f"permissions: HTTP {response.status_code}")
    return response.json().get("value", [])


def allows(permissions: list[dict[str, Any]], action: str) -> bool:
    """Azure's rule: some role's actions match ``action`` (wildcards, any case) and that
    role's notActions do not take it back."""
    wanted = action.lower()

    def matches(patterns: list[str]) -> bool:
        return any(fnmatch.fnmatchcase(wanted, pattern.lower()) for pattern in patterns)

    return any(matches(role.get("actions", [])) and not matches(role.get("notActions", []))
               for role in permissions)


def azure_preflight(spec: ClusterSpec, client: Any = None) -> list[str]:
    """What the subscription lacks for the program, each with the command that fixes it. A
    check that cannot ask is passed over."""
    subscription = azure_subscription()
    problems = [f"resource provider {namespace} is not registered in subscription "
                f"{subscription} (run `az provider register --namespace {namespace}`)"
                for namespace in unregistered_providers(subscription, client)]
    with contextlib.suppress(SweepUnavailable):
        if not allows(caller_permissions(subscription, client), ROLE_ASSIGNMENT_WRITE):
            problems.append(f"the signed-in identity may not assign roles in subscription "
                            f"{subscription} ({ROLE_ASSIGNMENT_WRITE}: Owner, or User Access "
                            "Administrator), which the program does for each node's identity")
    return problems


def has_credentials() -> bool:
    env = os.environ
    return bool(env.get("ARM_CLIENT_ID") and (env.get("ARM_CLIENT_SECRET")
                                              or env.get("ARM_USE_MSI")
                                              or env.get("ARM_USE_OIDC"))) or \
        (Path.home() / ".azure" / "azureProfile.json").is_file()


def blob_storage_options() -> dict[str, Any]:
    """adlfs's credential, the one Pulumi's provider uses: adlfs's default chain reads
    AZURE_CLIENT_*, not Pulumi's ARM_CLIENT_*, and would read the results as someone else (or
    no one). Without ARM_ settings, adlfs's own chain (`az login`) is what Pulumi used too."""
    env = os.environ
    if env.get("ARM_CLIENT_ID") and env.get("ARM_CLIENT_SECRET") and env.get("ARM_TENANT_ID"):
        from azure.identity import ClientSecretCredential

        return {"credential": ClientSecretCredential(env["ARM_TENANT_ID"], env["ARM_CLIENT_ID"],
                                                     env["ARM_CLIENT_SECRET"])}
    if env.get("ARM_USE_MSI"):
        from azure.identity import ManagedIdentityCredential

        return {"credential": ManagedIdentityCredential(client_id=env.get("ARM_CLIENT_ID"))}
    return {}


CLOUD = Cloud(
    name="azure", preemption_notice_s=45.0, machine_type="azure-native:compute:VirtualMachine",
    ssh_wait=SshWait(1800, "boot, the host key from Key Vault (a role assignment applies in up "
                           "to 10 min)",
                     first_boot=f"PyTorch {AZURE_TORCH} installed on each node (about 3 GB: "
                                "minutes)"),
    bucket_kinds=("storage:storageAccounts", "resources:resourceGroups"),
    has_credentials=has_credentials,
    credentials_hint="no Azure credentials (set ARM_CLIENT_ID, ARM_CLIENT_SECRET, "
                     "ARM_TENANT_ID and ARM_SUBSCRIPTION_ID, or run `az login`)",
    leftovers=lambda spec: azure_leftovers(spec.cluster, azure_subscription(),
                                           tag=spec.sweep_tag),
    running_machines=lambda spec: azure_running(spec.cluster, azure_subscription(),
                                                tag=spec.sweep_tag),
    # The deployer's read role on a new account applies within minutes, as the nodes' do.
    storage_options=blob_storage_options, bucket_grant_s=600.0,
    purge_deleted=lambda spec: purge_deleted_vaults(spec.cluster, azure_subscription(),
                                                    tag=spec.sweep_tag),
    preflight=azure_preflight)
