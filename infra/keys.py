"""ed25519 key pairs in OpenSSH format: the offline plan's stand-in for `tls.PrivateKey`, and the
local backend's host and client keys."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


@dataclass(frozen=True)
class KeyPair:
    private_openssh: str  # "-----BEGIN OPENSSH PRIVATE KEY-----\n..."
    public_openssh: str  # "ssh-ed25519 AAAA..." (no comment, no newline)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_openssh)


def fingerprint(public_key: str) -> str:
    """An OpenSSH public key's fingerprint as `ssh-keygen -l` prints it: "SHA256:<base64 of the
    key blob's SHA-256, without padding>"."""
    digest = hashlib.sha256(base64.b64decode(public_key.split()[1])).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def ed25519_key_pair() -> KeyPair:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    return KeyPair(private, public)
