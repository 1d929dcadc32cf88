"""The scaler queue: the oldest waiting scaler started when none runs, scalers held while the
job does not run, and spec replicas (`kubectl scale`) taken up as scalers of the difference."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

from etoperator import naming
from etoperator import status as st
from etoperator.api.statuses import ScaleOutStatus
from etoperator.clock import parse_iso
from etoperator.planning import queueing
from etoperator.planning.draft import Draft, Members
from etoperator.planning.kinds import MakeScaler, SpecReplicas
from etoperator.planning.rules import (
    by_index,
    check_scale_in,
    check_scale_out,
    scaler_order,
    workers,
)
from etoperator.planning.views import ScalerView


def start_scalers(d: Draft, m: Members) -> Members:
    """Fail bad scalers; start the oldest waiting one when none runs: the membership it
    leaves (its frozen plan's workers added, or its victims out of the host list)."""
    waiting = []
    for sc in sorted(d.inp.scalers, key=scaler_order):
        if sc.phase in st.SCALE_TERMINAL or sc.kind_name in d.plan.scaler_status:
            continue
        if sc.spec is None:
            d.fail_scaler(sc, "InvalidSpec", sc.error or "invalid spec")
        else:
            waiting.append(sc)
    if d.status.current_scaler or not waiting:
        return m
    if queueing.admitted_not_added(d):  # this pass adds them (settle): every scaler counts them
        d.come_back("scalers wait for the workers the queue admitted to be added")
        return m
    for sc in waiting:
        started = start_one(d, m, sc)
        if started is not None:
            return started
    return m


def start_one(d: Draft, m: Members, sc: ScalerView) -> Members | None:
    """The membership once `sc` started; None when it cannot start (it failed, saying why)."""
    job_spec, spec = d.spec, sc.spec
    assert spec is not None
    if spec.kind == naming.SCALEOUT_KIND:
        problem = check_scale_out(job_spec, list(m.members), spec, d.beyond)
        if problem:
            d.fail_scaler(sc, "MaxReplicasExceeded", problem)
            return None
        assert spec.count is not None
        indices = d.new_indices(spec.count)
        planned = [naming.worker_name(job_spec.name, i) for i in indices]
        m = m.adding(*planned)
        d.creating.extend(indices)
        what = f"adding {', '.join(planned)}"
    else:
        hosts = by_index(job_spec.name, list(m.hosts))
        planned, problem = check_scale_in(job_spec, list(m.members), hosts, spec, d.beyond)
        if problem:
            d.fail_scaler(sc, "InvalidScaleIn", problem)
            return None
        m = m.without(*planned)
        taken = min(spec.count, d.beyond) if spec.count is not None else 0
        d.beyond -= taken  # asked, never admitted: off the size, no pod to remove
        parts = [f"removing {', '.join(planned)}"] if planned else []
        if taken:
            parts.append(f"taking {workers(taken)} asked and not admitted off its size")
        what = "; ".join(parts)
    new = copy.deepcopy(sc.status)
    if st.is_true(new.conditions or [], "Waiting"):  # for its job to exist, or to run
        new.conditions, _ = st.set_condition(
            new.conditions or [], "Waiting", "False", "Started", "the scale started", d.now
        )
    if isinstance(new, ScaleOutStatus):
        new.add_pods = planned
    else:
        new.to_delete_pods = planned
    new.start_time = d.now
    d.scaler_status(sc.kind_name, new)
    d.set_scaler_cond(sc, st.SCALE_RUNNING, st.SCALE_RUNNING, "Scaling", what)
    d.scale_started(sc, planned)
    d.set_cond(st.SCALING, "True", "Scaling", f"{sc.kind} {sc.name}: {what}")
    d.come_back("a scaler started")
    return m


def hold_scalers(d: Draft, why: str) -> None:
    """The job does not run (queued, suspended, its gang not placed): its scalers wait, saying
    so, and one whose timeout passes (from its creation) fails then; they start once it runs."""
    for sc in sorted(d.inp.scalers, key=scaler_order):
        if sc.phase in st.SCALE_TERMINAL or sc.spec is None or sc.kind_name in d.plan.scaler_status:
            continue
        created = parse_iso(sc.created)
        limit = timedelta(seconds=sc.spec.timeout)
        if created is not None and d.inp.now - created >= limit:
            what = f"job {d.spec.name} did not run within the {sc.spec.timeout}s timeout ({why})"
            d.fail_scaler(sc, "JobNotRunning", what)
            continue
        what = f"job {d.spec.name} does not run ({why}): the scale starts once it does"
        d.set_scaler_cond(sc, "", "Waiting", "JobNotRunning", f"{what} (up to its timeout)")
        if created is not None:
            left = (created + limit - d.inp.now).total_seconds()
            d.plan.requeue = min(d.plan.requeue, max(left, 0.1))


def follow_replicas(d: Draft, shrunk: bool) -> None:
    """spec replicas follow the membership each scaler sets (so `kubectl get tj` shows the
    target, and a failed scale gives back the real size) and a lost worker that is not replaced
    (`shrunk`: asking for the old size again is then a request, not a no-op); a change by
    anyone else is a request, run as a scaler of the difference once the queue is empty."""
    request = replicas_request(d)
    if request is not None:
        take_request(d, request)
    elif (d.status_read.current_scaler or "") != (d.status.current_scaler or "") or (
        shrunk and not d.status.current_scaler  # a running scaler follows at its end
    ):
        d.follow_members(len(d.status.members))


def replicas_request(d: Draft) -> int | None:
    """The spec replicas a user asked for and the operator has not taken up, if any.

    acceptedReplicas is the value accounted for. While the operator's own write of it may
    not have landed, replicasBefore holds the value it replaces: seeing that value at the
    generation that status was written for is our write still to do (done again here), never a
    request, whatever crash came between. At a later generation the spec changed since (our
    write is preconditioned, so it lands only on that generation): the value is a request."""
    spec = d.spec.worker.replicas
    accepted = d.status.accepted_replicas
    if accepted is None or spec == accepted:
        d.accept_replicas(spec)
        return None
    ours = d.inp.generation == d.status_read.observed_generation
    if spec == d.status.replicas_before and ours:
        d.plan.put(SpecReplicas(int(accepted)))
        return None
    if any(sc.made_for == d.inp.generation and sc.owned for sc in d.inp.scalers):
        d.accept_replicas(spec)  # its scaler exists: the request is queued like any other
        return None
    d.status.replicas_before = None  # a request: no write of ours is pending any more
    return spec


def take_request(d: Draft, replicas: int) -> None:
    job_spec = d.spec
    if d.status.current_scaler or any(
        sc.phase not in st.SCALE_TERMINAL and sc.kind_name not in d.plan.scaler_status
        for sc in d.inp.scalers
    ):
        return  # let queued scalers run first; the difference is taken afterwards
    delta = replicas - len(d.status.members) - d.beyond
    if delta == 0:
        d.accept_replicas(replicas)
        return
    kind = naming.SCALEOUT_KIND if delta > 0 else naming.SCALEIN_KIND
    body: dict[str, Any] = {"selector": {"name": job_spec.name}}
    if delta > 0:
        body["toAdd"] = {"count": delta}
    else:
        body["toDelete"] = {"count": -delta}
    # Accepted once seen: a crash before the create lands leaves the request standing.
    d.plan.emit(
        MakeScaler(
            {
                "kind": kind,
                "name": naming.replicas_scaler_name(job_spec.name, d.inp.generation),
                "generation": d.inp.generation,
                "spec": body,
            }
        )
    )
    d.come_back("a scaler for kubectl scale is being made")
