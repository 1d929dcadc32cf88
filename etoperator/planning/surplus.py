"""A queued job's surplus: the workers above its core (minReplicas, a gang's minimum) are
asked for in a Workload of their own one priority lower, so a preemption takes them first and
the job shrinks instead of stopping. Kueue taking it back (or it deleted) makes its workers
leave as ScaleIn victims do; its admission is given back once they are gone, and the job
grows back when it is admitted again. ScaleOut, ScaleIn and `kubectl scale` change the
surplus only."""

from __future__ import annotations

import dataclasses
from datetime import datetime

from etoperator import naming
from etoperator.builders import workload as wl
from etoperator.planning.draft import Draft
from etoperator.planning.kinds import DeleteWorkload, MakeWorkload
from etoperator.planning.views import PodView, QueueView
from etoperator.status import Event

# Seconds the workers of a surplus Kueue took back may take to drain (Horovod leaving them at
# its next reset, 1-5 s here) before they go regardless: the job that preempted them waits
# until they are gone, and where no probe can tell (no SSH, no exec) they would wait for ever.
RECLAIM_DRAIN = 30.0


def drop_surplus(d: Draft, q: QueueView) -> None:
    """A job that does not run holds no surplus: it goes (its quota with it) once no pod of
    the job is left, and is asked for again at the next admission."""
    s = q.surplus
    if s is None:
        return
    if live_workers(d):
        d.come_back("the workers of a stopped job are going (its surplus quota is freed after)")
        return
    for name in (n for n in (s.workload, s.growing) if n):
        d.to_kueue(DeleteWorkload(name))


def grows(q: QueueView) -> bool:
    return bool(q.growing or (q.surplus is not None and q.surplus.growing))


def ask_more(d: Draft, q: QueueView, wanted: int) -> str:
    """The job wants more workers than Kueue admits: the surplus asks for them (made, its
    count raised while queued, or a slice once admitted with fewer); the slice's name."""
    need, s = wanted - q.workers, q.surplus
    if s is None:
        d.to_kueue(MakeWorkload(wl.surplus_name(d.spec), need, None, True))
        return ""
    if s.finished and not s.handing_over:
        d.to_kueue(DeleteWorkload(s.workload))  # ended by Kueue: a new one next pass
        return ""
    if s.evicted:  # asked again as it was once its admission is given back
        return ""
    if not s.reserved:
        if s.workers != need:
            d.update_workload(False, resize=need)
        return ""
    if s.admitted_workers >= need:
        return ""
    name = f"{naming.workload_name(d.spec.name, d.spec.uid)}-grow-{wanted}"
    if s.growing != name:
        d.to_kueue(MakeWorkload(name, need, s.workload, True))
    return name


def give_back(d: Draft, q: QueueView, wanted: int) -> None:
    """The job wants fewer workers than its Workloads ask for: the surplus asks for fewer (or
    goes), once no more worker pods than that are left; a Workload of an older make with no
    surplus asks for fewer itself."""
    s = q.surplus
    if s is None or s.finished:
        if wanted < q.workers:
            shrink(d, max(wanted, wl.core_workers(d.spec)))
        return
    need = max(wanted - q.workers, 0)
    if s.workers <= need:
        return
    if live_workers(d) > q.workers + need:
        d.come_back("workers removed are going (their quota is given back after)")
    elif need == 0:
        d.to_kueue(DeleteWorkload(s.workload))
    else:
        d.update_workload(False, resize=need)


def release_reclaimed(d: Draft, q: QueueView) -> None:
    """Kueue took the surplus's quota back (a preemption): its workers leave as ScaleIn
    victims do (observe.py marks them); once they are gone its admission is given back, which
    queues it again for the job to grow back."""
    s = q.surplus
    if s is None or not (s.evicted and s.reserved):
        return
    if live_workers(d) > q.room:
        d.come_back("workers whose quota Kueue took back are leaving")
        left = drain_left(q, d.inp.now)
        if left is not None:
            d.plan.requeue = min(d.plan.requeue, max(left, 0.5))
    else:
        d.update_workload(False, release=s.evicted_reason or "Evicted")


def reclaimed(views: list[PodView], q: QueueView | None) -> set[str]:
    """Pure: the workers beyond what Kueue admits now (its surplus taken back, or deleted):
    the surplus's first, the newest first. None while the whole job is stopped or its
    admission changes hands."""
    if q is None or not q.admitted or q.evicted or q.handing_over:
        return set()
    live = [
        v for v in views if v.role == naming.ROLE_WORKER and v.phase not in ("Succeeded", "Failed")
    ]
    over = len(live) - q.room - sum(1 for v in live if v.deleting)
    ranked = sorted(
        (v for v in live if not v.deleting), key=lambda v: (not v.surplus, -(v.index or 0))
    )
    return {v.name for v in ranked[: max(over, 0)]}


def surplus_made(d: Draft, creating: list[int]) -> list[int]:
    """Which of the new workers run under the surplus's admission (the core's slots filled
    first): they carry its label and its flavor's placement."""
    q = d.inp.queue
    if q is None or q.surplus is None:
        return []
    core = [
        p
        for p in d.workers.values()
        if not p.surplus and p.phase not in ("Succeeded", "Failed") and not p.deleting
    ]
    free = max(q.admitted_workers - len(core), 0)
    return sorted(creating)[free:]


def say_reclaimed(d: Draft, names: list[str]) -> None:
    q = d.inp.queue
    s = q.surplus if q is not None else None
    why = s.evicted if s is not None and s.evicted else "its surplus Workload is gone"
    message = (
        f"Kueue took back the quota of {', '.join(names)} ({why}): they leave the host list "
        f"and go, the job trains on without them and grows back when the queue admits them"
    )
    d.plan.tell(Event("Normal", "QuotaReclaimed", message))


def shrink(d: Draft, count: int) -> None:
    """The Workload asks for `count` workers (Kueue frees the rest at once): only once no more
    worker pods than that are left, a victim being deleted included (it runs until gone)."""
    if live_workers(d) > count:
        d.come_back("workers removed are going (their quota is given back after)")
    else:
        d.update_workload(True, resize=count)


def live_workers(d: Draft) -> int:
    """Worker pods that hold their node's resources: all but those that ended."""
    return sum(1 for p in d.workers.values() if p.phase not in ("Succeeded", "Failed"))


def reclaim(views: list[PodView], names: set[str], overdue: bool) -> list[PodView]:
    return [
        dataclasses.replace(v, leaving=v.leaving or RECLAIMED, reclaimed=True, overdue=overdue)
        if v.name in names
        else v
        for v in views
    ]


RECLAIMED = "Kueue took back the quota it runs under"


def reclaimed_views(views: list[PodView], q: QueueView | None, now: datetime) -> list[PodView]:
    """Pure: the pods as the planner sees them, those beyond Kueue's admission leaving (and
    going regardless once the surplus was taken back RECLAIM_DRAIN ago)."""
    return reclaim(views, reclaimed(views, q), drain_left(q, now) == 0)


def drain_left(q: QueueView | None, now: datetime) -> float | None:
    """Seconds left for the taken-back surplus's workers to drain (None: no bound runs)."""
    s = q.surplus if q is not None else None
    if s is None or s.evicted_at is None:
        return None
    return max(RECLAIM_DRAIN - (now - s.evicted_at).total_seconds(), 0.0)
