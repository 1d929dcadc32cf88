"""Timestamps are UTC whatever the machine's time zone (Events, conditions, status)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from etoperator import clock, kube


@pytest.fixture
def tokyo() -> Iterator[None]:
    old = os.environ.get("TZ")
    os.environ["TZ"] = "Asia/Tokyo"
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()


def test_event_timestamps_are_utc_on_a_machine_outside_utc(tokyo: None) -> None:
    now = clock.utcnow()  # what the reconciler passes
    job = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "n"}}
    ev = kube.event_manifest(job, "Normal", "Test", "message", now)
    stamped = datetime.strptime(ev["lastTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert abs((stamped - datetime.now(UTC)).total_seconds()) < 5
    assert ev["firstTimestamp"] == ev["lastTimestamp"] == clock.iso(now)


def test_iso_round_trip_naive_and_aware() -> None:
    aware = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert clock.iso(aware) == clock.iso(aware.replace(tzinfo=None)) == "2026-01-02T03:04:05Z"
    assert clock.parse_iso("2026-01-02T03:04:05Z") == aware.replace(tzinfo=None)
    assert clock.parse_iso("garbage") is None and clock.parse_iso(None) is None
