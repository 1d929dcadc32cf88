"""The one executor of a pass's writes (planning/writes.py says their order and why): a table
from each write's type to the method that makes it. Every write the pass makes goes through
`run`; the stage a write belongs to (planning/writes.py `STAGES`) is all JobReconciler.act
needs to know about it. The two writes made outside any job's pass (a script's outcome, an
orphan scaler's status) go through `alone`: no write of the operator's is made elsewhere."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from etoperator import metrics, naming
from etoperator import status as st
from etoperator.api.models import JobSpec
from etoperator.api.statuses import scaler_status
from etoperator.builders import scalers, workload
from etoperator.builders.common import Owner, job_owner
from etoperator.cache import Observed
from etoperator.clock import iso
from etoperator.kube import AlreadyExists, ApiError, Conflict, Kube
from etoperator.planning import kinds as k
from etoperator.planning.plan import Plan
from etoperator.planning.scaling import SCRIPT_EXECUTED
from etoperator.planning.writes import OffPass, OrphanScalerStatus, ScriptCondition
from etoperator.reconcile.children import Acted, Children
from etoperator.reconcile.gangs import Gangs
from etoperator.reconcile.queues import Queues, families
from etoperator.reconcile.state import Recorder, Writes, merge_patch

log = logging.getLogger(__name__)
Scalers = dict[tuple[str, str], dict[str, Any]]


@dataclass
class Pass:
    """What one pass's writes share: what was observed and planned, what acting met (said on
    the job by its next pass), and the objects as last written (a later write preconditions
    on the version an earlier one left)."""

    obs: Observed
    spec: JobSpec | None
    plan: Plan
    job: dict[str, Any]
    scalers: Scalers = field(default_factory=dict)
    acted: Acted = field(default_factory=Acted)


@dataclass
class Executor:
    kube: Kube
    children: Children
    gangs: Gangs
    queues: Queues
    writes: Writes
    recorder: Recorder
    clock: Callable[[], datetime]
    table: dict[type, Callable[[Pass, Any], None]] = field(init=False)
    off_pass: dict[type, Callable[[Any], bool]] = field(init=False)

    def __post_init__(self) -> None:
        self.table = {
            k.MakeBasics: self.make_basics,
            k.MakeLauncherAccess: self.make_access,
            k.UpdateLauncherRole: self.update_role,
            k.AdoptScaler: self.adopt_scaler,
            k.ScalerStatusWrite: self.scaler_status,
            k.JobStatusWrite: self.job_status,
            k.SpecReplicas: self.spec_replicas,
            k.TellEvents: self.tell,
            k.MakeGang: self.make_gang,
            k.HostList: self.host_list,
            k.DeletePod: self.delete_pod,
            k.DeleteService: self.delete_service,
            k.WorkerObjects: self.worker_objects,
            k.MakeLauncher: self.make_launcher,
            k.MakeScaler: self.make_scaler,
            k.DropWorkloads: self.drop_workloads,
            k.DeleteWorkload: self.delete_workload,
            k.MakeWorkload: self.make_workload,
            k.UpdateWorkload: self.update_workload,
            k.OwnWorkload: self.own_workload,
        }

        self.off_pass = {
            ScriptCondition: self.script_condition,
            OrphanScalerStatus: self.orphan_status,
        }

    def run(self, p: Pass, w: k.Write) -> None:
        self.table[type(w)](p, w)

    def alone(self, w: OffPass) -> bool:
        """A write from outside any job's pass (planning/writes.py); False: its object is gone."""
        return self.off_pass[type(w)](w)

    def write(
        self, body: dict[str, Any], change: dict[str, Any], sub: str | None = None
    ) -> dict[str, Any]:
        """A patch preconditioned on the version `body` was read at (a 409 if anyone wrote in
        between); until the cache shows the write, its copy of `body` counts as stale."""
        meta = body["metadata"]
        precondition = {**change.get("metadata", {}), "resourceVersion": meta["resourceVersion"]}
        new = self.kube.patch(
            body["kind"], meta["namespace"], meta["name"], {**change, "metadata": precondition},
            sub=sub,
        )  # fmt: skip
        if new["metadata"]["resourceVersion"] != meta["resourceVersion"]:  # not a no-op
            self.writes.wrote(body)
        else:
            log.debug("No-op write kind=%s name=%s", body["kind"], meta["name"])
        return new

    # The basics: what stood in the way holds the pass's children back.
    def make_basics(self, p: Pass, w: k.MakeBasics) -> None:
        p.acted.held += self.children.make_basics(p.obs, w.secret, w.config_map)

    def make_access(self, p: Pass, w: k.MakeLauncherAccess) -> None:
        self.children.make_launcher_access(p.obs, w.objects)

    def update_role(self, p: Pass, w: k.UpdateLauncherRole) -> None:
        self.children.update_launcher_role(p.obs)

    # The statuses, each preconditioned on the version read (a 409 ends the pass).
    def adopt_scaler(self, p: Pass, w: k.AdoptScaler) -> None:
        refs = p.scalers[w.kind_name]["metadata"].get("ownerReferences") or []
        meta = p.job["metadata"]
        owner = Owner(naming.JOB_KIND, meta["name"], meta["uid"])
        others = [r for r in refs if not r.get("controller")]
        change = {"metadata": {"ownerReferences": [*others, owner.reference()]}}
        p.scalers[w.kind_name] = self.write(p.scalers[w.kind_name], change)

    def scaler_status(self, p: Pass, w: k.ScalerStatusWrite) -> None:
        scaler = p.scalers[w.kind_name]
        change = {"status": merge_patch(scaler.get("status") or {}, w.status.to_dict())}
        self.write(scaler, change, "status")

    def job_status(self, p: Pass, w: k.JobStatusWrite) -> None:
        change = {"status": merge_patch(p.job.get("status") or {}, w.status.to_dict())}
        p.job = self.write({**p.job, "kind": naming.JOB_KIND}, change, sub="status")

    def spec_replicas(self, p: Pass, w: k.SpecReplicas) -> None:
        replicas = {"worker": {"replicas": w.replicas}}
        self.write({**p.job, "kind": naming.JOB_KIND}, {"spec": {"etReplicaSpecs": replicas}})

    def tell(self, p: Pass, w: k.TellEvents) -> None:
        """The pass's events, after the status writes they tell of, handed to the recorder
        (which posts them off the pass); the job's logged and counted."""
        meta = p.job["metadata"]
        for ev in w.job:
            log.info("%s namespace=%s job=%s message=%r", ev.reason, meta["namespace"],
                     meta["name"], ev.message)  # fmt: skip
            if ev.reason == "WorkerLost":
                metrics.WORKERS_LOST.inc()
            elif ev.reason == "WorkerReplaced":
                metrics.WORKERS_REPLACED.inc()
        now = self.clock()
        about = [(p.job, ev) for ev in w.job] + [(p.scalers[k], ev) for k, ev in w.scalers]
        for body, ev in about:
            self.recorder.post(body, ev.type, ev.reason, ev.message, now)

    # The children: what stood in the way goes into `acted`.
    def make_gang(self, p: Pass, w: k.MakeGang) -> None:
        self.gangs.make(self.spec(p))

    def host_list(self, p: Pass, w: k.HostList) -> None:
        self.children.publish(p.obs, self.spec(p), w.hosts)

    def delete_pod(self, p: Pass, w: k.DeletePod) -> None:
        self.children.delete_pod(p.obs, self.spec(p), w.name, w.now)

    def delete_service(self, p: Pass, w: k.DeleteService) -> None:
        found = [s for s in p.obs.services if s["metadata"]["name"] == w.name]
        uid = found[0]["metadata"].get("uid") if found else None
        self.kube.delete("Service", self.spec(p).namespace, w.name, uid)

    def worker_objects(self, p: Pass, w: k.WorkerObjects) -> None:
        made = self.children.worker_objects(p.obs, self.spec(p), p.plan, w.services, w.indices)
        p.acted.problems += made.problems
        p.acted.squatted += made.squatted

    def make_launcher(self, p: Pass, w: k.MakeLauncher) -> None:
        p.acted.problems += self.children.launcher(p.obs, self.spec(p), p.plan)

    def make_scaler(self, p: Pass, w: k.MakeScaler) -> None:
        """`kubectl scale`'s change as a scaler; one of that name not made for it is in the
        way until renamed or deleted."""
        spec, wanted = self.spec(p), w.wanted
        body = scalers.replicas_scaler(spec.namespace, job_owner(spec), wanted)
        try:
            self.kube.create(body)
        except AlreadyExists:
            found = self.kube.get(wanted["kind"], spec.namespace, wanted["name"])
            if found is None or scalers.is_replicas_scaler(found, spec.uid, wanted["generation"]):
                return
            p.acted.problems.append(
                f"{wanted['kind']} {wanted['name']} exists and was not made by the operator; "
                f"`kubectl scale` to {spec.worker.replicas} waits until it is renamed or deleted"
            )
            return
        said = f"replicas set to {spec.worker.replicas}: created {wanted['kind']} {wanted['name']}"
        self.recorder.post(p.obs.job, "Normal", "ReplicasChanged", said, self.clock())

    # Off the pass.
    def script_condition(self, w: ScriptCondition) -> bool:
        """Written on the version read (a pass writing the scaler in between makes it read
        again) and remembered as ours, so that a pass whose cache has not seen it yet waits
        instead of acting on the old one."""
        (kind, name), ns = w.kind_name, w.namespace
        for _ in range(5):
            scaler = self.kube.get(kind, ns, name)
            if scaler is None:
                return False
            conds, _ = st.set_condition(
                scaler_status(kind, scaler.get("status")).conditions or [],
                SCRIPT_EXECUTED, w.status, w.reason, w.message, iso(self.clock()),
            )  # fmt: skip
            try:
                self.write(scaler, {"status": {"conditions": conds}}, sub="status")
            except Conflict:
                continue
            if w.status != "Unknown":
                etype = "Normal" if w.status == "True" else "Warning"
                self.recorder.post(scaler, etype, w.reason, w.message, self.clock())
            return True
        raise RuntimeError(f"{kind} {ns}/{name} kept changing while its script was reported")

    def orphan_status(self, w: OrphanScalerStatus) -> bool:
        change = {"status": merge_patch(w.body.get("status") or {}, w.status.to_dict())}
        self.write(w.body, change, sub="status")
        if w.event is not None:
            self.recorder.post(w.body, *w.event, self.clock())
        return True

    # Kueue's Workloads.
    def drop_workloads(self, p: Pass, w: k.DropWorkloads) -> None:
        for body in p.obs.workloads:
            meta = body["metadata"]
            self.kube.delete(naming.WORKLOAD_KIND, meta["namespace"], meta["name"], meta["uid"])

    def delete_workload(self, p: Pass, w: k.DeleteWorkload) -> None:
        ns = self.spec(p).namespace
        uid = next((b["metadata"]["uid"] for b in p.obs.workloads
                    if b["metadata"]["name"] == w.name), None)  # fmt: skip
        if self.kube.delete(naming.WORKLOAD_KIND, ns, w.name, uid):
            log.info("Deleted Workload namespace=%s name=%s", ns, w.name)

    def make_workload(self, p: Pass, w: k.MakeWorkload) -> None:
        spec = self.spec(p)
        owner = job_owner(spec)
        p.acted.problems += self.queues.make(
            spec, owner, w.name, w.workers, w.replacing, surplus=w.surplus
        )

    def update_workload(self, p: Pass, w: k.UpdateWorkload) -> None:
        core, surplus = families(p.obs.workloads)
        body = core if w.core else surplus
        if body is None or body["metadata"]["name"] in p.plan.delete_workloads:
            return
        self.queues.update(body, w.resize, w.activate, list(w.conditions), w.release)

    def own_workload(self, p: Pass, w: k.OwnWorkload) -> None:
        """Its owners: the job (its controller) and the pods (a list replaced whole, on no
        version: the next pass mends what a write between changed)."""
        spec = self.spec(p)
        change = workload.owned_by_pods(job_owner(spec), w.pods)
        try:
            self.kube.patch(naming.WORKLOAD_KIND, spec.namespace, w.name, change)
        except ApiError as exc:
            if exc.status != 404:  # gone meanwhile: nothing of it to keep
                raise

    @staticmethod
    def spec(p: Pass) -> JobSpec:
        assert p.spec is not None, "a child write in a pass without a spec"
        return p.spec
