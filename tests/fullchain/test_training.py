"""The whole chain on one machine: kubectl -> kube-apiserver -> operator -> real sshd workers and a
real `horovodrun` launcher running the example elastic training. The tour of scaling steps runs
through `make demo` (tests/fullchain/test_demo.py); here, a preemption notice."""

from __future__ import annotations

import time
from typing import cast

import pytest

from etoperator.localcluster.process import ProcessKubelet
from etoperator.localcluster.tour import JOB, Training, example_steps
from tests.harness import ROOT, Cluster, wait_for

pytestmark = pytest.mark.fullchain


def test_preemption_notice_shrinks_without_rollback(chain: Cluster) -> None:
    """A worker that gets a DisruptionTarget notice leaves the host list before it dies, so
    Horovod shrinks at its next commit and no committed-then-lost step is ever repeated."""
    c = chain
    kubelet = cast(ProcessKubelet, c.kubelet)
    ns = c.new_namespace()
    c.kubectl("-n", ns, "create", "-f", str(ROOT / "examples/training_job.yaml"))
    tr = Training(lambda: c.pod_log(ns, f"{JOB}-launcher"))
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
