"""Level-based reconcile of one TrainingJob and its scalers, a pass in this order: observe (the
Observer, and the basics as Children sees them), plan (planning/), then run the plan's one
ordered list of writes (planning/writes.py says the order and why a crash or a 409 between any
two of them is harmless): the basics, the statuses, the pass's events, the children; scripts
start off the pass (Scripts). The JobReconciler holds those parts. Every pass starts again
from what is observed, so a pass cut short is finished by the next.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from etoperator import metrics, naming
from etoperator import status as st
from etoperator.api.fields import DEFAULT_MAX_WORKERS
from etoperator.api.statuses import JobStatus
from etoperator.builders import config
from etoperator.cache import Observed
from etoperator.clock import utcnow
from etoperator.kube import ApiError, Conflict, Kube
from etoperator.planning import JobInput, Plan, plan_job, plan_orphan_scaler
from etoperator.planning.kinds import JobStatusWrite, TellEvents
from etoperator.planning.lifecycle import plan_refused
from etoperator.planning.views import BasicsView
from etoperator.planning.writes import (
    OrphanScalerStatus,
    Queueing,
    Stage,
    ordered,
    staged,
)
from etoperator.reconcile.children import Acted, Children
from etoperator.reconcile.execute import Executor, Pass
from etoperator.reconcile.gangs import Gangs
from etoperator.reconcile.observe import Observer, scaler_view
from etoperator.reconcile.queues import Queues
from etoperator.reconcile.scripts import Scripts
from etoperator.reconcile.secretchecks import SecretChecks
from etoperator.reconcile.state import (
    BLOCKED_CLEARING,
    CONFLICT,
    GOING,
    GONE,
    REFUSED,
    STALE,
    AccessMakings,
    Keys,
    Next,
    Recorder,
    Writes,
    job_id,
    job_prefix,
    plan_next,
    refused,
)
from etoperator.sshcheck import SSHProber
from etoperator.status import Event

log = logging.getLogger(__name__)
# A job's independent creates (its Services and worker pods, its Secret and ConfigMap) go at
# once, at most this many in flight over all passes: a first pass waits for the slowest
# create, not for the sum of ~20, and two first passes at once (NEW_AT_ONCE) do not queue
# behind each other's 16.
CREATES_AT_ONCE = 32
SLOW_PASS = 0.5  # a pass longer than this is logged with each step's time
# Launchers' accounts, Roles and bindings are made off the passes, a job's in order, this many
# jobs' at once (the apiserver takes 0.2 s or more over each Role and binding).
ACCESS_AT_ONCE = 4
EVENT_THREADS = 2  # a pass's events, posted off the pass
REQUEST_THREADS = CREATES_AT_ONCE + ACCESS_AT_ONCE + EVENT_THREADS  # beside the passes' own
# A pass comes back this soon while its launcher's access is being made, to tell what that met.
ACCESS_CHECK = Next(1.0, "the launcher's account, Role and binding being made")


@dataclass
class JobReconciler:
    """One job's passes: observe (the Observer), plan (planning/), write the plan, act on the
    children (Children) and start scalers' scripts (Scripts). Built by `build`."""

    kube: Kube
    observer: Observer
    children: Children
    scripts: Scripts
    executor: Executor  # every write goes through it: a pass's, a script's, an orphan's
    writes: Writes
    keys: Keys
    pool: concurrent.futures.ThreadPoolExecutor  # independent writes made at once
    recorder: Recorder  # a pass's events, posted off the pass
    queues: Queues  # Kueue's Workloads of queued jobs
    gangs: Gangs  # gang jobs' PodGroups
    clock: Callable[[], datetime] = utcnow
    _refused: set[str] = field(default_factory=set)  # jobs whose last pass had a write refused
    _acted: dict[str, Acted] = field(default_factory=dict)  # what the last pass's acting met

    @classmethod
    def build(
        cls,
        kube: Kube,
        *,
        prober: SSHProber | None = None,
        ssh_checks: bool = True,
        max_workers: int = DEFAULT_MAX_WORKERS,
        own_account: str = "",
        probe_pool: concurrent.futures.ThreadPoolExecutor | None = None,
        tainted_nodes: Callable[[], set[str]] = set,
        clock: Callable[[], datetime] = utcnow,
    ) -> JobReconciler:
        """The reconciler and its parts, each handed what it needs."""
        keys, writes, makings = Keys(), Writes(), AccessMakings()
        pool = concurrent.futures.ThreadPoolExecutor(CREATES_AT_ONCE, "etoperator-create")
        observer = Observer(
            kube, keys, prober or SSHProber(), probe_pool or concurrent.futures.ThreadPoolExecutor(
                16, "etoperator-ssh"
            ), ssh_checks, max_workers, tainted_nodes, own_account=own_account,
            secrets=SecretChecks(kube, clock), writes=writes, makings=makings,
        )  # fmt: skip
        access = concurrent.futures.ThreadPoolExecutor(ACCESS_AT_ONCE, "etoperator-access")
        recorder = Recorder(
            kube, concurrent.futures.ThreadPoolExecutor(EVENT_THREADS, "etoperator-event")
        )
        children = Children(kube, keys, writes, pool, access, recorder, clock, makings)
        queues, gangs = Queues(kube, clock), Gangs(kube)
        executor = Executor(kube, children, gangs, queues, writes, recorder, clock)
        scripts = Scripts(kube, executor.alone, clock)
        return cls(
            kube, observer, children, scripts, executor, writes, keys, pool, recorder, queues,
            gangs, clock,
        )  # fmt: skip

    def forget(self, namespace: str, job: str) -> None:
        """The job is gone: drop all memory of it (keys, checks, problems, scripts, writes)."""
        prefix = job_prefix(namespace, job)
        self.keys.forget(prefix)
        self.observer.forget(prefix)
        self.children.forget(prefix)
        self.scripts.forget(prefix)
        self.queues.forget(prefix)
        self.writes.forget(namespace, job)
        self._refused = {k for k in self._refused if not k.startswith(prefix)}
        for k in [k for k in self._acted if k.startswith(prefix)]:
            self._acted.pop(k)

    def child_changed(self, namespace: str, job: str, kind: str, deleted: bool) -> None:
        """Someone else changed or deleted a child: read the user's Secret again on the next
        pass; a changed Secret's key replaces the one held (a deleted one's is kept to remake
        it with)."""
        self.children.forget(job_prefix(namespace, job))
        if self.observer.secrets is not None:
            self.observer.secrets.forget(job_prefix(namespace, job))
        if kind == "Secret" and not deleted:
            self.keys.secret_changed(job_prefix(namespace, job), naming.secret_name(job))

    def reconcile(self, obs: Observed) -> Next:
        """One pass over what was observed; when the next one is wanted."""
        if self.writes.stale(obs):
            metrics.STALE_VIEWS.inc()
            return STALE
        self.observer.parse(obs)
        metrics.RECONCILES.inc()
        took: dict[str, float] = {}
        start = time.monotonic()
        try:
            return self.reconcile_observed(replace(obs, configmap=self.writes.configmap(obs)), took)
        except ApiError as exc:
            if not refused(exc):
                raise
            self.report_refused(obs, exc)
            return REFUSED
        finally:
            secs = time.monotonic() - start
            metrics.RECONCILE_SECONDS.observe(secs)
            if secs > SLOW_PASS:
                meta, phase = obs.job["metadata"], (obs.job.get("status") or {}).get("phase")
                steps = " ".join(f"{k}={v:.2f}s" for k, v in took.items())
                log.info(
                    "Slow pass namespace=%s job=%s phase=%s took=%.2fs %s",
                    meta["namespace"], meta["name"], phase or "-", secs, steps,
                )  # fmt: skip

    def reconcile_observed(self, obs: Observed, took: dict[str, float]) -> Next:
        """observe (done) -> plan -> act; the seconds until the next pass. Each step's time
        goes into `took`."""
        namespace, name = obs.job["metadata"]["namespace"], obs.job["metadata"]["name"]
        jid = job_id(namespace, name, obs.job["metadata"]["uid"])
        inp, basics = self.job_input(obs, jid, took)
        with metrics.pass_step(took, "plan"):
            plan = plan_job(inp)
        going = self.going_away(namespace, plan)
        if going is not None:
            return going
        try:
            self.act(obs, inp, plan, took)
        except Conflict as exc:
            log.info("Conflict namespace=%s job=%s error=%s (pass repeated)", namespace, name, exc)
            return CONFLICT
        except ApiError as exc:
            if refused(exc):
                self._refused.add(jid)
            raise
        self._refused.discard(jid)
        now = self._acted.get(jid, Acted())
        quiet = not basics and not now.problems and not now.held
        return next_after(plan, quiet, self.children.makings.making(jid))

    def job_input(
        self, obs: Observed, jid: str, took: dict[str, float]
    ) -> tuple[JobInput, list[str]]:
        """What the planner is given of the job's world, and the basics it still lacks."""
        namespace, name = obs.job["metadata"]["namespace"], obs.job["metadata"]["name"]
        acted = self._acted.get(jid, Acted())
        basics, have = self.observer.basics(obs) if obs.spec is not None else ([], None)
        held = basics + acted.held
        with metrics.pass_step(took, "views"):
            scalers, queue = self.observer.scaler_views(obs), self.queues.view(obs)
            pods = self.observer.pod_views(obs, scalers, queue)
        gang = self.gangs.view(obs, obs.spec) if obs.spec is not None else None
        held = [*held, gang.conflict] if gang is not None and gang.conflict else held
        if gang is not None and gang.deferred:  # this run's new workers join no gang
            obs.spec = replace(obs.spec, gang=None)
        inp = JobInput(
            name=name,
            namespace=namespace,
            generation=int(obs.job["metadata"].get("generation") or 0),
            spec=obs.spec,
            error=obs.error,
            status=obs.status,
            pods=pods,
            scalers=scalers,
            now=self.clock(),
            published=config.hosts_of((obs.configmap or {}).get("data")) if obs.configmap else None,
            problems=(*held, *acted.problems),
            hold=bool(basics or acted.held),
            basics=have or BasicsView(),
            squatted=tuple(acted.squatted),
            public_key=self.keys.public.get(jid),
            refusal_over=jid not in self._refused,
            queue=queue,
            gang=gang,
            launcher_said=self.observer.launcher_said(obs, scalers),
            saved=self.observer.saved.get(job_prefix(namespace, name), ""),
            services=tuple(s["metadata"]["name"] for s in obs.services),
        )
        return inp, basics

    def going_away(self, namespace: str, plan: Plan) -> Next | None:
        """Bad news (a lost worker or launcher, a failure) while the namespace is being deleted
        is only the namespace's deletion taking the pods first: say nothing, do nothing; once
        it is gone, the job's loop ends (a cache may still show the job). Asked only when a
        pass has a warning to tell, so it costs no request in steady state."""
        if not any(ev.type == "Warning" for ev in plan.events):
            return None
        state = self.kube.namespace_state(namespace)
        return GONE if state == "gone" else GOING if state == "terminating" else None

    def report_refused(self, obs: Observed, exc: ApiError) -> None:
        """A write the apiserver refused (RBAC, admission, quota, validation): said on the job
        once, as Blocked/APIRefused with the server's words, and retried after a while. The
        status write is preconditioned like a pass's: if the pass wrote the job before the
        refusal, it is read again once."""
        meta = obs.job["metadata"]
        log.warning(
            "Refused namespace=%s job=%s error=%s retry_in=%.0fs",
            meta["namespace"], meta["name"], exc, REFUSED.seconds,
        )  # fmt: skip
        message = f"the API server refused a write: {exc}"
        if exc.request:
            message = f"the API server refused {exc.request}: {exc}"
        job: dict[str, Any] | None = obs.job
        for _ in range(2):
            assert job is not None
            new = plan_refused(JobStatus.from_dict(job.get("status")), message, self.clock())
            if new is None:
                return
            try:
                self.executor.run(Pass(obs, None, Plan(new), job), JobStatusWrite(new))
                break
            except Conflict:
                job = self.kube.get(naming.JOB_KIND, meta["namespace"], meta["name"])
                if job is None:
                    return
        else:
            return
        refused = TellEvents((Event("Warning", "APIRefused", message),))
        self.executor.run(Pass(obs, None, Plan(new), job), refused)

    def act(self, obs: Observed, inp: JobInput, plan: Plan, took: dict[str, float]) -> None:
        """The pass's writes (planning/writes.py), in their one order, stage by stage: the
        basics, the statuses and the pass's events, then the children; the scripts, off the
        pass. Each write goes through the one executor."""
        spec = inp.spec
        queue = None
        if spec is not None and (spec.queue or obs.workloads):
            queue = Queueing(bool(spec.queue))
        writes = ordered(plan, spec is not None and not inp.hold, queue)
        p = Pass(obs, spec, plan, obs.job)
        p.scalers = {(s["kind"], s["metadata"]["name"]): s for s in obs.scalers}
        with metrics.pass_step(took, "basics"):
            for w in staged(writes, Stage.BASICS):
                self.executor.run(p, w)
            self._acted[job_id(inp.namespace, inp.name, obs.job["metadata"]["uid"])] = p.acted
        with metrics.pass_step(took, "writes"):
            for w in staged(writes, Stage.STATUSES):
                self.executor.run(p, w)
            for kind, result, secs in plan.settled_scalers:
                metrics.SCALES.labels(kind, result).inc()
                metrics.SCALE_SECONDS.labels(kind).observe(float(secs))
        if spec is None or inp.hold or p.acted.held:
            return  # no child before its basics: the next pass says what is in their way
        with metrics.pass_step(took, "children"):
            for w in staged(writes, Stage.CHILDREN):
                self.executor.run(p, w)
            self.scripts.run(obs, plan)

    def reconcile_orphan_scaler(self, kind: str, namespace: str, name: str) -> None:
        body = self.kube.get(kind, namespace, name)
        if body is None:
            return
        view = scaler_view(body, None)
        # Only a valid name is looked up: another (say "a/b") would ask the apiserver for a
        # subresource, and its refusal is not this scaler's answer (InvalidSpec is).
        job_name = view.spec.job if view.spec is not None else ""
        job = self.kube.get(naming.JOB_KIND, namespace, job_name) if job_name else None
        new, event = plan_orphan_scaler(view, job is not None, self.clock())
        if new is not None:
            told = (event.type, event.reason, event.message) if event is not None else None
            self.executor.alone(OrphanScalerStatus(body, new, told))


def next_after(plan: Plan, quiet: bool, making_access: bool) -> Next:
    """When the next pass is wanted. A Blocked condition follows the world one pass later:
    once nothing blocks (`quiet`), come back soon to say so."""
    blocked = st.condition(plan.status.conditions or [], "Blocked") or {}
    if blocked.get("status") == "True" and quiet:
        return BLOCKED_CLEARING if plan.requeue > BLOCKED_CLEARING.seconds else plan_next(plan)
    if making_access and plan.requeue > ACCESS_CHECK.seconds:
        return ACCESS_CHECK
    return plan_next(plan)
