"""How an Azure cluster's declared resources read to a reviewer (`sortie plan`): who reaches SSH,
whether the bucket is private, where the host keys live and who may read them."""

from __future__ import annotations

import base64
from typing import Any

from sortie.infra.azure.program import BLOB_DATA_CONTRIBUTOR, KEY_VAULT_SECRETS_USER
from sortie.infra.review import Evaluation, SecuritySummary


def security_summary(evaluation: Evaluation) -> SecuritySummary:
    """Read the security posture back from what the program declared (not from the spec)."""
    rules = [r.state for r in evaluation.of_type("azure-native:network:SecurityRule")
             if r.state["direction"] == "Inbound"]
    allowed = [r for r in rules if r["access"] == "Allow"]
    ssh_from = [r["sourceAddressPrefix"] for r in allowed
                if r["destinationPortRange"] in ("22", "*") and r["protocol"] in ("Tcp", "*")
                and r["sourceAddressPrefix"] != r["destinationAddressPrefix"]]
    intra = any(r["sourceAddressPrefix"] == r["destinationAddressPrefix"] != "*"
                and r["destinationPortRange"] == "*" for r in allowed)
    denied = any(r["access"] == "Deny" and r["sourceAddressPrefix"] == "*"
                 and r["destinationPortRange"] == "*" for r in rules)
    accounts = [a.state for a in evaluation.of_type("azure-native:storage:StorageAccount")]
    containers = [c.state for c in evaluation.of_type("azure-native:storage:BlobContainer")]
    versioning = [v.state for v in
                  evaluation.of_type("azure-native:storage:BlobServiceProperties")]
    grants = [g for g in evaluation.of_type("azure-native:authorization:RoleAssignment")
              if g.state["roleDefinitionId"].endswith(BLOB_DATA_CONTRIBUTOR)]
    vms = [v.state for v in evaluation.of_type("azure-native:compute:VirtualMachine")]
    no_password = all(v["osProfile"]["linuxConfiguration"]["disablePasswordAuthentication"]
                      for v in vms)
    schedules = evaluation.of_type("azure-native:devtestlab:GlobalSchedule")
    guarded = _keys_guarded(evaluation)
    return SecuritySummary(
        ssh_from=ssh_from, intra_cluster=intra, bucket_managed=bool(accounts),
        bucket_public=any(a.get("allowBlobPublicAccess") is not False for a in accounts)
        or any(c.get("publicAccess") != "None" for c in containers),
        bucket_encrypted=bool(accounts),  # Azure Storage encrypts every blob at rest, always
        bucket_versioned=bool(versioning) and all(v.get("isVersioningEnabled")
                                                  for v in versioning),
        bucket_tls_only=bool(accounts) and all(
            a.get("enableHttpsTrafficOnly") and a.get("minimumTlsVersion") == "TLS1_2"
            for a in accounts),
        details={"other inbound traffic": "denied" if denied else "NOT DENIED",
                 "password login": "disabled" if no_password else "ENABLED",
                 "node identities reach": ", ".join(sorted(
                     {f"Storage Blob Data Contributor on {g.state['scope'].rsplit('/', 1)[-1]}"
                      for g in grants}
                     | ({"each its own host key"} if guarded else set()))),
                 "shared-key access": "off" if accounts and all(
                     a.get("allowSharedKeyAccess") is False for a in accounts) else
                 "ON" if accounts else "n/a (existing container)",
                 "auto-shutdown (deallocate)": schedules[0].state["dailyRecurrence"]["time"]
                 + " UTC" if schedules else "NONE",
                 "host private keys": _where_host_keys_live(vms, guarded)})


def _keys_guarded(evaluation: Evaluation) -> bool:
    """An RBAC-only vault with one secret per node, each readable by one identity only: the
    one its own VM runs as."""
    vaults = [v.state for v in evaluation.of_type("azure-native:keyvault:Vault")]
    secrets = {s.id for s in evaluation.of_type("azure-native:keyvault:Secret")}
    principals = {i.id: i.state["principalId"] for i in
                  evaluation.of_type("azure-native:managedidentity:UserAssignedIdentity")}
    runs_as = [principals.get(identity, "") for vm in evaluation.of_type(
        "azure-native:compute:VirtualMachine")
               for identity in vm.state["identity"]["userAssignedIdentities"]]
    readers: dict[str, list[str]] = {}
    for grant in evaluation.of_type("azure-native:authorization:RoleAssignment"):
        if grant.state["roleDefinitionId"].endswith(KEY_VAULT_SECRETS_USER):
            readers.setdefault(grant.state["scope"], []).append(grant.state["principalId"])
    return (bool(vaults) and all(v["properties"].get("enableRbacAuthorization") for v in vaults)
            and set(readers) == secrets and len(secrets) == len(runs_as) == len(set(runs_as))
            and sorted(p for found in readers.values() for p in found) == sorted(runs_as))


def _where_host_keys_live(vms: list[dict[str, Any]], guarded: bool) -> str:
    if any(b"PRIVATE KEY" in base64.b64decode(vm["osProfile"]["customData"]) for vm in vms):
        return "IN CUSTOM DATA (readable by anyone who may read the VM)"
    if guarded:
        return ("Key Vault (RBAC), one secret per node, readable only by its node's own "
                "identity; the vault is purged at teardown")
    return "Key Vault, NOT limited to each node's own identity"
