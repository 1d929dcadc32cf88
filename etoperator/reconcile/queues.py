"""Kueue, for jobs labelled with a LocalQueue: what a pass sees of their Workloads (`view`),
and how a Workload is made and brought up to date (`make`, `update`: the executor's Kueue
writes, reconcile/execute.py). The planner's side is planning/queueing.py.

Kueue's own job integrations are the model (sigs.k8s.io/kueue pkg/controller/jobframework):
one Workload per job with a controller reference and the job-uid label; a slice (a Workload
annotated as the replacement of the current one) to grow; the count lowered in place to
shrink; PodsReady and Finished set by the job's controller; after an eviction, the admission
cleared once the job's pods are gone, which requeues it. Status writes are merge patches
preconditioned on the resourceVersion read, as Kueue's own are with WorkloadRequestUseMergePatch:
a 409 repeats the pass.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from etoperator import naming
from etoperator import status as st
from etoperator.api.models import JobSpec
from etoperator.builders import workload as wl
from etoperator.builders.common import Owner, Placement
from etoperator.cache import Observed
from etoperator.clock import iso, parse_iso, utcnow
from etoperator.kube import JSON_PATCH, AlreadyExists, ApiError, Kube
from etoperator.planning.views import QueueView
from etoperator.reconcile import state

log = logging.getLogger(__name__)
SERVED_TTL = (300.0, 10.0)  # how long "Kueue's API is served" is believed: (yes, no)
FLAVOR_TTL = 60.0  # a ResourceFlavor's node labels and tolerations, read again after this
HANDOVER = 10.0  # seconds a slice's admission may follow the finish of what it replaces
API = f"{naming.KUEUE_GROUP}/{naming.KUEUE_VERSION}"


def cond(body: dict[str, Any], ctype: str) -> st.Condition:
    return st.condition((body.get("status") or {}).get("conditions") or [], ctype) or {}


def is_true(body: dict[str, Any], ctype: str) -> bool:
    return cond(body, ctype).get("status") == "True"


def worker_count(body: dict[str, Any], where: str = "spec") -> int:
    """The worker pod set's count asked (spec) or admitted (status.admission)."""
    if where == "spec":
        sets = (body.get("spec") or {}).get("podSets") or []
    else:
        sets = ((body.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
    for ps in sets:
        if ps.get("name") == wl.WORKER_SET:
            return int(ps.get("count") or 0)
    return 0


def said(body: dict[str, Any], ctype: str) -> str:
    c = cond(body, ctype)
    return f"{c.get('reason') or ctype}: {c.get('message') or ''}".rstrip(": ")


def order(bodies: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(not finished, finished), each oldest first: a slice is made after what it replaces."""
    ranked = sorted(
        bodies,
        key=lambda b: (
            b["metadata"].get("creationTimestamp", ""),
            wl.REPLACES in (b["metadata"].get("annotations") or {}),
            b["metadata"]["name"],
        ),
    )
    done = [b for b in ranked if is_true(b, "Finished")]
    return [b for b in ranked if not is_true(b, "Finished")], done


def families(
    bodies: list[dict[str, Any]],
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The current Workload of the core family and of the surplus family (None: none)."""
    core = order([b for b in bodies if not wl.is_surplus(b)])[0]
    extra = order([b for b in bodies if wl.is_surplus(b)])[0]
    return (core[0] if core else None), (extra[0] if extra else None)


def job_id(spec: JobSpec) -> str:
    return state.job_id(spec.namespace, spec.name, spec.uid)


def admitted_count(body: dict[str, Any] | None, finished_ok: bool = False) -> int:
    """The workers Kueue holds quota for in this Workload now: its admission's count, never
    more than the Workload asks (a count lowered in place gives quota back at once, while the
    admission keeps the old count); 0 unless Admitted and not Evicted, and not Finished (unless
    `finished_ok`: the count a replaced Workload held)."""
    if body is None or not is_true(body, "Admitted") or is_true(body, "Evicted"):
        return 0
    if (is_true(body, "Finished") and not finished_ok) or not (body.get("status") or {}).get(
        "admission"
    ):
        return 0
    return min(worker_count(body), worker_count(body, "admission"))


def handed_over(current: dict[str, Any], done: list[dict[str, Any]], now: datetime) -> int:
    """Kueue (v0.17) finishes the Workload a slice replaces just before it admits the slice:
    in between, for a moment, the job keeps the count the replaced one held (nothing beyond
    it). Only a moment (HANDOVER): where the slice's admission failed, Kueue expects the job
    to stop. A slice admitted once and evicted since is no hand-over: it was evicted."""
    conds = {c.get("type") for c in (current.get("status") or {}).get("conditions") or []}
    if conds & {"Admitted", "Evicted", "Requeued"}:
        return 0
    key = (current["metadata"].get("annotations") or {}).get(wl.REPLACES, "")
    for b in done:
        finish = cond(b, "Finished")
        if f"{b['metadata']['namespace']}/{b['metadata']['name']}" != key:
            continue
        at = parse_iso(str(finish.get("lastTransitionTime") or ""))
        recent = at is not None and (now - at).total_seconds() < HANDOVER
        if finish.get("reason") == "WorkloadSliceReplaced" and recent:
            return admitted_count(b, finished_ok=True)
    return 0


def grows(q: QueueView) -> str:
    """The slice growing the job, of either family ("" when none)."""
    return q.growing or (q.surplus.growing if q.surplus is not None else "")


def read_queue(
    queue: str, namespace: str, bodies: list[dict[str, Any]], now: datetime
) -> QueueView:
    """Pure: the job's Workloads as the planner sees them (placement aside): the core family,
    with the surplus family (wl.is_surplus) read the same way beside it."""
    core = read_family(queue, namespace, [b for b in bodies if not wl.is_surplus(b)], now)
    extra = [b for b in bodies if wl.is_surplus(b)]
    if not extra:
        return core
    surplus = read_family(queue, namespace, extra, now)
    return dataclasses.replace(core, surplus=surplus if surplus.workload else None)


def read_family(
    queue: str, namespace: str, bodies: list[dict[str, Any]], now: datetime
) -> QueueView:
    """One family: its current Workload (the oldest not finished), a slice replacing it."""
    live, done = order(bodies)
    current = live[0] if live else (done[-1] if done else None)
    if current is None:
        return QueueView(queue=queue)
    name = current["metadata"]["name"]
    slices = [
        b
        for b in live[1:]
        if (b["metadata"].get("annotations") or {}).get(wl.REPLACES) == f"{namespace}/{name}"
    ]
    growing = slices[0] if slices else None
    strays = tuple(b["metadata"]["name"] for b in live[1:] if b is not growing)
    evicted = is_true(current, "Evicted")
    handover = 0 if admitted_count(current) else handed_over(current, done, now)
    room = admitted_count(current) or handover
    return QueueView(
        queue=queue,
        workload=name,
        workers=worker_count(current),
        active=(current.get("spec") or {}).get("active") is not False,
        reserved=bool((current.get("status") or {}).get("admission")),
        admitted=room > 0,
        admitted_workers=room,
        cluster_queue=str(
            ((current.get("status") or {}).get("admission") or {}).get("clusterQueue") or ""
        ),
        evicted=said(current, "Evicted") if evicted else "",
        evicted_reason=str(cond(current, "Evicted").get("reason") or "") if evicted else "",
        evicted_at=parse_iso(str(cond(current, "Evicted").get("lastTransitionTime") or ""))
        if evicted
        else None,
        finished=said(current, "Finished") if is_true(current, "Finished") else "",
        replaced=cond(current, "Finished").get("reason") == "WorkloadSliceReplaced"
        and not handover,
        pods_ready=is_true(current, "PodsReady"),
        why=str(cond(current, "QuotaReserved").get("message") or ""),
        growing=growing["metadata"]["name"] if growing else "",
        growing_workers=worker_count(growing) if growing else 0,
        growing_admitted=admitted_count(growing) > 0,
        growing_why=str(cond(growing, "QuotaReserved").get("message") or "") if growing else "",
        strays=strays,
        handing_over=handover > 0,
    )


def pod_owners(bodies: list[dict[str, Any]]) -> tuple[tuple[str, frozenset[str]], ...]:
    """Pure: each Workload holding or asking quota, with the uids of the pods it is owned by."""
    return tuple(
        (b["metadata"]["name"], frozenset(
            str(r.get("uid")) for r in b["metadata"].get("ownerReferences") or []
            if r.get("kind") == "Pod"
        ))
        for b in bodies
        if not is_true(b, "Finished") and not b["metadata"].get("deletionTimestamp")
    )  # fmt: skip


@dataclass
class Queues:
    kube: Kube
    clock: Callable[[], datetime] = utcnow
    _flavors: dict[str, tuple[float, Placement]] = field(default_factory=dict)
    # Per job (namespace/name/uid): why its last Workload could not be made (Kueue's webhook
    # not answering, a refusal), said on the job until one is made.
    _unmade: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.served = state.Served(self.kube, API, SERVED_TTL)

    def forget(self, prefix: str) -> None:
        for key in [k for k in self._unmade if k.startswith(prefix)]:
            self._unmade.pop(key)

    def view(self, obs: Observed) -> QueueView | None:
        """The job's Workloads as the planner sees them; None when it is not queued."""
        spec = obs.spec
        if spec is None or not spec.queue:
            return None
        if not obs.workloads and not self.served():
            return QueueView(queue=spec.queue, served=False)
        if not obs.workloads:
            return QueueView(queue=spec.queue, unmade=self._unmade.get(job_id(spec)))
        view = read_queue(spec.queue, spec.namespace, obs.workloads, self.clock())
        view = dataclasses.replace(view, owners=pod_owners(obs.workloads))
        unmade = self._unmade.get(f"{job_id(spec)}/slice")
        if unmade and not grows(view):  # why a ScaleOut's slice could not be made
            view = dataclasses.replace(view, growing_why=unmade)
        if not view.admitted_workers or view.evicted:
            return view
        core, extra = families(obs.workloads)
        placement = self.placement(core) if core is not None else {}
        if extra is not None and view.surplus is not None and view.surplus.admitted_workers:
            # Its workers are placed by the surplus's own flavors.
            where = self.placement(extra).get(wl.WORKER_SET)
            if where is not None:
                placement[wl.SURPLUS_SET] = where
        return dataclasses.replace(view, placement=placement)

    def placement(self, body: dict[str, Any]) -> dict[str, Placement]:
        """Each admitted pod set's node labels and tolerations, from its flavors."""
        out = {}
        admission = (body.get("status") or {}).get("admission") or {}
        for psa in admission.get("podSetAssignments") or []:
            selector: dict[str, str] = {}
            tolerations: list[dict[str, Any]] = []
            for flavor in sorted(set((psa.get("flavors") or {}).values())):
                got = self.flavor(str(flavor))
                selector.update(dict(got.node_selector))
                tolerations += [t for t in got.tolerations if t not in tolerations]
            out[str(psa.get("name"))] = Placement(
                tuple(sorted(selector.items())), tuple(tolerations)
            )
        return out

    def flavor(self, name: str) -> Placement:
        now = time.monotonic()
        hit = self._flavors.get(name)
        if hit is None or now - hit[0] > FLAVOR_TTL:
            body = self.kube.get_cluster("ResourceFlavor", name) or {}
            spec = body.get("spec") or {}
            labels = {str(k): str(v) for k, v in (spec.get("nodeLabels") or {}).items()}
            got = Placement(tuple(sorted(labels.items())), tuple(spec.get("tolerations") or []))
            self._flavors[name] = hit = (now, got)
        return hit[1]

    def make(
        self,
        spec: JobSpec,
        owner: Owner,
        name: str,
        workers: int,
        replacing: str | None,
        surplus: bool = False,
    ) -> list[str]:
        priority = None
        apart = replacing is not None or surplus  # not the core: said on what waits for it
        key = job_id(spec) + ("/slice" if apart else "")
        if spec.priority_class:
            found = self.kube.get_cluster("WorkloadPriorityClass", spec.priority_class)
            if found is None:
                why = (
                    f"WorkloadPriorityClass {spec.priority_class} (label "
                    f"{naming.LABEL_KUEUE_PRIORITY}) does not exist"
                )
                if not apart:
                    return [f"{why}; the job is not queued"]
                self._unmade[key] = f"its Workload slice cannot be made: {why}"
                return []
            priority = wl.Priority(spec.priority_class, int(found.get("value") or 0))
        body = wl.workload(spec, owner, name, workers, priority, replacing, surplus)
        try:
            self.kube.create(body)
        except AlreadyExists:
            return []  # made by an earlier pass whose answer was lost: the watch brings it
        except ApiError as exc:  # said by the job's next pass, which tries again
            self._unmade[key] = f"not made: {exc}" if apart else str(exc)
            log.warning("Workload not made namespace=%s name=%s error=%s",
                        spec.namespace, name, exc)  # fmt: skip
            return []
        self._unmade.pop(key, None)
        log.info(
            "Created Workload namespace=%s name=%s queue=%s workers=%d",
            spec.namespace, name, spec.queue, workers,
        )  # fmt: skip
        return []

    def update(
        self,
        body: dict[str, Any],
        resize: int | None,
        activate: bool | None,
        conditions: list[tuple[str, str, str, str]],
        release: str,
    ) -> None:
        """A family's current Workload: count and activity (spec), then conditions and the
        admission (status)."""
        meta = body["metadata"]
        ns, name, version = meta["namespace"], meta["name"], meta["resourceVersion"]
        if resize is not None:
            index = next(
                i for i, ps in enumerate(body["spec"]["podSets"]) if ps.get("name") == wl.WORKER_SET
            )
            # A count set is the same whatever came between (no precondition: a failed JSON
            # patch test is a 422, not a conflict to repeat the pass on).
            patch = [{"op": "replace", "path": f"/spec/podSets/{index}/count",
                      "value": resize}]  # fmt: skip
            got = self.kube.patch(naming.WORKLOAD_KIND, ns, name, patch, content_type=JSON_PATCH)
            version = got["metadata"]["resourceVersion"]
        if activate is not None:
            change = {"metadata": {"resourceVersion": version},
                      "spec": {"active": activate}}  # fmt: skip
            got = self.kube.patch(naming.WORKLOAD_KIND, ns, name, change)
            version = got["metadata"]["resourceVersion"]
        status = self.new_status(body, conditions, release)
        if status is not None:
            change = {"metadata": {"resourceVersion": version}, "status": status}
            self.kube.patch(naming.WORKLOAD_KIND, ns, name, change, sub="status")

    def new_status(
        self, body: dict[str, Any], conditions: list[tuple[str, str, str, str]], release: str
    ) -> dict[str, Any] | None:
        """The status change: conditions set, and for a release the admission cleared, with
        QuotaReserved and Admitted False and Requeued (True after a preemption or a node's
        failure, as Kueue's integrations do); None when nothing changes."""
        conds = list((body.get("status") or {}).get("conditions") or [])
        now = iso(self.clock())
        gen = body["metadata"].get("generation")
        wanted = list(conditions)
        if release:
            message = "the pods it admitted are gone"
            requeued = release in ("Preempted", "NodeFailures")
            wanted += [
                ("QuotaReserved", "False", "Pending", message),
                ("Admitted", "False", "NoReservation", "The workload has no reservation"),
                ("Requeued", "True" if requeued else "False", release, message),
            ]
        changed = False
        for ctype, status, reason, message in wanted:
            conds, moved = st.set_condition(conds, ctype, status, reason, message, now)
            changed = changed or moved
        for c in conds:
            c.setdefault("observedGeneration", gen)
        out: dict[str, Any] = {"conditions": conds}
        if release and (body.get("status") or {}).get("admission"):
            out["admission"] = None
            changed = True
        return out if changed else None
