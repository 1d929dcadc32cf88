"""Pieces every child manifest shares: metadata with labels and the controller reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from etoperator import naming


@dataclass(frozen=True)
class Owner:
    """The parent a child points at with a controller ownerReference."""

    kind: str
    name: str
    uid: str
    api_version: str = naming.API_VERSION

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def metadata(
    name: str,
    namespace: str,
    owner: Owner,
    labels: dict[str, str],
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": dict(labels),
        "ownerReferences": [owner.reference()],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def is_controlled_by(obj: dict[str, Any], uid: str) -> bool:
    """True when `obj` names the parent with this uid as its controller."""
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("uid") == uid:
            return True
    return False
