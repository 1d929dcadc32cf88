"""The kinds of a pass's writes, as the planner's steps emit them into the plan (views.py
`Plan.writes`): the job's basics, the statuses, its pods and what goes with them, and Kueue's
(a Workload made: the core, the surplus, a slice; deleted; brought up to date; all dropped).
writes.py says their one order and why; reconcile/execute.py makes each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from etoperator.api.statuses import JobStatus, ScalerStatus
from etoperator.status import Event


@dataclass(frozen=True)
class DropWorkloads:
    """Every Workload of a job whose queue label was removed (it runs outside any queue)."""


@dataclass(frozen=True)
class DeleteWorkload:
    name: str


@dataclass(frozen=True)
class MakeWorkload:
    name: str
    workers: int
    replacing: str | None  # a slice: the Workload it replaces ("": a surplus asked whole)
    surplus: bool  # the workers above the job's core (minCount 1, a priority lower)


@dataclass(frozen=True)
class UpdateWorkload:
    """A family's current Workload (the core's or the surplus's): its count and activity
    (spec), then conditions set and the admission given back (status)."""

    core: bool
    resize: int | None = None
    activate: bool | None = None
    conditions: tuple[tuple[str, str, str, str], ...] = ()
    release: str = ""  # the eviction's reason, when the admission is given back


@dataclass(frozen=True)
class OwnWorkload:
    """A Workload owned by the job's pods as well as by the job: deleted with the job, the
    garbage collector keeps it (and Kueue its quota) until the last of them is gone."""

    name: str
    pods: tuple[tuple[str, str], ...]  # (name, uid)


QueueWrite = DeleteWorkload | MakeWorkload | UpdateWorkload | OwnWorkload  # Kueue's kinds


@dataclass(frozen=True)
class MakeBasics:
    """The job's SSH Secret and ConfigMap, those missing, made at once (independent creates)."""

    secret: bool
    config_map: bool


@dataclass(frozen=True)
class MakeLauncherAccess:
    objects: tuple[tuple[str, str], ...]  # kind, name: made in order, off the pass


@dataclass(frozen=True)
class UpdateLauncherRole:
    pass


@dataclass(frozen=True)
class AdoptScaler:
    kind_name: tuple[str, str]  # gets a controller reference to its job (goes with it)


@dataclass(frozen=True)
class ScalerStatusWrite:
    kind_name: tuple[str, str]
    status: ScalerStatus


@dataclass(frozen=True)
class JobStatusWrite:
    status: JobStatus


@dataclass(frozen=True)
class TellEvents:
    """The pass's events, told after the statuses they tell of: the job's, and the scalers'
    (kind and name, the event)."""

    job: tuple[Event, ...] = ()
    scalers: tuple[tuple[tuple[str, str], Event], ...] = ()


@dataclass(frozen=True)
class SpecReplicas:
    replicas: int


@dataclass(frozen=True)
class MakeGang:
    pass


@dataclass(frozen=True)
class HostList:
    hosts: tuple[str, ...]


@dataclass(frozen=True)
class DeletePod:
    name: str
    now: bool  # a victim past its drain: stopped at once, no wait for Horovod


@dataclass(frozen=True)
class DeleteService:
    name: str  # a worker's Service no pod of the job goes with


@dataclass(frozen=True)
class WorkerObjects:
    """The workers' Services of `services` that are missing and the pods of `indices`
    created, all at once (independent creates)."""

    services: tuple[str, ...]
    indices: tuple[int, ...]


@dataclass(frozen=True)
class MakeLauncher:
    pass


@dataclass(frozen=True)
class MakeScaler:
    wanted: dict[str, Any]  # kind, name, spec, generation: a `kubectl scale` as a scaler


Write = (
    MakeBasics | MakeLauncherAccess | UpdateLauncherRole | AdoptScaler | ScalerStatusWrite
    | JobStatusWrite | SpecReplicas | TellEvents | MakeGang | HostList | DeletePod | DeleteService
    | WorkerObjects
    | MakeLauncher | MakeScaler | DropWorkloads | DeleteWorkload | MakeWorkload | UpdateWorkload
    | OwnWorkload
)  # fmt: skip
