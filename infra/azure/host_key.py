"""Runs on an Azure node at boot, under cloud-init, not on the controller: prints the node's SSH
host private key, read from Key Vault as the node's own managed identity (a token from the
instance metadata service, IMDS). Only the standard library: it runs on the bare image.

    python3 azure_host_key.py VAULT_URI SECRET_NAME CLIENT_ID [IMDS_TOKEN_URL]

Any failure (the identity's role not yet in effect: 403) exits non-zero, and the caller retries.
"""

from __future__ import annotations

import json
import sys
import urllib.parse
import urllib.request

IMDS_TOKEN_URL = "http://169.254.169.254/metadata/identity/oauth2/token"
VAULT_RESOURCE = "https://vault.azure.net"
VAULT_API = "7.4"


def _get_json(url: str, headers: dict[str, str]) -> dict:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - fixed URLs
        return json.load(response)


def host_private_key(vault_uri: str, secret_name: str, client_id: str,
                     imds_token_url: str = IMDS_TOKEN_URL) -> str:
    query = urllib.parse.urlencode({"api-version": "2018-02-01", "resource": VAULT_RESOURCE,
                                    "client_id": client_id})
    token = _get_json(f"{imds_token_url}?{query}", {"Metadata": "true"})["access_token"]
    secret = _get_json(f"{vault_uri.rstrip('/')}/secrets/{urllib.parse.quote(secret_name)}"
                       f"?api-version={VAULT_API}", {"Authorization": f"Bearer {token}"})
    return secret["value"]


if __name__ == "__main__":
    print(host_private_key(*sys.argv[1:]))
