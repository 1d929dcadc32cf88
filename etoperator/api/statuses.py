"""The status of each kind, typed: what the planner and the reconciler read and write (never the
camelCase dict itself), and the source of the status schemas in crds/ (crds.py: each field's
schema is its annotation's metadata). None is "absent" (as a missing key was); keys this
version does not know are carried through."""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Annotated, Any, get_type_hints

from etoperator.status import Condition

Schema = dict[str, Any]

_STRING: Schema = {"type": "string"}
_TIME: Schema = {"type": "string", "format": "date-time"}
_COUNT: Schema = {"type": "integer", "format": "int32", "minimum": 0}
_INDEX: Schema = {"type": "integer"}
_STRINGS: Schema = {"type": "array", "items": {"type": "string"}}
_CONDITIONS: Schema = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string"},
            "status": {"type": "string"},
            "reason": {"type": "string"},
            "message": {"type": "string"},
            "lastUpdateTime": _TIME,
            "lastTransitionTime": _TIME,
        },
    },
}
_REPLICA_STATUS: Schema = {
    "type": "object",
    "properties": {
        k: {"type": "integer", "format": "int32"} for k in ("active", "succeeded", "failed")
    },
}
_SAVED: Schema = {
    "type": "object",
    "properties": {"step": {"type": "integer"}, "time": _TIME},
}
_REPLICA_STATUSES: Schema = {
    "type": "object",
    "properties": {"Launcher": _REPLICA_STATUS, "Worker": _REPLICA_STATUS},
}


@functools.cache
def _wire(name: str) -> str:
    return re.sub(r"_([a-z])", lambda m: m[1].upper(), name)


class Wire:
    """to/from the camelCase dict of the object (subclasses are dataclasses with `extra`)."""

    extra: dict[str, Any]

    if TYPE_CHECKING:  # the dataclasses' own __init__

        def __init__(self, **values: Any) -> None: ...

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> Any:
        names = {_wire(f.name): f.name for f in fields(cls) if f.name != "extra"}  # type: ignore[arg-type]
        raw = raw or {}
        known = {names[k]: copy.deepcopy(v) for k, v in raw.items() if k in names}
        rest = {k: copy.deepcopy(v) for k, v in raw.items() if k not in names}
        return cls(**known, extra=rest)

    def to_dict(self) -> dict[str, Any]:
        out = copy.deepcopy(self.extra)
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name != "extra" and value is not None:
                out[_wire(f.name)] = copy.deepcopy(value)
        return out

    @classmethod
    def schema(cls) -> Schema:
        """The status schema: one property per field, in the order declared."""
        hints = get_type_hints(cls, include_extras=True)
        props = {_wire(f.name): hints[f.name].__metadata__[0] for f in fields(cls)  # type: ignore[arg-type]
                 if f.name != "extra"}  # fmt: skip
        return {"type": "object", "properties": props}


@dataclass
class CommonStatus(Wire):
    """What every kind's status has."""

    phase: Annotated[str | None, _STRING] = None
    conditions: Annotated[list[Condition] | None, _CONDITIONS] = None
    start_time: Annotated[str | None, _TIME] = None
    completion_time: Annotated[str | None, _TIME] = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys this version does not know


@dataclass
class ScaleOutStatus(CommonStatus):
    # Its frozen plan: the workers it adds.
    add_pods: Annotated[list[str] | None, _STRINGS] = None


@dataclass
class ScaleInStatus(CommonStatus):
    # Its frozen plan: the workers it removes.
    to_delete_pods: Annotated[list[str] | None, _STRINGS] = None


ScalerStatus = ScaleOutStatus | ScaleInStatus


def scaler_status(kind: str, raw: dict[str, Any] | None) -> ScalerStatus:
    """A ScaleOut's or a ScaleIn's status, by kind."""
    cls = ScaleOutStatus if kind == "ScaleOut" else ScaleInStatus
    status: ScalerStatus = cls.from_dict(raw)
    return status


@dataclass
class JobStatus(CommonStatus):
    restart_count: Annotated[int | None, _COUNT] = None
    observed_generation: Annotated[int | None, _INDEX] = None
    # The scale subresource's labelSelectorPath.
    worker_selector: Annotated[str | None, _STRING] = None
    # The membership: pods this run should have (created or still to create).
    target_workers: Annotated[list[str] | None, _STRINGS] = None
    # The host list Horovod sees.
    current_workers: Annotated[list[str] | None, _STRINGS] = None
    # len(current_workers), for the scale subresource.
    replicas: Annotated[int | None, _COUNT] = None
    replica_statuses: Annotated[dict[str, Any] | None, _REPLICA_STATUSES] = None
    # The highest index ever used: names are never reused.
    last_worker_index: Annotated[int | None, _INDEX] = None
    # First index of the current run; lower ones belong to an earlier run.
    run_start_index: Annotated[int | None, _INDEX] = None
    # The one scaler allowed to touch pods, and its plan (to undo it if it is deleted).
    current_scaler: Annotated[str | None, _STRING] = None
    scaler_pods: Annotated[list[str] | None, _STRINGS] = None
    # Spec replicas accounted for (`kubectl scale`), and the value our pending write replaces.
    accepted_replicas: Annotated[int | None, _INDEX] = None
    replicas_before: Annotated[int | None, _INDEX] = None
    # Trusted again if the SSH Secret must be remade.
    ssh_public_key: Annotated[str | None, _STRING] = None
    # The training's last save reported before a stop (the save handshake): step and time.
    last_saved: Annotated[dict[str, Any] | None, _SAVED] = None

    @property
    def members(self) -> list[str]:
        return list(self.target_workers or [])

    @property
    def hosts(self) -> list[str]:
        return list(self.current_workers or [])
