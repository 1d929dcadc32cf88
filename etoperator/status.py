"""Pure helpers for status: conditions, phases and replica counts."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypedDict

# Job phases.
CREATED = "Created"
RUNNING = "Running"
SCALING = "Scaling"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
SUSPENDED = "Suspended"
QUEUED = "Queued"  # waiting for Kueue to admit it (again)
TERMINAL = (SUCCEEDED, FAILED)

# Scaler phases.
SCALE_PENDING = ""
SCALE_RUNNING = "Scaling"
SCALE_SUCCEEDED = "ScaleSucceeded"
SCALE_FAILED = "ScaleFailed"
SCALE_TERMINAL = (SCALE_SUCCEEDED, SCALE_FAILED)


class Condition(TypedDict, total=False):
    """A condition as the wire has it: a job's, a scaler's or a Kueue Workload's."""

    type: str
    status: str
    reason: str
    message: str
    lastUpdateTime: str
    lastTransitionTime: str
    observedGeneration: int  # a Workload's


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


def set_condition(
    conditions: list[Condition],
    ctype: str,
    status: str,
    reason: str,
    message: str,
    now: str,
) -> tuple[list[Condition], bool]:
    """A copy of `conditions` with one of type `ctype` set; True when anything changed.

    One entry per type; lastTransitionTime moves only when `status` flips. The changed entry
    moves to the end so that the last condition is the latest (as `kubectl describe` shows).
    """
    out = [c for c in conditions if c.get("type") != ctype]
    old = next((c for c in conditions if c.get("type") == ctype), None)
    if old and (old.get("status"), old.get("reason"), old.get("message")) == (
        status,
        reason,
        message,
    ):
        return copy.deepcopy(conditions), False
    transition = (
        now if not old or old.get("status") != status else old.get("lastTransitionTime", now)
    )
    out.append(
        {
            "type": ctype,
            "status": status,
            "reason": reason,
            "message": message,
            "lastUpdateTime": now,
            "lastTransitionTime": transition,
        }
    )
    return out, True


def condition(conditions: Iterable[Condition], ctype: str) -> Condition | None:
    return next((c for c in conditions if c.get("type") == ctype), None)


def is_true(conditions: Iterable[Condition], ctype: str) -> bool:
    c = condition(conditions, ctype)
    return bool(c and c.get("status") == "True")


def replica_counts(phases: Iterable[str]) -> dict[str, int]:
    counts = {"active": 0, "succeeded": 0, "failed": 0}
    for phase in phases:
        if phase in ("Pending", "Running"):
            counts["active"] += 1
        elif phase == "Succeeded":
            counts["succeeded"] += 1
        elif phase == "Failed":
            counts["failed"] += 1
    return counts
