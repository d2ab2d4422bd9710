"""AWS in a rehearsal (`infra/cloud_rehearsal.py`): an EC2 instance's user data, the Deep Learning
AMI's side (user `ubuntu`, PyTorch in /opt/pytorch), and stand-ins for IMDSv2 (a session token
first; the instance role's credentials; the spot notice, 2 minutes ahead) and Secrets Manager's
GetSecretValue (JSON 1.1 over HTTPS, signed with the role's key: only the node's own secret)."""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime, timedelta

from sortie.infra.aws.program import PYTHONS, SSH_USER
from sortie.infra.cloud_rehearsal import (
    Answer,
    Asked,
    CloudRehearsal,
    NodeSide,
    resource_named,
)
from sortie.infra.review import Evaluation

INSTANCE = "aws:ec2/instance:Instance"
SECRET = "aws:secretsmanager/secret:Secret"
TOKEN_PATH = "/latest/api/token"
CREDENTIALS = "/latest/meta-data/iam/security-credentials/"
ROLE = "sortie-node"  # the name IMDS gives the instance profile's role
NOTICE_S = 120.0  # "two-minute warning" (EC2 Spot interruption notices)
JSON_11 = "application/x-amz-json-1.1"
GRANT_S = 10.0  # IAM is eventually consistent; no figure is documented: seconds, typically


def _user_data(evaluation: Evaluation, node: str) -> str:
    return resource_named(evaluation, INSTANCE, f"{evaluation.spec.cluster}-{node}")["userData"]


def _secret_id(evaluation: Evaluation, node: str) -> str:
    return resource_named(evaluation, SECRET, f"{evaluation.spec.cluster}-{node}-host-key")["arn"]


def _identity(evaluation: Evaluation, node: str) -> dict[str, str]:
    """The role's key id as IMDS hands it to this node (one per node: the secret store tells
    the nodes apart by it, as AWS does by `ec2:SourceInstanceARN`)."""
    return {"access_key_id": "ASIA" + secrets.token_hex(8).upper(),
            "secret_access_key": secrets.token_urlsafe(30)}


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _metadata(asked: Asked, side: NodeSide) -> Answer:
    """IMDSv2 only (the programs require tokens): a PUT for a token, then GETs that carry it."""
    if asked.method == "PUT":
        if asked.path != TOKEN_PATH or not asked.headers.get(
                "x-aws-ec2-metadata-token-ttl-seconds"):
            return Answer(400)
        token = secrets.token_urlsafe(24)
        side.tokens.add(token)
        return Answer(200, token.encode())
    if asked.headers.get("x-aws-ec2-metadata-token") not in side.tokens:
        return Answer(401)
    path = asked.path
    now = datetime.now(UTC)
    if path == "/latest/meta-data/spot/instance-action":
        if not side.notice:
            return Answer(404)
        return Answer.of_json(200, {"action": "terminate",
                                    "time": _iso(now + timedelta(seconds=NOTICE_S))})
    if path in (CREDENTIALS, CREDENTIALS.rstrip("/")):
        return Answer(200, ROLE.encode())
    if path == CREDENTIALS + ROLE:
        return Answer.of_json(200, {
            "Code": "Success", "LastUpdated": _iso(now), "Type": "AWS-HMAC",
            "AccessKeyId": side.identity["access_key_id"],
            "SecretAccessKey": side.identity["secret_access_key"],
            "Token": "rehearsal-session", "Expiration": _iso(now + timedelta(hours=6))})
    if path == "/latest/meta-data/instance-id":
        return Answer(200, side.instance_id.encode())
    if path == "/latest/meta-data/placement/region":
        return Answer(200, side.region.encode())
    if path == "/latest/meta-data/instance-type":
        return Answer(200, side.instance_type.encode())
    return Answer(404)


def _denied(message: str) -> Answer:
    return Answer.of_json(400, {"__type": "AccessDeniedException", "Message": message}, JSON_11)


def _secret_store(asked: Asked, side: NodeSide) -> Answer:
    """GetSecretValue, signed (SigV4) with the key IMDS gave this node; its own secret only,
    once the grant is in effect (before: AccessDenied, as while IAM propagates)."""
    if asked.headers.get("x-amz-target") != "secretsmanager.GetSecretValue":
        return Answer.of_json(400, {"__type": "UnknownOperationException"}, JSON_11)
    signed_by = asked.headers.get("authorization", "").partition("Credential=")[2].split("/")[0]
    if signed_by != side.identity["access_key_id"]:
        return Answer.of_json(400, {"__type": "UnrecognizedClientException",
                                    "Message": "The security token included in the request "
                                               "is invalid."}, JSON_11)
    asked_for = (asked.json() or {}).get("SecretId")
    if not side.grant_ready or asked_for != side.secret_id:
        return _denied(f"User: {ROLE}/{side.instance_id} is not authorized to perform: "
                       f"secretsmanager:GetSecretValue on resource: {asked_for}")
    return Answer.of_json(200, {
        "ARN": side.secret_id, "Name": side.secret_id.rsplit(":", 1)[-1],
        "SecretString": side.secret_value, "VersionId": "rehearsal",
        "VersionStages": ["AWSCURRENT"], "CreatedDate": time.time()}, JSON_11)


REHEARSAL = CloudRehearsal(
    cloud="aws", login_user=SSH_USER, python_home=PYTHONS[0].rsplit("/bin/", 1)[0],
    notice_s=NOTICE_S, grant_s=GRANT_S, user_data=_user_data, secret_id=_secret_id,
    identity=_identity,
    hostnames=lambda evaluation: (f"secretsmanager.{evaluation.spec.region}.amazonaws.com",),
    metadata=_metadata, secret_store=_secret_store)
