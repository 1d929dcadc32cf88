"""A pass's writes come in one order (planning/writes.py): what makes a crash or a 409 between
any two of them harmless."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from etoperator.api.statuses import JobStatus, ScaleInStatus
from etoperator.planning import Plan, plan_job
from etoperator.planning.draft import Draft
from etoperator.planning.kinds import (
    AdoptScaler,
    DeletePod,
    DeleteService,
    DeleteWorkload,
    DropWorkloads,
    HostList,
    JobStatusWrite,
    MakeBasics,
    MakeGang,
    MakeLauncher,
    MakeLauncherAccess,
    MakeScaler,
    MakeWorkload,
    OwnWorkload,
    ScalerStatusWrite,
    SpecReplicas,
    TellEvents,
    UpdateLauncherRole,
    UpdateWorkload,
    WorkerObjects,
)
from etoperator.planning.writes import Queueing, ordered
from etoperator.status import Event
from tests.unit.test_planning import inp, jspec, launcher, running_status, w

SCALING = Event("Normal", "Scaling", "removing j-worker-2")
EVERYTHING = Plan(
    status=JobStatus(phase="Running"),
    writes=[  # as the steps emit them: the executor's order is not theirs
        MakeWorkload("w-grow-4", 2, "w-surplus", True),
        OwnWorkload("w", (("j-launcher", "u1"), ("j-worker-0", "u2"))),
        WorkerObjects(("j-worker-0", "j-worker-3"), (3,)),
        MakeScaler({"kind": "ScaleOut", "name": "j-replicas-2", "spec": {}, "generation": 2}),
        UpdateWorkload(True, 2, True, (("Finished", "True", "Succeeded", "done"),), ""),
        DeletePod("j-worker-1", False),
        MakeLauncher(),
        HostList(("j-worker-0", "j-worker-3")),
        MakeWorkload("w", 2, None, False),
        SpecReplicas(2),
        TellEvents((Event("Normal", "Saved", "step 7"),), ((("ScaleIn", "less"), SCALING),)),
        DeletePod("j-worker-2", True),
        DeleteService("j-worker-1"),
        MakeGang(),
        DeleteWorkload("w-grow-3"),
        JobStatusWrite(JobStatus(phase="Running")),
        ScalerStatusWrite(("ScaleIn", "less"), ScaleInStatus(phase="Scaling")),
        UpdateLauncherRole(),
        UpdateWorkload(False, None, None, (), "Preempted"),
        MakeLauncherAccess((("ServiceAccount", "j-launcher"), ("Role", "j-launcher"))),
        AdoptScaler(("ScaleIn", "less")),
        MakeWorkload("w-surplus", 1, None, True),
        MakeBasics(secret=True, config_map=True),
    ],
)
QUEUE = Queueing(True)


def kinds(writes: Sequence[object]) -> list[str]:
    return [type(w).__name__ for w in writes]


def test_every_write_of_a_pass_in_its_one_order() -> None:
    writes = ordered(EVERYTHING, pods=True, queue=QUEUE)
    basics, writes = writes[:3], writes[3:]
    assert kinds(basics) == ["MakeBasics", "MakeLauncherAccess", "UpdateLauncherRole"]
    assert basics[0] == MakeBasics(secret=True, config_map=True)
    assert basics[1] == MakeLauncherAccess(
        (("ServiceAccount", "j-launcher"), ("Role", "j-launcher"))
    )
    assert kinds(writes) == [
        "AdoptScaler", "ScalerStatusWrite", "JobStatusWrite", "SpecReplicas", "TellEvents",
        "MakeGang", "HostList", "DeletePod", "DeletePod", "DeleteService", "WorkerObjects",
        "MakeLauncher", "MakeScaler",
        "DeleteWorkload", "MakeWorkload", "MakeWorkload", "MakeWorkload", "UpdateWorkload",
        "UpdateWorkload", "OwnWorkload",
    ]  # fmt: skip
    assert writes[0] == AdoptScaler(("ScaleIn", "less"))
    assert writes[1] == ScalerStatusWrite(("ScaleIn", "less"), ScaleInStatus(phase="Scaling"))
    assert writes[3] == SpecReplicas(2)
    # The events after the statuses they tell of, before any child is touched.
    assert writes[4] == TellEvents(
        (Event("Normal", "Saved", "step 7"),), ((("ScaleIn", "less"), SCALING),)
    )
    assert writes[6] == HostList(("j-worker-0", "j-worker-3"))
    assert writes[7:9] == [DeletePod("j-worker-1", False), DeletePod("j-worker-2", True)]
    assert writes[9:11] == [
        DeleteService("j-worker-1"),
        WorkerObjects(("j-worker-0", "j-worker-3"), (3,)),
    ]
    assert isinstance(writes[2], JobStatusWrite) and isinstance(writes[5], MakeGang)
    assert isinstance(writes[11], MakeLauncher) and isinstance(writes[12], MakeScaler)
    # Kueue's last (after the pods: a shrink gives its quota back once done), deletes first.
    assert writes[13:] == [
        DeleteWorkload("w-grow-3"),
        MakeWorkload("w-grow-4", 2, "w-surplus", True),
        MakeWorkload("w", 2, None, False),
        MakeWorkload("w-surplus", 1, None, True),
        UpdateWorkload(True, 2, True, (("Finished", "True", "Succeeded", "done"),), ""),
        UpdateWorkload(False, None, None, (), "Preempted"),
        # its owners last: a patch of its metadata would stale the version the others are on
        OwnWorkload("w", (("j-launcher", "u1"), ("j-worker-0", "u2"))),
    ]


def test_a_job_whose_queue_label_went_drops_its_workloads_and_nothing_else() -> None:
    writes = ordered(EVERYTHING, pods=True, queue=Queueing(False))
    assert kinds(writes)[-2:] == ["MakeScaler", "DropWorkloads"]
    assert writes[-1] == DropWorkloads()


def test_a_family_s_changes_are_one_write_and_a_family_with_none_gets_none() -> None:
    d = Draft(inp(jspec(), {}, []))
    ready = ("PodsReady", "True", "PodsReady", "ready")
    d.update_workload(True, resize=2)
    d.update_workload(True, resize=3, condition=ready)
    d.to_kueue(MakeWorkload("w-surplus", 1, None, True))
    d.to_kueue(MakeWorkload("w-surplus", 2, None, True))  # the pass's last word
    writes = ordered(d.plan, pods=True, queue=QUEUE)
    assert [w for w in writes if isinstance(w, UpdateWorkload | MakeWorkload)] == [
        MakeWorkload("w-surplus", 2, None, True),
        UpdateWorkload(True, 3, None, (ready,), ""),
    ]


def test_a_status_as_read_is_not_written_again() -> None:
    """A job's first pass writes its status; a pass from that status, nothing new seen, does
    not (and a job in no queue makes no Workload)."""
    pods = [w(0), w(1), launcher()]
    first = plan_job(inp(jspec(), {}, pods, published=["j-worker-0", "j-worker-1"]))
    assert first.one(JobStatusWrite) == JobStatusWrite(first.status)
    settled = plan_job(inp(jspec(), first.status, pods, published=first.hosts))
    again = plan_job(inp(jspec(), settled.status, pods, published=settled.hosts))
    assert again.status == settled.status
    writes = ordered(again, pods=True, queue=None)
    assert "JobStatusWrite" not in kinds(writes) and "MakeWorkload" not in kinds(writes)
    assert "MakeWorkload" not in kinds(ordered(EVERYTHING, pods=True, queue=None))


def test_a_job_whose_pods_may_not_be_touched_gets_its_statuses_only() -> None:
    """Its spec unreadable, or the Secret, ConfigMap or RBAC its pods need missing."""
    writes = ordered(EVERYTHING, pods=False, queue=QUEUE)
    assert kinds(writes) == [
        "MakeBasics", "MakeLauncherAccess", "UpdateLauncherRole",
        "AdoptScaler", "ScalerStatusWrite", "JobStatusWrite", "SpecReplicas", "TellEvents",
    ]  # fmt: skip


def test_a_pass_s_events_are_one_write_in_the_order_they_were_told() -> None:
    d = Draft(inp(jspec(), {}, []))
    lost, scaling = Event("Warning", "WorkerLost", "j-worker-1"), Event("Normal", "Scaling", "x")
    d.plan.tell(lost)
    d.plan.tell(scaling, ("ScaleIn", "less"))
    d.plan.tell(Event("Normal", "WorkerReplaced", "j-worker-2"))
    told = [w for w in ordered(d.plan, pods=False, queue=None) if isinstance(w, TellEvents)]
    assert told == [
        TellEvents(
            (lost, Event("Normal", "WorkerReplaced", "j-worker-2")),
            ((("ScaleIn", "less"), scaling),),
        )
    ]
    assert d.plan.scaler_events == {("ScaleIn", "less"): [scaling]}


def test_a_service_no_worker_goes_with_is_deleted_those_of_its_workers_kept() -> None:
    """Worker 2 gone (a ScaleIn): its Service goes; the members' stay, a new member's is made."""
    job = inp(jspec(), running_status([0, 1, 3]), [w(0), w(1), w(3), launcher()])
    job = dataclasses.replace(job, services=("j-worker-0", "j-worker-1", "j-worker-2"))
    writes = ordered(plan_job(job), pods=True, queue=None)
    assert [x for x in writes if isinstance(x, DeleteService)] == [DeleteService("j-worker-2")]
    made = [x for x in writes if isinstance(x, WorkerObjects)]
    assert made == [WorkerObjects(("j-worker-0", "j-worker-1", "j-worker-3"), ())]
