"""Queued jobs (Kueue), planned: no pod without an admission, the run at the admitted size,
growth only through an admitted slice, quota given back, evictions stopped and released."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from etoperator.api.models import JobSpec, parse_job
from etoperator.api.statuses import JobStatus
from etoperator.builders import workload
from etoperator.builders.common import job_owner
from etoperator.planning import JobInput, PodView, plan_job, surplus
from etoperator.planning.views import QueueView
from etoperator.status import Condition, condition
from localcluster.manifests import job, scaleout
from tests.unit.test_planning import NOW, inp, jspec, launcher, running_status, scaler, w


def qspec(**kw: Any) -> JobSpec:
    b = job("j", **kw)
    b["metadata"].update(namespace="ns", uid="u", labels={"kueue.x-k8s.io/queue-name": "lq"})
    return parse_job(b)


def queued(
    spec: JobSpec, status: JobStatus | dict[str, Any], pods: list[PodView], q: QueueView
) -> JobInput:
    return dataclasses.replace(inp(spec, status, pods), queue=q)


ADMITTED = QueueView(
    queue="lq", workload="wl", workers=2, reserved=True, admitted=True, admitted_workers=2,
    cluster_queue="cq",
)  # fmt: skip


def cond(status: JobStatus, ctype: str) -> Condition:
    return condition(status.conditions or [], ctype) or Condition()


def test_a_new_queued_job_makes_its_core_workload_and_no_pod() -> None:
    """The core asks for the launcher and minReplicas workers; the rest is the surplus's,
    asked for once the core is admitted."""
    plan = plan_job(queued(qspec(replicas=3, minReplicas=2), {}, [], QueueView(queue="lq")))
    assert plan.make_workload == 2 and plan.make_surplus is None
    assert plan.create_workers == [] and not plan.create_launcher
    assert plan.status.phase == "Queued"
    assert cond(plan.status, "Queued")["reason"] == "Queued"
    assert plan.status.target_workers == [] and plan.status.last_worker_index == -1


def test_admitted_the_run_starts_at_the_admitted_size_with_the_first_names() -> None:
    spec = qspec(replicas=3, minReplicas=2)
    status = plan_job(queued(spec, {}, [], QueueView(queue="lq"))).status
    plan = plan_job(queued(spec, status, [], ADMITTED))
    assert plan.create_workers == [0, 1]
    assert plan.spec_replicas is None  # spec keeps what was asked: the rest comes later
    assert cond(plan.status, "Queued")["reason"] == "Admitted"
    assert "2 workers of 3 asked" in cond(plan.status, "Queued")["message"]
    assert plan.make_surplus == 1  # asked for at once, at a lower priority


def extra(workers: int, admitted: int, **kw: Any) -> QueueView:
    kw = {"workload": "wl-surplus", "reserved": admitted > 0, **kw}
    return QueueView(
        queue="lq", workers=workers, admitted=admitted > 0, admitted_workers=admitted, **kw
    )


def test_a_partly_admitted_job_asks_for_the_rest_and_grows_once_admitted() -> None:
    spec = qspec(replicas=3)
    status = running_status([0, 1], acceptedReplicas=3)
    pods = [w(0), w(1), launcher()]
    q = dataclasses.replace(ADMITTED, workers=1, admitted_workers=1, surplus=extra(2, 1))
    plan = plan_job(queued(spec, status, pods, q))
    # The surplus was admitted one worker of two: a slice of it asks for both.
    assert plan.make_slice is not None and plan.make_slice[1:] == (2, "wl-surplus")
    assert plan.create_workers == []
    grown = dataclasses.replace(q, surplus=extra(2, 2))
    plan = plan_job(queued(spec, status, pods, grown))
    assert plan.create_workers == [2]
    assert plan.status.target_workers == ["j-worker-0", "j-worker-1", "j-worker-2"]


def test_a_scale_out_creates_no_worker_until_its_slice_is_admitted() -> None:
    spec = qspec(replicas=2, maxReplicas=4)
    pods = [w(0), w(1), launcher()]
    so = scaler(scaleout("more", "j", 1))
    start = plan_job(dataclasses.replace(queued(spec, running_status([0, 1]), pods, ADMITTED),
                                         scalers=[so]))  # fmt: skip
    assert start.create_workers == []  # held from the pass it starts in
    so = dataclasses.replace(so, status=start.scaler_status[so.kind_name])
    wait = plan_job(dataclasses.replace(queued(spec, start.status, pods, ADMITTED), scalers=[so]))
    # No surplus yet: a new one asks for the ScaleOut's worker whole (no minCount).
    assert wait.make_slice is not None and wait.make_slice[1:] == (1, "")
    assert wait.create_workers == []
    sc = (wait.scaler_status.get(so.kind_name) or so.status).to_dict()
    assert "WaitingForQuota" in str(sc["conditions"])
    made = dataclasses.replace(ADMITTED, surplus=extra(1, 0, workload=wait.make_slice[0]))
    again = plan_job(dataclasses.replace(queued(spec, start.status, pods, made), scalers=[so]))
    assert again.make_slice is None and again.create_workers == []  # asked once
    admitted = dataclasses.replace(made, surplus=extra(1, 1, workload=wait.make_slice[0]))
    go = plan_job(dataclasses.replace(queued(spec, start.status, pods, admitted), scalers=[so]))
    assert go.create_workers == [2] and go.surplus_workers == [2]


def test_shrunk_below_what_it_holds_the_workload_gives_quota_back() -> None:
    spec = qspec(replicas=1)
    q = dataclasses.replace(ADMITTED, workers=2)
    plan = plan_job(queued(spec, running_status([0]), [w(0), launcher()], q))
    assert plan.updated(True).resize == 1


def test_evicted_the_pods_go_then_the_admission_is_given_back() -> None:
    spec = qspec(replicas=2)
    q = dataclasses.replace(
        ADMITTED, evicted="Preempted: higher priority", evicted_reason="Preempted"
    )
    pods = [w(0), w(1), launcher()]
    plan = plan_job(queued(spec, running_status([0, 1]), pods, q))
    assert plan.delete_pods == ["j-launcher"]  # first: its preStop asks for a save
    workers = plan_job(queued(spec, plan.status, [w(0), w(1)], q))
    assert workers.delete_pods == ["j-worker-0", "j-worker-1"] == workers.stop_now
    assert (
        plan.updated(True).release == workers.updated(True).release == ""
    )  # not while a pod is left
    assert plan.status.phase == "Queued"
    assert cond(plan.status, "Queued")["reason"] == "Evicted"
    later = plan_job(queued(spec, plan.status, [], q))
    assert later.updated(True).release == "Preempted"


def test_without_kueue_the_job_says_so_and_starts_nothing() -> None:
    plan = plan_job(queued(qspec(), {}, [], QueueView(queue="lq", served=False)))
    assert plan.create_workers == [] and plan.make_workload is None
    assert cond(plan.status, "Queued")["reason"] == "KueueNotInstalled"
    assert any(e.type == "Warning" for e in plan.events)


def test_an_ended_job_finishes_its_workload_once_its_pods_are_gone() -> None:
    spec = qspec(replicas=2)
    pods = [w(0), w(1), launcher("Succeeded")]
    plan = plan_job(queued(spec, running_status([0, 1]), pods, ADMITTED))
    assert plan.status.phase == "Succeeded"
    assert sorted(plan.delete_pods) == ["j-worker-0", "j-worker-1"]
    assert plan.updated(True).conditions == ()  # Kueue would free quota its pods still use
    going = [dataclasses.replace(w(0), deleting=True), launcher("Succeeded")]
    assert plan_job(queued(spec, plan.status, going, ADMITTED)).updated(True).conditions == ()
    later = plan_job(queued(spec, plan.status, [launcher("Succeeded")], ADMITTED))
    assert [c[:3] for c in later.updated(True).conditions] == [("Finished", "True", "Succeeded")]


def test_a_scale_in_gives_quota_back_once_its_victim_is_gone() -> None:
    spec = qspec(replicas=1)
    q = dataclasses.replace(ADMITTED, workers=2)
    going = [w(0), dataclasses.replace(w(1), deleting=True), launcher()]
    assert plan_job(queued(spec, running_status([0]), going, q)).updated(True).resize is None
    gone = plan_job(queued(spec, running_status([0]), [w(0), launcher()], q))
    assert gone.updated(True).resize == 1


def test_a_lost_worker_is_replaced_only_once_its_pod_is_gone() -> None:
    """Replacing it at once would run three workers' pods in an admission of two."""
    spec = qspec(replicas=2, workerRestartPolicy="Always")
    lost = dataclasses.replace(w(1), deleting=True)
    plan = plan_job(queued(spec, running_status([0, 1]), [w(0), lost, launcher()], ADMITTED))
    assert plan.create_workers == []
    assert plan.status.target_workers == ["j-worker-0", "j-worker-2"]  # named, not made yet
    later = plan_job(queued(spec, plan.status, [w(0), launcher()], ADMITTED))
    assert later.create_workers == [2]


VIEWS = st.builds(
    QueueView,
    queue=st.just("lq"),
    served=st.booleans(),
    workload=st.sampled_from(["", "wl"]),
    workers=st.integers(1, 4),
    reserved=st.booleans(),
    admitted=st.just(False),
    evicted=st.sampled_from(["", "Preempted: x"]),
)


@given(q=VIEWS, members=st.integers(1, 3), launched=st.booleans())
def test_no_pod_is_ever_made_without_an_admission(
    q: QueueView, members: int, launched: bool
) -> None:
    """A job admitted before (a label added to a running job is the next test's)."""
    pods = [w(i) for i in range(members)] + ([launcher()] if launched else [])
    status = running_status(list(range(members)))
    status["conditions"].append(ADMITTED_COND)
    plan = plan_job(queued(qspec(replicas=members), status, pods, q))
    assert plan.create_workers == [] and not plan.create_launcher
    first = ["j-launcher"] if launched else [p.name for p in pods]  # its workers once it is gone
    assert sorted(plan.delete_pods) == sorted(first)
    assert plan.status.phase == "Queued"


ADMITTED_COND = {"type": "Queued", "status": "False", "reason": "Admitted", "message": "x"}


def test_a_queue_label_added_to_a_running_job_takes_effect_at_its_next_start() -> None:
    """It restarted the run (every worker replaced); Kueue's integrations refuse the change."""
    pods = [w(0), w(1), launcher()]
    plan = plan_job(queued(qspec(replicas=2), running_status([0, 1]), pods, QueueView("lq")))
    assert plan.delete_pods == [] and plan.make_workload is None
    assert plan.status.phase == "Running"
    assert cond(plan.status, "Queued")["reason"] == "QueuedAtNextStart"
    assert [e.reason for e in plan.events if e.type == "Warning"] == ["QueuedAtNextStart"]


def test_a_running_job_whose_workload_was_deleted_says_so_and_queues_again() -> None:
    status = running_status([0, 1])
    status["conditions"].append(ADMITTED_COND)
    plan = plan_job(queued(qspec(replicas=2), status, [w(0), w(1), launcher()], QueueView("lq")))
    assert cond(plan.status, "Queued")["reason"] == "WorkloadDeleted"
    assert plan.make_workload == 1 and plan.status.phase == "Queued"


def test_a_job_taken_out_of_its_queue_starts_a_run() -> None:
    waiting = plan_job(queued(qspec(replicas=2), {}, [], QueueView(queue="lq"))).status
    plan = plan_job(inp(jspec(replicas=2), waiting, []))
    assert plan.create_workers == [0, 1]
    assert cond(plan.status, "Queued")["reason"] == "LeftQueue"


def test_a_gang_job_is_never_admitted_below_its_gang() -> None:
    from etoperator.builders.common import Owner
    from etoperator.builders.workload import workload

    b = job("j", replicas=4, minReplicas=1)
    b["metadata"].update(namespace="ns", uid="u", labels={"kueue.x-k8s.io/queue-name": "lq"})
    b["spec"]["schedulingPolicy"] = {"minAvailable": 3}
    body = workload(parse_job(b), Owner("TrainingJob", "j", "u"), "wl", 4)
    worker = next(ps for ps in body["spec"]["podSets"] if ps["name"] == "worker")
    assert worker["minCount"] == 3


def test_the_admitted_message_keeps_the_size_admitted_now() -> None:
    """It kept the first admission's size after the job grew through a slice."""
    spec = qspec(replicas=3)
    pods = [w(0), w(1), w(2), launcher()]
    q = dataclasses.replace(ADMITTED, workers=3, admitted_workers=3)
    status = running_status([0, 1, 2])
    status["conditions"].append(
        {"type": "Queued", "status": "False", "reason": "Admitted",
         "message": "admitted by ClusterQueue cq: 2 workers of 3 asked (partial admission)"}
    )  # fmt: skip
    plan = plan_job(queued(spec, status, pods, q))
    assert cond(plan.status, "Queued")["message"] == "admitted by ClusterQueue cq: 3 workers"
    assert not [e for e in plan.events if e.reason == "Admitted"]  # kept current, no event


PREEMPTED: dict[str, Any] = {"evicted": "Preempted: by a job", "evicted_reason": "Preempted"}


def reclaiming(views: list[PodView], q: QueueView) -> list[PodView]:
    """The pods as the observer hands them on: those beyond Kueue's admission leaving."""
    return surplus.reclaimed_views(views, q, NOW)


def test_a_surplus_kueue_takes_back_leaves_gracefully_and_grows_back_when_readmitted() -> None:
    """Shrink instead of evict: the surplus's workers leave the host list (not replaced, the
    spec kept), go once Horovod has left them, the surplus's admission is given back once they
    are gone, and the job grows back when Kueue admits it again."""
    spec = qspec(replicas=4, minReplicas=2)
    status = running_status([0, 1, 2, 3], acceptedReplicas=4)
    core = dataclasses.replace(ADMITTED, workers=2, admitted_workers=2)
    taken = dataclasses.replace(core, surplus=extra(2, 0, reserved=True, **PREEMPTED))
    pods = [w(0), w(1), w(2, surplus=True), w(3, surplus=True), launcher()]
    plan = plan_job(queued(spec, status, reclaiming(pods, taken), taken))
    assert plan.status.target_workers == ["j-worker-0", "j-worker-1"]
    assert plan.status.current_workers == ["j-worker-0", "j-worker-1"]
    assert plan.hosts == ["j-worker-0", "j-worker-1"]
    assert plan.delete_pods == [] and plan.create_workers == []  # Horovod is still on them
    assert plan.spec_replicas is None and plan.status.phase == "Running"  # no restart
    assert plan.updated(False).release == ""
    reasons = [e.reason for e in plan.events]
    assert "QuotaReclaimed" in reasons and "WorkerLost" not in reasons
    left = [w(0), w(1), w(2, surplus=True, busy=False), w(3, surplus=True, busy=False), launcher()]
    drained = plan_job(queued(spec, plan.status, reclaiming(left, taken), taken))
    assert sorted(drained.delete_pods) == ["j-worker-2", "j-worker-3"]
    gone = plan_job(queued(spec, plan.status, [w(0), w(1), launcher()], taken))
    assert gone.updated(False).release == "Preempted" and gone.spec_replicas is None
    back = dataclasses.replace(core, surplus=extra(2, 2))
    grown = plan_job(queued(spec, gone.status, [w(0), w(1), launcher()], back))
    assert grown.create_workers == [4, 5] and grown.surplus_workers == [4, 5]


def test_the_surplus_s_workers_are_taken_back_first_then_the_newest() -> None:
    q = dataclasses.replace(ADMITTED, workers=2, admitted_workers=2)
    views = [w(0, surplus=True), w(1), w(2), w(3)]
    assert surplus.reclaimed(views, q) == {"j-worker-0", "j-worker-3"}
    going = [w(0, surplus=True, deleting=True), w(1), w(2), w(3)]
    assert surplus.reclaimed(going, q) == {"j-worker-3"}  # one going already counts
    assert surplus.reclaimed(views[:2], q) == set()
    evicted = dataclasses.replace(q, **PREEMPTED)  # the whole job stops instead
    assert surplus.reclaimed(views, evicted) == set()


def test_a_scale_in_lowers_the_surplus_then_removes_it() -> None:
    spec = qspec(replicas=3, minReplicas=2)
    q = dataclasses.replace(ADMITTED, workers=2, surplus=extra(2, 2))
    pods = [w(0), w(1), w(2), launcher()]
    plan = plan_job(queued(spec, running_status([0, 1, 2], acceptedReplicas=3), pods, q))
    assert plan.updated(False).resize == 1 and plan.updated(True).resize is None
    spec = qspec(replicas=2, minReplicas=2)
    going = [w(0), w(1), dataclasses.replace(w(2), deleting=True), launcher()]
    status = running_status([0, 1], acceptedReplicas=2)
    assert "wl-surplus" not in plan_job(queued(spec, status, going, q)).delete_workloads
    gone = plan_job(queued(spec, status, [w(0), w(1), launcher()], q))
    assert gone.delete_workloads == ["wl-surplus"] and gone.updated(True).resize is None


def test_a_job_evicted_whole_drops_its_surplus_once_its_pods_are_gone() -> None:
    spec = qspec(replicas=3)
    q = dataclasses.replace(ADMITTED, surplus=extra(1, 0), **PREEMPTED)
    pods = [w(0), w(1), w(2), launcher()]
    plan = plan_job(queued(spec, running_status([0, 1, 2]), pods, q))
    assert plan.status.phase == "Queued" and plan.delete_workloads == []
    later = plan_job(queued(spec, plan.status, [], q))
    assert later.delete_workloads == ["wl-surplus"] and later.updated(True).release == "Preempted"


def test_a_reclaimed_worker_whose_drain_cannot_be_told_goes_at_the_bound() -> None:
    """Where the operator cannot tell whether Horovod has left a worker (no answer over SSH or
    exec), the worker waited for ever, and with it the job that preempted the surplus (Kueue
    admits it only once the surplus's admission is given back)."""
    spec = qspec(replicas=3, minReplicas=2)
    status = running_status([0, 1], acceptedReplicas=3)
    pods = [w(0), w(1), w(2, surplus=True), launcher()]

    def taken(ago: float) -> QueueView:
        at = NOW - timedelta(seconds=ago)
        return dataclasses.replace(
            ADMITTED, surplus=extra(1, 0, reserved=True, evicted_at=at, **PREEMPTED)
        )

    early = taken(surplus.RECLAIM_DRAIN - 5)
    plan = plan_job(queued(spec, status, surplus.reclaimed_views(pods, early, NOW), early))
    assert plan.delete_pods == [] and plan.requeue <= 5
    late = taken(surplus.RECLAIM_DRAIN + 1)
    plan = plan_job(queued(spec, status, surplus.reclaimed_views(pods, late, NOW), late))
    assert plan.delete_pods == ["j-worker-2"]


def test_a_workload_owned_by_the_pods_keeps_the_job_as_its_controller() -> None:
    """The owners patch names the job (the one controller) and each pod, nothing else: the
    garbage collector keeps the Workload while any of them lives."""
    spec = parse_job(job("j", 2))
    body = workload.owned_by_pods(job_owner(spec), [("j-worker-0", "u0"), ("j-worker-1", "u1")])
    refs = body["metadata"]["ownerReferences"]
    assert [r["controller"] for r in refs if r.get("controller")] == [True]
    assert refs[0]["kind"] == "TrainingJob" and refs[0]["name"] == "j"
    assert [(r["kind"], r["name"], r["uid"]) for r in refs[1:]] == [
        ("Pod", "j-worker-0", "u0"),
        ("Pod", "j-worker-1", "u1"),
    ]
