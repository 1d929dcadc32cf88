"""The whole chain on one machine: kubectl -> emulator -> operator -> real sshd workers and a
real `horovodrun` launcher running the example elastic training, scaled while it trains."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.harness import Cluster, wait_for
from tests.scenario import JOB, Scenario

pytestmark = pytest.mark.fullchain


def test_elastic_training_survives_scaling_and_worker_loss(chain: Cluster) -> None:
    c = chain
    ns = c.new_namespace()
    launcher = (ns, f"{JOB}-launcher")

    def launcher_log() -> str:
        path = c.kubelet.logs.get(launcher)
        return path.read_text(errors="replace") if path and path.exists() else ""

    scenario = Scenario(
        kubectl=lambda *a, **kw: c.kubectl("-n", ns, *a, **kw),
        launcher_log=launcher_log,
        kill_worker=lambda name: c.kubelet.crash(ns, name),  # type: ignore[attr-defined]
        hosts=lambda: c.hosts(ns, JOB),
        phase=lambda: c.phase(ns, JOB),
    )
    out = os.environ.get("ETOPERATOR_FULLCHAIN_RESULTS")
    timings = scenario.run(Path(out) if out else None)
    assert set(timings) == {
        "steps_per_s_at_2",
        "scale_out_+2",
        "scale_in_count_1",
        "scale_in_by_name",
        "worker_killed",
    }
    wait_for(lambda: c.pods(ns, JOB, "worker") == [], 30, "workers cleaned up")
