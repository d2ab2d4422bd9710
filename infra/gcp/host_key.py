"""Runs on a GCP node at boot, under cloud-init, not on the controller: prints the node's SSH
host private key, read from Secret Manager as the node's own service account (a token from the
metadata server). Only the standard library: it needs no gcloud on root's PATH.

    python3 gcp_host_key.py PROJECT SECRET_ID [METADATA_TOKEN_URL [SECRET_MANAGER_URL]]

Any failure (the account's grant not yet in effect: 403) exits non-zero, and the caller retries.
"""

from __future__ import annotations

import base64
import json
import sys
import urllib.parse
import urllib.request

METADATA_TOKEN_URL = ("http://metadata.google.internal/computeMetadata/v1/instance/"
                      "service-accounts/default/token")
SECRET_MANAGER_URL = "https://secretmanager.googleapis.com/v1"


def _get_json(url: str, headers: dict[str, str]) -> dict:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - fixed URLs
        return json.load(response)


def host_private_key(project: str, secret_id: str, token_url: str = METADATA_TOKEN_URL,
                     secrets_url: str = SECRET_MANAGER_URL) -> str:
    token = _get_json(token_url, {"Metadata-Flavor": "Google"})["access_token"]
    version = (f"{secrets_url.rstrip('/')}/projects/{urllib.parse.quote(project)}/secrets/"
               f"{urllib.parse.quote(secret_id)}/versions/latest:access")
    payload = _get_json(version, {"Authorization": f"Bearer {token}"})["payload"]["data"]
    return base64.b64decode(payload).decode()


if __name__ == "__main__":
    print(host_private_key(*sys.argv[1:]))
