"""One pass, in order: `plan_job` reads the status, says what blocks the job, then either winds
an ended job down, suspends, resumes, or advances the run (membership.py), and completes the
plan (Services, replica counts, when to come back)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from etoperator import naming
from etoperator import status as st
from etoperator.api.models import JobSpec
from etoperator.api.statuses import JobStatus
from etoperator.builders import runtimes
from etoperator.clock import iso
from etoperator.planning import gangs, queueing, surplus
from etoperator.planning.draft import Draft, Members
from etoperator.planning.ends import wind_down
from etoperator.planning.kinds import (
    AdoptScaler,
    DeleteService,
    HostList,
    JobStatusWrite,
    MakeBasics,
    MakeLauncherAccess,
    UpdateLauncherRole,
    WorkerObjects,
)
from etoperator.planning.membership import advance_run
from etoperator.planning.plan import Plan
from etoperator.planning.scalerqueue import hold_scalers
from etoperator.planning.views import JobInput
from etoperator.status import Event


def plan_job(inp: JobInput) -> Plan:
    """Everything the reconciler should do for one job and its scalers, from one observation."""
    d = Draft(inp)
    plan = plan_pass(d)
    # The phase and when the job ended are written here alone, as phases.py decides them.
    d.status.phase = d.phase
    if d.phase not in st.TERMINAL:
        d.status.completion_time = None
    elif d.status_read.phase not in st.TERMINAL:
        d.status.completion_time = d.now
    plan.status = d.status
    if d.status != d.status_read:
        plan.put(JobStatusWrite(d.status))
    return plan


def plan_pass(d: Draft) -> Plan:
    inp = d.inp
    d.status.conditions = d.status.conditions if d.status.conditions is not None else []
    if inp.spec is None:
        if d.status_read.phase and d.status_read.phase not in st.TERMINAL:
            hold_edit(d, inp.error or "invalid spec")
        else:
            refuse_invalid(d, inp.error or "invalid spec")
        return complete_plan(d)
    begin(d, inp.spec)
    update_blocked(d)
    phase = d.phase
    make_basics(d)
    if inp.hold and phase not in st.TERMINAL:
        d.plan.requeue = 5.0
        return d.plan  # status only: nothing moves until the job's basics are there
    move(d, phase, inp.spec)
    settle_after(d, phase)
    return complete_plan(d)


def begin(d: Draft, job_spec: JobSpec) -> None:
    """What every pass of a valid spec states; a job's first pass (or first since its spec
    was fixed) starts its first run."""
    fixed = refused_for_spec(d)
    if fixed:
        # The spec was fixed after being refused: nothing was ever started, begin afresh.
        d.set_cond(st.FAILED, "False", "SpecFixed", "the spec is valid now")
    drop_foreign_names(d)
    d.status.worker_selector = naming.worker_selector(job_spec.name)
    if d.inp.public_key:
        d.status.ssh_public_key = d.inp.public_key
    adopt_scalers(d)
    if not d.status_read.phase or fixed:
        d.status.start_time = d.status.start_time or d.now
        d.status.restart_count = d.status.restart_count if d.status.restart_count is not None else 0
        d.start_fresh_run()
        d.set_cond(st.CREATED, "True", "TrainingJobCreated", f"job {job_spec.name} is created")


def move(d: Draft, phase: str | None, job_spec: JobSpec) -> None:
    """The run's move this pass, by the phase the pass began in."""
    if phase in st.TERMINAL:
        wind_down(d)
        queueing.finished(d)
    elif job_spec.suspended:
        suspend(d)
        queueing.suspended(d)
    elif queueing.hold_for_queue(d) or gangs.hold_for_gang(d):
        pass
    elif phase in (st.SUSPENDED, st.QUEUED) and d.run_goes_on():
        repair_phase(d, phase)
        advance_run(d)
    elif phase == st.SUSPENDED:
        d.start_fresh_run()
        d.set_cond(st.SUSPENDED, "False", "Resumed", "job resumed")
        d.plan.tell(Event("Normal", "Resumed", "job resumed: starting afresh"))
        advance_run(d)
    elif phase == st.QUEUED and d.inp.queue is None:  # its queue label removed: no queue
        d.start_fresh_run()
        message = "no longer queued (the queue label was removed): starting"
        d.set_cond(queueing.QUEUED, "False", "LeftQueue", message, event=False)
        d.plan.tell(Event("Normal", "LeftQueue", message))
        advance_run(d)
    else:
        advance_run(d)


def settle_after(d: Draft, phase: str | None) -> None:
    """After the move: scalers held while the job does not run; Kueue's and the gang's
    objects brought to what the job now is."""
    if d.phase in (st.QUEUED, st.SUSPENDED) or gangs.waiting(d):
        hold_scalers(d, not_running_why(d))
    if d.phase in st.TERMINAL and phase not in st.TERMINAL:
        queueing.finished(d)  # ended this pass
    else:
        queueing.settle(d)
    queueing.owned_by_pods(d)
    if d.phase not in st.TERMINAL:
        gangs.settle(d)


def note_saved(d: Draft) -> None:
    """The save the stopping launcher's preStop reported (the save handshake), or the one a
    new run's launcher found on the volume: the job's status.lastSaved when newer than what
    it says, and an event the first time it is seen."""
    launcher = d.launcher
    said = launcher.saved if launcher is not None and launcher.saved else d.inp.saved
    if not said:
        return
    step, at = (part.split("=", 1)[1] for part in said.split())
    when = iso(datetime.fromtimestamp(float(at), UTC))
    if str((d.status.last_saved or {}).get("time") or "") >= when:
        return  # said already, or older than what is said
    d.status.last_saved = {"step": int(step), "time": when}
    message = f"the training saved step {step} as its run stopped"
    d.plan.tell(Event("Normal", "Saved", message))


def repair_phase(d: Draft, phase: str) -> None:
    message = (
        f"the status said {phase}, but nothing stopped the run (its launcher runs): it goes on"
    )
    d.plan.tell(Event("Warning", "StatusRepaired", message))


def not_running_why(d: Draft) -> str:
    if d.phase == st.SUSPENDED:
        return "it is suspended"
    if d.phase == st.QUEUED:
        queued = st.condition(d.status.conditions or [], queueing.QUEUED) or {}
        return str(queued.get("message") or "it is queued")
    return gangs.waiting(d)


def make_basics(d: Draft) -> None:
    """What the job's pods need, made when missing before any pod (a job that ended needs none):
    its Secret and ConfigMap (remade with the key pair and hosts the job has), the launcher's
    account, Role and binding, and a Role an older operator made brought up to date."""
    if d.phase in st.TERMINAL:
        return
    have = d.inp.basics
    if not (have.secret and have.config_map):
        d.plan.put(MakeBasics(not have.secret, not have.config_map))
    if have.access:
        d.plan.put(MakeLauncherAccess(have.access))
    if not have.role_current:
        d.plan.put(UpdateLauncherRole())


def update_blocked(d: Draft) -> None:
    """Blocked/ChildConflict while something of ours is in the way, cleared once it is not;
    Blocked/APIRefused (set when a write was refused) cleared once writes pass again."""
    current = st.condition(d.status.conditions or [], "Blocked") or {}
    reason = current.get("reason") if current.get("status") == "True" else None
    if d.inp.problems:
        message = "; ".join(d.inp.problems)
        d.set_cond("Blocked", "True", "ChildConflict", message, warn=True)
    elif reason == "ChildConflict":
        d.set_cond("Blocked", "False", "Resolved", "nothing blocks the job")
    elif reason == "APIRefused" and d.inp.refusal_over:
        d.set_cond("Blocked", "False", "Resolved", "the API server accepts the job's writes")
    elif reason == "InvalidSpec":
        d.set_cond("Blocked", "False", "SpecFixed", "the spec is valid again")


def plan_refused(status: JobStatus, message: str, now: datetime) -> JobStatus | None:
    """The job's status once the apiserver refused one of a pass's writes: Blocked/APIRefused
    with the server's words (cleared by `update_blocked` once writes pass again); None when it
    says so already (said once, not on every retry)."""
    conditions = status.conditions or []
    new, changed = st.set_condition(conditions, "Blocked", "True", "APIRefused", message, iso(now))
    return dataclasses.replace(status, conditions=new) if changed else None


def hold_edit(d: Draft, error: str) -> None:
    """A job under way whose spec was edited into one the operator refuses: the edit is
    refused and said (Blocked/InvalidSpec, a Warning once), and nothing changes until the spec
    is fixed: its pods, host list and scales stay as they are (failing it would stop the
    training for an edit, and the pods it runs were made from the valid spec)."""
    message = f"the spec as edited is refused: {error}; the job runs on as it was until it is fixed"
    d.set_cond("Blocked", "True", "InvalidSpec", message, warn=True)


def refused_for_spec(d: Draft) -> bool:
    """The job ended Failed because its spec was refused (not for anything it ran)."""
    failed = st.condition(d.status.conditions or [], st.FAILED) or {}
    return d.status_read.phase == st.FAILED and failed.get("reason") == "InvalidSpec"


def refuse_invalid(d: Draft, error: str) -> None:
    """Failed/InvalidSpec, its scalers with it; a job that ended for another reason keeps
    its end (nothing of an ended job is acted upon, its spec neither)."""
    if d.status_read.phase in st.TERMINAL and not refused_for_spec(d):
        return
    d.happened.ended = st.FAILED
    d.set_cond(st.FAILED, "True", "InvalidSpec", error, warn=True)
    for sc in d.inp.scalers:
        if sc.phase not in st.SCALE_TERMINAL:
            d.fail_scaler(sc, "JobInvalid", f"job {d.inp.name} is invalid: {error}")


def adopt_scalers(d: Draft) -> None:
    for sc in d.inp.scalers:
        if not sc.owned and sc.phase not in st.SCALE_TERMINAL:
            d.plan.emit(AdoptScaler(sc.kind_name))


def suspend(d: Draft) -> None:
    d.stop_run("JobSuspended", "the job was suspended")
    d.happened.waits = st.SUSPENDED
    d.set_cond(st.SUSPENDED, "True", "Suspended", "job suspended: all pods deleted")


def complete_plan(d: Draft) -> Plan:
    note_saved(d)
    if d.inp.published and not d.status.hosts and d.plan.hosts is None and not d.launcher:
        d.plan.put(HostList(()))  # a stopped run's list, once its launcher (and its save) is gone
    job_spec = d.inp.spec
    if job_spec is not None:
        members = set(d.status.target_workers or [])
        wanted = {naming.worker_index(job_spec.name, m) for m in members}
        held = {naming.worker_index(job_spec.name, m) for m in queueing.held_by_quota(d)}
        creating = queueing.within_admission(d, sorted(set(d.creating) & wanted - held))
        d.plan.surplus_workers = surplus.surplus_made(d, creating)
        deleted = set(d.plan.delete_pods)  # read from the writes once, not once a worker
        keep = {p.name for p in d.workers.values() if not p.deleting and p.name not in deleted}
        keep |= {naming.worker_name(job_spec.name, i) for i in creating}
        if d.phase not in st.TERMINAL:
            keep |= members
        kept = keep | set(runtimes.of(job_spec).services(job_spec))
        for gone in sorted(set(d.inp.services) - kept):
            d.plan.emit(DeleteService(gone))
        d.plan.put(WorkerObjects(tuple(sorted(keep)), tuple(creating)))

        run_pods = [
            p
            for p in d.inp.pods
            if p.role == naming.ROLE_LAUNCHER or (p.index or 0) >= (d.status.run_start_index or 0)
        ]
        d.status.replica_statuses = {
            "Launcher": st.replica_counts(
                p.phase for p in run_pods if p.role == naming.ROLE_LAUNCHER
            ),
            "Worker": st.replica_counts(p.phase for p in run_pods if p.role == naming.ROLE_WORKER),
        }
        d.status.replicas = len(d.status.current_workers or [])
    if not d.status.current_scaler:
        d.scale_ended()
    d.status.observed_generation = d.inp.generation
    d.plan.pending = [*d.pending, *d.watching]
    if d.pending or d.plan.create_workers or d.plan.delete_pods:
        d.plan.requeue = min(d.plan.requeue, 1.0)
    return d.plan


def drop_foreign_names(d: Draft) -> None:
    """Names in targetWorkers and currentWorkers that are no worker of this job (a status
    written by someone with the rights to) are dropped and said: a ScaleOut counted them."""
    job = d.spec.name
    named = [*d.status.members, *d.status.hosts]
    foreign = sorted({n for n in named if naming.worker_index(job, n) is None})
    if not foreign:
        return
    kept = Members(tuple(d.status.members), tuple(d.status.hosts)).without(*foreign)
    d.set_members(kept, publish=False)
    message = f"the status named {', '.join(foreign)}, not workers of this job: dropped"
    d.plan.tell(Event("Warning", "StatusRepaired", message))
