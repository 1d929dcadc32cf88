"""A pass's writes, in the one order they are made: what `plan_job` decided, as a list.

The steps emit each write into the plan as they decide it (kinds.py; plan.py `Plan.emit`). The
reconciler runs this list and nothing else (reconcile/job.py `JobReconciler.act`); the
planner's crash tests replay the same list (tests/unit/test_replicas.py). The order is what
makes a crash or a 409 between any two writes harmless:
  the basics a job's pods need (its Secret and ConfigMap, the launcher's access): a pod is
  never made before them, and when one of them meets an object in the way, the pass makes no
  child (the next pass says why: Blocked);
  scalers adopted, then scaler statuses (a scaler's frozen plan before the job acts on it);
  the job status, then the spec replicas it accepted (replicasBefore marks them as ours until
  they land), then the pass's events (told after the statuses they tell of); then, when the
  job's pods may be touched at all: the gang's objects before the workers that join it; the
  host list before any pod is deleted (Horovod never lists a pod that is going); deletes; the
  workers' Services and pods; the launcher; the replicas scalers `kubectl scale` asked for;
  last the Kueue Workload writes (after the pods, so a shrink gives its quota back once done),
  the pods that hold a Workload's quota named its owners last (a patch of its metadata would
  stale the version its other writes are preconditioned on).
Off the list by design: scaler scripts (run on the launcher, recorded there;
reconcile/scripts.py), and the making of the launcher's access, which MakeLauncherAccess hands
to a pool of its own (a Role or binding can take the apiserver a second; the launcher waits
for them). Two writes come from outside any job's pass and go through the same executor alone
(`OffPass`): a script's outcome on its scaler, from the script's thread, and the status of a
scaler whose job is not there."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from etoperator.api.statuses import ScalerStatus
from etoperator.planning import kinds as k
from etoperator.planning.plan import Plan


@dataclass(frozen=True)
class Queueing:
    """A job in a queue or with Workloads: `labelled` False, its queue label went."""

    labelled: bool


@dataclass(frozen=True)
class ScriptCondition:
    """A scaler script's ScriptExecuted condition, from its thread: on the version read (again
    after a 409); an outcome (True/False) is also an Event."""

    kind_name: tuple[str, str]
    namespace: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class OrphanScalerStatus:
    """The status of a scaler whose job is not there (planning/orphans.py), on the version
    read; `event`: (type, reason, message) told of it."""

    body: dict[str, Any]
    status: ScalerStatus
    event: tuple[str, str, str] | None


OffPass = ScriptCondition | OrphanScalerStatus


def ordered(plan: Plan, pods: bool, queue: Queueing | None) -> list[k.Write]:
    """The plan's writes in order: a stable sort by ORDER (writes of one kind keep the order
    the steps emitted them in). `pods`: the job's children may be touched this pass (its spec
    parsed, the Secret, ConfigMap and RBAC its pods need in place); `queue`: the job is in a
    queue or still has Workloads (None: Kueue's writes are dropped; its queue label gone: all
    its Workloads are)."""
    own = queue is not None and queue.labelled
    writes: list[k.Write] = [w for w in plan.writes if own or not isinstance(w, k.QueueWrite)]
    if queue is not None and not queue.labelled:
        writes.append(k.DropWorkloads())
    kept = [w for w in writes if pods or STAGES[type(w)] is not Stage.CHILDREN]
    return sorted(kept, key=lambda w: RANK[type(w)])


class Stage(enum.IntEnum):
    BASICS = 0  # what a job's pods need: when one meets an object in the way, no child is made
    STATUSES = 1  # the scalers' and the job's own objects, then the pass's events
    CHILDREN = 2  # the job's pods and what goes with them, only when they may be touched


# The one order of a pass's writes, by stage (the module's docstring says why).
ORDER: tuple[tuple[Stage, tuple[type, ...]], ...] = (
    (Stage.BASICS, (k.MakeBasics, k.MakeLauncherAccess, k.UpdateLauncherRole)),
    (Stage.STATUSES, (k.AdoptScaler, k.ScalerStatusWrite, k.JobStatusWrite, k.SpecReplicas,
                      k.TellEvents)),
    (Stage.CHILDREN, (k.MakeGang, k.HostList, k.DeletePod, k.DeleteService,
                      k.WorkerObjects, k.MakeLauncher,
                      k.MakeScaler, k.DropWorkloads, k.DeleteWorkload, k.MakeWorkload,
                      k.UpdateWorkload, k.OwnWorkload)),
)  # fmt: skip
RANK: dict[type, int] = {kind: i for i, kind in enumerate(k for _, ks in ORDER for k in ks)}
STAGES: dict[type, Stage] = {kind: stage for stage, kinds in ORDER for kind in kinds}


def staged(writes: list[k.Write], stage: Stage) -> list[k.Write]:
    """The writes of one stage, in their order."""
    return [w for w in writes if STAGES[type(w)] is stage]
