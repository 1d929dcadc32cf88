"""Pure planning: observed world + job status -> what to create, delete and write.

One function, `plan_job`, decides everything for a job and its scalers. It never talks to the
API server, reads no clock and draws no random numbers: the reconciler observes, calls it,
acts on the plan, and writes the status it returns. Planning twice from the same observation
gives the same plan, which is what makes restarts and retries safe.

The job's status carries the few facts that cannot be observed again:
  targetWorkers   the membership: pods this run should have (created or still to create)
  currentWorkers  the host list Horovod sees
  lastWorkerIndex the highest index ever used, so names are never reused
  runStartIndex   first index of the current run; lower ones belong to an earlier run
  acceptedReplicas spec.etReplicaSpecs.worker.replicas as last acted upon (`kubectl scale`)
  currentScaler   the one scaler allowed to touch pods, whose plan is frozen in its status
  scalerPods      that plan again, so a scaler deleted while it runs can be undone
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from etoperator import naming
from etoperator import status as st
from etoperator.api.models import JobSpec, ScalerSpec
from etoperator.clock import iso, parse_iso
from etoperator.status import Event


@dataclass(frozen=True)
class PodView:
    name: str
    role: str
    index: int | None = None
    phase: str = "Pending"
    deleting: bool = False
    ready: bool = False  # worker: sshd accepts the job key; launcher: Running
    exit_code: int | None = None
    reason: str = ""
    run: int | None = None  # launcher: the run (restartCount) it was created for
    leaving: str = ""  # a notice that the pod is about to go (preemption, drain)
    busy: bool | None = None  # scale-in victim: a Horovod process still runs on it

    @property
    def draining(self) -> bool:
        """Noticed for preemption, still running: Horovod may still be on it."""
        return bool(self.leaving) and self.phase == "Running" and not self.deleting

    @property
    def gone_bad(self) -> bool:
        return self.phase in ("Failed", "Succeeded") or self.deleting or bool(self.leaving)


@dataclass(frozen=True)
class ScalerView:
    kind: str
    name: str
    created: str
    spec: ScalerSpec | None
    error: str | None = None
    status: dict[str, Any] = field(default_factory=dict)
    owned: bool = False
    made_for: int | None = None  # made by the operator for `kubectl scale` at this generation

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.name)

    @property
    def phase(self) -> str:
        return str(self.status.get("phase") or "")

    @property
    def planned(self) -> list[str]:
        field_name = "addPods" if self.kind == naming.SCALEOUT_KIND else "toDeletePods"
        return list(self.status.get(field_name) or [])


@dataclass(frozen=True)
class JobInput:
    name: str
    namespace: str
    generation: int
    spec: JobSpec | None
    error: str | None
    status: dict[str, Any]
    pods: list[PodView]
    scalers: list[ScalerView]
    now: datetime
    published: list[str] | None = None  # the host list in the ConfigMap now
    problems: tuple[str, ...] = ()  # children in the way (found now, or by the last pass's acts)
    public_key: str | None = None  # the job's SSH public key, recorded for a later rotation
    squatted: tuple[str, ...] = ()  # worker names held by pods that are not this job's
    hold: bool = False  # the Secret, ConfigMap or RBAC a pod needs is not there: touch no pod
    refusal_over: bool = False  # the apiserver accepted the last pass's writes again


@dataclass
class Plan:
    status: dict[str, Any]
    create_workers: list[int] = field(default_factory=list)
    delete_pods: list[str] = field(default_factory=list)
    create_launcher: bool = False
    hosts: list[str] | None = None  # None: leave the ConfigMap as it is
    services: list[str] = field(default_factory=list)  # worker services that should exist
    scaler_status: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    scaler_events: dict[tuple[str, str], list[Event]] = field(default_factory=dict)
    adopt_scalers: list[tuple[str, str]] = field(default_factory=list)
    create_scalers: list[dict[str, Any]] = field(default_factory=list)
    spec_replicas: int | None = None
    events: list[Event] = field(default_factory=list)
    requeue: float = 60.0  # steady state: a resync now and then; events wake us sooner
    settled_scalers: list[tuple[str, str, str]] = field(default_factory=list)  # kind, result, secs
    run_scripts: list[tuple[tuple[str, str], list[str], int]] = field(default_factory=list)


def _workers(n: int) -> str:
    return "1 worker" if n == 1 else f"{n} workers"


def _by_index(job: str, names: list[str]) -> list[str]:
    return sorted(set(names), key=lambda n: (naming.worker_index(job, n) or 0, n))


def replaces(policy: str, pod: PodView | None) -> bool:
    """Does the worker restartPolicy ask for a replacement of this lost worker?"""
    if policy == "Always":
        return True
    if policy == "Never":
        return False
    code = pod.exit_code if pod is not None and not pod.deleting and not pod.leaving else None
    if policy == "OnFailure":
        return code != 0
    # ExitCode: 1-127 are the program's own verdict (permanent); signals and loss are retryable.
    return code is None or code >= 128


def victims_by_count(job: str, members: list[str], count: int) -> list[str]:
    """Highest indices first."""
    return _by_index(job, members)[::-1][:count]


def check_scale_in(
    job: JobSpec, members: list[str], hosts: list[str], spec: ScalerSpec
) -> tuple[list[str], str | None]:
    """Victims of a ScaleIn, or the reason it cannot run (then nothing is deleted)."""
    if spec.pod_names is not None:
        unknown = [n for n in spec.pod_names if n not in members]
        if unknown:
            return [], (
                f"not current workers of job {job.name}: {', '.join(unknown)}; nothing deleted"
            )
        victims = list(spec.pod_names)
    else:
        assert spec.count is not None
        victims = victims_by_count(job.name, members, spec.count)
    left = len(members) - len(victims)
    if left < job.worker.min_replicas:
        return [], (
            f"removing {len(victims)} of {_workers(len(members))} would leave {left}, "
            f"below minReplicas {job.worker.min_replicas}"
        )
    if hosts and not [h for h in hosts if h not in victims]:
        return [], "would remove every worker in the host list; Horovod needs one to keep state"
    return _by_index(job.name, victims), None


def check_scale_out(job: JobSpec, members: list[str], spec: ScalerSpec) -> str | None:
    assert spec.count is not None
    limit, what = job.worker.max_replicas, "maxReplicas"
    if limit is None or limit > job.worker.limit:
        limit, what = job.worker.limit, "this operator's limit of workers per job"
    if len(members) + spec.count > limit:
        return (
            f"adding {spec.count} to {_workers(len(members))} would exceed {what} {limit}; "
            "nothing added"
        )
    return None


def script_argv(spec: ScalerSpec, pods: list[str], slots: int) -> list[str]:
    """The scaler's script called as the Go operator called it, `timeout <t> sh <script>
    pod1:slots,pod2:slots`, so scripts written for it work unchanged; but as an argv list, with
    `env` setting the variables: values arrive as written, no shell parses them."""
    assert spec.script is not None
    return [
        "timeout",
        str(spec.timeout),
        "env",
        *(f"{k}={v}" for k, v in spec.env),
        "sh",
        spec.script,
        ",".join(f"{pod}:{slots}" for pod in pods),
    ]


def scaler_order(s: ScalerView) -> tuple[str, str]:
    return (s.created, s.name)


class _Planner:
    def __init__(self, inp: JobInput) -> None:
        self.inp = inp
        self.now = iso(inp.now)
        self.s: dict[str, Any] = copy.deepcopy(inp.status)
        self.plan = Plan(status=self.s)
        self.workers = {p.name: p for p in inp.pods if p.role == naming.ROLE_WORKER}
        self.launcher = next((p for p in inp.pods if p.role == naming.ROLE_LAUNCHER), None)
        self.scalers = {s.key: s for s in inp.scalers}
        self.busy = False  # something is in flight: come back soon

    # -- small helpers -------------------------------------------------------------------

    def cond(self, ctype: str, status: str, reason: str, message: str, warn: bool = False) -> None:
        conds, changed = st.set_condition(
            self.s.get("conditions") or [], ctype, status, reason, message, self.now
        )
        self.s["conditions"] = conds
        if changed and status == "True":
            self.plan.events.append(Event("Warning" if warn else "Normal", reason, message))

    def scaler_cond(
        self, sc: ScalerView, phase: str, ctype: str, reason: str, message: str, warn: bool = False
    ) -> dict[str, Any]:
        new = copy.deepcopy(self.plan.scaler_status.get(sc.key, sc.status))
        conds, changed = st.set_condition(
            new.get("conditions") or [], ctype, "True", reason, message, self.now
        )
        new["conditions"] = conds
        new["phase"] = phase
        if phase in st.SCALE_TERMINAL:
            new.setdefault("completionTime", self.now)
            started = parse_iso(new.get("startTime"))
            secs = (self.inp.now - started).total_seconds() if started else 0.0
            result = "succeeded" if phase == st.SCALE_SUCCEEDED else "failed"
            self.plan.settled_scalers.append((sc.kind, result, f"{secs:.3f}"))
        if new != sc.status:
            self.plan.scaler_status[sc.key] = new
        if changed:
            event = Event("Warning" if warn else "Normal", reason, message)
            self.plan.scaler_events.setdefault(sc.key, []).append(event)
            if phase in st.SCALE_TERMINAL:  # `kubectl describe tj` tells how each scale ended
                self.plan.events.append(
                    Event(event.type, reason, f"{sc.kind} {sc.name}: {message}")
                )
        return new

    def fail_scaler(self, sc: ScalerView, reason: str, message: str) -> None:
        self.scaler_cond(sc, st.SCALE_FAILED, st.SCALE_FAILED, reason, message, warn=True)

    def delete(self, name: str) -> None:
        pod = self.workers.get(name) or (
            self.launcher if self.launcher and self.launcher.name == name else None
        )
        if pod is not None and not pod.deleting and name not in self.plan.delete_pods:
            self.plan.delete_pods.append(name)

    def job(self) -> JobSpec:
        assert self.inp.spec is not None
        return self.inp.spec

    def fresh_run(self) -> None:
        """Membership for a new run: fresh indices, an empty host list."""
        job = self.job()
        start = self.last_index() + 1
        self.s["runStartIndex"] = start
        self.s["targetWorkers"] = [
            naming.worker_name(job.name, i) for i in range(start, start + job.worker.replicas)
        ]
        self.s["lastWorkerIndex"] = start + job.worker.replicas - 1
        self.s["currentWorkers"] = []
        self.accept(job.worker.replicas)
        self.s["phase"] = st.CREATED
        for ctype in ("WorkersReady", "LauncherCreated", "Running"):
            if st.condition(self.s.get("conditions") or [], ctype):
                self.cond(ctype, "False", "NewRun", "a new run is starting")

    def last_index(self) -> int:
        seen = [p.index for p in self.workers.values() if p.index is not None]
        return max([int(self.s.get("lastWorkerIndex", -1)), *seen])

    def active_scaler(self) -> ScalerView | None:
        ref = naming.parse_scaler_ref(str(self.s.get("currentScaler") or ""))
        if ref is None:
            return None
        sc = self.scalers.get((ref[0], ref[2]))
        if sc is None or sc.phase in st.SCALE_TERMINAL or not sc.planned:
            return None
        return sc

    # -- the plan ------------------------------------------------------------------------

    def run(self) -> Plan:
        inp = self.inp
        self.s.setdefault("conditions", [])
        if inp.spec is None:
            self.invalid(inp.error or "invalid spec")
            return self.finish()
        job = inp.spec
        failed_cond = st.condition(self.s["conditions"], st.FAILED)
        if (
            self.s.get("phase") == st.FAILED
            and failed_cond
            and failed_cond.get("reason") == "InvalidSpec"
        ):
            # The spec was fixed after being refused: nothing was ever started, begin afresh.
            self.cond(st.FAILED, "False", "SpecFixed", "the spec is valid now")
            self.s.pop("phase", None)
            self.s.pop("completionTime", None)
        self.s["workerSelector"] = naming.worker_selector(job.name)
        if inp.public_key:
            self.s["sshPublicKey"] = inp.public_key
        self.adopt_scalers()
        if not self.s.get("phase"):
            self.s["startTime"] = self.s.get("startTime") or self.now
            self.s.setdefault("restartCount", 0)
            self.fresh_run()
            self.cond(st.CREATED, "True", "TrainingJobCreated", f"job {job.name} is created")
        self.blocked()
        phase = self.s["phase"]
        if inp.hold and phase not in st.TERMINAL:
            self.plan.requeue = 5.0
            return self.plan  # status only: nothing moves until the job's basics are there
        if phase in st.TERMINAL:
            self.finished()
        elif job.suspended:
            self.suspend()
        elif phase == st.SUSPENDED:
            self.fresh_run()
            self.cond(st.SUSPENDED, "False", "Resumed", "job resumed")
            self.plan.events.append(Event("Normal", "Resumed", "job resumed: starting afresh"))
            self.running()
        else:
            self.running()
        return self.finish()

    def blocked(self) -> None:
        """Blocked/ChildConflict while something of ours is in the way, cleared once it is not;
        Blocked/APIRefused (set when a write was refused) cleared once writes pass again."""
        current = st.condition(self.s["conditions"], "Blocked") or {}
        reason = current.get("reason") if current.get("status") == "True" else None
        if self.inp.problems:
            message = "; ".join(self.inp.problems)
            self.cond("Blocked", "True", "ChildConflict", message, warn=True)
        elif reason == "ChildConflict":
            self.cond("Blocked", "False", "Resolved", "nothing blocks the job")
        elif reason == "APIRefused" and self.inp.refusal_over:
            self.cond("Blocked", "False", "Resolved", "the API server accepts the job's writes")

    def invalid(self, error: str) -> None:
        if self.s.get("phase") != st.FAILED:
            self.s["phase"] = st.FAILED
            self.s["completionTime"] = self.now
        self.cond(st.FAILED, "True", "InvalidSpec", error, warn=True)
        for sc in self.inp.scalers:
            if sc.phase not in st.SCALE_TERMINAL:
                self.fail_scaler(sc, "JobInvalid", f"job {self.inp.name} is invalid: {error}")

    def adopt_scalers(self) -> None:
        for sc in self.inp.scalers:
            if not sc.owned and sc.phase not in st.SCALE_TERMINAL:
                self.plan.adopt_scalers.append(sc.key)

    def finished(self) -> None:
        job = self.job()
        for pod in self.inp.pods:
            if job.clean_pod_policy == "All" or (
                job.clean_pod_policy == "Running" and pod.phase in ("Pending", "Running")
            ):
                self.delete(pod.name)
        self.s["currentScaler"] = ""
        for sc in self.inp.scalers:
            if sc.phase not in st.SCALE_TERMINAL:
                self.fail_scaler(
                    sc, "JobFinished", f"job {job.name} ended {self.s['phase']}; nothing scaled"
                )

    def suspend(self) -> None:
        for pod in self.inp.pods:
            self.delete(pod.name)
        self.s["targetWorkers"] = []
        self.s["currentWorkers"] = []
        self.plan.hosts = []
        self.s["phase"] = st.SUSPENDED
        self.fail_active("JobSuspended", "the job was suspended")
        self.s["currentScaler"] = ""
        self.cond(st.SUSPENDED, "True", "Suspended", "job suspended: all pods deleted")

    def fail_active(self, reason: str, message: str) -> None:
        active = self.active_scaler()
        if active is not None:
            self.fail_scaler(active, reason, message)

    # -- a live run ----------------------------------------------------------------------

    def running(self) -> None:
        job = self.job()
        start = int(self.s.get("runStartIndex", 0))
        run = int(self.s.get("restartCount", 0))
        members: list[str] = list(self.s.get("targetWorkers") or [])
        hosts: list[str] = [h for h in self.s.get("currentWorkers") or [] if h in members]
        active = self.active_scaler()
        if active is None and self.s.get("currentScaler"):
            ref = naming.parse_scaler_ref(str(self.s["currentScaler"]))
            if ref is not None and (ref[0], ref[2]) not in self.scalers:
                members, hosts = self.cancel_scale(ref[0], ref[2], members, hosts)
            self.s["currentScaler"] = ""
        joining = set(active.planned) if active and active.kind == naming.SCALEOUT_KIND else set()
        leaving = set(active.planned) if active and active.kind == naming.SCALEIN_KIND else set()
        scale_out_broken: list[str] = []

        # Pods of earlier runs go.
        for pod in self.workers.values():
            if pod.index is not None and pod.index < start:
                self.delete(pod.name)
        launcher: PodView | None = self.launcher
        if launcher is not None and launcher.run != run:
            self.delete(launcher.name)
            launcher = None
            self.busy = True
        launched = st.is_true(self.s["conditions"], "LauncherCreated")

        # Lost workers leave the host list at once; replaced per restartPolicy.
        for name in list(members):
            member = self.workers.get(name)
            lost = member.gone_bad if member else name in hosts
            if not lost:
                continue
            members.remove(name)
            if name in hosts:
                hosts.remove(name)
            why = self.describe_loss(member)
            if member is not None and not member.draining:
                self.delete(name)
            if name in joining:
                scale_out_broken.append(name)
                continue
            if name in leaving:
                continue
            self.plan.events.append(
                Event("Warning", "WorkerLost", f"worker {name} {why}; removed from the host list")
            )
            if member is not None and member.leaving:
                self.cond(
                    "WorkerPreempted",
                    "True",
                    "PreemptionNotice",
                    f"worker {name} {why}; left the host list before being stopped",
                )
            if replaces(job.worker.restart_policy, member):
                index = self.last_index() + 1
                self.s["lastWorkerIndex"] = index
                new = naming.worker_name(job.name, index)
                members.append(new)
                self.plan.events.append(
                    Event("Normal", "WorkerReplaced", f"worker {name} replaced by {new}")
                )
            elif not launched:
                self.s["targetWorkers"], self.s["currentWorkers"] = members, hosts
                self.fail_job("WorkerFailed", f"worker {name} {why} before training started")
                return

        # Anything of this run that is not a member goes, unless Horovod may still run on it:
        # a ScaleIn victim (its scaler decides), or a preempted worker until Horovod left it
        # (deleting it sooner would kill training mid-step; its node takes it anyway).
        for pod in self.workers.values():
            if pod.index is None or pod.index < start or pod.name in members:
                continue
            if pod.name in leaving and not pod.gone_bad:
                continue
            if pod.draining and pod.busy is not False:
                self.busy = True
                continue
            self.delete(pod.name)
        # Members without a pod are created (a name is free once its old pod is gone).
        for name in members:
            if name not in self.workers:
                wanted = naming.worker_index(job.name, name)
                if wanted is not None:
                    self.plan.create_workers.append(wanted)

        if active is not None and active.kind == naming.SCALEOUT_KIND:
            members, hosts = self.drive_scale_out(active, members, hosts, scale_out_broken)
        elif active is not None:
            members, hosts = self.drive_scale_in(active, members, hosts)
        self.s["targetWorkers"] = _by_index(job.name, members)

        # The launcher: created once every member is ready, marked created once it is seen.
        ready = [m for m in members if self.workers.get(m) and self.workers[m].ready]
        if launcher is not None and not launched:
            self.cond(
                "LauncherCreated", "True", "LauncherCreated", f"launcher {launcher.name} created"
            )
            launched = True
        if not launched:
            if self.launcher is None and members and len(ready) == len(members):
                hosts = list(members)
                self.plan.create_launcher = True
                self.cond(
                    "WorkersReady",
                    "True",
                    "WorkersReady",
                    f"{_workers(len(members))} {'accepts' if len(members) == 1 else 'accept'} "
                    "the job's SSH key",
                )
            self.busy = True
        else:
            # Ready members join, except those a running ScaleOut admits together.
            hosts += [m for m in ready if m not in hosts and m not in joining]
            if launcher is None or launcher.deleting:
                if job.launcher.restart_policy in ("Always", "OnFailure"):
                    if launcher is None:
                        self.plan.create_launcher = True
                    self.plan.events.append(
                        Event(
                            "Warning",
                            "LauncherRecreated",
                            f"launcher {naming.launcher_name(job.name)} was lost; recreating it",
                        )
                    )
                    self.busy = True
                else:
                    self.s["targetWorkers"], self.s["currentWorkers"] = members, hosts
                    self.fail_job(
                        "LauncherLost",
                        f"launcher {naming.launcher_name(job.name)} disappeared and its "
                        "restartPolicy does not recreate it",
                    )
                    return
            elif launcher.phase == "Succeeded":
                self.s["currentWorkers"] = _by_index(job.name, hosts)
                self.succeed_job()
                return
            elif launcher.phase == "Failed":
                self.s["currentWorkers"] = _by_index(job.name, hosts)
                self.launcher_failed(launcher)
                return
            elif launcher.phase == "Running":
                if self.s["phase"] == st.CREATED:
                    self.cond(st.RUNNING, "True", "Running", "the launcher is running")
                self.s["phase"] = st.RUNNING
            else:
                self.busy = True

        self.s["currentWorkers"] = _by_index(job.name, hosts)
        self.plan.hosts = self.s["currentWorkers"]
        if self.s["phase"] in (st.RUNNING, st.SCALING):
            self.start_scalers()
            self.replicas()
            self.s["phase"] = st.SCALING if self.s.get("currentScaler") else st.RUNNING
        if any(
            not (self.workers.get(m) and self.workers[m].ready) for m in self.s["targetWorkers"]
        ):
            self.busy = True

    def cancel_scale(
        self, kind: str, name: str, members: list[str], hosts: list[str]
    ) -> tuple[list[str], list[str]]:
        """The running scaler was deleted: undo what it had not finished."""
        pods = list(self.s.get("scalerPods") or [])
        if kind == naming.SCALEOUT_KIND:
            members = [m for m in members if m not in pods]
            hosts = [h for h in hosts if h not in pods]
            what = f"its new workers are removed: {', '.join(pods)}"
        else:
            back = [
                p
                for p in pods
                if p in self.workers and not self.workers[p].gone_bad and p not in members
            ]
            members = members + back
            what = f"its workers stay: {', '.join(back) or 'none left'}"
        message = f"{kind} {name} was deleted while it ran; {what}"
        self.cond(st.SCALING, "False", "ScaleCancelled", message)
        self.plan.events.append(Event("Warning", "ScaleCancelled", message))
        return members, hosts

    def describe_loss(self, pod: PodView | None) -> str:
        if pod is None:
            return "disappeared"
        if pod.leaving:
            return f"is about to be taken away ({pod.leaving})"
        if pod.deleting:
            return "is being deleted"
        detail = f", exit code {pod.exit_code}" if pod.exit_code is not None else ""
        reason = f" ({pod.reason}{detail})" if pod.reason or detail else ""
        return f"ended {pod.phase}{reason}"

    def fail_job(self, reason: str, message: str) -> None:
        self.s["phase"] = st.FAILED
        self.s["completionTime"] = self.now
        self.cond(st.FAILED, "True", reason, message, warn=True)
        self.finished()

    def succeed_job(self) -> None:
        self.s["phase"] = st.SUCCEEDED
        self.s["completionTime"] = self.now
        self.cond(st.SUCCEEDED, "True", "Succeeded", "the launcher completed successfully")
        self.finished()

    def launcher_failed(self, launcher: PodView) -> None:
        job = self.job()
        count = int(self.s.get("restartCount", 0))
        why = f"the launcher failed ({launcher.reason or 'Error'}, exit code {launcher.exit_code})"
        if job.restart_policy == "OnFailure" and count < job.backoff_limit:
            self.fail_active("JobRestarted", "the job restarted; scale not applied")
            self.s["currentScaler"] = ""
            self.s["restartCount"] = count + 1
            for pod in self.inp.pods:
                self.delete(pod.name)
            self.fresh_run()
            self.plan.hosts = []
            self.cond(
                "Restarting",
                "True",
                "Restarting",
                f"{why}; restart {count + 1} of {job.backoff_limit}",
                warn=True,
            )
            self.busy = True
            return
        limit = (
            f"; backoffLimit {job.backoff_limit} reached"
            if job.restart_policy == "OnFailure"
            else ""
        )
        self.fail_job("LauncherFailed", why + limit)

    # -- scaling -------------------------------------------------------------------------

    def timed_out(self, sc: ScalerView) -> bool:
        assert sc.spec is not None
        started = parse_iso(sc.status.get("startTime"))
        return started is not None and self.inp.now - started >= timedelta(seconds=sc.spec.timeout)

    def drive_scale_out(
        self, sc: ScalerView, members: list[str], hosts: list[str], broken: list[str]
    ) -> tuple[list[str], list[str]]:
        new = sc.planned
        taken = [n for n in new if n in self.inp.squatted]
        if taken:  # never ours to wait for, nor to remove
            ours = [n for n in new if n not in taken]
            for n in ours:
                self.delete(n)
            why = f"pod {', '.join(taken)} exists and is not this job's"
            removed = f"; removed {', '.join(ours)}" if ours else ""
            self.fail_scaler(sc, "ScaleOutFailed", f"{why}; nothing added{removed}")
            self.s["currentScaler"] = ""
            self.cond(st.SCALING, "False", "ScaleOutFailed", why)
            return [m for m in members if m not in new], [h for h in hosts if h not in new]
        if broken or self.timed_out(sc):
            assert sc.spec is not None
            missing = [n for n in new if not (self.workers.get(n) and self.workers[n].ready)]
            why = (
                f"new workers failed while joining: {', '.join(broken)}"
                if broken
                else f"new workers not ready within {sc.spec.timeout}s: {', '.join(missing)}"
            )
            for n in new:
                self.delete(n)
            members = [m for m in members if m not in new]
            hosts = [h for h in hosts if h not in new]
            self.fail_scaler(sc, "ScaleOutFailed", f"{why}; removed {', '.join(new)}")
            self.s["currentScaler"] = ""
            self.cond(st.SCALING, "False", "ScaleOutFailed", why)
            return members, hosts
        if all(self.workers.get(n) and self.workers[n].ready for n in new):
            hosts = hosts + [n for n in new if n not in hosts]
            # Succeed only once Horovod can see them: the ConfigMap is written after statuses.
            if set(new) <= set(self.inp.published or []):
                if not self.script_done(sc, new):
                    return members, hosts
                self.finish_scale(sc, members, f"added {', '.join(new)} to the host list")
            else:
                self.busy = True
        else:
            self.busy = True
        return members, hosts

    def drive_scale_in(
        self, sc: ScalerView, members: list[str], hosts: list[str]
    ) -> tuple[list[str], list[str]]:
        victims = sc.planned
        hosts = [h for h in hosts if h not in victims]
        members = [m for m in members if m not in victims]
        published = set(self.inp.published or [])
        alive = [v for v in victims if v in self.workers and not self.workers[v].deleting]
        # A victim has drained when Horovod no longer runs on it (or its pod is not running).
        draining = [
            v
            for v in alive
            if self.workers[v].phase == "Running"
            and (v in published or self.workers[v].busy is not False)
        ]
        if not set(victims) & published and not self.script_done(sc, victims):
            return members, hosts
        if draining and not self.timed_out(sc):
            self.busy = True
            return members, hosts
        for v in alive:
            self.delete(v)
        if draining:
            assert sc.spec is not None
            self.scaler_cond(
                sc,
                st.SCALE_RUNNING,
                "DrainTimeout",
                "DrainTimeout",
                f"Horovod still ran on {', '.join(draining)} after {sc.spec.timeout}s; "
                "deleted anyway",
                warn=True,
            )
        self.finish_scale(sc, members, f"removed {', '.join(victims)}")
        return members, hosts

    def script_done(self, sc: ScalerView, pods: list[str]) -> bool:
        """The scaler's script (if any) has run on the launcher; else ask for it to run."""
        assert sc.spec is not None
        if not sc.spec.script or st.condition(sc.status.get("conditions") or [], "ScriptExecuted"):
            return True
        if self.launcher is None or self.launcher.phase != "Running":
            return True  # nowhere to run it; the scale itself goes on
        argv = script_argv(sc.spec, pods, self.job().slots_per_worker)
        self.plan.run_scripts.append((sc.key, argv, sc.spec.timeout))
        self.busy = True
        return False

    def finish_scale(self, sc: ScalerView, members: list[str], what: str) -> None:
        self.scaler_cond(sc, st.SCALE_SUCCEEDED, st.SCALE_SUCCEEDED, "ScaleSucceeded", what)
        self.s["currentScaler"] = ""
        self.cond(st.SCALING, "False", "ScaleSucceeded", f"{sc.kind} {sc.name}: {what}")

    def start_scalers(self) -> None:
        """Fail bad scalers; start the oldest waiting one when none runs."""
        job = self.job()
        waiting = []
        for sc in sorted(self.inp.scalers, key=scaler_order):
            if sc.phase in st.SCALE_TERMINAL or sc.key in self.plan.scaler_status:
                continue
            if sc.spec is None:
                self.fail_scaler(sc, "InvalidSpec", sc.error or "invalid spec")
            else:
                waiting.append(sc)
        if self.s.get("currentScaler") or not waiting:
            return
        members: list[str] = self.s["targetWorkers"]
        hosts: list[str] = self.s["currentWorkers"]
        for sc in waiting:
            spec = sc.spec
            assert spec is not None
            if spec.kind == naming.SCALEOUT_KIND:
                problem = check_scale_out(job, members, spec)
                if problem:
                    self.fail_scaler(sc, "MaxReplicasExceeded", problem)
                    continue
                assert spec.count is not None
                first = self.last_index() + 1
                planned = [
                    naming.worker_name(job.name, i) for i in range(first, first + spec.count)
                ]
                self.s["lastWorkerIndex"] = first + spec.count - 1
                self.s["targetWorkers"] = members + planned
                self.plan.create_workers.extend(range(first, first + spec.count))
                field_name = "addPods"
                what = f"adding {', '.join(planned)}"
            else:
                planned, problem = check_scale_in(job, members, hosts, spec)
                if problem:
                    self.fail_scaler(sc, "InvalidScaleIn", problem)
                    continue
                self.s["targetWorkers"] = [m for m in members if m not in planned]
                self.s["currentWorkers"] = [h for h in hosts if h not in planned]
                self.plan.hosts = self.s["currentWorkers"]
                field_name = "toDeletePods"
                what = f"removing {', '.join(planned)}"
            new = copy.deepcopy(sc.status)
            new[field_name] = planned
            new["startTime"] = self.now
            self.plan.scaler_status[sc.key] = new
            self.scaler_cond(sc, st.SCALE_RUNNING, st.SCALE_RUNNING, "Scaling", what)
            self.s["currentScaler"] = naming.scaler_ref(sc.kind, self.inp.namespace, sc.name)
            self.s["scalerPods"] = planned
            self.cond(st.SCALING, "True", "Scaling", f"{sc.kind} {sc.name}: {what}")
            self.busy = True
            return

    # -- spec replicas: `kubectl scale` ----------------------------------------------------

    def replicas(self) -> None:
        """spec replicas follow the membership each scaler sets (so `kubectl get tj` shows the
        target, and a failed scale gives back the real size); a change by anyone else is a
        request, run as a scaler of the difference once the queue is empty."""
        request = self.replicas_request()
        if request is not None:
            self.take_request(request)
        elif (self.inp.status.get("currentScaler") or "") != (self.s.get("currentScaler") or ""):
            self.follow(len(self.s["targetWorkers"]))

    def replicas_request(self) -> int | None:
        """The spec replicas a user asked for and the operator has not taken up, if any.

        acceptedReplicas is the value accounted for. While the operator's own write of it may
        not have landed, replicasBefore holds the value it replaces: seeing that value is our
        write still to do (done again here), never a request, whatever crash came between."""
        spec = self.job().worker.replicas
        accepted = self.s.get("acceptedReplicas")
        if accepted is None or spec == accepted:
            self.accept(spec)
            return None
        if spec == self.s.get("replicasBefore"):
            self.plan.spec_replicas = int(accepted)
            return None
        if any(sc.made_for == self.inp.generation and sc.owned for sc in self.inp.scalers):
            self.accept(spec)  # its scaler exists: the request is queued like any other
            return None
        return spec

    def accept(self, replicas: int) -> None:
        self.s["acceptedReplicas"] = replicas
        self.s.pop("replicasBefore", None)

    def follow(self, members: int) -> None:
        worker = self.job().worker
        wanted = max(members, worker.min_replicas)
        if worker.max_replicas is not None:
            wanted = min(wanted, worker.max_replicas)  # the schema refuses anything else
        if wanted == worker.replicas:
            self.accept(wanted)
            return
        self.s["acceptedReplicas"] = wanted
        self.s["replicasBefore"] = worker.replicas
        self.plan.spec_replicas = wanted

    def take_request(self, replicas: int) -> None:
        job = self.job()
        if self.s.get("currentScaler") or any(
            sc.phase not in st.SCALE_TERMINAL and sc.key not in self.plan.scaler_status
            for sc in self.inp.scalers
        ):
            return  # let queued scalers run first; the difference is taken afterwards
        delta = replicas - len(self.s["targetWorkers"])
        if delta == 0:
            self.accept(replicas)
            return
        kind = naming.SCALEOUT_KIND if delta > 0 else naming.SCALEIN_KIND
        body: dict[str, Any] = {"selector": {"name": job.name}}
        if delta > 0:
            body["toAdd"] = {"count": delta}
        else:
            body["toDelete"] = {"count": -delta}
        # Accepted once seen: a crash before the create lands leaves the request standing.
        self.plan.create_scalers.append(
            {
                "kind": kind,
                "name": naming.replicas_scaler_name(job.name, self.inp.generation),
                "generation": self.inp.generation,
                "spec": body,
            }
        )
        self.busy = True

    def finish(self) -> Plan:
        job = self.inp.spec
        if job is not None:
            members = set(self.s.get("targetWorkers") or [])
            wanted = {naming.worker_index(job.name, m) for m in members}
            self.plan.create_workers = sorted(set(self.plan.create_workers) & wanted)
            keep = {
                p.name
                for p in self.workers.values()
                if not p.deleting and p.name not in self.plan.delete_pods
            }
            keep |= {naming.worker_name(job.name, i) for i in self.plan.create_workers}
            if self.s.get("phase") not in st.TERMINAL:
                keep |= members
            self.plan.services = sorted(keep)

            run_pods = [
                p
                for p in self.inp.pods
                if p.role == naming.ROLE_LAUNCHER
                or (p.index or 0) >= int(self.s.get("runStartIndex", 0))
            ]
            self.s["replicaStatuses"] = {
                "Launcher": st.replica_counts(
                    p.phase for p in run_pods if p.role == naming.ROLE_LAUNCHER
                ),
                "Worker": st.replica_counts(
                    p.phase for p in run_pods if p.role == naming.ROLE_WORKER
                ),
            }
            self.s["replicas"] = len(self.s.get("currentWorkers") or [])
        if not self.s.get("currentScaler"):
            self.s.pop("scalerPods", None)
        self.s["observedGeneration"] = self.inp.generation
        if self.busy or self.plan.create_workers or self.plan.delete_pods:
            self.plan.requeue = 1.0
        return self.plan


def plan_job(inp: JobInput) -> Plan:
    """Everything the reconciler should do for one job and its scalers, from one observation."""
    return _Planner(inp).run()


def plan_orphan_scaler(
    sc: ScalerView, job_exists: bool, now: datetime
) -> tuple[dict[str, Any] | None, Event | None]:
    """Status (and event) for a scaler no job loop looks after: refuse an invalid one, wait for
    a job that does not exist yet, fail one whose job was deleted. (None, None): no change."""
    if sc.phase in st.SCALE_TERMINAL:
        return None, None
    job = sc.spec.job if sc.spec else "?"
    if sc.spec is None:
        error = sc.error or "invalid spec"
        ctype, reason, msg, phase = st.SCALE_FAILED, "InvalidSpec", error, st.SCALE_FAILED
    elif job_exists:
        return None, None  # its job's loop runs it
    elif sc.owned or sc.phase == st.SCALE_RUNNING:
        ctype, reason, msg, phase = (
            st.SCALE_FAILED,
            "JobDeleted",
            f"job {job} was deleted",
            st.SCALE_FAILED,
        )
    else:
        ctype, reason, msg, phase = "Waiting", "JobNotFound", f"waiting for job {job} to exist", ""
    t = iso(now)
    conds, changed = st.set_condition(
        sc.status.get("conditions") or [], ctype, "True", reason, msg, t
    )
    if not changed and sc.phase == phase:
        return None, None
    new = {**copy.deepcopy(sc.status), "conditions": conds, "phase": phase}
    if phase == st.SCALE_FAILED:
        new["completionTime"] = t
        return new, Event("Warning", reason, msg)
    return new, None
