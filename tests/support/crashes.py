"""A run of steps with the operator SIGKILLed after every write a test picks."""

from __future__ import annotations

import time
from collections.abc import Callable

from tests.faultproxy import Crash
from tests.harness import Cluster

Step = tuple[Callable[[], object], Callable[[], bool]]


def crash_through(cluster: Cluster, steps: list[Step], arm: Callable[[], Crash]) -> int:
    """Each step's act, then its check polled until it holds, the operator SIGKILLed after
    each write `arm` matches and a new one started: the number of crashes."""
    crashes, crash = 0, arm()
    for act, done in steps:
        act()
        deadline = time.monotonic() + 120
        while not done():
            assert time.monotonic() < deadline, f"not consistent after {crashes} crashes"
            if crash.fired:  # a new process takes over, to be killed at its first write
                assert crash.killed.wait(30), "the operator was not killed"
                cluster.proxy.disarm()
                cluster.operator.start()
                crashes, crash = crashes + 1, arm()
            time.sleep(0.05)
    cluster.proxy.disarm()
    if crash.fired:
        assert crash.killed.wait(30)
        cluster.operator.start()
    return crashes
