"""What the planner reads (views of pods, scalers, the job) and what it returns (a plan)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from etoperator.api.models import JobSpec
from etoperator.api.scalers import ScalerSpec
from etoperator.api.statuses import JobStatus, ScaleOutStatus, ScalerStatus
from etoperator.builders.common import Placement


@dataclass(frozen=True)
class PodView:
    name: str
    role: str
    index: int | None = None
    phase: str = "Pending"
    deleting: bool = False
    ready: bool = False  # worker: sshd accepts the job key; launcher: Running
    exit_code: int | None = None
    reason: str = ""
    run: int | None = None  # launcher: the run (restartCount) it was created for
    leaving: str = ""  # a notice that the pod is about to go (preemption, drain)
    busy: bool | None = None  # asked (a victim, a joining worker): a Horovod process runs on it
    # Asked what Horovod does on it, and the probe could not tell (SSH did not answer in time,
    # as under load): neither busy nor idle.
    horovod_unknown: bool = False
    ip: str = ""
    # Asked of a joining worker (and one host already in): the addresses Horovod's processes
    # on it are connected to; None when not asked or it could not be told.
    peers: frozenset[str] | None = None
    waiting: str = ""  # why a pod that is not running cannot run (its own words), if it says
    bound: bool = False  # the scheduler has placed it on a node
    saved: str = ""  # launcher: the save it reported before it stopped ("step=<n> t=<unix>")
    surplus: bool = False  # a queued job's worker made under its surplus admission
    # Kueue took back the admission it runs under (the surplus's): it leaves as a ScaleIn
    # victim does, is not replaced, and the job's size asked stays (it grows back).
    reclaimed: bool = False
    overdue: bool = False  # reclaimed longer than its drain may take: it goes regardless
    age: float | None = None  # seconds since the pod was made (None: not told)
    uid: str = ""

    @property
    def draining(self) -> bool:
        """Noticed for preemption, still running: Horovod may still be on it."""
        return bool(self.leaving) and self.phase == "Running" and not self.deleting

    @property
    def gone_bad(self) -> bool:
        return self.phase in ("Failed", "Succeeded") or self.deleting or bool(self.leaving)


@dataclass(frozen=True)
class ScalerView:
    kind: str
    name: str
    created: str
    spec: ScalerSpec | None
    error: str | None = None
    status: ScalerStatus = field(default_factory=ScaleOutStatus)  # as read, of its kind
    owned: bool = False
    made_for: int | None = None  # made by the operator for `kubectl scale` at this generation

    @property
    def kind_name(self) -> tuple[str, str]:
        return (self.kind, self.name)

    @property
    def phase(self) -> str:
        return self.status.phase or ""

    @property
    def planned(self) -> list[str]:
        """Its frozen plan: the workers it adds (a ScaleOut) or removes (a ScaleIn: its
        victims, in this one form from its status to the planner)."""
        s = self.status
        pods = s.add_pods if isinstance(s, ScaleOutStatus) else s.to_delete_pods
        return list(pods or [])


@dataclass(frozen=True)
class QueueView:
    """The job's Kueue Workloads as the planner sees them (reconcile/queues.py reads them):
    the current one (the oldest not finished; else the last finished), and a slice that would
    replace it to grow the job."""

    queue: str  # the LocalQueue
    served: bool = True  # Kueue's API is there
    workload: str = ""  # the current Workload's name; "" when none is made yet
    workers: int = 0  # the worker count it asks for
    active: bool = True  # spec.active
    reserved: bool = False  # QuotaReserved: it holds quota (status.admission is set)
    admitted: bool = False
    admitted_workers: int = 0  # the worker count admitted
    cluster_queue: str = ""
    evicted: str = ""  # "<reason>: <message>" of Evicted, while True
    evicted_reason: str = ""
    evicted_at: datetime | None = None  # when Evicted turned True
    finished: str = ""  # "<reason>: <message>" of Finished, when True
    pods_ready: bool = False  # PodsReady is True
    why: str = ""  # Kueue's words on why it waits (QuotaReserved's message)
    placement: dict[str, Placement] = field(default_factory=dict)  # by pod set, once admitted
    growing: str = ""  # a slice replacing the current Workload, not finished
    growing_workers: int = 0
    growing_admitted: bool = False
    growing_why: str = ""
    strays: tuple[str, ...] = ()  # other unfinished Workloads of the job (none should be)
    unmade: str | None = None  # why its Workload could not be made (the apiserver's words)
    # A slice's admission follows the finish of what it replaced: the job keeps what it had.
    handing_over: bool = False
    # The current Workload was finished by Kueue for a slice that is gone (one deleted as
    # Kueue admitted it, or made by someone else): the job lost its admission, it did not end.
    replaced: bool = False
    # The surplus Workload family (workers above the core, at a lower priority: what a
    # preemption takes first); None when the job has none.
    surplus: QueueView | None = None
    # Each Workload of the job that holds or asks quota (not finished, not being deleted): its
    # name and the uids of the pods among its owners (the garbage collector keeps it until the
    # last of them is gone).
    owners: tuple[tuple[str, frozenset[str]], ...] = ()

    @property
    def room(self) -> int:
        """Workers Kueue holds quota for now: the core's (or its admitted slice's) and the
        surplus's (0 while evicted)."""
        own = max(self.admitted_workers, self.growing_workers if self.growing_admitted else 0)
        return own + (self.surplus.room if self.surplus is not None else 0)

    @property
    def asked(self) -> int:
        """Workers the job's Workloads ask for (a surplus Kueue finished asks for none)."""
        s = self.surplus
        return self.workers + (s.workers if s is not None and not s.finished else 0)


@dataclass(frozen=True)
class GangView:
    """A gang job's PodGroup as the planner sees it (reconcile/gangs.py reads it)."""

    served: bool = True  # the Workload API is there
    group: bool = False  # its PodGroup exists
    why: str = ""  # the scheduler's words on why the gang waits (PodGroupScheduled False)
    conflict: str = ""  # a PodGroup of its name that is not the job's
    # spec.schedulingPolicy set while workers of the job run (no PodGroup holds them): it
    # applies from a start with none running; new workers meanwhile join no gang.
    deferred: bool = False
    min_count: int | None = None  # the PodGroup's gang minCount, as made (it is immutable)


@dataclass(frozen=True)
class BasicsView:
    """What a job's pods need before any is made, as the watches show it."""

    secret: bool = True  # the job's own SSH Secret is there (or the job names a user's)
    config_map: bool = True
    access: tuple[tuple[str, str], ...] = ()  # the launcher's account, Role, binding missing
    role_current: bool = True  # the launcher's Role grants what its script needs now
    launcher_ready: bool = True  # its account, Role and binding are all seen: it may start


@dataclass(frozen=True)
class JobInput:
    name: str
    namespace: str
    generation: int
    spec: JobSpec | None
    error: str | None
    status: JobStatus  # as read
    pods: list[PodView]
    scalers: list[ScalerView]
    now: datetime
    published: list[str] | None = None  # the host list in the ConfigMap now
    problems: tuple[str, ...] = ()  # children in the way (found now, or by the last pass's acts)
    public_key: str | None = None  # the job's SSH public key, recorded for a later rotation
    squatted: tuple[str, ...] = ()  # worker names held by pods that are not this job's
    hold: bool = False  # the Secret, ConfigMap or RBAC a pod needs is not there: touch no pod
    basics: BasicsView = BasicsView()
    refusal_over: bool = False  # the apiserver accepted the last pass's writes again
    queue: QueueView | None = None  # labelled for Kueue: its Workload
    gang: GangView | None = None  # spec.schedulingPolicy: its PodGroup
    # While a ScaleOut waits for Horovod: the launcher's last lines naming its new workers.
    launcher_said: tuple[str, ...] = ()
    saved: str = ""  # the save the job's last launcher reported as its pod went (the handshake)
    services: tuple[str, ...] = ()  # the job's Services, as the watches show them
