"""A job's loop: a burst of events becomes one pass; a lone event starts its pass at once."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from typing import Any, cast

from etoperator.cache import Observed
from etoperator.reconcile.job import JobReconciler
from etoperator.reconcile.state import GONE, Next
from etoperator.runtime import GAP, Runtime

REF = ("ns", "job")


class Passes:
    """Stands in for the reconciler: notes when each pass began (monotonic seconds)."""

    def __init__(self) -> None:
        self.at: list[float] = []

    def reconcile(self, obs: Observed) -> Next:
        self.at.append(time.monotonic())
        return Next(60.0, "nothing to do")

    def forget(self, *ref: Any) -> None:
        pass


async def _run(scenario: Any, gap: float = GAP) -> list[float]:
    passes = Passes()
    rt = Runtime(cast(JobReconciler, passes), workers=1, gap=gap)
    rt.observe = lambda ns, name: cast(Observed, object())
    rt.start(REF)
    try:
        await scenario(rt, passes)
    finally:
        rt.forget(REF)
    return passes.at


async def _until(cond: Any, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.001)


def test_a_burst_of_events_is_one_pass_a_gap() -> None:
    burst: list[float] = []  # when the kicks began and ended

    async def kicks(rt: Runtime, passes: Passes) -> None:
        await _until(lambda: len(passes.at) == 1)  # the first pass, at start
        burst.append(time.monotonic())
        for _ in range(100):  # a pod's status, its endpoints, the next pods'...
            rt.kick(REF)
            await asyncio.sleep(0.001)
        burst.append(time.monotonic())
        await _until(lambda: passes.at[-1] > burst[1])  # the last kick's pass
        await asyncio.sleep(2 * rt.gap)  # a further pass would have begun by now

    at = asyncio.run(_run(kicks))
    # (each start as the pool thread saw it: a few ms after the loop asked)
    spacing = 0.1 - 0.03
    assert all(b - a >= spacing for a, b in itertools.pairwise(at)), at
    # Passes that began while kicks came fit the time from the first pass to the last kick
    # (a busy machine stretches the burst, not the count); then one for the last kick.
    gaps = math.floor((burst[1] - at[0]) / spacing)
    assert len(at) - 1 <= gaps + 1, f"{len(at) - 1} passes for 100 kicks in {gaps} gaps"


def test_a_lone_event_after_quiet_starts_its_pass_at_once() -> None:
    async def lone(rt: Runtime, passes: Passes) -> None:
        await _until(lambda: len(passes.at) == 1)
        await asyncio.sleep(2 * rt.gap)
        kicked = time.monotonic()
        rt.kick(REF)
        await _until(lambda: len(passes.at) == 2)
        # At once, not a gap later: a gap of 1 s tells them apart however busy the machine
        # (with the 0.1 s gap, 0.051 s of a 0.05 s bound once, beside the suite).
        assert passes.at[1] - kicked < rt.gap / 2

    asyncio.run(_run(lone, gap=1.0))


def test_a_pass_acts_on_what_the_caches_show_when_it_starts() -> None:
    """With every thread busy, a job's pass waits; the view it acts on is read when it runs.

    A view read first and queued behind slow passes is stale by the time it is acted on:
    under load (hundreds of jobs starting) it missed the pods the job had already made, which
    were then made again and refused with a 409 each.
    """
    ages: dict[str, float] = {}

    class Slow(Passes):
        def reconcile(self, obs: Observed) -> Next:
            name, read_at = cast(tuple[str, float], obs)
            ages[name] = time.monotonic() - read_at
            if name == "slow":
                time.sleep(0.5)  # holds the only thread
            return Next(60.0, "nothing to do")

    async def scenario() -> None:
        rt = Runtime(cast(JobReconciler, Slow()), workers=1)
        rt.observe = lambda ns, name: cast(Observed, (name, time.monotonic()))
        rt.start(("ns", "slow"))
        await asyncio.sleep(0.05)  # the slow pass holds the thread
        rt.start(("ns", "next"))
        try:
            await _until(lambda: "next" in ages)
        finally:
            rt.forget(("ns", "slow"))
            rt.forget(("ns", "next"))

    asyncio.run(scenario())
    assert ages["next"] < 0.1, f"the pass acted on a view {ages['next']:.2f} s old"


def test_a_burst_of_new_jobs_leaves_threads_for_running_jobs() -> None:
    """New jobs' first passes make ~20 objects each and are slow while hundreds start at once;
    they never take every thread, so a running job's pass (a worker lost) starts at once."""
    waited: dict[str, float] = {}

    class FirstPassesSlow(Passes):
        def reconcile(self, obs: Observed) -> Next:
            name, read_at = cast(tuple[str, float], obs)
            waited[name] = time.monotonic() - read_at
            if name.startswith("new"):
                time.sleep(0.5)
            return Next(60.0, "nothing to do")

    async def scenario() -> None:
        rt = Runtime(cast(JobReconciler, FirstPassesSlow()), workers=4)
        woken: dict[str, float] = {}
        rt.observe = lambda ns, name: cast(Observed, (name, woken.get(name, time.monotonic())))
        refs = [("ns", f"new-{i}") for i in range(8)]
        for ref in refs:
            rt.start(ref)
        await asyncio.sleep(0.05)  # the new jobs hold what threads they may
        rt.set_phase(("ns", "running"), "Running")
        woken["running"] = time.monotonic()
        rt.start(("ns", "running"))
        try:
            await _until(lambda: "running" in waited)
        finally:
            for ref in [*refs, ("ns", "running")]:
                rt.forget(ref)

    asyncio.run(scenario())
    assert waited["running"] < 0.1, f"a running job waited {waited['running']:.2f} s"


def test_a_job_whose_namespace_is_gone_is_forgotten() -> None:
    """The caches can keep a job whose namespace went (its watch ended before the deletions
    reached it): each of its passes asked the apiserver for the namespace again, for as long
    as the operator ran. A pass that finds the namespace gone ends the job's loop."""

    class Gone(Passes):
        def reconcile(self, obs: Observed) -> Next:
            self.at.append(time.monotonic())
            return GONE

    async def scenario() -> tuple[int, bool, bool]:
        passes = Gone()
        rt = Runtime(cast(JobReconciler, passes), workers=1, resync=0.05)
        rt.observe = lambda ns, name: cast(Observed, object())
        rt.start(REF)
        await _until(lambda: REF not in rt.tasks)
        await asyncio.sleep(0.2)  # resyncs that would have come
        return len(passes.at), REF in rt.known, rt.has(REF)

    count, known, has = asyncio.run(scenario())
    assert count == 1 and not known and not has
