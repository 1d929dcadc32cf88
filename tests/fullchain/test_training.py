"""The whole chain on one machine: kubectl -> kube-apiserver -> operator -> real sshd workers and a
real `horovodrun` launcher running the example elastic training, scaled while it trains."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import cast

import pytest

from etoperator.localcluster.process import ProcessKubelet
from etoperator.localcluster.tour import JOB, Tour, Training, example_steps
from tests.harness import ROOT, Cluster, wait_for

pytestmark = pytest.mark.fullchain


def test_elastic_training_survives_scaling_and_worker_loss(chain: Cluster) -> None:
    c = chain
    kubelet = cast(ProcessKubelet, c.kubelet)
    ns = c.new_namespace()
    launcher = (ns, f"{JOB}-launcher")

    def launcher_log() -> str:
        path = kubelet.logs.get(launcher)
        return path.read_text(errors="replace") if path and path.exists() else ""

    scenario = Tour(
        kubectl=lambda *a, **kw: c.kubectl("-n", ns, *a, **kw),
        launcher_log=launcher_log,
        kill_worker=lambda name: kubelet.crash(ns, name),
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
        "kubectl_scale_3",
        "worker_killed",
    }
    wait_for(lambda: c.pods(ns, JOB, "worker") == [], 30, "workers cleaned up")


def test_preemption_notice_shrinks_without_rollback(chain: Cluster) -> None:
    """A worker that gets a DisruptionTarget notice leaves the host list before it dies, so
    Horovod shrinks at its next commit and no committed-then-lost step is ever repeated."""
    c = chain
    kubelet = cast(ProcessKubelet, c.kubelet)
    ns = c.new_namespace()
    c.kubectl("-n", ns, "create", "-f", str(ROOT / "examples/training_job.yaml"))
    launcher = (ns, f"{JOB}-launcher")

    def launcher_log() -> str:
        path = kubelet.logs.get(launcher)
        return path.read_text(errors="replace") if path and path.exists() else ""

    tr = Training(launcher_log)
    wait_for(
        lambda: len([s for s in tr.read().steps if s[1] == 2]) >= 20,
        120,
        "training on 2 workers",
        interval=0.2,
    )
    victim = f"{JOB}-worker-1"
    t0 = time.time()
    c.kubelet.disrupt(ns, victim)
    wait_for(lambda: victim not in c.hosts(ns, JOB), 5, "the noticed worker out of the list")
    wait_for(lambda: tr.first_step_at(1, t0), 60, "training on 1 worker", interval=0.2)
    shrunk = tr.first_step_at(1, t0)
    assert shrunk is not None
    print(f"preemption notice: first step at size 1 after {shrunk - t0:.2f}s")
    # The node goes away after its notice (unless the operator already deleted the drained pod).
    if (ns, victim) in kubelet.procs:
        kubelet.crash(ns, victim)
    wait_for(lambda: c.phase(ns, JOB) == "Succeeded", 240, "the job to succeed", interval=0.5)
    steps = [s for s, *_ in tr.read().steps]
    after = [s for s, _, _, t in tr.steps if t >= t0]
    assert len(after) == len(set(after)), "a step was repeated: training rolled back"
    assert after == sorted(after) and max(steps) == example_steps()
    assert tr.done is not None and tr.done[1] == 1
    cond = c.condition(ns, JOB, "WorkerPreempted")
    assert cond and "DisruptionTarget" in cond["message"]
