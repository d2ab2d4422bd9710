"""Azure in a rehearsal (`infra/cloud_rehearsal.py`): a VM's `customData`, the image's side (user
`sortie`, made from `admin_username` and the key; the trainer's venv where the program's setup
builds it), and stand-ins for IMDS (`Metadata: true`; the user-assigned identity's token, by its
client id; Scheduled Events' `Preempt`, 30 s ahead) and Key Vault's `GET /secrets/NAME` (HTTPS,
the token as bearer: only the node's own secret)."""

from __future__ import annotations

import base64
import secrets
import urllib.parse

from sortie.infra.azure.program import SSH_USER, VENV
from sortie.infra.cloud_rehearsal import (
    Answer,
    Asked,
    CloudRehearsal,
    NodeSide,
    resource_named,
)
from sortie.infra.review import Evaluation

VM = "azure-native:compute:VirtualMachine"
VAULT = "azure-native:keyvault:Vault"
IDENTITY = "azure-native:managedidentity:UserAssignedIdentity"
NOTICE_S = 30.0  # Spot eviction: "a minimum of 30 seconds" (Scheduled Events)
VAULT_RESOURCE = "https://vault.azure.net"
GRANT_S = 600.0  # "up to 10 minutes" for a role assignment (Azure RBAC)


def _user_data(evaluation: Evaluation, node: str) -> str:
    vm = resource_named(evaluation, VM, f"{evaluation.spec.cluster}-{node}")
    return base64.b64decode(vm["osProfile"]["customData"]).decode()


def _vault_uri(evaluation: Evaluation) -> str:
    [vault] = evaluation.of_type(VAULT)
    return vault.state["properties"]["vaultUri"]


def _secret_id(evaluation: Evaluation, node: str) -> str:
    """The secret's path in its vault, as the fetcher asks for it."""
    return f"/secrets/host-key-{node}"


def _identity(evaluation: Evaluation, node: str) -> dict[str, str]:
    identity = resource_named(evaluation, IDENTITY, f"{evaluation.spec.cluster}-{node}-identity")
    return {"client_id": identity["clientId"],
            "vault_host": urllib.parse.urlparse(_vault_uri(evaluation)).hostname or ""}


def _metadata(asked: Asked, side: NodeSide) -> Answer:
    """Only with `Metadata: true` and never forwarded; a token for the node's own identity."""
    if asked.headers.get("metadata") != "true" or "x-forwarded-for" in asked.headers:
        return Answer.of_json(400, {"error": "bad_request"})
    path, _, query = asked.path.partition("?")
    asked_for = dict(urllib.parse.parse_qsl(query))
    if path == "/metadata/identity/oauth2/token":
        if asked_for.get("client_id") != side.identity["client_id"] or \
                asked_for.get("resource") != VAULT_RESOURCE:
            return Answer.of_json(400, {"error": "invalid_request",
                                        "error_description": "Identity not found"})
        token = "eyJ.rehearsal-" + secrets.token_urlsafe(24)
        side.tokens.add(token)
        return Answer.of_json(200, {"access_token": token, "expires_in": "86399",
                                    "resource": VAULT_RESOURCE, "token_type": "Bearer"})
    if path == "/metadata/instance/compute/name":  # what Scheduled Events' Resources name
        return Answer(200, side.node.encode())
    if path == "/metadata/instance/compute/vmSize":  # with `format=text`, as Azure's IMDS
        return Answer(200, side.instance_type.encode())
    if path == "/metadata/scheduledevents":
        events = [{"EventId": "rehearsal-1", "EventType": "Preempt", "ResourceType":
                   "VirtualMachine", "Resources": [side.node], "EventStatus": "Scheduled",
                   "NotBefore": ""}] if side.notice else []
        return Answer.of_json(200, {"DocumentIncarnation": int(side.notice), "Events": events})
    return Answer.of_json(404, {"error": "not_found"})


def _secret_store(asked: Asked, side: NodeSide) -> Answer:
    """The node's own secret in the vault, with its identity's token, once its role assignment
    is in effect (before: 403 Forbidden, as for up to 10 minutes on Azure)."""
    token = asked.headers.get("authorization", "").removeprefix("Bearer ")
    if token not in side.tokens:
        return Answer.of_json(401, {"error": {"code": "Unauthorized"}})
    path = asked.path.partition("?")[0]
    if path != side.secret_id or not side.grant_ready:
        return Answer.of_json(403, {"error": {"code": "Forbidden", "message": "Caller is not "
                                              "authorized to perform action on resource."}})
    return Answer.of_json(200, {"value": side.secret_value, "contentType": "OpenSSH private key",
                                "id": f"https://{side.identity['vault_host']}{path}/1"})


REHEARSAL = CloudRehearsal(
    cloud="azure", login_user=SSH_USER, python_home=VENV, notice_s=NOTICE_S, grant_s=GRANT_S,
    user_data=_user_data, secret_id=_secret_id, identity=_identity,
    hostnames=lambda evaluation: (urllib.parse.urlparse(_vault_uri(evaluation)).hostname or "",),
    metadata=_metadata, secret_store=_secret_store)
