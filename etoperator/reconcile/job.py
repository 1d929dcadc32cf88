"""Level-based reconcile of one TrainingJob and its scalers: observe -> plan -> act -> status.

Order of writes, chosen so that a crash or a 409 between any two of them is harmless:
  1. scaler statuses: a scaler's plan (addPods/toDeletePods) is frozen before any pod moves;
  2. the job status, with its resourceVersion as precondition: it points `currentScaler` at
     the frozen plan and records membership before pods are created;
  3. the spec replicas that status accepted (shown as the job's target; `replicasBefore` in the
     status tells the operator's pending write from a `kubectl scale`);
  4. children: ConfigMap host list first (so victims leave Horovod before they are deleted),
     then pods and services.
Every pass starts again from what is observed, so a pass cut short is finished by the next.
"""

from __future__ import annotations

import base64
import concurrent.futures
import copy
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import paramiko

from etoperator import metrics, naming
from etoperator import status as st
from etoperator.api.models import (
    DEFAULT_MAX_WORKERS,
    InvalidSpec,
    JobSpec,
    ScalerSpec,
    parse_job,
    parse_scaler,
)
from etoperator.builders import config, pods, rbac, scalers, ssh
from etoperator.builders.common import Owner, is_controlled_by
from etoperator.cache import Observed
from etoperator.clock import iso, utcnow
from etoperator.kube import AlreadyExists, ApiError, Conflict, Kube
from etoperator.planning import JobInput, Plan, PodView, ScalerView, plan_job, plan_orphan_scaler
from etoperator.sshcheck import SSHProber, SSHUnavailable, busy_script, load_key

log = logging.getLogger(__name__)

SCALER_KINDS = (naming.SCALEOUT_KIND, naming.SCALEIN_KIND)
REFUSED_RETRY = 10.0  # seconds between tries of a write the apiserver refused
USER_SECRET_RECHECK = 900.0  # seconds
STALE_RETRY = 0.05  # the cache is behind our own write: its watch event is on its way


def _job_key(namespace: str, name: str, uid: str) -> str:
    """What the reconciler's memory of a job is filed under (a new job of the name is another)."""
    return f"{namespace}/{name}/{uid}"


def _ref(body: dict[str, Any]) -> tuple[str, str, str]:
    meta = body["metadata"]
    return (str(body.get("kind")), meta.get("namespace", ""), meta["name"])


def refused(exc: ApiError) -> bool:
    """A refusal that retrying at once will not change (not a 404, conflict or throttle)."""
    return 400 <= exc.status < 500 and exc.status not in (404, 409, 429)


def _container_exit(pod: dict[str, Any]) -> tuple[int | None, str]:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            return term.get("exitCode"), str(term.get("reason") or "")
    return None, ""


def _leaving(pod: dict[str, Any], tainted_nodes: set[str]) -> str:
    """Why this pod is about to be taken away, or '' when nothing says so."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return f"DisruptionTarget: {cond.get('reason') or 'disruption'}"
    node = (pod.get("spec") or {}).get("nodeName")
    if node and node in tainted_nodes:
        return f"node {node} is tainted for termination"
    return ""


@dataclass
class JobReconciler:
    kube: Kube
    prober: SSHProber = field(default_factory=SSHProber)
    clock: Callable[[], datetime] = utcnow
    ssh_checks: bool = True  # off: a Running worker counts as ready (no network path to pods)
    tainted_nodes: Callable[[], set[str]] = set
    max_workers: int = DEFAULT_MAX_WORKERS
    _keys: dict[str, paramiko.PKey] = field(default_factory=dict)
    _key_texts: dict[str, str] = field(default_factory=dict)  # to recreate a deleted Secret
    _basics_checked: dict[str, datetime] = field(default_factory=dict)
    _act_problems: dict[str, list[str]] = field(default_factory=dict)  # children in the way
    _public: dict[str, str] = field(default_factory=dict)  # the job's trusted public key
    _squatted: dict[str, list[str]] = field(default_factory=dict)  # worker names others hold
    _refused: set[str] = field(default_factory=set)  # jobs whose last pass had a write refused
    _pool: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(16, "etoperator-ssh")
    )
    script_pool: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(8, "etoperator-script")
    )
    _scripts: dict[str, concurrent.futures.Future[None]] = field(default_factory=dict)
    _superseded: dict[tuple[str, str, str], set[str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- observe -------------------------------------------------------------------------

    def parse(self, obs: Observed) -> Observed:
        try:
            obs.spec, obs.error = parse_job(obs.job, self.max_workers), None
        except InvalidSpec as exc:
            obs.spec, obs.error = None, str(exc)
        return obs

    def stale(self, obs: Observed) -> bool:
        """The cache still shows an object as it was before one of our writes: wait for the
        watch to bring the write (acting on it would only meet a 409)."""
        stale = False
        for body in (obs.job, *obs.scalers):
            old = self._superseded.get(_ref(body))
            if old is None:
                continue
            if body["metadata"].get("resourceVersion") in old:
                stale = True
            else:
                self._superseded.pop(_ref(body))  # the cache has caught up
        return stale

    def wrote(self, before: dict[str, Any]) -> None:
        """`before` was replaced by a write of ours: until the cache moves past it (and any
        version between our writes), it is stale."""
        old = self._superseded.setdefault(_ref(before), set())
        old.add(before["metadata"]["resourceVersion"])

    def _key(self, obs: Observed, job: JobSpec, secret_name: str) -> paramiko.PKey | None:
        cache_key = f"{_job_key(job.namespace, job.name, job.uid)}/{secret_name}"
        if cache_key not in self._keys:
            secret = self._user_secret(job) if job.ssh_secret else obs.secret
            raw = ((secret or {}).get("data") or {}).get(ssh.PRIVATE_KEY)
            if not raw:
                return None
            try:
                text = base64.b64decode(raw).decode()
                self._keys[cache_key] = load_key(text)
                self._key_texts[cache_key] = text
            except (SSHUnavailable, ValueError):
                return None
        return self._keys[cache_key]

    def pod_views(self, obs: Observed) -> list[PodView]:
        """Pods as the planner sees them, with SSH readiness and drain checks filled in."""
        assert obs.spec is not None or obs.error
        job = obs.job
        name = job["metadata"]["name"]
        status = job.get("status") or {}
        hosts = set(status.get("currentWorkers") or [])
        published = set(config.hosts_of((obs.configmap or {}).get("data")))
        victims: set[str] = set()
        ref = naming.parse_scaler_ref(str(status.get("currentScaler") or ""))
        if ref and ref[0] == naming.SCALEIN_KIND:
            for s in obs.scalers:
                if s["kind"] == ref[0] and s["metadata"]["name"] == ref[2]:
                    victims = set((s.get("status") or {}).get("toDeletePods") or [])
        tainted = self.tainted_nodes()
        key = None
        if obs.spec is not None and self.ssh_checks:
            key = self._key(obs, obs.spec, obs.spec.ssh_secret or naming.secret_name(name))
        leaving = {
            p["metadata"]["name"]: _leaving(p, tainted)
            for p in obs.pods
            if p["metadata"]["labels"].get(naming.LABEL_ROLE) == naming.ROLE_WORKER
        }
        probes: dict[str, concurrent.futures.Future[bool | None]] = {}
        for p in obs.pods:
            pname = p["metadata"]["name"]
            ip = (p.get("status") or {}).get("podIP")
            running = (p.get("status") or {}).get("phase") == "Running"
            if pname not in leaving or not running or p["metadata"].get("deletionTimestamp"):
                continue
            if pname in victims or leaving[pname]:
                # Draining: once Horovod can no longer see it, ask whether it has left it.
                if pname not in published:
                    probes[pname] = self._pool.submit(self.horovod_on, obs.spec, pname, ip, key)
            elif pname not in hosts and key is not None and ip:
                probes[pname] = self._pool.submit(self.prober.ready, ip, key)
        views = []
        for p in obs.pods:
            meta, pst = p["metadata"], p.get("status") or {}
            labels = meta.get("labels") or {}
            role = labels.get(naming.LABEL_ROLE, "")
            pname = meta["name"]
            phase = pst.get("phase") or "Pending"
            code, term_reason = _container_exit(p)
            running = phase == "Running" and not meta.get("deletionTimestamp")
            draining = pname in victims or bool(leaving.get(pname))
            busy = probes[pname].result() if draining and pname in probes else None
            if role != naming.ROLE_WORKER or not self.ssh_checks or pname in hosts:
                ready = running and not draining
            else:  # a new worker: ready once its sshd accepts the job's key
                ready = (
                    running and not draining and bool(pname in probes and probes[pname].result())
                )
            run = meta.get("annotations", {}).get(naming.ANN_RUN)
            views.append(
                PodView(
                    name=pname,
                    role=role,
                    index=naming.worker_index(name, pname) if role == naming.ROLE_WORKER else None,
                    phase=phase,
                    deleting=bool(meta.get("deletionTimestamp")),
                    ready=ready,
                    exit_code=code,
                    reason=str(pst.get("reason") or term_reason),
                    run=int(run) if run is not None and str(run).isdigit() else None,
                    leaving=leaving.get(pname, ""),
                    busy=busy,
                )
            )
        return views

    def horovod_on(
        self, spec: JobSpec | None, pod: str, ip: str | None, key: paramiko.PKey | None
    ) -> bool | None:
        """Does a Horovod process still run on `pod`? Over SSH, or through pods/exec when the
        operator has no network path to pods; None when it cannot tell."""
        if key is not None and ip:
            return self.prober.horovod_running(ip, key, pod)
        if self.ssh_checks or spec is None:
            return None
        code, out = self.kube.exec_in_pod(spec.namespace, pod, ["sh", "-c", busy_script(pod)], 10)
        return out.strip() == "busy" if code == 0 else None

    @staticmethod
    def scaler_views(obs: Observed) -> list[ScalerView]:
        return [scaler_view(s, obs.job["metadata"]["uid"]) for s in obs.scalers]

    # -- the pass ------------------------------------------------------------------------

    def reconcile(self, obs: Observed) -> float:
        """One pass over what was observed; the seconds until the next one is wanted."""
        metrics.RECONCILES.inc()
        with metrics.RECONCILE_SECONDS.time():
            if self.stale(self.parse(obs)):
                return STALE_RETRY
            try:
                return self.reconcile_observed(obs)
            except ApiError as exc:
                if not refused(exc):
                    raise
                self.report_refused(obs, exc)
                return REFUSED_RETRY

    def reconcile_observed(self, obs: Observed) -> float:
        """observe (done) -> plan -> act; the seconds until the next pass."""
        job = obs.job
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        key = _job_key(namespace, name, job["metadata"]["uid"])
        basics = self.ensure_basics(obs) if obs.spec is not None else []
        inp = JobInput(
            name=name,
            namespace=namespace,
            generation=int(job["metadata"].get("generation") or 0),
            spec=obs.spec,
            error=obs.error,
            status=copy.deepcopy(job.get("status") or {}),
            pods=self.pod_views(obs),
            scalers=self.scaler_views(obs),
            now=self.clock(),
            published=config.hosts_of((obs.configmap or {}).get("data")) if obs.configmap else None,
            problems=(*basics, *self._act_problems.get(key, [])),
            hold=bool(basics),
            squatted=tuple(self._squatted.get(key, [])),
            public_key=self._public.get(key),
            refusal_over=key not in self._refused,
        )
        plan = plan_job(inp)
        try:
            self.act(obs, inp, plan)
        except Conflict as exc:
            log.info("Conflict namespace=%s job=%s error=%s (pass repeated)", namespace, name, exc)
            return 0.2
        except ApiError as exc:
            if refused(exc):
                self._refused.add(key)
            raise
        self._refused.discard(key)
        # Blocked conditions follow the world one pass later: come back soon to say so.
        blocked = st.condition(plan.status.get("conditions") or [], "Blocked") or {}
        if blocked.get("status") == "True" and not basics and not self._act_problems.get(key):
            return min(plan.requeue, 0.5)
        return plan.requeue

    def ensure_basics(self, obs: Observed) -> list[str]:
        """Secret, ConfigMap and the launcher's RBAC (as the watches show them, so this costs
        no request unless something is missing); what stands in their way, if anything."""
        spec = obs.spec
        assert spec is not None
        if (obs.job.get("status") or {}).get("phase") in st.TERMINAL:
            return []
        owner = Owner(naming.JOB_KIND, spec.name, spec.uid)
        problems = self.check_user_secret(spec) if spec.ssh_secret else []
        if not spec.ssh_secret and obs.secret is None:
            problems += self.repair_secret(obs, owner)
        elif obs.secret is not None:
            self._public[_job_key(spec.namespace, spec.name, spec.uid)] = ssh.public_key(obs.secret)
        if obs.configmap is None:
            problems += self.repair_config_map(obs, owner)
        for obj in rbac.launcher_rbac(spec, owner):
            if (obj["kind"], obj["metadata"]["name"]) not in obs.present:
                problems += self.ensure(obs, obj)
        return problems

    def check_user_secret(self, spec: JobSpec) -> list[str]:
        """The Secret the annotation names: not the job's own, so not watched; read again at
        most every few minutes (and whenever it was found wanting)."""
        key = _job_key(spec.namespace, spec.name, spec.uid)
        checked = self._basics_checked.get(key)
        if checked and (self.clock() - checked).total_seconds() < USER_SECRET_RECHECK:
            return []
        secret, name = self._user_secret(spec), spec.ssh_secret
        problems = []
        if secret is None:
            problems.append(f"SSH Secret {name} named by the annotation is missing")
        elif ssh.missing_keys(secret):
            problems.append(f"SSH Secret {name} lacks {', '.join(ssh.missing_keys(secret))}")
        elif other := ssh.other_job(secret, spec.uid):
            problems.append(
                f"SSH Secret {name} belongs to TrainingJob {other}: a job may only name a "
                "Secret of its own (its key opens that job's workers)"
            )
        if problems:
            self._basics_checked.pop(key, None)
        else:
            self._basics_checked[key] = self.clock()
        return problems

    def _user_secret(self, spec: JobSpec) -> dict[str, Any] | None:
        assert spec.ssh_secret is not None
        return self.kube.get("Secret", spec.namespace, spec.ssh_secret)

    def repair_secret(self, obs: Observed, owner: Owner) -> list[str]:
        """(Re)create the job's SSH Secret: with the key pair we still hold when it was deleted
        under a running job (its workers and launcher hold that key), else a fresh one."""
        spec = obs.spec
        assert spec is not None
        name = naming.secret_name(spec.name)
        comment = f"etoperator-{spec.name}"
        key = _job_key(spec.namespace, spec.name, spec.uid)
        kept = self._key_texts.get(f"{key}/{name}")
        keys = ssh.keypair_from_private(kept, comment) if kept else ssh.generate_keypair(comment)
        # Pods of the job still hold the old key until their volumes refresh: keep trusting it.
        old = (self._public.get(key) or (obs.job.get("status") or {}).get("sshPublicKey") or "",)
        secret = ssh.ssh_secret(spec.name, spec.namespace, owner, keys, old)
        made, problems = self.create(obs, secret)
        if made:
            self._public[key] = keys.public_openssh
        if made and (obs.job.get("status") or {}).get("currentWorkers"):
            how = (
                "with the job's key pair"
                if kept
                else "with a new key pair; pods still holding the old key are trusted too"
            )
            message = f"Secret {name} was missing; recreated {how}"
            self.kube.event(obs.job, "Warning", "ChildRepaired", message, self.clock())
        return problems

    def forget(self, namespace: str, job: str) -> None:
        """The job is gone: drop all memory of it (keys, checks, problems)."""
        prefix = f"{namespace}/{job}/"
        caches = (self._keys, self._key_texts, self._basics_checked, self._act_problems)
        for cache in (*caches, self._squatted, self._public):
            for k in [k for k in cache if k.startswith(prefix)]:
                cache.pop(k)
        self._refused = {k for k in self._refused if not k.startswith(prefix)}

    def child_changed(self, namespace: str, job: str, kind: str, deleted: bool) -> None:
        """Someone else changed or deleted a child: look at the basics again on the next pass;
        a changed Secret's key replaces the one we hold (a deleted one's is kept to recreate)."""
        prefix = f"{namespace}/{job}/"
        for k in [k for k in self._basics_checked if k.startswith(prefix)]:
            self._basics_checked.pop(k)
        if kind == "Secret" and not deleted:
            for cache in (self._keys, self._key_texts):
                for k in [k for k in cache if k.endswith(f"/{naming.secret_name(job)}")]:
                    cache.pop(k)

    def repair_config_map(self, obs: Observed, owner: Owner) -> list[str]:
        """(Re)create the ConfigMap with the host list the job has now: one that is deleted
        under a running job comes back with it, never empty (Horovod would drop every host)."""
        spec = obs.spec
        assert spec is not None
        hosts = list((obs.job.get("status") or {}).get("currentWorkers") or [])
        cm = config.config_map(spec.name, spec.namespace, owner, hosts, spec.slots_per_worker)
        made, problems = self.create(obs, cm)
        if made and hosts:
            message = f"ConfigMap {cm['metadata']['name']} was missing; recreated with hosts " + (
                ", ".join(hosts)
            )
            self.kube.event(obs.job, "Warning", "ChildRepaired", message, self.clock())
        return problems

    def ensure(self, obs: Observed, obj: dict[str, Any]) -> list[str]:
        """Create `obj`; a same-named object this job does not control is a problem, not ours.
        A refusal by the apiserver propagates: the pass reports it as Blocked/APIRefused."""
        return self.create(obs, obj)[1]

    def create(self, obs: Observed, obj: dict[str, Any]) -> tuple[bool, list[str]]:
        """(made now, problems): not made when it existed already (ours, or in the way)."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        try:
            self.kube.create(obj)
            log.info("Created %s namespace=%s name=%s", kind, obj["metadata"]["namespace"], name)
            return True, []
        except AlreadyExists:
            existing = self.kube.get(kind, obj["metadata"]["namespace"], name)
            if existing is None or is_controlled_by(existing, obs.job["metadata"]["uid"]):
                return False, []
            return False, [f"{kind} {name} exists and is not owned by this job; not touching it"]

    def report_refused(self, obs: Observed, exc: ApiError) -> None:
        """A write the apiserver refused (RBAC, admission, quota, validation): said on the job
        once, as Blocked/APIRefused with the server's words, and retried after a while."""
        log.warning(
            "Refused namespace=%s job=%s error=%s retry_in=%.0fs",
            obs.job["metadata"]["namespace"], obs.job["metadata"]["name"], exc, REFUSED_RETRY,
        )  # fmt: skip
        message = f"the API server refused a write: {exc}"
        if exc.request:
            message = f"the API server refused {exc.request}: {exc}"
        if self._set_blocked(obs, "True", "APIRefused", message):
            self.kube.event(obs.job, "Warning", "APIRefused", message, self.clock())

    def _set_blocked(self, obs: Observed, status: str, reason: str, message: str) -> bool:
        conds = (obs.job.get("status") or {}).get("conditions") or []
        new, changed = st.set_condition(conds, "Blocked", status, reason, message, self.now())
        if changed:
            meta = obs.job["metadata"]
            self.kube.patch(
                naming.JOB_KIND, meta["namespace"], meta["name"], {"status": {"conditions": new}},
                sub="status",
            )  # fmt: skip
            obs.job.setdefault("status", {})["conditions"] = new
        return changed

    def now(self) -> str:
        return iso(self.clock())

    # -- act -----------------------------------------------------------------------------

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
            self.wrote(body)
        else:
            log.debug("No-op write kind=%s name=%s", body["kind"], meta["name"])
        return new

    def act(self, obs: Observed, inp: JobInput, plan: Plan) -> None:
        job = obs.job
        by_key = {(s["kind"], s["metadata"]["name"]): s for s in obs.scalers}
        # 0. scalers get a controller reference to their job (so they go with it).
        owner = Owner(naming.JOB_KIND, inp.name, job["metadata"]["uid"])
        for key in plan.adopt_scalers:
            refs = by_key[key]["metadata"].get("ownerReferences") or []
            others = [r for r in refs if not r.get("controller")]
            by_key[key] = self.write(
                by_key[key], {"metadata": {"ownerReferences": [*others, owner.reference()]}}
            )
        # 1. scaler statuses (frozen plans first).
        for key, new in plan.scaler_status.items():
            old = by_key[key].get("status") or {}
            self.write(by_key[key], {"status": _merge_patch(old, new)}, sub="status")
        for kind, result, secs in plan.settled_scalers:
            metrics.SCALES.labels(kind, result).inc()
            metrics.SCALE_SECONDS.labels(kind).observe(float(secs))
        # 2. job status, then 3. the spec replicas it has accepted (replicasBefore marks them
        # as ours until they land, so a crash between the two is never read as `kubectl scale`).
        old_status = job.get("status") or {}
        latest = job
        if plan.status != old_status:
            status = _merge_patch(old_status, plan.status)
            latest = self.write(job, {"status": status}, sub="status")
        if plan.spec_replicas is not None:
            replicas = {"worker": {"replicas": plan.spec_replicas}}
            self.write({**latest, "kind": naming.JOB_KIND}, {"spec": {"etReplicaSpecs": replicas}})
        ns, name = inp.namespace, inp.name
        for ev in plan.events:
            log.info("%s namespace=%s job=%s message=%r", ev.reason, ns, name, ev.message)
            self.kube.event(job, ev.type, ev.reason, ev.message, self.clock())
            if ev.reason == "WorkerLost":
                metrics.WORKERS_LOST.inc()
            elif ev.reason == "WorkerReplaced":
                metrics.WORKERS_REPLACED.inc()
        for key, events in plan.scaler_events.items():
            for ev in events:
                self.kube.event(by_key[key], ev.type, ev.reason, ev.message, self.clock())
        if inp.spec is None or inp.hold:
            return
        self.act_children(obs, inp.spec, plan)

    def act_children(self, obs: Observed, spec: JobSpec, plan: Plan) -> None:
        ns, name = spec.namespace, spec.name
        owner = Owner(naming.JOB_KIND, name, spec.uid)
        # 4. host list before any pod is deleted.
        if plan.hosts is not None and obs.configmap is not None:
            data = config.config_data(name, ns, plan.hosts, spec.slots_per_worker)
            if (obs.configmap.get("data") or {}) != data:
                self.kube.patch("ConfigMap", ns, naming.config_map_name(name), {"data": data})
                metrics.HOST_UPDATES.inc()
                log.info(
                    "Updated host list namespace=%s job=%s hosts=%s", ns, name, ",".join(plan.hosts)
                )
        by_name = {p["metadata"]["name"]: p for p in obs.pods}
        for pod_name in plan.delete_pods:
            pod = by_name.get(pod_name)
            if self.kube.delete("Pod", ns, pod_name, (pod or {}).get("metadata", {}).get("uid")):
                log.info("Deleted Pod namespace=%s name=%s", ns, pod_name)
        secret = spec.ssh_secret or naming.secret_name(name)
        # Only pod builders need it, and for a user's Secret it costs a GET: ask when building.
        keys = (
            self._secret_keys(spec, secret)
            if plan.create_workers or plan.create_launcher
            else ssh.OWN_KEYS
        )
        problems: list[str] = []
        existing_services = {s["metadata"]["name"]: s for s in obs.services}
        for svc_name in plan.services:
            if svc_name not in existing_services:
                windex = naming.worker_index(name, svc_name)
                if windex is not None:
                    problems += self.ensure(obs, pods.worker_service(spec, owner, windex))
        for svc_name, svc in existing_services.items():
            if svc_name not in plan.services:
                self.kube.delete("Service", ns, svc_name, svc["metadata"].get("uid"))
        squatted = []
        for index in plan.create_workers:
            found = self.ensure(obs, pods.worker_pod(spec, owner, index, secret, keys))
            squatted += [naming.worker_name(name, index)] if found else []
            problems += found
        if plan.create_launcher:
            launcher = pods.launcher_pod(
                spec, owner, secret, keys, int(plan.status.get("restartCount", 0))
            )
            problems += self.ensure(obs, launcher)
        for wanted in plan.create_scalers:
            problems += self.make_replicas_scaler(obs, spec, owner, wanted)
        # Said on the job by the next pass (one status write per pass).
        key = _job_key(spec.namespace, spec.name, spec.uid)
        self._act_problems[key] = problems
        self._squatted[key] = squatted
        self.run_scripts(obs, plan)

    def make_replicas_scaler(
        self, obs: Observed, spec: JobSpec, owner: Owner, wanted: dict[str, Any]
    ) -> list[str]:
        body = scalers.replicas_scaler(spec.namespace, owner, wanted)
        try:
            self.kube.create(body)
        except AlreadyExists:
            existing = self.kube.get(wanted["kind"], spec.namespace, wanted["name"])
            if existing is None or scalers.is_replicas_scaler(
                existing, spec.uid, wanted["generation"]
            ):
                return []
            return [
                f"{wanted['kind']} {wanted['name']} exists and was not made by the operator; "
                f"`kubectl scale` to {spec.worker.replicas} waits until it is renamed or deleted"
            ]
        message = (
            f"replicas set to {spec.worker.replicas}: created {wanted['kind']} {wanted['name']}"
        )
        self.kube.event(obs.job, "Normal", "ReplicasChanged", message, self.clock())
        return []

    def run_scripts(self, obs: Observed, plan: Plan) -> None:
        """Scaler scripts, on the launcher, off the reconcile path: the job keeps being looked
        after while one runs, and its scaler waits for the ScriptExecuted condition."""
        meta = obs.job["metadata"]
        for key, argv, timeout in plan.run_scripts:
            run = f"{_job_key(meta['namespace'], meta['name'], meta['uid'])}/{key[0]}/{key[1]}"
            with self._lock:
                if run in self._scripts:
                    continue  # still running from an earlier pass
                self._scripts[run] = self.script_pool.submit(
                    self.run_script, meta["namespace"], meta["name"], key, argv, timeout, run
                )

    def run_script(
        self, ns: str, job: str, key: tuple[str, str], argv: list[str], timeout: int, run: str
    ) -> None:
        """The outcome becomes the scaler's ScriptExecuted condition; writing it wakes the job."""
        try:
            code, output = self.kube.exec_in_pod(ns, naming.launcher_name(job), argv, timeout + 5)
            log.info("Scaler script ran namespace=%s scaler=%s exit_code=%s", ns, key[1], code)
            log.debug(
                "Scaler script output namespace=%s scaler=%s output=%r", ns, key[1], output[-2000:]
            )
            scaler = self.kube.get(key[0], ns, key[1])
            if scaler is not None:
                self.report_script(scaler, code, naming.launcher_name(job))
        except Exception:  # a lost launcher or a refused write: the next pass asks again
            log.exception("Scaler script failed to run namespace=%s scaler=%s", ns, key[1])
        finally:
            with self._lock:
                self._scripts.pop(run, None)

    def report_script(self, scaler: dict[str, Any], code: int | None, launcher: str) -> None:
        ok = code == 0
        msg = f"script exited {code} on {launcher}"
        meta = scaler["metadata"]
        conds, _ = st.set_condition(
            (scaler.get("status") or {}).get("conditions") or [],
            "ScriptExecuted",
            "True" if ok else "False",
            "ScriptSucceeded" if ok else "ScriptFailed",
            msg,
            self.now(),
        )
        self.kube.patch(
            scaler["kind"], meta["namespace"], meta["name"], {"status": {"conditions": conds}},
            sub="status",
        )  # fmt: skip
        reason = "ScriptSucceeded" if ok else "ScriptFailed"
        self.kube.event(scaler, "Normal" if ok else "Warning", reason, msg, self.clock())

    def _secret_keys(self, spec: JobSpec, secret_name: str) -> frozenset[str]:
        if not spec.ssh_secret:
            return ssh.OWN_KEYS
        return frozenset((self._user_secret(spec) or {}).get("data") or {})

    # -- scalers without a job -----------------------------------------------------------

    def reconcile_orphan_scaler(self, kind: str, namespace: str, name: str) -> None:
        body = self.kube.get(kind, namespace, name)
        if body is None:
            return
        job_name = ((body.get("spec") or {}).get("selector") or {}).get("name")
        job = self.kube.get(naming.JOB_KIND, namespace, job_name) if job_name else None
        view = scaler_view(body, None)
        new, event = plan_orphan_scaler(view, job is not None, self.clock())
        if new is None:
            return
        self.kube.patch(
            kind,
            namespace,
            name,
            {
                "metadata": {"resourceVersion": body["metadata"]["resourceVersion"]},
                "status": _merge_patch(view.status, new),
            },
            sub="status",
        )
        if event is not None:
            self.kube.event(body, event.type, event.reason, event.message, self.clock())


def scaler_view(body: dict[str, Any], job_uid: str | None) -> ScalerView:
    """A scaler as the planner sees it; `owned` is control by that job (any job when None)."""
    try:
        spec: ScalerSpec | None = parse_scaler(body["kind"], body)
        error = None
    except InvalidSpec as exc:
        spec, error = None, str(exc)
    refs = body["metadata"].get("ownerReferences") or []
    made = (body["metadata"].get("annotations") or {}).get(naming.ANN_SCALE_GENERATION, "")
    return ScalerView(
        kind=body["kind"],
        name=body["metadata"]["name"],
        created=body["metadata"].get("creationTimestamp", ""),
        spec=spec,
        error=error,
        status=copy.deepcopy(body.get("status") or {}),
        owned=is_controlled_by(body, job_uid)
        if job_uid
        else any(r.get("controller") for r in refs),
        made_for=int(made) if made.isdigit() else None,
    )


def _merge_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch turning `old` into `new` (removed keys become null)."""
    patch: dict[str, Any] = {k: v for k, v in new.items() if old.get(k) != v}
    for k in old:
        if k not in new:
            patch[k] = None
    return patch
