"""Statuses as the planner keeps them: typed fields, read from and written back to the object's
camelCase status. None is "absent" (as a missing key was); fields this version does not know
are carried through unchanged."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any


def _wire(name: str) -> str:
    return re.sub(r"_([a-z])", lambda m: m[1].upper(), name)


class Wire:
    """to/from the camelCase dict of the object (subclasses are dataclasses with `extra`)."""

    extra: dict[str, Any]

    if TYPE_CHECKING:  # the dataclasses' own __init__

        def __init__(self, **values: Any) -> None: ...

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Any:
        names = {_wire(f.name): f.name for f in fields(cls) if f.name != "extra"}  # type: ignore[arg-type]
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


@dataclass
class CommonStatus(Wire):
    """What every kind's status has (as crds.py's `_common_status`)."""

    phase: str | None = None
    conditions: list[dict[str, Any]] | None = None
    start_time: str | None = None
    completion_time: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys this version does not know


@dataclass
class ScalerStatus(CommonStatus):
    add_pods: list[str] | None = None  # a ScaleOut's frozen plan
    to_delete_pods: list[str] | None = None  # a ScaleIn's frozen plan


@dataclass
class JobStatus(CommonStatus):
    restart_count: int | None = None
    observed_generation: int | None = None
    worker_selector: str | None = None
    target_workers: list[str] | None = None  # the membership: pods this run should have
    current_workers: list[str] | None = None  # the host list Horovod sees
    replicas: int | None = None  # len(current_workers), for the scale subresource
    replica_statuses: dict[str, Any] | None = None
    last_worker_index: int | None = None  # the highest index ever used: names never repeat
    run_start_index: int | None = None  # lower indices belong to an earlier run
    current_scaler: str | None = None  # the one scaler allowed to touch pods
    scaler_pods: list[str] | None = None  # its plan, to undo it if it is deleted
    accepted_replicas: int | None = None  # spec replicas accounted for (`kubectl scale`)
    replicas_before: int | None = None  # the spec value our pending write of them replaces
    ssh_public_key: str | None = None  # trusted again if the SSH Secret must be remade

    @property
    def members(self) -> list[str]:
        return list(self.target_workers or [])

    @property
    def hosts(self) -> list[str]:
        return list(self.current_workers or [])
