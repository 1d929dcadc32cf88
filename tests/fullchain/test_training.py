"""The whole chain on one machine: kubectl -> kube-apiserver -> the operator deployed from deploy/
-> real sshd workers in containers and a real `horovodrun` launcher running the example elastic
training. The tour of scaling steps runs through `make demo` (tests/fullchain/test_demo.py);
here, a preemption notice."""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml

from localcluster.tour import JOB, Training, example_steps
from tests.harness import ROOT, Chain, wait_for

pytestmark = pytest.mark.fullchain


def test_preemption_notice_shrinks_without_rollback(chain: Chain) -> None:
    """A worker that gets a DisruptionTarget notice leaves the host list before it dies, so
    Horovod shrinks at its next commit and no committed-then-lost step is ever repeated."""
    c = chain
    ns = c.new_namespace()
    c.kubectl("-n", ns, "create", "-f", str(ROOT / "examples/training_job.yaml"))
    tr = Training(lambda: c.pod_log(ns, f"{JOB}-launcher"))
    wait_for(
        lambda: len([s for s in tr.read().steps if s[1] == 2]) >= 20,
        180,
        "training on 2 workers",
        interval=0.2,
    )
    victim = f"{JOB}-worker-1"
    t0 = time.time()
    c.disrupt(ns, victim)
    wait_for(lambda: victim not in c.hosts(ns, JOB), 5, "the noticed worker out of the list")
    wait_for(lambda: tr.first_step_at(1, t0), 60, "training on 1 worker", interval=0.2)
    shrunk = tr.first_step_at(1, t0)
    assert shrunk is not None
    print(f"preemption notice: first step at size 1 after {shrunk - t0:.2f}s")
    # The node goes away after its notice (unless the operator already deleted the drained pod).
    if victim in c.pods(ns, JOB, "worker"):
        c.kill(ns, victim)
    wait_for(lambda: c.phase(ns, JOB) == "Succeeded", 240, "the job to succeed", interval=0.5)
    steps = [s for s, *_ in tr.read().steps]
    after = [s for s, _, _, t in tr.steps if t >= t0]
    assert len(after) == len(set(after)), "a step was repeated: training rolled back"
    assert after == sorted(after) and max(steps) == example_steps()
    assert tr.done is not None and tr.done[1] == 1
    cond = c.condition(ns, JOB, "WorkerPreempted")
    assert cond and "DisruptionTarget" in cond["message"]


def test_a_non_root_launcher_is_told_at_once_why_it_cannot_train(chain: Chain) -> None:
    """On real nodes a launcher running as uid 1000 cannot read the job's key under /root/.ssh
    (nor has OpenSSH a passwd entry for it), so training could never start: the job says so
    before any pod is made, as Failed/InvalidSpec with a Warning event naming the field."""
    c = chain
    ns = c.new_namespace()
    doc = yaml.safe_load((ROOT / "examples/training_job.yaml").read_text())
    launcher = doc["spec"]["etReplicaSpecs"]["launcher"]["template"]["spec"]
    launcher["securityContext"] = {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000}
    assert c.kubectl_create(ns, doc).returncode == 0
    wait_for(lambda: c.phase(ns, JOB) == "Failed", 10, "the job to fail")
    cond = c.condition(ns, JOB, "Failed")
    assert cond is not None and cond["reason"] == "InvalidSpec"
    assert "launcher" in cond["message"] and "uid 1000" in cond["message"]
    event = c.wait_event(ns, JOB, "InvalidSpec", "Warning")
    assert "uid 1000" in event["message"]
    assert c.pods(ns, JOB) == []


def test_workers_the_scheduler_cannot_place_are_said_on_the_job(chain: Chain) -> None:
    """On real nodes, a worker asking for more CPU than any node has stays Pending: the job says
    so in the scheduler's words (WorkersPending and a Warning event) instead of sitting in
    Created without a word."""
    c = chain
    ns = c.new_namespace()
    doc = yaml.safe_load((ROOT / "examples/training_job.yaml").read_text())
    worker = doc["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    worker["resources"] = {"requests": {"cpu": "64"}}
    assert c.kubectl_create(ns, doc).returncode == 0
    workers = [f"{JOB}-worker-0", f"{JOB}-worker-1"]

    def both_named() -> dict[str, Any] | None:
        """The scheduler marks the pods one at a time: the message follows until both."""
        cond = c.condition(ns, JOB, "WorkersPending")
        return cond if cond and all(w in cond["message"] for w in workers) else None

    cond = wait_for(both_named, 30, "WorkersPending naming both workers")
    assert (
        cond is not None and cond["status"] == "True" and "Insufficient cpu" in cond["message"]
    ), cond
    event = c.wait_event(ns, JOB, "WorkersPending", "Warning")
    assert "Insufficient cpu" in event["message"]
    assert c.phase(ns, JOB) == "Created"
