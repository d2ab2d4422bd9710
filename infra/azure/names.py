"""Azure's names and ids for a cluster's resources: storage accounts and key vaults have global,
short names (a readable prefix and a hash), role assignments name a role by its definition id,
and an image is a Marketplace URN or an image resource id."""

from __future__ import annotations

import hashlib
import re

# Built-in roles, the same ids everywhere.
BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
# Storage Blob Data Reader (Azure built-in roles): what the controller needs to collect results.
BLOB_DATA_READER = "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1"


def image_reference(image: str) -> dict[str, str]:
    """A Marketplace URN (publisher:offer:sku:version) or an image resource id."""
    if image.startswith("/subscriptions/"):
        return {"id": image}
    publisher, offer, sku, version = image.split(":")
    return {"publisher": publisher, "offer": offer, "sku": sku, "version": version}


def storage_account_name(cluster: str, group_id: str) -> str:
    """Storage account names are global, 3-24 lowercase letters and digits: a readable prefix
    and a hash of the resource group's id (subscription + group), stable for the stack."""
    digest = hashlib.sha256(group_id.lower().encode()).hexdigest()[:10]
    return "sortie" + re.sub(r"[^a-z0-9]", "", cluster)[:8] + digest


def key_vault_name(cluster: str, seed: str) -> str:
    """Vault names are global, 3-24 letters, digits and dashes, and stay taken while a deleted
    vault is kept: a readable prefix and a hash of ``seed``, a key made once per stack, so
    that every sortie's vault has a name of its own."""
    digest = hashlib.sha256(seed.encode()).hexdigest()[:12]
    return "sortie" + re.sub(r"[^a-z0-9]", "", cluster)[:6] + digest


def role_definition_id(scope: str, role: str = BLOB_DATA_CONTRIBUTOR) -> str:
    """A built-in role's id in the subscription that holds `scope`."""
    subscription = scope.split("/")[2]
    return f"/subscriptions/{subscription}/providers/Microsoft.Authorization/roleDefinitions/{role}"
