"""Children: the Secret, ConfigMap and launcher RBAC a job needs, repaired when deleted; pods,
Services and scalers created as planned; objects of others in the way reported, never taken."""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from etoperator import metrics, naming
from etoperator.api import claims
from etoperator.api.models import JobSpec
from etoperator.builders import config, pods, rbac, runtimes, ssh, volumes
from etoperator.builders.common import ANYWHERE, Owner, is_controlled_by, job_owner
from etoperator.builders.workload import LAUNCHER_SET
from etoperator.cache import Observed
from etoperator.clock import utcnow
from etoperator.kube import AlreadyExists, Kube
from etoperator.planning import Plan
from etoperator.reconcile.state import (
    AccessMakings,
    Keys,
    Recorder,
    Writes,
    in_parallel,
    job_id,
)

log = logging.getLogger(__name__)
KILL_GRACE = 1  # seconds: a pod stopped at once (its drain is over by the operator's word)

# Made many at a time or off the pass: their caches may lag the job's.
UNSEEN_KINDS = ("Pod", "Service", "ServiceAccount", "Role", "RoleBinding")


@dataclass
class Acted:
    """What acting on a job's children met, said on the job by its next pass."""

    problems: list[str] = field(default_factory=list)  # objects of others in the way
    squatted: list[str] = field(default_factory=list)  # worker names others' pods hold
    held: list[str] = field(default_factory=list)  # in the way of the job's basics


@dataclass
class Children:
    """The objects a job owns: made, repaired, brought up to date; what is in the way told."""

    kube: Kube
    keys: Keys
    writes: Writes  # pods created (or found existing), until the cache shows them
    pool: concurrent.futures.ThreadPoolExecutor  # independent creates go at once
    access_pool: concurrent.futures.ThreadPoolExecutor  # launchers' access, made off the pass
    recorder: Recorder  # what acting met, told as the pass's own events are: off the pass
    clock: Callable[[], datetime] = utcnow
    makings: AccessMakings = field(default_factory=AccessMakings)  # the Observer reads them

    def forget(self, prefix: str) -> None:
        self.makings.forget(prefix)

    # -- the basics' writes (planning/writes.py), first in a pass ------------------------------

    def make_basics(self, obs: Observed, secret: bool, config_map: bool) -> list[str]:
        """The job's Secret and ConfigMap, those asked, made at once; what is in their way."""
        assert obs.spec is not None
        owner = job_owner(obs.spec)
        tasks: list[Callable[[], list[str]]] = []
        if secret:
            tasks.append(partial(self.repair_secret, obs, owner))
        if config_map:
            tasks.append(partial(self.repair_config_map, obs, owner))
        return [p for found in in_parallel(self.pool, tasks) for p in found]

    def make_launcher_access(self, obs: Observed, objects: tuple[tuple[str, str], ...]) -> None:
        """The launcher's account, Role and binding, made off the pass: only the launcher needs
        them (it waits for them: `access_ready`), and the apiserver makes a Role or binding
        slowly where a namespace holds many (it lists every binding there to rule out an
        escalation: 0.2 s each with 150 jobs, over 1 s at p99). What the making met, an object
        in the way or a refusal (raised), the job's next pass tells."""
        spec = obs.spec
        assert spec is not None
        jid = job_id(spec.namespace, spec.name, spec.uid)
        wanted = rbac.launcher_rbac(spec, job_owner(spec))
        missing = [o for o in wanted if (o["kind"], o["metadata"]["name"]) in objects]
        if missing:
            self.makings.start(
                jid, partial(self.access_pool.submit, self.make_access, obs, missing)
            )

    def update_launcher_role(self, obs: Observed) -> None:
        """A Role made by an older operator: grant what the current launcher script needs."""
        spec = obs.spec
        assert spec is not None and obs.role is not None
        wanted = rbac.launcher_rbac(spec, job_owner(spec))
        role = next(o for o in wanted if o["kind"] == "Role")
        meta = obs.role["metadata"]
        body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "rules": role["rules"]}
        self.kube.patch("Role", meta["namespace"], meta["name"], body)
        log.info("Updated Role namespace=%s name=%s", meta["namespace"], meta["name"])

    def make_access(self, obs: Observed, missing: list[dict[str, Any]]) -> list[str]:
        """In order: a binding is refused before the Role it binds exists."""
        return [p for obj in missing for p in self.create_child(obs, obj)]

    def repair_secret(self, obs: Observed, owner: Owner) -> list[str]:
        """(Re)create the job's SSH Secret: with the key pair we still hold when it was deleted
        under a running job (its workers and launcher hold that key), else a fresh one."""
        spec = obs.spec
        assert spec is not None
        name = naming.secret_name(spec.name)
        claimed = self.claimed(spec.namespace, name, spec.uid)
        if claimed:
            return claimed
        comment = f"etoperator-{spec.name}"
        jid = job_id(spec.namespace, spec.name, spec.uid)
        kept = self.keys.text.get(f"{jid}/{name}")
        keys = ssh.keypair_from_private(kept, comment) if kept else ssh.generate_keypair(comment)
        # Pods of the job still hold the old key until their volumes refresh: keep trusting it.
        status = obs.status
        old = (self.keys.public.get(jid) or status.ssh_public_key or "",)
        secret = ssh.ssh_secret(spec.name, spec.namespace, owner, keys, old)
        made, problems = self.create_or_find(obs, secret)
        if made:
            self.keys.public[jid] = keys.public_openssh
        if made and status.hosts:
            how = (
                "with the job's key pair"
                if kept
                else "with a new key pair; pods still holding the old key are trusted too"
            )
            message = f"Secret {name} was missing; recreated {how}"
            self.recorder.post(obs.job, "Warning", "ChildRepaired", message, self.clock())
        return problems

    def claimed(self, namespace: str, secret: str, uid: str) -> list[str]:
        """Another job that names this job's Secret-to-be would have its key mounted the
        moment it exists (the kubelet retries a missing Secret, `optional: true` too): checked
        as it is made, so no order of creation gets past it."""
        problems = []
        for other in self.kube.list(naming.JOB_KIND, namespace):
            at = claims.claims(other, secret) if other["metadata"].get("uid") != uid else None
            if at:
                problems.append(
                    f"TrainingJob {other['metadata']['name']} names Secret {secret} ({at}), "
                    "which would hold this job's private key: not made until it no longer does"
                )
        return problems

    def repair_config_map(self, obs: Observed, owner: Owner) -> list[str]:
        """(Re)create the ConfigMap with the host list the job has now: one that is deleted
        under a running job comes back with it, never empty (Horovod would drop every host)."""
        spec = obs.spec
        assert spec is not None
        hosts = obs.status.hosts
        data = runtimes.of(spec).config_data(spec, hosts)
        cm = config.config_map(spec.name, spec.namespace, owner, hosts, 1, data)
        made, problems = self.create_or_find(obs, cm)
        if made and hosts:
            message = f"ConfigMap {cm['metadata']['name']} was missing; recreated with hosts " + (
                ", ".join(hosts)
            )
            self.recorder.post(obs.job, "Warning", "ChildRepaired", message, self.clock())
        return problems

    def create_child(self, obs: Observed, obj: dict[str, Any]) -> list[str]:
        """Create `obj`; a same-named object this job does not control is a problem, not ours.
        A refusal by the apiserver propagates: the pass reports it as Blocked/APIRefused."""
        return self.create_or_find(obs, obj)[1]

    def create_or_find(self, obs: Observed, obj: dict[str, Any]) -> tuple[bool, list[str]]:
        """(made now, problems): not made when it existed already (ours, or in the way)."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        try:
            self.kube.create(obj)
            log.info("Created %s namespace=%s name=%s", kind, obj["metadata"]["namespace"], name)
            if kind in UNSEEN_KINDS:
                self.writes.made(obs.job, kind, name)
            return True, []
        except AlreadyExists:
            existing = self.kube.get(kind, obj["metadata"]["namespace"], name)
            if existing is None:
                return False, []
            if is_controlled_by(existing, obs.job["metadata"]["uid"]):
                if kind in UNSEEN_KINDS:  # ours and not in the cache yet: wait for it
                    self.writes.made(obs.job, kind, name)
                return False, []
            return False, [f"{kind} {name} exists and is not owned by this job; not touching it"]

    # -- the pass's child writes (planning/writes.py), each run by the reconciler in order ----

    def publish(self, obs: Observed, spec: JobSpec, hosts: tuple[str, ...]) -> None:
        """The host list, when it differs from the ConfigMap's (before any pod is deleted)."""
        if obs.configmap is None:
            return
        data = runtimes.of(spec).config_data(spec, list(hosts))
        if (obs.configmap.get("data") or {}) == data:
            return
        cm = naming.config_map_name(spec.name)
        after = self.kube.patch("ConfigMap", spec.namespace, cm, {"data": data})
        self.writes.published(obs.job, obs.configmap, after)
        metrics.HOST_UPDATES.inc()
        log.info(
            "Updated host list namespace=%s job=%s hosts=%s",
            spec.namespace, spec.name, ",".join(hosts),
        )  # fmt: skip

    def delete_pod(self, obs: Observed, spec: JobSpec, pod_name: str, now: bool) -> None:
        """Deleted as the pod observed (its uid): a victim whose drain timed out is stopped now,
        as its preStop hook would wait for Horovod again, for the pod's whole grace period."""
        pod = next((p for p in obs.pods if p["metadata"]["name"] == pod_name), {})
        uid = pod.get("metadata", {}).get("uid")
        if self.kube.delete(
            "Pod", spec.namespace, pod_name, uid, grace=KILL_GRACE if now else None
        ):
            log.info("Deleted Pod namespace=%s name=%s", spec.namespace, pod_name)

    def worker_objects(
        self,
        obs: Observed,
        spec: JobSpec,
        plan: Plan,
        services: tuple[str, ...],
        indices: tuple[int, ...],
    ) -> Acted:
        """The wanted Services missing and the new workers' pods created at once; what was in
        the way, and which worker names others' pods hold."""
        name = spec.name
        owner = job_owner(spec)
        existing = {s["metadata"]["name"]: s for s in obs.services}
        unseen = self.writes.unseen(obs)
        made = [
            pods.worker_service(spec, owner, windex)
            for svc_name in services
            if svc_name not in existing
            and ("Service", svc_name) not in unseen
            and (windex := naming.worker_index(name, svc_name)) is not None
        ]
        secret, items = self._pod_secret(spec, bool(indices))
        if spec.shared is not None and workers_wanted(name, indices, unseen):
            claim = volumes.shared_claim(spec, owner)
            problems = self.create_child(obs, claim)  # made once; each run resumes from it
            if problems:
                return Acted(problems=problems)
        run = plan.status.restart_count or 0
        workers = [
            runtimes.worker(
                spec, owner, i, run, (secret, items), plan.placement, i in plan.surplus_workers
            )
            for i in indices
            if ("Pod", naming.worker_name(name, i)) not in unseen
        ]
        found = in_parallel(
            self.pool, [partial(self.create_child, obs, obj) for obj in made + workers]
        )
        squatted = [
            w["metadata"]["name"] for w, p in zip(workers, found[len(made) :], strict=True) if p
        ]
        return Acted(problems=[p for each in found for p in each], squatted=squatted)

    def launcher(self, obs: Observed, spec: JobSpec, plan: Plan) -> list[str]:
        if ("Pod", naming.launcher_name(spec.name)) in self.writes.unseen(obs):
            return []
        owner = job_owner(spec)
        secret, items = self._pod_secret(spec, True)
        run, size = plan.status.restart_count or 0, len(plan.status.hosts)  # size: its start
        where = plan.placement.get(LAUNCHER_SET, ANYWHERE)
        made = runtimes.of(spec).launcher(spec, owner, run, (secret, items), size, where)
        return [p for obj in made for p in self.create_child(obs, obj)]

    def _pod_secret(self, spec: JobSpec, building: bool) -> tuple[str, frozenset[str]]:
        """The Secret pods mount and its items, the names in its data (for a user's Secret a
        GET: only asked when a pod is built)."""
        secret = spec.ssh_secret or naming.secret_name(spec.name)
        return secret, self._secret_items(spec) if building else ssh.OWN_KEYS

    def _secret_items(self, spec: JobSpec) -> frozenset[str]:
        if not spec.ssh_secret:
            return ssh.OWN_KEYS
        assert spec.ssh_secret is not None
        secret = self.kube.get("Secret", spec.namespace, spec.ssh_secret)  # not watched
        return frozenset((secret or {}).get("data") or {})


def workers_wanted(job: str, indices: tuple[int, ...], unseen: set[tuple[str, str]]) -> bool:
    """Some worker of `indices` is to be made (not one the caches have yet to show)."""
    return any(("Pod", naming.worker_name(job, i)) not in unseen for i in indices)
