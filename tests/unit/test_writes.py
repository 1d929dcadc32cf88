"""A pass's writes come in one order (planning/writes.py): what makes a crash or a 409 between
any two of them harmless."""

from __future__ import annotations

from collections.abc import Sequence

from etoperator.api.statuses import JobStatus, ScaleInStatus
from etoperator.planning import Plan
from etoperator.planning.draft import Draft
from etoperator.planning.kueuewrites import (
    DeleteWorkload,
    DropWorkloads,
    MakeWorkload,
    UpdateWorkload,
)
from etoperator.planning.writes import (
    AdoptScaler,
    DeletePod,
    HostList,
    JobStatusWrite,
    MakeBasics,
    MakeGang,
    MakeLauncher,
    MakeLauncherAccess,
    MakeScaler,
    Queueing,
    ScalerStatusWrite,
    SpecReplicas,
    WorkerObjects,
    ordered,
)
from tests.unit.test_planning import inp, jspec

EVERYTHING = Plan(
    status=JobStatus(phase="Running"),
    create_workers=[3],
    delete_pods=["j-worker-1", "j-worker-2"],
    stop_now=["j-worker-2"],
    create_launcher=True,
    hosts=["j-worker-0", "j-worker-3"],
    services=["j-worker-0", "j-worker-3"],
    scaler_status={("ScaleIn", "less"): ScaleInStatus(phase="Scaling")},
    adopt_scalers=[("ScaleIn", "less")],
    create_scalers=[{"kind": "ScaleOut", "name": "j-replicas-2", "spec": {}, "generation": 2}],
    spec_replicas=2,
    make_gang=True,
    make_secret=True,
    make_config_map=True,
    make_access=(("ServiceAccount", "j-launcher"), ("Role", "j-launcher")),
    update_role=True,
    queue_writes=[  # as the steps emit them: the executor's order is not theirs
        MakeWorkload("w-grow-4", 2, "w-surplus", True),
        UpdateWorkload(True, 2, True, (("Finished", "True", "Succeeded", "done"),), ""),
        MakeWorkload("w", 2, None, False),
        DeleteWorkload("w-grow-3"),
        UpdateWorkload(False, None, None, (), "Preempted"),
        MakeWorkload("w-surplus", 1, None, True),
    ],
)
QUEUE = Queueing(True)


def kinds(writes: Sequence[object]) -> list[str]:
    return [type(w).__name__ for w in writes]


def test_every_write_of_a_pass_in_its_one_order() -> None:
    writes = ordered(EVERYTHING, JobStatus(), pods=True, queue=QUEUE)
    basics, writes = writes[:3], writes[3:]
    assert kinds(basics) == ["MakeBasics", "MakeLauncherAccess", "UpdateLauncherRole"]
    assert basics[0] == MakeBasics(secret=True, config_map=True)
    assert basics[1] == MakeLauncherAccess(
        (("ServiceAccount", "j-launcher"), ("Role", "j-launcher"))
    )
    assert kinds(writes) == [
        "AdoptScaler", "ScalerStatusWrite", "JobStatusWrite", "SpecReplicas", "MakeGang",
        "HostList", "DeletePod", "DeletePod", "WorkerObjects", "MakeLauncher", "MakeScaler",
        "DeleteWorkload", "MakeWorkload", "MakeWorkload", "MakeWorkload", "UpdateWorkload",
        "UpdateWorkload",
    ]  # fmt: skip
    assert writes[0] == AdoptScaler(("ScaleIn", "less"))
    assert writes[1] == ScalerStatusWrite(("ScaleIn", "less"), ScaleInStatus(phase="Scaling"))
    assert writes[3] == SpecReplicas(2)
    assert writes[5] == HostList(("j-worker-0", "j-worker-3"))
    assert writes[6:8] == [DeletePod("j-worker-1", False), DeletePod("j-worker-2", True)]
    assert writes[8] == WorkerObjects(("j-worker-0", "j-worker-3"), (3,))
    assert isinstance(writes[2], JobStatusWrite) and isinstance(writes[4], MakeGang)
    assert isinstance(writes[9], MakeLauncher) and isinstance(writes[10], MakeScaler)
    # Kueue's last (after the pods: a shrink gives its quota back once done), deletes first.
    assert writes[11:] == [
        DeleteWorkload("w-grow-3"),
        MakeWorkload("w-grow-4", 2, "w-surplus", True),
        MakeWorkload("w", 2, None, False),
        MakeWorkload("w-surplus", 1, None, True),
        UpdateWorkload(True, 2, True, (("Finished", "True", "Succeeded", "done"),), ""),
        UpdateWorkload(False, None, None, (), "Preempted"),
    ]


def test_a_job_whose_queue_label_went_drops_its_workloads_and_nothing_else() -> None:
    writes = ordered(EVERYTHING, JobStatus(), pods=True, queue=Queueing(False))
    assert kinds(writes)[-2:] == ["MakeScaler", "DropWorkloads"]
    assert writes[-1] == DropWorkloads()


def test_a_family_s_changes_are_one_write_and_a_family_with_none_gets_none() -> None:
    d = Draft(inp(jspec(), {}, []))
    ready = ("PodsReady", "True", "PodsReady", "ready")
    d.update_workload(True, resize=2)
    d.update_workload(True, resize=3, condition=ready)
    d.to_kueue(MakeWorkload("w-surplus", 1, None, True))
    d.to_kueue(MakeWorkload("w-surplus", 2, None, True))  # the pass's last word
    writes = ordered(d.plan, JobStatus(), pods=True, queue=QUEUE)
    assert [w for w in writes if isinstance(w, UpdateWorkload | MakeWorkload)] == [
        MakeWorkload("w-surplus", 2, None, True),
        UpdateWorkload(True, 3, None, (ready,), ""),
    ]


def test_a_status_as_read_is_not_written_again() -> None:
    writes = ordered(EVERYTHING, JobStatus(phase="Running"), pods=True, queue=None)
    assert "JobStatusWrite" not in kinds(writes) and "MakeWorkload" not in kinds(writes)


def test_a_job_whose_pods_may_not_be_touched_gets_its_statuses_only() -> None:
    """Its spec unreadable, or the Secret, ConfigMap or RBAC its pods need missing."""
    writes = ordered(EVERYTHING, JobStatus(), pods=False, queue=QUEUE)
    assert kinds(writes) == [
        "MakeBasics", "MakeLauncherAccess", "UpdateLauncherRole",
        "AdoptScaler", "ScalerStatusWrite", "JobStatusWrite", "SpecReplicas",
    ]  # fmt: skip
