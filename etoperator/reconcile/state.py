"""Small pieces every part of the reconciler uses: when the next pass is wanted (`Next`), how
a job's memory is filed, the writes of ours the cache has yet to show (`Writes`), the SSH keys
held (`Keys`), the launchers' access being made off the pass (`AccessMakings`), independent
writes made at once (`in_parallel`), and a pass's events posted off the pass (`Recorder`)."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import paramiko

from etoperator import naming
from etoperator.cache import Observed
from etoperator.kube import ApiError, Kube
from etoperator.planning import Plan

log = logging.getLogger(__name__)
T = TypeVar("T")

USER_SECRET_RECHECK = 900.0  # seconds
MADE_UNSEEN = 30.0  # seconds a child we created may take to show in the cache before made again
EVENTS_WAITING = 1000  # events waiting to be posted at most; more are dropped (and logged)


@dataclass(frozen=True)
class Next:
    """When the job's next pass is wanted (at the latest: any event brings it sooner), and why."""

    seconds: float
    why: str


# Its watch event brings the next pass; the wait is only a floor under a lost event.
STALE = Next(1.0, "the cache is behind our own write: its watch event is on its way")
REFUSED = Next(10.0, "the apiserver refused a write: try again after a while")
CONFLICT = Next(0.2, "a write met a newer version: look again")
BLOCKED_CLEARING = Next(0.5, "nothing blocks the job any more: say so")
GOING = Next(60.0, "its namespace is being deleted: nothing more to do or to say")
# Its namespace is gone, the job with it, whatever a cache still shows: its loop ends.
GONE = Next(0.0, "its namespace is gone")


def job_id(namespace: str, name: str, uid: str) -> str:
    """What the reconciler's memory of a job is filed under (a new job of the name is another)."""
    return f"{namespace}/{name}/{uid}"


def plan_next(plan: Plan) -> Next:
    quiet = "resync" if plan.requeue >= 60 else "pods created or deleted"
    return Next(plan.requeue, "; ".join(plan.pending) or quiet)


def job_prefix(namespace: str, name: str) -> str:
    """The start of every memory of that job name, whatever its uid."""
    return f"{namespace}/{name}/"


Ref = tuple[str, str, str]  # kind, namespace, name


def ref(body: dict[str, Any]) -> Ref:
    meta = body["metadata"]
    return (str(body.get("kind")), meta.get("namespace", ""), meta["name"])


def view_of(body: dict[str, Any]) -> tuple[str, str]:
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


def in_parallel(
    pool: concurrent.futures.ThreadPoolExecutor, tasks: Sequence[Callable[[], T]]
) -> list[T]:
    """Each task's result, in order, the tasks run at once in `pool`; a failure is raised once
    every task has ended (the others' writes are made and kept)."""
    if len(tasks) < 2:
        return [task() for task in tasks]
    futures = [pool.submit(task) for task in tasks]
    concurrent.futures.wait(futures)
    return [f.result() for f in futures]


@dataclass
class Recorder:
    """A pass's events, posted off the pass as client-go's recorder posts them: a pass never
    waits for them (best effort, as events are). At most EVENTS_WAITING wait: an apiserver
    that takes none must not grow the operator's memory; past that they are dropped, logged."""

    kube: Kube
    pool: concurrent.futures.ThreadPoolExecutor
    _waiting: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def post(
        self, obj: dict[str, Any], etype: str, reason: str, message: str, now: datetime
    ) -> None:
        with self._lock:
            full = self._waiting >= EVENTS_WAITING
            self._waiting += 0 if full else 1
        if full:
            name = obj.get("metadata", {}).get("name")
            log.warning("Event dropped reason=%s object=%s (too many waiting)", reason, name)
            return
        self.pool.submit(self._post, obj, etype, reason, message, now)

    def _post(
        self, obj: dict[str, Any], etype: str, reason: str, message: str, now: datetime
    ) -> None:
        try:
            self.kube.event(obj, etype, reason, message, now)
        finally:
            with self._lock:
                self._waiting -= 1


@dataclass
class Writes:
    """Our writes the watch caches may not show yet: per job view (the job, its scalers), each
    object's versions a write of ours replaced (a pass that sees one waits for the watch), and
    the children we created that their caches have yet to show (not created again
    meanwhile: under load those caches lag the job's by seconds, and each second try would only
    meet a 409)."""

    _replaced: dict[tuple[str, str], dict[Ref, set[str]]] = field(default_factory=dict)
    _made: dict[tuple[str, str], dict[tuple[str, str], float]] = field(default_factory=dict)
    # Per job view: the host-list ConfigMap's versions our writes replaced, and the last write.
    _lists: dict[tuple[str, str], tuple[set[str], dict[str, Any]]] = field(default_factory=dict)

    def wrote(self, before: dict[str, Any]) -> None:
        """`before` was replaced by a write of ours: until the cache moves past it (and any
        version between our writes), it is stale."""
        mine = self._replaced.setdefault(view_of(before), {})
        mine.setdefault(ref(before), set()).add(before["metadata"]["resourceVersion"])

    def stale(self, obs: Observed) -> bool:
        """The cache still shows an object as it was before one of our writes (acting on it
        would only meet a 409)."""
        mine = self._replaced.get(view_of(obs.job), {})
        shown = {ref(body): body for body in (obs.job, *obs.scalers)}
        stale = False
        for r, old in list(mine.items()):
            body = shown.get(r)
            if body is not None and body["metadata"].get("resourceVersion") in old:
                stale = True
            else:  # the cache has caught up, or the object left the job's view (deleted)
                mine.pop(r)
        return stale

    def published(self, job: dict[str, Any], before: dict[str, Any], after: dict[str, Any]) -> None:
        """The job's host-list ConfigMap `before` was replaced by our write, `after`."""
        key = view_of(job)
        olds = self._lists.get(key, (set(), after))[0]
        self._lists[key] = (olds | {before["metadata"]["resourceVersion"]}, after)

    def configmap(self, obs: Observed) -> dict[str, Any] | None:
        """The host-list ConfigMap as it is: our last write of it while the cache still shows
        a version it replaced (the host list decides which victim may go, and whether a list
        equal to the cache's needs writing: a stale one would let a worker go while listed)."""
        mine = self._lists.get(view_of(obs.job))
        if mine is None or obs.configmap is None:
            self._lists.pop(view_of(obs.job), None)
            return obs.configmap
        if obs.configmap["metadata"].get("resourceVersion") in mine[0]:
            return mine[1]
        self._lists.pop(view_of(obs.job))  # the cache caught up, or someone else wrote it
        return obs.configmap

    def made(self, job: dict[str, Any], kind: str, name: str) -> None:
        self._made.setdefault(view_of(job), {})[(kind, name)] = time.monotonic()

    def unseen(self, obs: Observed) -> set[tuple[str, str]]:
        """(kind, name) of the children of the job we created that its caches do not
        show yet. Forgotten once shown, or after MADE_UNSEEN seconds (deleted before the cache
        saw it: create it again)."""
        mine = self._made.get(view_of(obs.job), {})
        shown = {("Pod", p["metadata"]["name"]) for p in obs.pods}
        shown |= {("Service", s["metadata"]["name"]) for s in obs.services} | obs.present
        now = time.monotonic()
        for child, at in list(mine.items()):
            if child in shown or now - at > MADE_UNSEEN:
                mine.pop(child)
        return set(mine)

    def forget(self, namespace: str, job: str) -> None:
        self._replaced.pop((namespace, job), None)
        self._made.pop((namespace, job), None)
        self._lists.pop((namespace, job), None)

    def count(self) -> int:
        """How many objects are remembered as written but maybe not yet seen so."""
        made = sum(map(len, self._made.values())) + len(self._lists)
        return sum(len(v) for v in self._replaced.values()) + made


@dataclass
class Keys:
    """Each job's SSH key as last read, filed under `<job_key>/<secret name>`: parsed (for the
    readiness and drain probes), its text (to remake a deleted Secret with the key the pods
    hold), and the public key its workers trust (by job_key)."""

    parsed: dict[str, paramiko.PKey] = field(default_factory=dict)
    text: dict[str, str] = field(default_factory=dict)
    public: dict[str, str] = field(default_factory=dict)

    def forget(self, prefix: str) -> None:
        for held in (self.parsed, self.text, self.public):
            for k in [k for k in held if k.startswith(prefix)]:
                held.pop(k)

    def secret_changed(self, prefix: str, secret: str) -> None:
        """A job's Secret was changed by someone: read its key again."""
        for held in (self.parsed, self.text):
            for k in [k for k in held if k.startswith(prefix) and k.endswith(f"/{secret}")]:
                held.pop(k)


@dataclass
class AccessMakings:
    """Each job's making of its launcher's access, off the pass (Children starts it, the
    Observer reads what it met): a making in flight, and what the last one met, said on
    every pass until the next making ends (not only on the pass that read it: the Blocked
    message flapped, a status write and a Warning each pass)."""

    _making: dict[str, concurrent.futures.Future[list[str]]] = field(default_factory=dict)
    _met: dict[str, list[str]] = field(default_factory=dict)

    def start(self, jid: str, make: Callable[[], concurrent.futures.Future[list[str]]]) -> None:
        if jid not in self._making:
            self._making[jid] = make()

    def making(self, jid: str) -> bool:
        """Being made: the job's next pass comes soon to tell."""
        return jid in self._making

    def met(self, jid: str, missing: bool) -> tuple[list[str], bool]:
        """What the last making met, until it is made again (nothing once none of it is
        missing); and whether that making ended since the last pass."""
        making = self._making.get(jid)
        ended = making is not None and making.done()
        if ended:
            self._met[jid] = self._making.pop(jid).result()
        if not missing:
            self._met.pop(jid, None)
        return list(self._met.get(jid, [])), ended

    def forget(self, prefix: str) -> None:
        for memo in (self._making, self._met):
            for k in [k for k in memo if k.startswith(prefix)]:
                memo.pop(k)


@dataclass
class Served:
    """Whether the apiserver serves an API group version, asked by discovery and believed for
    `ttl` seconds: (when it was, when it was not). An optional API (Kueue's, the Workload API)
    is looked up once in a while, not on every pass."""

    kube: Kube
    group_version: str
    ttl: tuple[float, float]
    _last: tuple[float, bool] | None = None

    def __call__(self) -> bool:
        now = time.monotonic()
        if self._last is None or now - self._last[0] > self.ttl[not self._last[1]]:
            self._last = (now, self.kube.serves(self.group_version))
        return self._last[1]
