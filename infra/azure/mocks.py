"""What Azure computes for the program's resources and lookups, offline
(`infra/cloud_mocks.py`): ARM-shaped ids, names, addresses, identities."""

from __future__ import annotations

import uuid
from typing import Any

from sortie.infra.cloud_mocks import Addresses, CloudMocks

AZURE_SUBSCRIPTION = "00000000-0000-0000-0000-0000000ff11e"
AZURE_OFFLINE_TENANT = "00000000-0000-0000-0000-000000007e4a"
AZURE_OFFLINE_PRINCIPAL = "00000000-0000-0000-0000-0000000c11e4"
# Azure resources whose name is an input (the rest are auto-named from the Pulumi name).
AZURE_NAME_INPUTS = {"resources:ResourceGroup": "resourceGroupName",
                     "storage:StorageAccount": "accountName", "compute:VirtualMachine": "vmName",
                     "storage:BlobContainer": "containerName",
                     "compute:AvailabilitySet": "availabilitySetName",
                     "keyvault:Vault": "vaultName", "keyvault:Secret": "secretName"}


def new_resource(token: str, name: str, inputs: dict[str, Any], state: dict[str, Any],
                 addresses: Addresses) -> str | None:
    """Fill in what Azure computes; return an ARM-shaped resource id."""
    kind = token.split(":", 1)[1]
    if kind in AZURE_NAME_INPUTS:
        state["name"] = inputs[AZURE_NAME_INPUTS[kind]]
    state.setdefault("name", name)
    if kind == "network:PublicIPAddress":
        state["ipAddress"] = addresses.public_ip()
    elif kind == "network:NetworkInterface":
        state["ipConfigurations"] = [{**config, "privateIPAddress": addresses.private_ip()}
                                     for config in inputs.get("ipConfigurations", [])]
    elif kind == "managedidentity:UserAssignedIdentity":
        state["principalId"] = str(uuid.uuid5(uuid.NAMESPACE_URL, name))
        state["clientId"] = str(uuid.uuid5(uuid.NAMESPACE_DNS, name))
    elif kind == "compute:VirtualMachine" and "identity" in inputs:
        # In v3 the identities go in as a list of ids and come back as a map by id.
        identity = inputs["identity"]
        state["identity"] = {**identity, "userAssignedIdentities": {
            i: {} for i in identity.get("userAssignedIdentities", [])}}
    elif kind == "keyvault:Vault":
        state["properties"] = {**inputs["properties"],
                               "vaultUri": f"https://{state['name']}.vault.azure.net/"}
    subscription = f"/subscriptions/{AZURE_SUBSCRIPTION}"
    if kind == "resources:ResourceGroup":
        return f"{subscription}/resourceGroups/{state['name']}"
    if kind == "keyvault:Secret":  # a child of its vault
        return (f"{subscription}/resourceGroups/{inputs['resourceGroupName']}/providers/"
                f"Microsoft.KeyVault/vaults/{inputs['vaultName']}/secrets/{state['name']}")
    module, cls = kind.split(":")
    return (f"{subscription}/resourceGroups/{inputs.get('resourceGroupName', 'none')}/"
            f"providers/Microsoft.{module}/{cls[0].lower()}{cls[1:]}s/{state['name']}")


def call(token: str, args: dict[str, Any]) -> dict[str, Any] | None:
    if token == "azure-native:authorization:getClientConfig":
        return {"clientId": AZURE_OFFLINE_PRINCIPAL, "objectId": AZURE_OFFLINE_PRINCIPAL,
                "subscriptionId": AZURE_SUBSCRIPTION, "tenantId": AZURE_OFFLINE_TENANT}
    return None


MOCKS = CloudMocks(provider="azure-native", new_resource=new_resource, call=call)
