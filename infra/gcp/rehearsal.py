"""GCP in a rehearsal (`infra/cloud_rehearsal.py`): an instance's `user-data` metadata, the Deep
Learning VM's side (user `sortie`, made by the guest agent from `ssh-keys`; PyTorch in
/opt/conda), and stand-ins for the metadata server (`Metadata-Flavor: Google`; the service
account's token; `instance/preempted`, 30 s ahead) and Secret Manager's `versions/latest:access`
(HTTPS, the token as bearer: only the node's own secret)."""

from __future__ import annotations

import base64
import secrets

from sortie.infra.cloud_rehearsal import (
    Answer,
    Asked,
    CloudRehearsal,
    NodeSide,
    resource_named,
)
from sortie.infra.gcp.program import PYTHONS, SSH_USER
from sortie.infra.review import Evaluation

INSTANCE = "gcp:compute/instance:Instance"
SECRET = "gcp:secretmanager/secret:Secret"
METADATA = "/computeMetadata/v1/"
NOTICE_S = 30.0  # "Compute Engine sends a preemption notice ... 30 seconds"
# IAM access change propagation: "typically 2 minutes, potentially 7 minutes or longer"
GRANT_S = 120.0


def _user_data(evaluation: Evaluation, node: str) -> str:
    instance = resource_named(evaluation, INSTANCE, f"{evaluation.spec.cluster}-{node}")
    return instance["metadata"]["user-data"]


def _secret_id(evaluation: Evaluation, node: str) -> str:
    """``projects/P/secrets/S``: the path its fetcher asks for (project and secret id)."""
    secret = resource_named(evaluation, SECRET, f"{evaluation.spec.cluster}-{node}-host-key")
    return f"projects/{secret['project']}/secrets/{secret['secretId']}"


PROJECT_NUMBER = "123456789012"  # the project's number, in the paths GCP's metadata answers


def _metadata(asked: Asked, side: NodeSide) -> Answer:
    """Only with `Metadata-Flavor: Google`, and never a forwarded request (as GCP refuses)."""
    if asked.headers.get("metadata-flavor") != "Google" or "x-forwarded-for" in asked.headers:
        return Answer(403)
    path = asked.path.split("?")[0]
    if path == METADATA + "instance/preempted":
        return Answer(200, b"TRUE" if side.notice else b"FALSE")
    if path == METADATA + "instance/maintenance-event":  # no host maintenance is coming
        return Answer(200, b"NONE")
    if path == METADATA + "instance/service-accounts/default/token":
        token = "ya29.rehearsal-" + secrets.token_urlsafe(24)
        side.tokens.add(token)
        return Answer.of_json(200, {"access_token": token, "expires_in": 3599,
                                    "token_type": "Bearer"})
    if path == METADATA + "instance/id":
        return Answer(200, side.instance_id.encode())
    if path == METADATA + "instance/name":
        return Answer(200, side.node.encode())
    if path == METADATA + "instance/machine-type":  # the full path, as GCP answers it
        return Answer(200, f"projects/{PROJECT_NUMBER}/machineTypes/{side.instance_type}"
                      .encode())
    return Answer(404)


def _secret_store(asked: Asked, side: NodeSide) -> Answer:
    """The node's own secret, with a token its metadata server gave it, once its account's
    grant is in effect (before: 403 PERMISSION_DENIED, as while IAM propagates)."""
    token = asked.headers.get("authorization", "").removeprefix("Bearer ")
    if token not in side.tokens:
        return Answer.of_json(401, {"error": {"code": 401, "status": "UNAUTHENTICATED"}})
    wanted = f"/v1/{side.secret_id}/versions/latest:access"
    if asked.path != wanted or not side.grant_ready:
        return Answer.of_json(403, {"error": {
            "code": 403, "status": "PERMISSION_DENIED",
            "message": f"Permission 'secretmanager.versions.access' denied for {asked.path}"}})
    data = base64.b64encode(side.secret_value.encode()).decode()
    return Answer.of_json(200, {"name": f"{side.secret_id}/versions/1",
                                "payload": {"data": data}})


REHEARSAL = CloudRehearsal(
    cloud="gcp", login_user=SSH_USER, python_home=PYTHONS[0].rsplit("/bin/", 1)[0],
    notice_s=NOTICE_S, grant_s=GRANT_S, user_data=_user_data, secret_id=_secret_id,
    identity=lambda evaluation, node: {},
    hostnames=lambda evaluation: ("metadata.google.internal", "secretmanager.googleapis.com"),
    metadata=_metadata, secret_store=_secret_store)
