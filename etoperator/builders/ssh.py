"""The job's SSH Secret. Key generation lives apart from the (pure) manifest builder."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from etoperator import naming
from etoperator.builders.common import Owner, metadata

# Keys existing images expect (the Go operator's names); ed25519 despite the `id_rsa` name:
# OpenSSH reads the key type from the file, not from its name.
PRIVATE_KEY = "id_rsa"
PUBLIC_KEY = "id_rsa.pub"
AUTHORIZED_KEYS = "authorized_keys"
CONFIG = "config"
OWN_KEYS = frozenset({PRIVATE_KEY, PUBLIC_KEY, AUTHORIZED_KEYS, CONFIG})  # the operator's Secret

SSH_CLIENT_CONFIG = """\
Host *
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
    IdentityFile ~/.ssh/id_rsa
    ServerAliveInterval 10
"""


@dataclass(frozen=True)
class KeyPair:
    private_openssh: str
    public_openssh: str

    def __repr__(self) -> str:  # never let a private key reach a log through repr()
        return f"KeyPair(public={self.public_openssh[:30]}...)"


def generate_keypair(comment: str = "etoperator") -> KeyPair:
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return KeyPair(private_openssh=private, public_openssh=f"{public} {comment}\n")


def keypair_from_private(private_openssh: str, comment: str = "etoperator") -> KeyPair:
    """The pair of a private key we still hold (to recreate a deleted Secret unchanged)."""
    key = serialization.load_ssh_private_key(private_openssh.encode(), None)
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return KeyPair(private_openssh=private_openssh, public_openssh=f"{public} {comment}\n")


def ssh_secret(
    job: str, namespace: str, owner: Owner, keys: KeyPair, also_trusted: tuple[str, ...] = ()
) -> dict[str, Any]:
    """`also_trusted`: earlier public keys that pods still holding them must keep using."""
    trusted = keys.public_openssh + "".join(
        k.strip() + "\n"
        for k in also_trusted
        if k.strip() and k.strip() != keys.public_openssh.strip()
    )
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(naming.secret_name(job), namespace, owner, naming.job_labels(job)),
        "type": "Opaque",
        "stringData": {
            PRIVATE_KEY: keys.private_openssh,
            PUBLIC_KEY: keys.public_openssh,
            AUTHORIZED_KEYS: trusted,
            CONFIG: SSH_CLIENT_CONFIG,
        },
    }


def missing_keys(secret: dict[str, Any]) -> list[str]:
    """Keys a usable job Secret must hold but this one lacks."""
    data = {**(secret.get("data") or {}), **(secret.get("stringData") or {})}
    return [k for k in (PRIVATE_KEY, PUBLIC_KEY) if k not in data]


def public_key(secret: dict[str, Any]) -> str:
    """The Secret's public key (recorded in the job status: it is needed to rotate the pair)."""
    raw = (secret.get("data") or {}).get(PUBLIC_KEY) or ""
    return base64.b64decode(raw).decode(errors="replace").strip()


def other_job(secret: dict[str, Any], uid: str) -> str | None:
    """The TrainingJob, other than `uid`, that controls this Secret, if any."""
    for ref in secret.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == naming.JOB_KIND and ref.get("controller") and ref.get("uid") != uid:
            return str(ref.get("name"))
    return None
