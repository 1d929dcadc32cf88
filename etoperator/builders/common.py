"""Pieces every child manifest shares: metadata with labels and the controller reference."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from etoperator import naming
from etoperator.api.models import JobSpec


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


def job_owner(spec: JobSpec) -> Owner:
    """The TrainingJob as its children's controller."""
    return Owner(naming.JOB_KIND, spec.name, spec.uid)


@dataclass(frozen=True)
class Placement:
    """Where a pod set's pods may run, as a queue's admission says (its flavors' node labels
    and tolerations)."""

    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[dict[str, Any], ...] = ()

    def apply(self, spec: dict[str, Any]) -> None:
        """Merged into a pod spec: the flavors' labels win over the template's own."""
        if self.node_selector:
            spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **dict(self.node_selector)}
        if self.tolerations:
            own = list(spec.get("tolerations") or [])
            spec["tolerations"] = own + [t for t in self.tolerations if t not in own]


ANYWHERE = Placement()  # no queue's admission says where pods go


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


def init_like(first: dict[str, Any], name: str, command: list[str]) -> dict[str, Any]:
    """An init container of `first`'s image, got the same way (its pull policy and security
    context): what the pod runs anyway, nothing more to pull or allow."""
    init = {"name": name, "image": first.get("image"), "command": command}
    for key in ("imagePullPolicy", "securityContext"):
        if key in first:
            init[key] = copy.deepcopy(first[key])
    return init


def is_controlled_by(obj: dict[str, Any], uid: str) -> bool:
    """True when `obj` names the parent with this uid as its controller."""
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("uid") == uid:
            return True
    return False
