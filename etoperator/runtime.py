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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from etoperator import metrics
from etoperator.cache import JobRef, Observed
from etoperator.kube import ApiError
from etoperator.reconcile.job import JobReconciler
from etoperator.reconcile.state import GONE

log = logging.getLogger(__name__)

RESYNC = 60.0
MAX_BACKOFF = 60.0
# While the API server cannot be reached, a job comes back at least this often: its return
# should be noticed within seconds, and an unreachable server is not this job's fault.
UNREACHABLE_BACKOFF = 2.0
# A job's passes start at least this far apart: a burst of events (a pod's status, its
# endpoints, the next pod's) becomes one pass and one status write, while a lone event after a
# quiet spell still starts its pass at once.
GAP = 0.1
# New jobs' first passes at once. Each makes ~20 objects at once through the creates' pool
# (reconcile.job.CREATES_AT_ONCE in flight, shared by all passes, sized for two of them): more
# first passes at once only queue behind each other's creates, each slower, and no more of
# them done in a second.
NEW_AT_ONCE = 2


@dataclass
class Runtime:
    reconciler: JobReconciler
    workers: int = 16
    tasks: dict[JobRef, asyncio.Task[None]] = field(default_factory=dict)
    kicks: dict[JobRef, asyncio.Event] = field(default_factory=dict)
    phases: dict[JobRef, str] = field(default_factory=dict)
    tainted: set[str] = field(default_factory=set)  # nodes about to be taken away
    taint_keys: set[str] = field(default_factory=set)  # taints that announce that
    observe: Callable[[str, str], Observed | None] | None = None  # from the watch caches
    leading: asyncio.Event | None = None  # set while this replica holds the Lease (None: alone)
    known: set[JobRef] = field(default_factory=set)  # every job seen, leading or not
    resync: float = RESYNC  # a pass at least this often (reading caches: it costs no request)
    gap: float = GAP  # passes of one job at most this often
    _pool: concurrent.futures.ThreadPoolExecutor | None = None
    _turns: asyncio.Semaphore | None = None
    _new_turns: asyncio.Semaphore | None = None

    @property
    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.workers, "etoperator-job")
        return self._pool

    @contextlib.asynccontextmanager
    async def turn(self, new: bool) -> AsyncIterator[None]:
        """A thread's turn for a job's pass. Jobs with no phase yet (`new`) take at most
        NEW_AT_ONCE threads: their first passes make ~20 objects each, a running job's pass (a
        worker lost) must not wait behind hundreds of them, and more at once would not make
        more of them a second (see NEW_AT_ONCE)."""
        if self._turns is None or self._new_turns is None:
            self._turns = asyncio.Semaphore(self.workers)
            self._new_turns = asyncio.Semaphore(min(NEW_AT_ONCE, self.workers))
        if new:
            async with self._new_turns, self._turns:
                yield
        else:
            async with self._turns:
                yield

    def has(self, ref: JobRef) -> bool:
        return ref in self.tasks

    def kick(self, ref: JobRef) -> None:
        event = self.kicks.get(ref)
        if event is not None:
            event.set()

    def is_leader(self) -> bool:
        return self.leading is None or self.leading.is_set()

    async def lead(self) -> None:
        """A standby starts the loops of every known job once it holds the Lease."""
        assert self.leading is not None
        await self.leading.wait()
        for ref in list(self.known):
            self.start(ref)

    def start(self, ref: JobRef) -> None:
        self.known.add(ref)
        if not self.is_leader():
            return  # a standby watches (its caches stay warm) and writes nothing
        if ref not in self.tasks or self.tasks[ref].done():
            self.kicks[ref] = asyncio.Event()
            self.tasks[ref] = asyncio.create_task(self._loop(ref), name=f"job {ref[0]}/{ref[1]}")
        self.kick(ref)

    def forget(self, ref: JobRef) -> None:
        self.known.discard(ref)
        task = self.tasks.pop(ref, None)
        self.kicks.pop(ref, None)
        self.phases.pop(ref, None)
        self._publish_phases()
        self.reconciler.forget(*ref)
        if task is not None and task is not asyncio.current_task():  # a loop ending itself
            task.cancel()

    def kick_all(self) -> None:
        for ref in list(self.kicks):
            self.kick(ref)

    async def _loop(self, ref: JobRef) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        kick = self.kicks[ref]
        while True:
            kick.clear()
            started = loop.time()
            try:
                new = not self.phases.get(ref)
                async with self.turn(new):
                    waited = loop.time() - started
                    metrics.PASS_WAIT_SECONDS.labels("new" if new else "started").observe(waited)
                    # Read in the event loop, where the caches change, and only once a thread
                    # is free: a view queued behind busy threads would miss what was made since.
                    obs = self.observe(*ref) if self.observe is not None else None
                    if obs is None:  # the job is gone
                        self.tasks.pop(ref, None)
                        self.kicks.pop(ref, None)
                        self.reconciler.forget(*ref)
                        return
                    nxt = await loop.run_in_executor(self.pool, self.reconciler.reconcile, obs)
                if nxt is GONE:
                    log.info("Forgetting job namespace=%s job=%s: %s", *ref, nxt.why)
                    self.forget(ref)
                    return
                delay = nxt.seconds
                log.debug("Next pass namespace=%s job=%s in=%.2fs why=%s", *ref, delay, nxt.why)
                failures = 0
            except (ApiError, OSError) as exc:
                failures += 1
                delay = min(MAX_BACKOFF, 0.5 * 2 ** min(failures, 7))
                if isinstance(exc, OSError) or exc.unreachable:
                    delay = min(delay, UNREACHABLE_BACKOFF)
                metrics.RECONCILE_ERRORS.inc()
                log.warning(
                    "Reconcile failed namespace=%s job=%s error=%s retry_in=%.1fs", *ref, exc, delay
                )
            except Exception:
                # One bad job must never take the operator down: log, count, back off.
                failures += 1
                delay = min(MAX_BACKOFF, 0.5 * 2 ** min(failures, 7))
                metrics.RECONCILE_ERRORS.inc()
                log.exception("Reconcile raised namespace=%s job=%s retry_in=%.1fs", *ref, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(kick.wait(), timeout=min(delay, self.resync))
            # What arrives meanwhile joins this pass (kick is cleared only when it starts).
            await asyncio.sleep(max(0.0, started + self.gap - loop.time()))

    def set_phase(self, ref: JobRef, phase: str) -> None:
        if self.phases.get(ref) != phase:
            self.phases[ref] = phase
            self._publish_phases()

    def _publish_phases(self) -> None:
        counts = Counter(self.phases.values())
        for phase in ("", "Created", "Running", "Scaling", "Succeeded", "Failed", "Suspended"):
            metrics.JOBS.labels(phase or "New").set(counts.get(phase, 0))
