"""Scaling: a running ScaleOut or ScaleIn driven to its end (the queue: scalerqueue.py)."""

from __future__ import annotations

from datetime import datetime, timedelta

from etoperator import naming
from etoperator import status as st
from etoperator.clock import parse_iso
from etoperator.planning import queueing
from etoperator.planning.draft import Draft, Members
from etoperator.planning.rules import (
    script_argv,
)
from etoperator.planning.views import ScalerView

SCRIPT_EXECUTED = "ScriptExecuted"
# Beyond its timeout, how long a script's exec may take to end (the `timeout` it runs under
# kills it at its timeout; the exec stream is given this much more).
SCRIPT_GRACE = 5


def timed_out(d: Draft, sc: ScalerView, more: int = 0) -> bool:
    """Whether the scale has run its timeout (and `more` seconds)."""
    assert sc.spec is not None
    return overdue(sc, d.inp.now, more)


def overdue(sc: ScalerView, now: datetime, more: float = 0) -> bool:
    """Whether the scale has run its timeout and `more` seconds (fewer, when negative) by
    `now`; never for one not started."""
    started = parse_iso(sc.status.start_time)
    if started is None or sc.spec is None:
        return False
    return now - started >= timedelta(seconds=sc.spec.timeout + more)


def drive_scale_out(d: Draft, sc: ScalerView, m: Members, broken: list[str]) -> Members:
    """New workers join the host list together, once all are ready; the scaler succeeds
    once Horovod can see them."""
    new = sc.planned
    taken = [n for n in new if n in d.inp.squatted]
    if taken:  # never ours to wait for, nor to remove
        ours = [n for n in new if n not in taken]
        removed = f"; removed {', '.join(ours)}" if ours else ""
        why = f"pod {', '.join(taken)} exists and is not this job's"
        return fail_scale_out(d, sc, m, ours, why, f"{why}; nothing added{removed}")
    quota = queueing.quota_to_grow(d, sc)
    if quota is not None:
        return wait_for_quota(d, sc, m, quota)
    missing = [n for n in new if not (d.workers.get(n) and d.workers[n].ready)]
    # The timeout bounds the joining only: once they are in, a script that runs on is
    # reported when it ends (bounded by the same timeout), never a rollback.
    assert sc.spec is not None
    limit = sc.spec.timeout
    if broken:
        why = f"new workers failed while joining: {', '.join(broken)}"
        return fail_scale_out(d, sc, m, new, why, f"{why}; removed {', '.join(new)}")
    if missing:
        names = ", ".join(not_ready_why(d, n) for n in missing)
        failed = f"new workers not ready within {limit}s: {names}"
        waiting = f"waiting for {names} to accept the job's SSH key and resolve by name"
        return wait_to_join(d, sc, m, new, "WaitingForWorkers", failed, waiting)
    m = m.hosting(*new)
    # Succeed only once Horovod can see them (the ConfigMap is written after statuses), and
    # has taken them in: until then Horovod is resetting, and a host-list change made
    # meanwhile is lost or reaches a worker still starting (so no next scale may begin).
    if not set(new) <= set(d.inp.published or []):
        d.come_back("new workers not yet in the published host list")
        return m
    horovod, outside = horovod_on(d, new)
    if not horovod and saw_horovod(sc):
        # Horovod ran on the earlier hosts in this scale and no longer does: the run is
        # ending (its launcher's end says how), never a success.
        horovod, outside = True, list(new)
    if outside:
        return wait_for_horovod(d, sc, m, outside)
    if ensure_script_ran(d, sc, new):
        joined = ": Horovod has taken them in" if horovod else " to the host list"
        finish_scale(d, sc, f"added {', '.join(new)}{joined}")
    return m


def saw_horovod(sc: ScalerView) -> bool:
    """This scale has waited for Horovod to take its workers in (so Horovod ran then)."""
    cond = st.condition(sc.status.conditions or [], st.SCALE_RUNNING) or {}
    return cond.get("reason") == "WaitingForHorovod"


def wait_for_horovod(d: Draft, sc: ScalerView, m: Members, outside: list[str]) -> Members:
    """Listed, not yet taken in. Once Horovod has started its process on a new worker, the
    workers already training wait for it in their rendezvous: removing it then would fail
    that rendezvous, and the job with it. So past its timeout the scale waits on while the
    rendezvous may (the launcher's Gloo timeout); a worker Horovod never started on is rolled
    back at the timeout, saying why as the launcher's log does (an ssh or a name that failed),
    or what else may be the cause."""
    assert sc.spec is not None
    new, names = sc.planned, ", ".join(outside)
    said = "; ".join(d.inp.launcher_said)
    heard = f" (the launcher said: {said})" if said else ""
    waiting = f"waiting for Horovod to take {names} in{heard}"
    views = {n: w for n in outside if (w := d.workers.get(n)) is not None}
    starting = [n for n, w in views.items() if w.busy]
    unknown = [n for n, w in views.items() if w.horovod_unknown]  # may be starting: not idle
    job = d.inp.spec
    rendezvous = job.launcher.rendezvous_timeout if job else naming.RENDEZVOUS_TIMEOUT
    if (starting or unknown) and timed_out(d, sc) and not timed_out(d, sc, rendezvous):
        what = [f"Horovod is starting on {', '.join(starting)}"] if starting else []
        if unknown:
            what.append(f"what Horovod does on {', '.join(unknown)} cannot be asked now")
        text = (
            f"{'; '.join(what)}, past the {sc.spec.timeout}s timeout: removed now, a rendezvous "
            f"under way would fail the job (waiting up to {rendezvous}s more)"
        )
        wait_on(d, sc, "WaitingForHorovod", text, f"WaitingForHorovod: {waiting}")
        return m
    failed = f"Horovod did not take {names} in within {sc.spec.timeout}s" + (
        f" and its {rendezvous}s rendezvous" if starting or unknown else ""
    )
    return wait_to_join(d, sc, m, new, "WaitingForHorovod", failed + why_not(d, heard), waiting)


def why_not(d: Draft, heard: str) -> str:
    """Why Horovod may not have taken new workers in: what the launcher said of them, else
    whether it still runs on the earlier hosts, else the likely causes."""
    if heard:
        return heard
    published = d.inp.published or []
    if not any(w.busy for h in published if (w := d.workers.get(h)) is not None):
        return " (Horovod no longer runs on the earlier hosts: the run is ending)"
    return (
        " (it started no process there: its ssh from the launcher failed, or horovodrun's "
        "--max-np is below the new size; the launcher's log tells)"
    )


def wait_for_quota(d: Draft, sc: ScalerView, m: Members, waiting: str) -> Members:
    """A queued job grows only once Kueue admits its new size: until then no new worker is
    made; at the timeout the scale is rolled back (and the slice it asked for removed). Woken
    by the Workload's watch events, and at the timeout."""
    assert sc.spec is not None
    if timed_out(d, sc):  # its slice goes once no scale waits for it (queueing.settle)
        failed = f"not admitted within {sc.spec.timeout}s: {waiting}"
        return fail_scale_out(d, sc, m, [], failed, f"{failed}; nothing added")
    queueing.ask_to_grow(d, sc)
    d.set_scaler_cond(
        sc, st.SCALE_RUNNING, st.SCALE_RUNNING, "WaitingForQuota",
        f"{waiting} (up to the {sc.spec.timeout}s timeout)",
    )  # fmt: skip
    started = parse_iso(sc.status.start_time)
    if started is not None:
        left = started + timedelta(seconds=sc.spec.timeout) - d.inp.now
        d.plan.requeue = min(d.plan.requeue, max(left.total_seconds(), 0.1))
    d.await_pods("a ScaleOut waits for its queue's quota")
    return m


def wait_to_join(
    d: Draft, sc: ScalerView, m: Members, new: list[str], reason: str, failed: str, waiting: str
) -> Members:
    """New workers not in yet: the scale waits, saying for what, until its timeout rolls it
    back (`failed` says why)."""
    assert sc.spec is not None
    if timed_out(d, sc):
        return fail_scale_out(d, sc, m, new, failed, f"{failed}; removed {', '.join(new)}")
    what = f"{waiting} (up to the {sc.spec.timeout}s timeout)"
    wait_on(d, sc, reason, what, f"{reason}: {waiting}")
    return m


def horovod_on(d: Draft, new: list[str]) -> tuple[bool, list[str]]:
    """Whether Horovod runs in this job, and the new workers it has not taken in yet: each must
    run a Horovod process connected to every other host (Horovod connects all ranks to each
    other once its rendezvous at the new size is done). It does not run when the hosts that
    were there before run no Horovod process (no launcher yet, a launcher that runs something
    else), or when nothing could tell (no SSH checks); an earlier host asked that did not answer
    is no such answer: all the new workers count as not taken in until one comes."""
    if d.launcher is None or d.launcher.phase != "Running":
        return False, []
    published = d.inp.published or []
    before = [d.workers[h] for h in published if h not in new and h in d.workers]
    if not any(w.busy for w in before):
        # None asked could tell: Horovod may well run (ask again); else it does not.
        unknown = any(w.horovod_unknown for w in before)
        return unknown, list(new) if unknown else []
    addresses = {d.workers[h].ip for h in published if h in d.workers and d.workers[h].ip}
    outside = []
    for name in new:
        w = d.workers.get(name)
        if w is None or not w.busy or w.peers is None or not addresses - {w.ip} <= w.peers:
            outside.append(name)
    return True, outside


def wait_on(d: Draft, sc: ScalerView, reason: str, what: str, why: str) -> None:
    """A running scale that waits says for what on its Scaling condition (and comes back)."""
    d.set_scaler_cond(sc, st.SCALE_RUNNING, st.SCALE_RUNNING, reason, what)
    d.come_back(why)


def not_ready_why(d: Draft, name: str) -> str:
    """A worker that is not ready, and what holds it if its pod says (unschedulable, an
    image that cannot be had)."""
    pod = d.workers.get(name)
    return f"{name} ({pod.waiting})" if pod is not None and pod.waiting else name


def fail_scale_out(
    d: Draft, sc: ScalerView, m: Members, ours: list[str], why: str, message: str
) -> Members:
    for n in ours:
        d.delete(n)
    d.fail_scaler(sc, "ScaleOutFailed", message)
    d.scale_ended()
    d.set_cond(st.SCALING, "False", "ScaleOutFailed", why)
    return m.without(*sc.planned)


def drive_scale_in(d: Draft, sc: ScalerView, m: Members) -> Members:
    """Victims leave the host list first, then their pods go once Horovod has left them
    (or the scaler's timeout runs out)."""
    victims = sc.planned
    m = m.without(*victims)
    published = set(d.inp.published or [])
    alive = [v for v in victims if v in d.workers and not d.workers[v].deleting]
    # A victim has drained when Horovod no longer runs on it (or its pod is not running).
    draining = [
        v
        for v in alive
        if d.workers[v].phase == "Running" and (v in published or d.workers[v].busy is not False)
    ]
    if victims and not set(victims) & published and not ensure_script_ran(d, sc, victims):
        return m
    if draining and not timed_out(d, sc):
        assert sc.spec is not None
        what = (
            f"waiting for Horovod to stop on {', '.join(draining)} (up to the "
            f"{sc.spec.timeout}s timeout, then they are deleted anyway)"
        )
        wait_on(d, sc, "Draining", what, f"victims still draining: {draining}")
        return m
    for v in alive:
        d.delete(v)
    if draining:
        d.plan.stop_at_once(draining)
        assert sc.spec is not None
        d.set_scaler_cond(
            sc,
            st.SCALE_RUNNING,
            "DrainTimeout",
            "DrainTimeout",
            f"Horovod still ran on {', '.join(draining)} after {sc.spec.timeout}s; deleted anyway",
            warn=True,
        )
    said = f"removed {', '.join(victims)}" if victims else "no running worker removed"
    finish_scale(d, sc, said)
    return m


def ensure_script_ran(d: Draft, sc: ScalerView, pods: list[str]) -> bool:
    """The scaler's script (if any) has run on the launcher; else ask for it to run. One
    marked as started is never started again: its end is recorded on the launcher, and an
    operator that did not see it end (it restarted meanwhile) asks the launcher for it."""
    assert sc.spec is not None
    ran = st.condition(sc.status.conditions or [], SCRIPT_EXECUTED)
    if not sc.spec.script or (ran and ran.get("status") in ("True", "False")):
        return True
    if d.launcher is None or d.launcher.phase != "Running":
        return True  # nowhere to run it; the scale itself goes on
    started = parse_iso(str((ran or {}).get("lastTransitionTime") or "")) if ran else None
    record = script_record(sc)
    if started is not None:
        over = d.inp.now >= started + timedelta(seconds=sc.spec.timeout + SCRIPT_GRACE)
        d.plan.check_scripts.append((sc.kind_name, record, over))
    else:
        argv = script_argv(sc.spec, pods, d.spec.slots_per_worker)
        d.plan.run_scripts.append((sc.kind_name, argv, sc.spec.timeout, record))
    d.come_back("the scaler's script runs")
    return False


def script_record(sc: ScalerView) -> str:
    """Where the launcher records the script's run: one name per scaler, a new one for a new
    scaler of the same name (a file name: scaler names are DNS labels)."""
    return f"{sc.kind}-{sc.name}-{''.join(c for c in sc.created if c.isdigit())}"


def finish_scale(d: Draft, sc: ScalerView, what: str) -> None:
    d.set_scaler_cond(sc, st.SCALE_SUCCEEDED, st.SCALE_SUCCEEDED, "ScaleSucceeded", what)
    d.scale_ended()
    d.set_cond(st.SCALING, "False", "ScaleSucceeded", f"{sc.kind} {sc.name}: {what}")
