"""Gang scheduling (spec.schedulingPolicy): the workers are placed all or nothing, through
Kubernetes' Workload API. The Workload and PodGroup are made before the first worker; a gang
that waits says why, in the scheduler's words; where the API is not served the job says so
and starts nothing. A ScaleOut's workers join a placed group at once (the scheduler's rule),
and a ScaleIn never takes it below minAvailable (rules.check_scale_in)."""

from __future__ import annotations

from etoperator import naming
from etoperator import status as st
from etoperator.planning.draft import Draft
from etoperator.planning.kinds import MakeGang
from etoperator.status import Event

PENDING = "GangPending"
RECHECK = 30.0  # seconds between looks for the Workload API where it was not served


def hold_for_gang(d: Draft) -> bool:
    """True when gang scheduling was asked for where the cluster cannot do it."""
    g = d.inp.gang
    if g is not None and g.deferred:
        say_deferred(d)
        return False
    if g is not None and g.conflict:  # said as Blocked (it is among the pass's problems)
        d.plan.requeue = min(d.plan.requeue, RECHECK)  # it carries no label that would wake us
        return True  # nothing is made, nothing running is touched
    if g is None or g.served:
        return False
    d.stop_run("GangUnavailable", "gang scheduling is not available")
    why = (
        "spec.schedulingPolicy asks for gang scheduling, but this cluster does not serve "
        f"{naming.SCHEDULING_GROUP}/{naming.SCHEDULING_VERSION} (Kubernetes' Workload API, "
        "feature gates GenericWorkload and GangScheduling): no worker is created"
    )
    d.set_cond(PENDING, "True", "WorkloadAPIUnavailable", why, warn=True)
    d.plan.requeue = min(d.plan.requeue, RECHECK)
    return True


def say_deferred(d: Draft) -> None:
    """spec.schedulingPolicy was set while the job's workers run: they are no gang, and new
    ones join none (a lone new member of a new gang waited forever); said once."""
    message = (
        "spec.schedulingPolicy was set while the job's workers run: they are not a gang, and "
        "workers added meanwhile join none; it applies from a start with no worker running "
        "(a resume, a requeue)"
    )
    old = st.condition(d.status.conditions or [], PENDING) or {}
    d.set_cond(PENDING, "False", "AtNextStart", message, event=False)
    if old.get("reason") != "AtNextStart":
        d.plan.tell(Event("Warning", "GangAtNextStart", message))


def say_policy_kept(d: Draft, made: int | None, asked: int) -> None:
    """minAvailable changed after the PodGroup was made: Kubernetes does not change a
    PodGroup's policy, so the gang keeps the count it was made with (said, with a Warning
    once; it was taken silently)."""
    old = st.condition(d.status.conditions or [], "GangPolicyKept") or {}
    if made is None or made == asked:
        if old.get("status") == "True":
            d.set_cond("GangPolicyKept", "False", "Matches", f"the gang's minCount is {asked}")
        return
    message = (
        f"spec.schedulingPolicy.minAvailable is {asked}, but the workers' PodGroup was made "
        f"with minCount {made}, and Kubernetes does not change a PodGroup's policy: the gang "
        f"keeps {made} (a new job takes the new value)"
    )
    d.set_cond("GangPolicyKept", "True", "PodGroupImmutable", message, warn=True)


def waiting(d: Draft) -> str:
    """Why the job's gang keeps it from running ("" when it does not)."""
    pending = st.condition(d.status.conditions or [], PENDING) or {}
    if pending.get("status") != "True" or d.phase not in (st.CREATED, None):
        return ""
    return f"its gang is not placed: {pending.get('message') or pending.get('reason')}"


def settle(d: Draft) -> None:
    """The group before any worker; GangPending while members wait to be placed together,
    with how many of the minimum are placed (an Event when it starts waiting)."""
    g, policy = d.inp.gang, d.spec.gang
    if g is None or policy is None:
        return
    if d.creating and not g.group:
        d.plan.put(MakeGang())
    say_policy_kept(d, g.min_count, policy.min_available)
    members = [d.workers.get(n) for n in d.status.target_workers or []]
    placed = sum(1 for p in members if p is not None and p.bound)
    waiting = [p for p in members if p is not None and not p.bound and not p.deleting]
    old = st.condition(d.status.conditions or [], PENDING) or {}
    if waiting and placed < policy.min_available and g.why:
        message = f"{placed} of {policy.min_available} workers placed: {g.why}"
        news = old.get("status") != "True" or old.get("reason") != "Unschedulable"
        d.set_cond(PENDING, "True", "Unschedulable", message, warn=True, event=news)
    elif old.get("status") == "True" and placed >= policy.min_available:
        d.set_cond(PENDING, "False", "Placed", f"{placed} workers placed together")
