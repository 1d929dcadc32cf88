"""One reconcile loop per job: woken by any event about the job, its pods or its scalers, and
by a resync timer. Passes of one job never overlap; jobs never wait on each other.

kopf daemons would do this too, but they put a finalizer on every job, so deleting a job would
hang whenever the operator is down. Plain tasks started from watch events need no finalizer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from etoperator import metrics
from etoperator.cache import Observed
from etoperator.kube import ApiError
from etoperator.reconcile.job import JobReconciler

log = logging.getLogger(__name__)

Key = tuple[str, str]
RESYNC = 60.0
MAX_BACKOFF = 60.0


@dataclass
class Runtime:
    reconciler: JobReconciler
    workers: int = 16
    tasks: dict[Key, asyncio.Task[None]] = field(default_factory=dict)
    kicks: dict[Key, asyncio.Event] = field(default_factory=dict)
    phases: dict[Key, str] = field(default_factory=dict)
    tainted: set[str] = field(default_factory=set)  # nodes about to be taken away
    taint_keys: set[str] = field(default_factory=set)  # taints that announce that
    observe: Callable[[str, str], Observed | None] | None = None  # from the watch caches
    leading: asyncio.Event | None = None  # set while this replica holds the Lease (None: alone)
    known: set[Key] = field(default_factory=set)  # every job seen, leading or not
    resync: float = RESYNC  # a pass at least this often (reading caches: it costs no request)
    _pool: concurrent.futures.ThreadPoolExecutor | None = None

    def __post_init__(self) -> None:
        self.reconciler.tainted_nodes = lambda: set(self.tainted)

    @property
    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.workers, "etoperator-job")
        return self._pool

    def has(self, key: Key) -> bool:
        return key in self.tasks

    def kick(self, key: Key) -> None:
        event = self.kicks.get(key)
        if event is not None:
            event.set()

    def is_leader(self) -> bool:
        return self.leading is None or self.leading.is_set()

    async def lead(self) -> None:
        """A standby starts the loops of every known job once it holds the Lease."""
        assert self.leading is not None
        await self.leading.wait()
        for key in list(self.known):
            self.start(key)

    def start(self, key: Key) -> None:
        self.known.add(key)
        if not self.is_leader():
            return  # a standby watches (its caches stay warm) and writes nothing
        if key not in self.tasks or self.tasks[key].done():
            self.kicks[key] = asyncio.Event()
            self.tasks[key] = asyncio.create_task(self._loop(key), name=f"job {key[0]}/{key[1]}")
        self.kick(key)

    def forget(self, key: Key) -> None:
        self.known.discard(key)
        task = self.tasks.pop(key, None)
        self.kicks.pop(key, None)
        self.phases.pop(key, None)
        self._publish_phases()
        self.reconciler.forget(*key)
        if task is not None:
            task.cancel()

    def kick_all(self) -> None:
        for key in list(self.kicks):
            self.kick(key)

    async def _loop(self, key: Key) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        kick = self.kicks[key]
        while True:
            kick.clear()
            try:
                # Read in the event loop, where the caches change; the pass owns its copy.
                obs = self.observe(*key) if self.observe is not None else None
                if obs is None:  # the job is gone
                    self.tasks.pop(key, None)
                    self.kicks.pop(key, None)
                    self.reconciler.forget(*key)
                    return
                nxt = await loop.run_in_executor(self.pool, self.reconciler.reconcile, obs)
                delay = nxt.seconds
                log.debug("Next pass namespace=%s job=%s in=%.2fs why=%s", *key, delay, nxt.why)
                failures = 0
            except (ApiError, OSError) as exc:
                failures += 1
                delay = min(MAX_BACKOFF, 0.5 * 2 ** min(failures, 7))
                metrics.RECONCILE_ERRORS.inc()
                log.warning(
                    "Reconcile failed namespace=%s job=%s error=%s retry_in=%.1fs", *key, exc, delay
                )
            except Exception:
                # One bad job must never take the operator down: log, count, back off.
                failures += 1
                delay = min(MAX_BACKOFF, 0.5 * 2 ** min(failures, 7))
                metrics.RECONCILE_ERRORS.inc()
                log.exception("Reconcile raised namespace=%s job=%s retry_in=%.1fs", *key, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(kick.wait(), timeout=min(delay, self.resync))

    def set_phase(self, key: Key, phase: str) -> None:
        if self.phases.get(key) != phase:
            self.phases[key] = phase
            self._publish_phases()

    def _publish_phases(self) -> None:
        counts = Counter(self.phases.values())
        for phase in ("", "Created", "Running", "Scaling", "Succeeded", "Failed", "Suspended"):
            metrics.JOBS.labels(phase or "New").set(counts.get(phase, 0))
