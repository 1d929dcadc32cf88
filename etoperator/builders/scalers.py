"""The scaler the operator makes when `kubectl scale` changes a job's worker replicas."""

from __future__ import annotations

from typing import Any

from etoperator import naming
from etoperator.builders.common import Owner, metadata


def replicas_scaler(namespace: str, owner: Owner, wanted: dict[str, Any]) -> dict[str, Any]:
    """`wanted` is the planner's entry: kind, name, generation and spec."""
    annotations = {naming.ANN_SCALE_GENERATION: str(wanted["generation"])}
    return {
        "apiVersion": naming.API_VERSION,
        "kind": wanted["kind"],
        "metadata": metadata(
            wanted["name"], namespace, owner, naming.job_labels(owner.name), annotations
        ),
        "spec": wanted["spec"],
    }


def is_replicas_scaler(obj: dict[str, Any], job_uid: str, generation: int) -> bool:
    """Made by the operator for this job at this generation (not a user's of the same name)."""
    annotations = obj.get("metadata", {}).get("annotations") or {}
    made_for = annotations.get(naming.ANN_SCALE_GENERATION)
    return made_for == str(generation) and any(
        r.get("controller") and r.get("uid") == job_uid
        for r in obj["metadata"].get("ownerReferences") or []
    )
