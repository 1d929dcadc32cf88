"""Observe: pods and scalers as the planner sees them, with SSH readiness and drain checks."""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import paramiko

from etoperator import naming
from etoperator import status as st
from etoperator.api.fields import DEFAULT_MAX_WORKERS, InvalidSpec
from etoperator.api.models import JobSpec, parse_job
from etoperator.api.scalers import ScalerSpec, parse_scaler
from etoperator.api.statuses import JobStatus, scaler_status
from etoperator.builders import config, rbac, runtimes, ssh
from etoperator.builders.common import is_controlled_by, job_owner
from etoperator.cache import Observed
from etoperator.clock import utcnow
from etoperator.kube import Kube
from etoperator.planning import PodView, ScalerView, surplus
from etoperator.planning.scaling import overdue
from etoperator.planning.views import BasicsView, QueueView
from etoperator.reconcile.launcherlog import said_saved, words_about
from etoperator.reconcile.podviews import classify
from etoperator.reconcile.secretchecks import SecretChecks
from etoperator.reconcile.state import AccessMakings, Keys, Writes, job_id, job_prefix
from etoperator.sshcheck import (
    HorovodOn,
    SSHProber,
    SSHUnavailable,
    busy_script,
    horovod_state,
    load_key,
)

log = logging.getLogger(__name__)


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
        status=scaler_status(body["kind"], body.get("status")),
        owned=is_controlled_by(body, job_uid)
        if job_uid
        else any(r.get("controller") for r in refs),
        made_for=int(made) if made.isdigit() else None,
    )


LOG_EVERY = 5.0  # seconds between reads of a launcher's log while a ScaleOut waits on Horovod


def borrowed_identity(spec: JobSpec, own_account: str) -> str | None:
    """Pure: a template that runs its pod as the operator's own ServiceAccount (its token lists
    every Secret of the cluster) is refused, naming the field."""
    for role, tmpl in (("launcher", spec.launcher.template), ("worker", spec.worker.template)):
        account = (tmpl.get("spec") or {}).get("serviceAccountName")
        if account and f"{spec.namespace}/{account}" == own_account:
            return (
                f"spec.etReplicaSpecs.{role}.template.spec.serviceAccountName names "
                f"{account}, the operator's own ServiceAccount: a pod it makes never runs "
                "with the operator's identity"
            )
    return None


def running_scale(status: JobStatus, scalers: list[ScalerView]) -> tuple[str, list[str]]:
    """The running scaler's kind and the pods it adds or removes (("", []) when none runs)."""
    ref = naming.parse_scaler_ref(status.current_scaler or "")
    if not ref:
        return "", []
    for s in scalers:
        if s.kind_name == (ref[0], ref[2]):
            return s.kind, s.planned
    return "", []


def probes_wanted(
    views: list[PodView],
    hosts: set[str],
    published: set[str],
    scale: tuple[str, list[str]],
    can_probe: bool,
) -> dict[str, str]:
    """Pure: which running workers to ask what.
    - "drain": a leaving one (a ScaleIn victim, or noticed for preemption) once Horovod can no
      longer see it: has Horovod left it?
    - "ready": a new one (not yet a host): does its sshd take the job's key, and does its name
      resolve to it?
    - "horovod": a ScaleOut's workers once published, and the first host that was there before
      them: does Horovod run here, and to whom is it connected? Over SSH only: through
      pods/exec (no network path to pods) every pass of a joining scale would pay an exec
      per worker; there the scale succeeds once published, as before."""
    kind, pods = scale
    victims = set(pods) if kind == naming.SCALEIN_KIND else set()
    joining = set(pods) & published if kind == naming.SCALEOUT_KIND and can_probe else set()
    wanted = {}
    for v in views:
        if v.role != naming.ROLE_WORKER or v.phase != "Running" or v.deleting:
            continue
        if v.name in victims or v.leaving:
            if v.name not in published:
                wanted[v.name] = "drain"
        elif v.name in joining:
            wanted[v.name] = "horovod"
        elif v.name not in hosts and can_probe:
            wanted[v.name] = "ready"
    if joining:
        running = {v.name for v in views if v.phase == "Running" and not v.deleting}
        before = sorted(published - joining - victims, key=lambda n: (len(n), n))
        for name in [n for n in before if n in running][:1]:
            wanted[name] = "horovod"
    return wanted


def settle(
    v: PodView,
    results: dict[str, HorovodOn | bool | None],
    hosts: set[str],
    victims: set[str],
    ssh: bool,
    hooked: bool = False,
) -> PodView:
    """Pure: readiness and Horovod's state from the probes' answers. `hooked`: a runtime
    whose leaving worker takes itself out (its preStop), so none is waited on here."""
    running = v.phase == "Running" and not v.deleting
    draining = v.name in victims or bool(v.leaving)
    answer = results.get(v.name)
    horovod = answer if isinstance(answer, HorovodOn) else None
    busy = horovod.busy if horovod is not None else (False if hooked else None)
    peers = horovod.peers if horovod is not None else None
    unknown = v.name in results and answer is None  # asked what Horovod does; no answer
    if v.role != naming.ROLE_WORKER or not ssh or v.name in hosts:
        ready = running and not draining
    else:  # a new worker: ready once its sshd accepts the job's key and its name resolves
        ready = running and not draining and answer is True
    return dataclasses.replace(v, ready=ready, busy=busy, peers=peers, horovod_unknown=unknown)


@dataclass
class Observer:
    """What a pass sees beyond the watch caches: the spec parsed, pods classified, and the SSH
    readiness and drain probes, run at once in `probe_pool`."""

    kube: Kube
    keys: Keys
    prober: SSHProber = field(default_factory=SSHProber)
    probe_pool: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(16, "etoperator-ssh")
    )
    ssh_checks: bool = True  # off: a Running worker counts as ready (no network path to pods)
    max_workers: int = DEFAULT_MAX_WORKERS
    tainted_nodes: Callable[[], set[str]] = set  # nodes announced to be taken away
    # Per job: each scaler's view by its uid, with the resourceVersion it was made from.
    _scaler_views: dict[str, dict[str, tuple[str | None, ScalerView]]] = field(default_factory=dict)
    # Per job: when its launcher's log was last read, and the lines it said of joining workers.
    _said: dict[str, tuple[float, tuple[str, ...]]] = field(default_factory=dict)
    now: Callable[[], float] = time.monotonic
    own_account: str = ""  # the operator's ServiceAccount, "<namespace>/<name>"
    wall: Callable[[], datetime] = utcnow
    saved: dict[str, str] = field(default_factory=dict)  # by job prefix: note_gone's
    secrets: SecretChecks | None = None  # the Secrets a job names that are not its own
    writes: Writes = field(default_factory=Writes)  # ours, the caches may not show yet
    makings: AccessMakings = field(default_factory=AccessMakings)  # Children's, read here

    def secret_problems(self, obs: Observed) -> list[str]:
        """What is wrong with the unwatched Secrets a live job names (read now and then)."""
        if obs.spec is None or obs.status.phase in st.TERMINAL or self.secrets is None:
            return []
        return self.secrets.problems(obs.spec)

    def basics(self, obs: Observed) -> tuple[list[str], BasicsView]:
        """What the job's pods need, as the watches show it, and what stands in its way: the
        Secrets it names found wanting, or what the last making of the launcher's access met."""
        spec = obs.spec
        assert spec is not None
        if obs.status.phase in st.TERMINAL:
            return [], BasicsView()
        problems = self.secret_problems(obs)
        jid = job_id(spec.namespace, spec.name, spec.uid)
        if obs.secret is not None:
            self.keys.public[jid] = ssh.public_key(obs.secret)
        wanted = rbac.launcher_rbac(spec, job_owner(spec))
        unseen = self.writes.unseen(obs)
        refs = [(o["kind"], o["metadata"]["name"]) for o in wanted]
        missing = tuple(r for r in refs if r not in obs.present and r not in unseen)
        met, ended = self.makings.met(jid, bool(missing))
        role = next(o for o in wanted if o["kind"] == "Role")
        view = BasicsView(
            secret=not runtimes.of(spec).ssh or bool(spec.ssh_secret) or obs.secret is not None,
            config_map=obs.configmap is not None,
            # A making that met something in the way is tried again at the job's next pass,
            # not in the pass that told of it (which came a second after: a making a second).
            access=() if self.makings.making(jid) or ended else missing,
            role_current=not obs.role or obs.role.get("rules") == role["rules"],
            launcher_ready=all(r in obs.present for r in refs),
        )
        return problems + met, view

    def parse(self, obs: Observed) -> Observed:
        """The job's spec (None and the error, when invalid), parsed once a pass."""
        try:
            obs.spec, obs.error = parse_job(obs.job, self.max_workers), None
            obs.error = borrowed_identity(obs.spec, self.own_account)
            obs.spec = None if obs.error else obs.spec
        except InvalidSpec as exc:
            obs.spec, obs.error = None, str(exc)
        return obs

    def _ssh_key(self, obs: Observed, spec: JobSpec, secret_name: str) -> paramiko.PKey | None:
        filed = f"{job_id(spec.namespace, spec.name, spec.uid)}/{secret_name}"
        if filed not in self.keys.parsed:
            secret = (
                self.kube.get("Secret", spec.namespace, secret_name)
                if spec.ssh_secret
                else obs.secret
            )
            raw = ((secret or {}).get("data") or {}).get(ssh.PRIVATE_KEY)
            if not raw:
                return None
            try:
                text = base64.b64decode(raw).decode()
                self.keys.parsed[filed] = load_key(text)
                self.keys.text[filed] = text
            except (SSHUnavailable, ValueError):
                return None
        return self.keys.parsed[filed]

    def pod_views(
        self, obs: Observed, scalers: list[ScalerView], queue: QueueView | None = None
    ) -> list[PodView]:
        """Pods as the planner sees them, with SSH readiness and drain checks filled in (a
        running scale's pods, of `scalers`, probed as it needs; workers whose quota Kueue
        took back, of `queue`, leave as victims do)."""
        assert obs.spec is not None or obs.error
        views = classify(obs.job["metadata"]["name"], obs.pods, self.tainted_nodes(), self.wall())
        views = surplus.reclaimed_views(views, queue, self.wall())
        scale = running_scale(obs.status, scalers)
        victims = set(scale[1]) if scale[0] == naming.SCALEIN_KIND else set()
        ssh_key = None
        probes = runtimes.of(obs.spec).probes
        if obs.spec is not None and self.ssh_checks and probes:
            secret = obs.spec.ssh_secret or naming.secret_name(obs.spec.name)
            ssh_key = self._ssh_key(obs, obs.spec, secret)
        hosts = set(obs.status.hosts)
        published = set(config.hosts_of((obs.configmap or {}).get("data")))
        wanted = probes_wanted(views, hosts, published, scale, ssh_key is not None)
        results = self.run_probes(obs.spec, wanted, {v.name: v.ip for v in views}, ssh_key)
        ssh = self.ssh_checks and probes
        return [settle(v, results, hosts, victims, ssh, not probes) for v in views]

    def run_probes(
        self,
        spec: JobSpec | None,
        wanted: dict[str, str],
        ips: dict[str, str],
        ssh_key: paramiko.PKey | None,
    ) -> dict[str, HorovodOn | bool | None]:
        """The SSH checks, in parallel: "ready" (sshd takes the key, the name resolves), or
        "drain"/"horovod" (what Horovod does there)."""
        futures: dict[str, concurrent.futures.Future[HorovodOn | bool | None]] = {}
        for name, what in wanted.items():
            ip = ips.get(name)
            if what in ("drain", "horovod"):
                futures[name] = self.probe_pool.submit(self.horovod_on, spec, name, ip, ssh_key)
            elif ssh_key is not None and ip:
                futures[name] = self.probe_pool.submit(self.prober.ready, ip, ssh_key, name)
        return {name: f.result() for name, f in futures.items()}

    def horovod_on(
        self, spec: JobSpec | None, pod: str, ip: str | None, ssh_key: paramiko.PKey | None
    ) -> HorovodOn | None:
        """What Horovod does on `pod`: over SSH, or through pods/exec when the operator has no
        network path to pods; None when it cannot tell."""
        if ssh_key is not None and ip:
            return self.prober.horovod(ip, ssh_key, pod)
        if self.ssh_checks or spec is None:
            return None
        code, out = self.kube.exec_in_pod(spec.namespace, pod, ["sh", "-c", busy_script(pod)], 10)
        return horovod_state(out) if code == 0 else None

    def scaler_views(self, obs: Observed) -> list[ScalerView]:
        """The job's scalers as the planner sees them, each parsed again only once it changed:
        finished ones stay, and a job scaled often gathers hundreds, each parsed on every pass."""
        meta = obs.job["metadata"]
        jid = job_id(meta["namespace"], meta["name"], meta["uid"])
        known, fresh = self._scaler_views.get(jid, {}), {}
        for body in obs.scalers:
            smeta = body["metadata"]
            uid, version = smeta.get("uid") or smeta["name"], smeta.get("resourceVersion")
            hit = known.get(uid)
            view = hit[1] if hit and version and hit[0] == version else None
            fresh[uid] = (version, view or scaler_view(body, meta["uid"]))
        self._scaler_views[jid] = fresh
        return [view for _, view in fresh.values()]

    def note_gone(self, namespace: str, job: str, pod: dict[str, Any]) -> None:
        """A pod of the job went: the save its launcher reported, kept for the job's next pass
        (the kubelet removes a stopped pod moments after its last status)."""
        if said := said_saved(pod):
            self.saved[job_prefix(namespace, job)] = said

    def forget(self, prefix: str) -> None:
        self.saved.pop(prefix, None)
        for jid in [k for k in list(self._scaler_views) if k.startswith(prefix)]:
            self._scaler_views.pop(jid, None)
        for jid in [k for k in list(self._said) if k.startswith(prefix)]:
            self._said.pop(jid, None)
        if self.secrets is not None:
            self.secrets.forget(prefix)

    def launcher_said(self, obs: Observed, scalers: list[ScalerView]) -> tuple[str, ...]:
        """While a ScaleOut waits for Horovod to take its workers in, what the launcher's log
        says of them (an ssh that failed, a name, a timeout): the lines naming them, read at
        most every LOG_EVERY seconds (at every pass near its timeout, so that a rollback says
        the last of them); () otherwise."""
        meta = obs.job["metadata"]
        jid = job_id(meta["namespace"], meta["name"], meta["uid"])
        kind, pods = running_scale(obs.status, scalers)
        waiting = [
            s
            for s in scalers
            if s.planned == pods and "WaitingForHorovod" in str(s.status.conditions)
        ]
        if kind != naming.SCALEOUT_KIND or not waiting or not pods:
            self._said.pop(jid, None)
            return ()
        last = self._said.get(jid)
        due = any(overdue(s, self.wall(), -LOG_EVERY) for s in waiting)
        if last is not None and self.now() - last[0] < LOG_EVERY and not due:
            return last[1]
        text = self.kube.pod_log(meta["namespace"], naming.launcher_name(meta["name"]), 400)
        said = tuple(words_about(text, pods))
        self._said[jid] = (self.now(), said)
        return said

    def held_views(self) -> int:
        """How many scaler views are kept (for the memory they hold)."""
        return sum(len(views) for views in list(self._scaler_views.values()))
