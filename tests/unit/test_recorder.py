"""A pass's events are posted off the pass, and an apiserver that takes none cannot make the
operator hold more than EVENTS_WAITING of them."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from datetime import datetime
from typing import Any, cast

from etoperator.kube import Kube
from etoperator.reconcile.state import EVENTS_WAITING, Recorder

NOW = datetime(2026, 1, 1)


class StuckApiserver:
    """Takes each event only once `opened` is set; keeps what it took."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.took: list[str] = []

    def event(self, obj: dict[str, Any], etype: str, reason: str, message: str, now: Any) -> None:
        self.opened.wait(10)
        self.took.append(message)


def test_events_never_hold_a_pass_and_a_stuck_apiserver_gets_a_bounded_backlog() -> None:
    server = StuckApiserver()
    pool = concurrent.futures.ThreadPoolExecutor(2)
    recorder = Recorder(cast(Kube, server), pool)
    job = {"metadata": {"name": "j", "namespace": "ns"}}
    start = time.monotonic()
    for i in range(EVENTS_WAITING + 50):
        recorder.post(job, "Normal", "Reason", f"event {i}", NOW)
    assert time.monotonic() - start < 1.0  # no post waited for the apiserver
    server.opened.set()
    deadline = time.monotonic() + 10
    while len(server.took) < EVENTS_WAITING and time.monotonic() < deadline:
        time.sleep(0.01)
    recorder.post(job, "Normal", "Reason", "after", NOW)  # room again once they are posted
    pool.shutdown(wait=True)
    # The first EVENTS_WAITING and the one after; the 50 past the bound were dropped.
    assert sorted(server.took) == sorted([f"event {i}" for i in range(EVENTS_WAITING)] + ["after"])
