"""A queued job's scaling against crashes: the crash world (test_replicas.py) with the job in a
Kueue queue. Its Workloads are the bodies the operator makes (builders/workload.py), read as
the reconciler reads them (reconcile/queues.py `read_queue`); between passes a small admitter
does what Kueue does with them here (admits within a quota, a slice by finishing what it
replaces). Every write a pass makes, Kueue's among them, is a step a crash can end it after;
the quota as Kueue counts it is checked after each one."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from etoperator import naming
from etoperator.api.models import JobSpec
from etoperator.api.statuses import JobStatus
from etoperator.builders import workload as wl
from etoperator.builders.common import Owner
from etoperator.clock import iso
from etoperator.planning import JobInput, surplus
from etoperator.planning.kinds import (
    DeleteWorkload,
    DropWorkloads,
    MakeLauncher,
    MakeWorkload,
    OwnWorkload,
    UpdateWorkload,
    Write,
)
from etoperator.planning.writes import Queueing
from etoperator.reconcile.queues import (
    Queues,
    admitted_count,
    families,
    order,
    pod_owners,
    read_queue,
)
from localcluster.manifests import scalein, scaleout
from tests.unit.test_planning import NOW, launcher, scaler, w
from tests.unit.test_queueing import qspec
from tests.unit.test_replicas import World, assert_scaled, each_crash

Body = dict[str, Any]


@dataclass
class QueuedWorld(World):
    quota: int = 4  # workers the ClusterQueue admits
    workloads: dict[str, Body] = field(default_factory=dict)
    made_workloads: int = 0
    min_replicas: int = 1

    def now(self) -> Any:
        return NOW + timedelta(seconds=self.tick)

    def observe(self) -> JobInput:
        q = read_queue("lq", "ns", list(self.workloads.values()), self.now())
        q = dataclasses.replace(q, owners=pod_owners(list(self.workloads.values())))
        views = surplus.reclaimed_views(list(self.pods.values()), q, self.now())
        return dataclasses.replace(super().observe(), spec=self.spec(), pods=views, queue=q)

    def queueing(self) -> Queueing | None:
        return Queueing(True)

    def spec(self) -> JobSpec:
        return qspec(replicas=self.replicas, minReplicas=self.min_replicas,
                     maxReplicas=self.max_replicas)  # fmt: skip

    def write(self, fn: Callable[..., object], *args: Any) -> None:
        super().write(fn, *args)
        self.check_quota()

    def apply(self, write: Write) -> None:
        if isinstance(write, MakeLauncher):
            made = dataclasses.replace(launcher(), uid="uid-j-launcher")
            self.write(self.pods.__setitem__, "j-launcher", made)
        elif isinstance(write, MakeWorkload) and write.name not in self.workloads:
            self.write(self._make_workload, write)
        elif isinstance(write, DeleteWorkload) and write.name in self.workloads:
            self.write(self.workloads.pop, write.name)
        elif isinstance(write, DropWorkloads) and self.workloads:
            self.write(self.workloads.clear)
        elif isinstance(write, UpdateWorkload):
            self._update(write)
        elif isinstance(write, OwnWorkload) and write.name in self.workloads:
            refs = [{"kind": "Pod", "name": n, "uid": u} for n, u in write.pods]
            self.write(self.workloads[write.name]["metadata"].__setitem__, "ownerReferences", refs)
        else:
            super().apply(write)

    def _start(self, i: int) -> None:
        name = f"j-worker-{i}"
        made = w(i, busy=False, surplus=i in self.plan.surplus_workers)
        self.pods[name] = dataclasses.replace(made, uid=f"uid-{name}")

    def _make_workload(self, write: MakeWorkload) -> None:
        body = wl.workload(self.spec(), Owner(naming.JOB_KIND, "j", "u"), write.name,
                           write.workers, None, write.replacing, write.surplus)  # fmt: skip
        self.made_workloads += 1
        body["metadata"].update(uid=f"w{self.made_workloads}", resourceVersion="1",
                                creationTimestamp=iso(self.now()))  # fmt: skip
        self.workloads[write.name] = body

    def _update(self, write: UpdateWorkload) -> None:
        """As Queues.update makes it: the count, the activity, then the status, three writes."""
        core, extra = families(list(self.workloads.values()))
        body = core if write.core else extra
        if body is None or body["metadata"]["name"] in self.plan.delete_workloads:
            return
        if write.resize is not None:
            (worker,) = [p for p in body["spec"]["podSets"] if p["name"] == wl.WORKER_SET]
            self.write(worker.__setitem__, "count", write.resize)
        if write.activate is not None:
            self.write(body["spec"].__setitem__, "active", write.activate)
        status = Queues(kube=None, clock=self.now).new_status(  # type: ignore[arg-type]
            body, list(write.conditions), write.release
        )
        if status is not None:
            self.write(self._set_status, body, status)

    @staticmethod
    def _set_status(body: Body, change: Body) -> None:
        merged = {**(body.get("status") or {}), **change}
        body["status"] = {k: v for k, v in merged.items() if v is not None}

    def admitted(self) -> int:
        """The workers Kueue holds quota for: every Workload's admission, as it counts it."""
        return sum(admitted_count(b) for b in self.workloads.values())

    def check_quota(self) -> None:
        workers = [p for p in self.pods.values() if p.role == "worker"]
        assert len(workers) <= self.admitted(), (
            f"write {self.writes}: {len(workers)} workers run on {self.admitted()} admitted"
        )

    def admit(self) -> bool:
        """Kueue between passes: each pending active Workload, oldest first, admitted within
        the quota (at least its minCount); a slice's admission finishes what it replaces.
        Whether it admitted any."""
        admitted = False
        for body in order(list(self.workloads.values()))[0]:
            if admitted_count(body) or (body["spec"].get("active") is False):
                continue
            key = (body["metadata"].get("annotations") or {}).get(wl.REPLACES, "")
            replaced = self.workloads.get(key.rpartition("/")[2]) if key else None
            free = self.quota - self.admitted() + admitted_count(replaced)
            (worker,) = [p for p in body["spec"]["podSets"] if p["name"] == wl.WORKER_SET]
            count = min(worker["count"], free)
            if count < worker.get("minCount", worker["count"]) or count < 1:
                continue
            sets = [{"name": p["name"], "count": count if p is worker else p["count"]}
                    for p in body["spec"]["podSets"]]  # fmt: skip
            now = iso(self.now())
            body["status"] = {"admission": {"clusterQueue": "cq", "podSetAssignments": sets},
                              "conditions": [condition("QuotaReserved", now),
                                             condition("Admitted", now)]}  # fmt: skip
            if replaced is not None:
                done = condition("Finished", now, "WorkloadSliceReplaced")
                replaced.setdefault("status", {}).setdefault("conditions", []).append(done)
            admitted = True
        return admitted

    def act(self) -> float:
        """The pass, then Kueue: what either wrote wakes the next pass (a watch event)."""
        before = self.writes
        requeue = super().act()
        return 0.0 if self.admit() or self.writes > before else requeue

    def live(self) -> list[Body]:
        return order(list(self.workloads.values()))[0]

    def unheld(self) -> list[str]:
        """Workloads holding quota whose owners miss a pod of the job: deleted with the job,
        the garbage collector would take them (and Kueue count their quota free) before it."""
        pods = {p.uid for p in self.pods.values()}
        return [name for name, owners in pod_owners(self.live()) if owners != pods]


def condition(ctype: str, at: str, reason: str = "") -> Body:
    return {"type": ctype, "status": "True", "reason": reason or ctype, "message": "",
            "lastTransitionTime": at}  # fmt: skip


def new_job(replicas: int, *scalers: Any, min_replicas: int = 1, quota: int = 4) -> QueuedWorld:
    return QueuedWorld(replicas=replicas, status=JobStatus(), pods={},
                       scalers={s.kind_name: s for s in scalers}, published=[],
                       max_replicas=4, min_replicas=min_replicas, quota=quota)  # fmt: skip


AT_START = iso(NOW)  # a scaler made with the job (its timeout counts from it)


def grows_by_a_slice() -> QueuedWorld:
    return new_job(2, scaler(scaleout("more", "j", 2), created=AT_START), min_replicas=2)


def running(replicas: int, quota: int, *scalers: Body) -> QueuedWorld:
    """A queued job admitted and settled (no crash), then its scalers made: a crash counts
    from their first write."""
    wd = new_job(replicas, min_replicas=2, quota=quota)
    wd.settle()
    for made in scalers:
        sc = scaler(made, created=iso(wd.now()))
        wd.scalers[sc.kind_name] = sc
    wd.writes = 0
    return wd


def shrinks() -> QueuedWorld:
    return running(4, 4, scalein("less", "j", count=2))


def partly_admitted_shrinks() -> QueuedWorld:
    """Asked 4, Kueue admits 3: a ScaleIn of 1 takes the one never admitted."""
    return running(4, 3, scalein("less", "j", count=1))


def partly_admitted_scaled_down() -> QueuedWorld:
    """Asked 4, Kueue admits 2: `kubectl scale` to 3 lowers the size asked (it was a
    ScaleOut of 1, by the 2 that run, waiting for quota the job no longer wants)."""
    wd = running(4, 2)
    wd.set_replicas(3)
    return wd


# (the world, the workers it runs once settled, spec replicas then)
SCENARIOS: dict[str, tuple[Callable[[], QueuedWorld], int, int]] = {
    "a new job's ScaleOut through a slice": (grows_by_a_slice, 4, 4),
    "a ScaleIn at full size": (shrinks, 2, 2),
    "a ScaleIn of a partly admitted job": (partly_admitted_shrinks, 3, 3),
    "kubectl scale down of a partly admitted job": (partly_admitted_scaled_down, 2, 3),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_crash_at_any_write_of_a_queued_job_keeps_the_quota_and_the_scale(
    scenario: str,
) -> None:
    """Queued from its creation: admitted, run, scaled. At no write do more workers run than
    Kueue admitted; once settled, the scale is done once, every admitted worker runs (no quota
    held for nothing) and each Workload family has one current Workload."""
    make, expected, replicas = SCENARIOS[scenario]
    clean = make()
    clean.settle()
    assert len(clean.members()) == expected, clean.members()
    assert clean.made_workloads >= 2  # the core's and a slice or the surplus
    assert clean.scalers and clean.writes > 0
    assert all(s.phase == "ScaleSucceeded" for s in clean.scalers.values()), clean.scalers
    for k, wd in each_crash(make, clean.writes):
        assert_scaled(wd, k, expected, replicas)
        workers = [p for p in wd.pods.values() if p.role == "worker"]
        assert wd.admitted() == len(workers), f"crash at write {k}: quota held for nothing"
        live = [b["metadata"]["name"] for b in wd.live()]
        assert len(live) == len({wl.is_surplus(b) for b in wd.live()}), (k, live)
        assert not wd.unheld(), f"crash at write {k}: not owned by every pod: {wd.unheld()}"


def made_with_a_scale_in() -> QueuedWorld:
    return new_job(4, scaler(scalein("less", "j", count=2), created=AT_START), min_replicas=2)


def test_a_scale_in_made_with_a_queued_job_counts_the_workers_its_queue_admitted() -> None:
    """The job starts with its core; its surplus, admitted as it starts, is added that pass.
    A ScaleIn started in that pass judged the job by its core alone ("removing 2 of 2 workers
    would leave 0, below minReplicas 2") and failed; it waits for them instead."""
    wd = made_with_a_scale_in()
    wd.settle()
    assert [s.phase for s in wd.scalers.values()] == ["ScaleSucceeded"], wd.scalers
    assert len(wd.members()) == 2 and wd.admitted() == 2


def test_a_scale_in_of_a_queued_job_whose_surplus_is_not_admitted_yet_counts_it() -> None:
    """Kueue slower than the pass (here a crash after the core's first writes delays the
    surplus by a pass): the ScaleIn starts with the core alone running. It failed, "would
    leave 0", though the job asked for 4; it takes the 2 not admitted off the size asked,
    removes no pod, and the surplus is never grown for."""
    wd = made_with_a_scale_in()
    wd.crash_at = 4
    wd.settle()
    assert [s.phase for s in wd.scalers.values()] == ["ScaleSucceeded"], wd.scalers
    assert len(wd.members()) == 2 and wd.replicas == 2 and wd.admitted() == 2
