"""What Google Cloud computes for the program's resources, offline (`infra/cloud_mocks.py`)."""

from __future__ import annotations

from typing import Any

from sortie.infra.cloud_mocks import Addresses, CloudMocks


def new_resource(token: str, name: str, inputs: dict[str, Any], state: dict[str, Any],
                 addresses: Addresses) -> str | None:
    if token == "gcp:compute/instance:Instance":
        state["networkInterfaces"] = [
            {**nic, "networkIp": addresses.private_ip(),
             "accessConfigs": [{**access, "natIp": addresses.public_ip()}
                               for access in nic.get("accessConfigs", [])]}
            for nic in inputs.get("networkInterfaces", [])]
    elif token == "gcp:serviceaccount/account:Account":
        state["email"] = f"{inputs['accountId']}@offline.iam.gserviceaccount.com"
        state["member"] = f"serviceAccount:{state['email']}"
    elif token == "gcp:secretmanager/secret:Secret":
        state.setdefault("project", "offline-project")  # the provider's default project
        state["name"] = f"projects/{state['project']}/secrets/{inputs['secretId']}"
        return state["name"]
    elif token == "gcp:storage/bucket:Bucket":
        state.setdefault("name", f"{name}-offline")  # Pulumi's auto-name
    elif token == "gcp:compute/resourcePolicy:ResourcePolicy":
        state["selfLink"] = f"https://compute.googleapis.com/offline/{name}"
    return None


MOCKS = CloudMocks(provider="gcp", new_resource=new_resource)
