"""What a queued job's Workloads admit, read as Kueue holds it now: a count lowered in place,
a Workload a slice replaced, an evicted slice and a partial admission are never taken for
room (reconcile/queues.read_queue)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from etoperator.planning import plan_job
from etoperator.reconcile.queues import read_queue
from tests.unit.test_planning import launcher, running_status, w
from tests.unit.test_queueing import cond, qspec, queued

NS = "ns"
NOW = datetime(2026, 1, 1, 0, 1, 5)  # 5 s after the slices below were made


def wl(
    name: str,
    asked: int,
    admitted: int | None = None,
    conds: Mapping[str, str | tuple[str, str]] | None = None,
    replaces: str = "",
    created: str = "2026-01-01T00:00:00Z",
) -> dict[str, Any]:
    """A Workload asking for `asked` workers, `admitted` in its admission (None: none); each
    condition is a status, or (status, reason)."""
    status: dict[str, Any] = {"conditions": []}
    for ctype, value in (conds or {}).items():
        state, reason = value if isinstance(value, tuple) else (value, ctype)
        status["conditions"].append(
            {"type": ctype, "status": state, "reason": reason, "lastTransitionTime": created}
        )
    if admitted is not None:
        status["admission"] = {
            "clusterQueue": "cq",
            "podSetAssignments": [{"name": "launcher", "count": 1},
                                  {"name": "worker", "count": admitted}],
        }  # fmt: skip
    meta: dict[str, Any] = {"name": name, "namespace": NS, "creationTimestamp": created}
    if replaces:
        meta["annotations"] = {"kueue.x-k8s.io/workload-slice-replacement-for": f"{NS}/{replaces}"}
    return {
        "metadata": meta,
        "spec": {"podSets": [{"name": "launcher", "count": 1}, {"name": "worker", "count": asked}]},
        "status": status,
    }


ADMITTED: dict[str, str | tuple[str, str]] = {"QuotaReserved": "True", "Admitted": "True"}
REPLACED = {**ADMITTED, "Finished": ("True", "WorkloadSliceReplaced")}
LATER = "2026-01-01T00:01:00Z"  # when the slices are made (and the replaced one finished)


def test_a_count_lowered_in_place_admits_only_the_lower_count() -> None:
    """After a ScaleIn the admission still records 2; Kueue counts 1: a ScaleOut back to 2
    must ask Kueue again (it once added its worker without asking)."""
    q = read_queue("lq", NS, [wl("w", asked=1, admitted=2, conds=ADMITTED)], NOW)
    assert q.admitted and q.admitted_workers == 1


def test_a_partial_admission_admits_what_was_admitted() -> None:
    q = read_queue("lq", NS, [wl("w", asked=3, admitted=1, conds=ADMITTED)], NOW)
    assert q.admitted_workers == 1


def test_an_evicted_slice_admits_nothing_though_it_replaced_an_admitted_workload() -> None:
    """A job grown through a slice, then preempted: the Workload the slice replaced is
    finished; it once was read as admitted and the job restarted at once, outside its quota."""
    old = wl("w", asked=2, admitted=2, conds=REPLACED)
    evicted = {"QuotaReserved": ("False", "Pending"), "Admitted": ("False", "NoReservation"),
               "Evicted": ("True", "Preempted"), "Requeued": ("True", "Preempted")}  # fmt: skip
    new = wl("w-s", asked=3, conds=evicted, replaces="w", created="2026-01-01T00:01:00Z")
    q = read_queue("lq", NS, [old, new], NOW)
    assert q.workload == "w-s"
    assert not q.admitted and q.admitted_workers == 0
    # Before the release: still reserved, evicted, and no room either.
    held = wl("w-s", asked=3, admitted=3, replaces="w", created="2026-01-01T00:01:00Z",
              conds={**ADMITTED, "Evicted": ("True", "Preempted")})  # fmt: skip
    q = read_queue("lq", NS, [old, held], NOW)
    assert q.evicted and q.reserved and q.admitted_workers == 0


def test_while_a_slice_takes_over_the_job_keeps_only_what_it_had() -> None:
    """Kueue finishes the replaced Workload as it admits the slice; shown in between, the job
    runs on (no stop) with the count it had, never the slice's."""
    old = wl("w", asked=2, admitted=2, conds=REPLACED, created=LATER)
    new = wl("w-s", asked=3, replaces="w", created=LATER,
             conds={"QuotaReserved": ("False", "Pending")})  # fmt: skip
    q = read_queue("lq", NS, [old, new], NOW)
    assert q.admitted and q.admitted_workers == 2 and q.handing_over
    # Kueue's admission of the slice failed: after a moment the job holds nothing.
    assert not read_queue("lq", NS, [old, new], NOW + timedelta(seconds=30)).admitted
    done = wl("w-s", asked=3, admitted=3, conds=ADMITTED, replaces="w",
              created="2026-01-01T00:01:00Z")  # fmt: skip
    assert read_queue("lq", NS, [old, done], NOW).admitted_workers == 3


def test_a_slice_is_room_only_once_admitted() -> None:
    cur = wl("w", asked=2, admitted=2, conds=ADMITTED)
    waiting = wl("w-s", asked=3, replaces="w", created="2026-01-01T00:01:00Z",
                 conds={"QuotaReserved": ("False", "Pending")})  # fmt: skip
    q = read_queue("lq", NS, [cur, waiting], NOW)
    assert q.growing == "w-s" and not q.growing_admitted and q.admitted_workers == 2
    admitted = wl("w-s", asked=3, admitted=3, conds=ADMITTED, replaces="w",
                  created="2026-01-01T00:01:00Z")  # fmt: skip
    q = read_queue("lq", NS, [cur, admitted], NOW)
    assert q.growing_admitted and q.growing_workers == 3


def test_a_workload_finished_for_a_slice_that_is_gone_is_an_admission_lost() -> None:
    """A slice (a forged one, or one deleted as Kueue admitted it) replaced the job's Workload
    and is gone: the job did not end (it was read as Failed/WorkloadFinished, every pod
    deleted); it lost its admission, stops, and queues again."""
    old = wl("w", asked=2, admitted=2, conds=REPLACED)
    q = read_queue("lq", NS, [old], NOW)
    assert q.finished and q.replaced and not q.admitted
    spec = qspec(replicas=2)
    pods = [w(0), w(1), launcher()]
    plan = plan_job(queued(spec, running_status([0, 1]), pods, q))
    assert (
        plan.status.phase == "Queued" and cond(plan.status, "Queued")["reason"] == "AdmissionLost"
    )
    assert plan.delete_pods == ["j-launcher"]  # its workers once it is gone
    workers = plan_job(queued(spec, plan.status, [w(0), w(1)], q))
    assert workers.delete_pods == ["j-worker-0", "j-worker-1"]
    later = plan_job(queued(spec, workers.status, [], q))
    assert later.delete_workloads == ["w"] and later.status.phase == "Queued"
