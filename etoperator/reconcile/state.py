"""What the reconciler keeps between passes (keys, problems met, writes in flight), and the
small pieces every part of it uses."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import paramiko

from etoperator import naming
from etoperator.api.fields import DEFAULT_MAX_WORKERS
from etoperator.api.models import (
    JobSpec,
)
from etoperator.clock import iso, utcnow
from etoperator.kube import ApiError, Kube
from etoperator.sshcheck import SSHProber

log = logging.getLogger(__name__)
T = TypeVar("T")


USER_SECRET_RECHECK = 900.0  # seconds


@dataclass(frozen=True)
class Next:
    """When the job's next pass is wanted (at the latest: any event brings it sooner), and why."""

    seconds: float
    why: str


STALE = Next(0.05, "the cache is behind our own write: its watch event is on its way")
REFUSED = Next(10.0, "the apiserver refused a write: try again after a while")
CONFLICT = Next(0.2, "a write met a newer version: look again")
BLOCKED_CLEARING = Next(0.5, "nothing blocks the job any more: say so")
GOING = Next(60.0, "its namespace is being deleted: nothing more to do or to say")


def job_key(namespace: str, name: str, uid: str) -> str:
    """What the reconciler's memory of a job is filed under (a new job of the name is another)."""
    return f"{namespace}/{name}/{uid}"


Ref = tuple[str, str, str]  # kind, namespace, name


def ref(body: dict[str, Any]) -> Ref:
    meta = body["metadata"]
    return (str(body.get("kind")), meta.get("namespace", ""), meta["name"])


def job_of(body: dict[str, Any]) -> tuple[str, str]:
    """The job whose view `body` is in: itself, or the one a scaler selects."""
    meta = body["metadata"]
    if body.get("kind") == naming.JOB_KIND:
        return (meta.get("namespace", ""), meta["name"])
    return (meta.get("namespace", ""), naming.selected_job(body))


def refused(exc: ApiError) -> bool:
    """A refusal that retrying at once will not change (not a 404, conflict or throttle)."""
    return 400 <= exc.status < 500 and exc.status not in (404, 409, 429)


def merge_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch turning `old` into `new` (removed keys become null)."""
    patch: dict[str, Any] = {k: v for k, v in new.items() if old.get(k) != v}
    for k in old:
        if k not in new:
            patch[k] = None
    return patch


@dataclass
class State:
    kube: Kube
    prober: SSHProber = field(default_factory=SSHProber)
    clock: Callable[[], datetime] = utcnow
    ssh_checks: bool = True  # off: a Running worker counts as ready (no network path to pods)
    tainted_nodes: Callable[[], set[str]] = set
    max_workers: int = DEFAULT_MAX_WORKERS
    _keys: dict[str, paramiko.PKey] = field(default_factory=dict)
    _key_texts: dict[str, str] = field(default_factory=dict)  # to recreate a deleted Secret
    _user_secret_checked: dict[str, datetime] = field(default_factory=dict)
    _act_problems: dict[str, list[str]] = field(default_factory=dict)  # children in the way
    _public: dict[str, str] = field(default_factory=dict)  # the job's trusted public key
    _squatted: dict[str, list[str]] = field(default_factory=dict)  # worker names others hold
    _refused: set[str] = field(default_factory=set)  # jobs whose last pass had a write refused
    probe_pool: concurrent.futures.ThreadPoolExecutor = field(  # SSH readiness and drain checks
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(16, "etoperator-ssh")
    )
    # A job's independent creates (its Services and worker pods, its Secret, ConfigMap and RBAC)
    # go at once, at most this many in flight over all passes: a first pass waits for the
    # slowest create, not for the sum of ~20.
    create_pool: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(16, "etoperator-create")
    )
    _scripts: dict[str, threading.Thread] = field(default_factory=dict)  # scripts running
    # Scripts that ran and were reported: never run again for the same scaler, even by a pass
    # that read the scaler before the report landed.
    _scripts_done: set[str] = field(default_factory=set)
    # Per job (namespace, name): objects of its view (the job, its scalers) -> versions that a
    # write of ours replaced, which the cache may still show.
    _superseded: dict[tuple[str, str], dict[Ref, set[str]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> str:
        return iso(self.clock())

    def in_parallel(self, tasks: Sequence[Callable[[], T]]) -> list[T]:
        """Each task's result, in order, the tasks run at once in `create_pool`; a failure is
        raised once every task has ended (the others' writes are made and kept)."""
        if len(tasks) < 2:
            return [task() for task in tasks]
        futures = [self.create_pool.submit(task) for task in tasks]
        concurrent.futures.wait(futures)
        return [f.result() for f in futures]

    def forget(self, namespace: str, job: str) -> None:
        """The job is gone: drop all memory of it (keys, checks, problems)."""
        prefix = f"{namespace}/{job}/"
        caches = (self._keys, self._key_texts, self._user_secret_checked, self._act_problems)
        for cache in (*caches, self._squatted, self._public):
            for k in [k for k in cache if k.startswith(prefix)]:
                cache.pop(k)
        self._refused = {k for k in self._refused if not k.startswith(prefix)}
        self._scripts_done = {k for k in self._scripts_done if not k.startswith(prefix)}
        self._superseded.pop((namespace, job), None)

    def wrote(self, before: dict[str, Any]) -> None:
        """`before` was replaced by a write of ours: until the cache moves past it (and any
        version between our writes), it is stale."""
        mine = self._superseded.setdefault(job_of(before), {})
        mine.setdefault(ref(before), set()).add(before["metadata"]["resourceVersion"])

    def superseded(self) -> int:
        """How many objects are remembered as written but maybe not yet seen so."""
        return sum(len(v) for v in self._superseded.values())

    def child_changed(self, namespace: str, job: str, kind: str, deleted: bool) -> None:
        """Someone else changed or deleted a child: read the user's Secret again on the next pass;
        a changed Secret's key replaces the one we hold (a deleted one's is kept to recreate)."""
        prefix = f"{namespace}/{job}/"
        for k in [k for k in self._user_secret_checked if k.startswith(prefix)]:
            self._user_secret_checked.pop(k)
        if kind == "Secret" and not deleted:
            for cache in (self._keys, self._key_texts):
                for k in [k for k in cache if k.endswith(f"/{naming.secret_name(job)}")]:
                    cache.pop(k)

    def _user_secret(self, spec: JobSpec) -> dict[str, Any] | None:
        assert spec.ssh_secret is not None
        return self.kube.get("Secret", spec.namespace, spec.ssh_secret)
