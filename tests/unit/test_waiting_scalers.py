"""Scalers of a job that does not run (queued, suspended) are answered: they wait, saying so,
and fail at their timeout (they got no status at all, and ran later or never)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from etoperator.planning import plan_job
from etoperator.planning.views import QueueView
from localcluster.manifests import scaleout
from tests.unit.test_planning import NOW, inp, jspec, scaler
from tests.unit.test_queueing import qspec, queued


def status_of(plan: Any, sc: Any) -> dict[str, Any]:
    return dict((plan.scaler_status.get(sc.kind_name) or sc.status).to_dict())


def test_a_scaler_of_a_queued_job_waits_then_fails_at_its_timeout() -> None:
    so = dataclasses.replace(
        scaler(scaleout("more", "j", 1, timeout=20)), created="2026-01-01T12:00:00Z"
    )
    waiting = {"phase": "Queued"}
    q = QueueView(queue="lq", workload="wl", workers=2, why="no quota")
    plan = plan_job(dataclasses.replace(queued(qspec(replicas=2), waiting, [], q), scalers=[so]))
    got = status_of(plan, so)
    assert got.get("phase", "") == ""
    said = next(c for c in got["conditions"] if c["type"] == "Waiting")
    assert said["reason"] == "JobNotRunning" and "no quota" in said["message"]
    assert plan.requeue <= 20
    late = dataclasses.replace(
        queued(qspec(replicas=2), waiting, [], q), scalers=[so], now=NOW + timedelta(seconds=21)
    )
    ended = status_of(plan_job(late), so)
    assert ended["phase"] == "ScaleFailed" and "did not run within the 20s" in str(ended)


def test_a_scaler_of_a_suspended_job_waits() -> None:
    so = dataclasses.replace(scaler(scaleout("more", "j", 1)), created="2026-01-01T12:00:00Z")
    spec = jspec(replicas=2, suspend=True)
    plan = plan_job(inp(spec, {"phase": "Suspended"}, [], [so]))
    said = next(c for c in status_of(plan, so)["conditions"] if c["type"] == "Waiting")
    assert "suspended" in said["message"]
