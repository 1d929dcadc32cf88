"""Kueue: a job labelled with a LocalQueue runs only while Kueue admits its Workload, at the
size admitted. It grows through a slice (a Workload replacing the current one) that Kueue must
admit before any new worker is made; it gives quota back as soon as it shrinks; evicted, it
stops, gives its admission back once its pods are gone, and waits to be admitted again.
The Workload writes are in the plan (views.Plan); reconcile/queues.py makes them."""

from __future__ import annotations

import hashlib

from etoperator import naming
from etoperator import status as st
from etoperator.builders import workload as wl
from etoperator.planning.draft import Draft, Members
from etoperator.planning.ends import fail_job
from etoperator.planning.kinds import DeleteWorkload, MakeWorkload, OwnWorkload
from etoperator.planning.rules import workers
from etoperator.planning.surplus import (
    ask_more,
    drop_surplus,
    give_back,
    grows,
    live_workers,
    release_reclaimed,
)
from etoperator.planning.views import QueueView, ScalerView
from etoperator.status import Event

QUEUED = "Queued"  # the job's condition while it waits for Kueue
KUEUE_API = f"{naming.KUEUE_GROUP}/{naming.KUEUE_VERSION}"
UNMADE_RETRY = 5.0  # seconds between tries to make a Workload Kueue's webhook refused


def hold_for_queue(d: Draft) -> bool:
    """True when the queue holds the job this pass (no pod of it may run; its surplus goes
    once they are gone); False: the run goes on, its pods placed as the admission says."""
    q = d.inp.queue
    if q is None:
        return False
    held = hold(d, q)
    if held:
        drop_surplus(d, q)
    return held


def hold(d: Draft, q: QueueView) -> bool:
    for name in (*q.strays, *(q.surplus.strays if q.surplus else ())):
        d.to_kueue(DeleteWorkload(name))
    if not q.served:
        why = (
            f"labelled {naming.LABEL_QUEUE}={q.queue}, but this cluster serves no Kueue API "
            f"({KUEUE_API}): the job waits, with no pod, until Kueue is installed or the label "
            "is removed"
        )
        return wait(d, "KueueNotInstalled", why, warn=True)
    if q.finished and q.replaced:
        return admission_lost(d, q)
    if q.finished:
        fail_job(d, "WorkloadFinished", f"Kueue ended its Workload {q.workload}: {q.finished}")
        return True
    if not q.workload and d.run_goes_on():
        if not was_admitted(d):
            return queued_while_running(d, q)
        make_core(d)
        why = (
            "its Workload was deleted while it ran: no admission holds its pods, so it stops "
            "and queues again with a new one (as Kueue's own integrations do)"
        )
        return wait(d, "WorkloadDeleted", why, warn=True)
    if not q.workload:
        make_core(d)
        if q.unmade:
            d.plan.requeue = min(d.plan.requeue, UNMADE_RETRY)
            why = f"its Workload could not be made (is Kueue running?): {q.unmade}"
            return wait(d, "KueueNotAnswering", why, warn=True)
        return wait(d, QUEUED, f"queued in {q.queue}: its Workload is being made")
    if not q.active:
        d.update_workload(True, activate=True)  # resumed: back in the queue
    if q.evicted and q.reserved:
        return evicted(d, q)
    if not q.admitted:
        follow_spec(d, q)
        again = f" again after an eviction ({q.evicted})" if q.evicted else ""
        return wait(d, QUEUED, f"queued in {q.queue}{again}: {q.why or 'waiting for quota'}")
    if d.phase == st.QUEUED and not d.run_goes_on():  # else a phase forged over a run
        admit(d, q)
    if q.handing_over:  # its admission comes in a moment, or the job stops (HANDOVER)
        d.plan.requeue = min(d.plan.requeue, 2.0)
    d.plan.placement = dict(q.placement)
    return False


def owned_by_pods(d: Draft) -> None:
    """Every Workload holding quota is owned by the job's pods (all of them, those being
    deleted too): a job deleted takes its Workloads only once its pods are gone, so Kueue
    never counts its quota free while they still run (no finalizer of ours: the garbage
    collector does it, the operator there or not)."""
    q = d.inp.queue
    if q is None:
        return
    pods = tuple(sorted((p.name, p.uid) for p in d.inp.pods if p.uid))
    uids = {uid for _, uid in pods}
    for name, owners in q.owners:
        if owners != uids:
            d.plan.emit(OwnWorkload(name, pods))


def make_core(d: Draft) -> None:
    """The job's core Workload: the launcher and its minimum of workers."""
    name = naming.workload_name(d.spec.name, d.spec.uid)
    d.to_kueue(MakeWorkload(name, wl.core_workers(d.spec), None, False))


def was_admitted(d: Draft) -> bool:
    queued = st.condition(d.status.conditions or [], QUEUED) or {}
    return queued.get("reason") == "Admitted"


def queued_while_running(d: Draft, q: QueueView) -> bool:
    """The queue label was added to a running job: Kueue's own integrations refuse a queue
    change on a running job; this one cannot refuse it, so it takes effect at the job's next
    start, and the run goes on (said once, as a Warning)."""
    message = (
        f"labelled {naming.LABEL_QUEUE}={q.queue} while it runs: a running job's queue does "
        "not change (as in Kueue's own integrations); it runs on, and is queued from its next "
        "start"
    )
    old = st.condition(d.status.conditions or [], QUEUED) or {}
    news = old.get("reason") != "QueuedAtNextStart"
    d.set_cond(QUEUED, "False", "QueuedAtNextStart", message, event=False)
    if news:
        d.plan.tell(Event("Warning", "QueuedAtNextStart", message))
    return False


def wait(d: Draft, reason: str, message: str, warn: bool = False) -> bool:
    """No pod runs: the run stops (its running scale fails) and the job waits, saying why
    (an Event only when the reason changes: Kueue's words on quota change often)."""
    d.stop_run("JobQueued", f"the job waits for its queue: {message}")
    if d.status_read.phase is None:
        # Its first pass named the workers of a run that never started: names stay unused.
        d.unname_run()
    d.happened.waits = st.QUEUED
    old = st.condition(d.status.conditions or [], QUEUED) or {}
    news = old.get("status") != "True" or old.get("reason") != reason
    d.set_cond(QUEUED, "True", reason, message, warn=warn, event=news)
    return True


def admission_lost(d: Draft, q: QueueView) -> bool:
    """Kueue finished the job's Workload for a slice that is gone (deleted as Kueue admitted
    it, or one the operator never made): the job did not end, it holds no admission. It stops
    as an evicted job does, and queues again with a new Workload once its pods are gone."""
    why = f"Kueue finished its Workload {q.workload} for a slice that is gone ({q.finished})"
    wait(d, "AdmissionLost", f"{why}; queued again", warn=True)
    if not d.inp.pods:
        d.to_kueue(DeleteWorkload(q.workload))  # the next pass makes a new one
    else:
        d.come_back("the pods of a job that lost its admission are going")
    return True


def evicted(d: Draft, q: QueueView) -> bool:
    """Evicted (preempted, a node lost, PodsReady not in time, deactivated): stop, and once
    no pod is left give the admission back, which puts the Workload back in the queue."""
    wait(d, "Evicted", f"evicted by Kueue ({q.evicted}); waits to be admitted again", warn=True)
    release(d, q)
    return True


def release(d: Draft, q: QueueView) -> None:
    if q.reserved and q.evicted and not d.inp.pods:
        d.update_workload(True, release=q.evicted_reason or "Evicted")
    elif q.reserved and q.evicted:
        d.come_back("an evicted job's pods are going")


def admit(d: Draft, q: QueueView) -> None:
    """Admitted: a fresh run at the admitted size. Fewer workers than asked (partial
    admission): spec replicas stay what was asked, and the job grows once Kueue admits the
    rest (`settle`)."""
    d.start_fresh_run()
    message = say_admitted(d, q)
    d.plan.tell(Event("Normal", "Admitted", message))
    if q.surplus is None and d.spec.worker.replicas > q.workers:
        need = d.spec.worker.replicas - q.workers
        d.to_kueue(MakeWorkload(wl.surplus_name(d.spec), need, None, True))


def say_admitted(d: Draft, q: QueueView) -> str:
    """The Queued condition (False, Admitted) with the size Kueue admits now (kept current as
    the job grows and shrinks through its admission, without an event each time)."""
    asked = d.spec.worker.replicas
    message = f"admitted by ClusterQueue {q.cluster_queue}: {workers(q.room)}"
    s = q.surplus
    if s is not None and s.evicted:
        message += (
            f" of {asked} asked (Kueue took back the quota above the core, {s.evicted}: "
            "the job trains on without those workers, and grows back when the queue admits "
            "them again)"
        )
    elif q.room < asked:
        message += f" of {asked} asked (partial admission: the rest when the queue admits it)"
    if q.cluster_queue:  # empty while a slice takes over from the Workload it replaces
        d.set_cond(QUEUED, "False", "Admitted", message, event=False)
    return message


def follow_spec(d: Draft, q: QueueView) -> None:
    """`kubectl scale` of a queued job: its Workload asks for the new size."""
    replicas = d.spec.worker.replicas
    if wl.core_workers(d.spec) != q.workers and not q.reserved:
        d.update_workload(True, resize=wl.core_workers(d.spec))
    d.accept_replicas(replicas)


def suspended(d: Draft) -> None:
    """A suspended job leaves the queue (its Workload inactive), and gives its admission back
    once Kueue has evicted it and its pods are gone."""
    q = d.inp.queue
    if q is None or not q.served or not q.workload or q.finished:
        return
    if q.active:
        d.update_workload(True, activate=False)
    release(d, q)
    drop_surplus(d, q)


def finished(d: Draft) -> None:
    """The job ended: its Workload is finished (Kueue frees the quota at once), a slice of it
    removed."""
    q = d.inp.queue
    if q is None or not q.served or not q.workload:
        return
    if q.growing:
        d.to_kueue(DeleteWorkload(q.growing))
    if q.surplus is not None and not going_pods(d):
        drop_surplus(d, q)
    if not q.finished:
        if going_pods(d):
            # Kueue frees the quota at Finished: not while a pod it counted still runs.
            d.come_back("the ended job's pods are going (its quota is freed after)")
            return
        ok = d.phase == st.SUCCEEDED
        cond = st.condition(d.status.conditions or [], st.SUCCEEDED if ok else st.FAILED) or {}
        message = str(cond.get("message") or d.phase)
        d.update_workload(
            True, condition=("Finished", "True", "Succeeded" if ok else "Failed", message)
        )


def slice_name(d: Draft, sc: ScalerView) -> str:
    """The slice a ScaleOut asks for: one name per scaler (a new one for a new scaler of the
    same name), so a pass repeated after a crash asks for the same one."""
    digest = hashlib.sha256(f"{sc.kind}/{sc.name}/{sc.created}".encode()).hexdigest()[:5]
    return f"{naming.workload_name(d.spec.name, d.spec.uid)}-{digest}"


def admits(q: QueueView, workers: int) -> bool:
    """Kueue has admitted this many workers: the core, the surplus, a slice replacing one."""
    return q.room >= workers


def growing_why(q: QueueView) -> str:
    """Why the job's growth waits: its slice could not be made, or Kueue's words on it."""
    s = q.surplus
    if q.growing_why or s is None:
        return q.growing_why
    return s.growing_why or ("" if s.admitted else s.why)


def quota_to_grow(d: Draft, sc: ScalerView) -> str | None:
    """A ScaleOut of a queued job: None once Kueue has admitted the new size; else what it
    waits for."""
    q = d.inp.queue
    if q is None or not q.served:
        return None
    wanted = len(d.status.members)
    if admits(q, wanted):
        return None
    return f"waiting for queue {q.queue} to admit {workers(wanted)}: {growing_why(q) or 'queued'}"


def ask_to_grow(d: Draft, sc: ScalerView) -> None:
    """The surplus the ScaleOut's size needs: a slice replacing the surplus, or a new surplus
    asked whole where there is none (one a pass asked for before stays; another is
    replaced)."""
    q = d.inp.queue
    assert q is not None
    name, s = slice_name(d, sc), q.surplus
    need = len(d.status.members) - q.workers
    if need <= 0 or (s is not None and name in (s.workload, s.growing)):
        return
    if s is None:
        d.to_kueue(MakeWorkload(name, need, "", True))
        return
    if s.growing:
        d.to_kueue(DeleteWorkload(s.growing))  # a slice no scale waits for
    d.to_kueue(MakeWorkload(name, need, s.workload, True))


def held_by_quota(d: Draft) -> set[str]:
    """Workers not to create yet: a ScaleOut's (from the pass it starts in), until Kueue
    admits the job's new size."""
    q = d.inp.queue
    ref = naming.parse_scaler_ref(str(d.status.current_scaler or ""))
    if q is None or ref is None or ref[0] != naming.SCALEOUT_KIND:
        return set()
    if admits(q, len(d.status.members)):
        return set()
    return set(d.status.scaler_pods or [])


def admitted_not_added(d: Draft) -> int:
    """Workers Kueue admitted that a running queued job has not added yet (settle adds them).
    A scaler started before they are would judge the job by the part it ran first: a ScaleIn
    of 2 from a job of 4 whose surplus was admitted that pass failed, "removing 2 of 2
    workers would leave 0"."""
    q = d.inp.queue
    if q is None or not q.admitted or d.phase not in (st.RUNNING, st.SCALING):
        return 0
    wanted = d.status.accepted_replicas or d.spec.worker.replicas
    return max(0, min(wanted, q.room) - len(d.status.members))


def settle(d: Draft) -> None:
    """After a running job's pass, with no scale running: PodsReady once it runs; workers added
    up to spec replicas as far as Kueue has admitted, the surplus asked for the rest; the
    surplus (then the core) lowered once the job wants fewer workers than they ask for (after
    a ScaleIn, or a scale rolled back after its slice was admitted): quota back at once; a
    surplus Kueue took back given back once its workers are gone. A slice nothing waits for
    is removed."""
    q = d.inp.queue
    if q is None or not q.admitted or d.phase not in (st.RUNNING, st.SCALING):
        return
    say_admitted(d, q)
    if not q.pods_ready:
        ready = ("PodsReady", "True", "PodsReady", "the launcher runs and its workers are ready")
        d.update_workload(True, condition=ready)
    release_reclaimed(d, q)
    active = d.active_scaler()
    wanted_slice = slice_name(d, active) if active is not None else ""
    if not d.status.current_scaler:
        # What the job wants after this pass (a scale rolled back gives its size back).
        wanted = d.status.accepted_replicas or d.spec.worker.replicas
        size, due = len(d.status.members), admitted_not_added(d)
        if due:
            grow(d, due)
        elif size < wanted:
            wanted_slice = ask_more(d, q, wanted)
        elif wanted < q.asked and not grows(q):
            give_back(d, q, wanted)
    for family in (q, q.surplus):
        if family is not None and family.growing and family.growing != wanted_slice:
            d.to_kueue(DeleteWorkload(family.growing))


def going_pods(d: Draft) -> bool:
    """A pod of the job is being deleted (or is by this pass) and has not ended yet."""
    return any(
        (p.deleting or p.name in d.plan.delete_pods) and p.phase not in ("Succeeded", "Failed")
        for p in d.inp.pods
    )


def within_admission(d: Draft, creating: list[int]) -> list[int]:
    """The new workers a queued job may create now: as many as fit in what Kueue admits at
    this moment beside the worker pods still there (one being deleted counts until it is
    gone). The rest are made by a later pass (a member without a pod is made then)."""
    q = d.inp.queue
    if q is None or not q.served:
        return creating
    allowed = max(q.room - live_workers(d), 0)
    if len(creating) > allowed:
        d.come_back("new workers wait for room in the admission (pods still going)")
    return creating[:allowed]


def grow(d: Draft, count: int) -> None:
    """Kueue admitted more workers than the job runs: they join as replacements do (members
    first; each enters the host list once ready)."""
    job = d.spec.name
    indices = d.new_indices(count)
    names = [naming.worker_name(job, i) for i in indices]
    d.set_members(Members(tuple(d.status.members), tuple(d.status.hosts)).adding(*names), False)
    d.creating.extend(indices)
    message = f"the queue admitted {workers(count)} more: adding {', '.join(names)}"
    d.plan.tell(Event("Normal", "Grown", message))
