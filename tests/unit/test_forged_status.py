"""A status written by someone else (with status rights) never restarts a run that goes on."""

from __future__ import annotations

import dataclasses

import pytest

from etoperator.planning import plan_job
from tests.unit.test_planning import inp, jspec, launcher, running_status, w
from tests.unit.test_queueing import ADMITTED, qspec, queued


@pytest.mark.parametrize("forged", ["Queued", "Suspended"])
def test_a_forged_phase_over_a_running_job_leaves_the_run_alone(forged: str) -> None:
    """`status.phase: Queued` on a running job without a queue label restarted it ("no longer
    queued ... starting"), every worker replaced; Suspended did the same ("resumed")."""
    status = running_status([0, 1], phase=forged)
    pods = [w(0), w(1), launcher()]
    plan = plan_job(inp(jspec(replicas=2), status, pods))
    assert plan.delete_pods == [] and plan.create_workers == []
    assert plan.status.target_workers == ["j-worker-0", "j-worker-1"]
    assert plan.status.phase == "Running"
    assert any(e.reason == "StatusRepaired" and e.type == "Warning" for e in plan.events)


def test_a_forged_queued_phase_over_an_admitted_running_job_leaves_it_alone() -> None:
    status = running_status([0, 1], phase="Queued")
    pods = [w(0), w(1), launcher()]
    plan = plan_job(queued(qspec(replicas=2), status, pods, ADMITTED))
    assert plan.delete_pods == [] and plan.create_workers == []
    assert plan.status.phase == "Running"


def test_a_run_that_did_stop_still_resumes_afresh() -> None:
    status = running_status([0, 1], phase="Suspended")
    going = [dataclasses.replace(launcher(), deleting=True)]
    plan = plan_job(inp(jspec(replicas=2), status, going))
    assert plan.status.target_workers == ["j-worker-2", "j-worker-3"]
