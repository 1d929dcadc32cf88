"""Crash consistency: the operator SIGKILLed right after each write of the scale path lands.

The fault proxy kills the operator once the n-th write of a scale has reached the apiserver
(before the operator hears the answer); a new operator process takes over. For every kind of
scale and every n up to the number of writes it makes, the world must end as the scalers say:
no duplicate or orphan pod, no stuck scaler, workers as many as the successful scalers imply."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest

from etoperator import naming
from localcluster.manifests import job, scalein, scaleout, torchrun_job
from localcluster.queues import MILLICPU, QuotaWatch, make_queue
from localcluster.torchlogs import Logbook
from tests.faultproxy import Crash
from tests.harness import Cluster, wait_for
from tests.support.crashes import Step, crash_through
from tests.support.waits import running

pytestmark = [pytest.mark.integration, pytest.mark.faults]
SO, SI = "ScaleOut", "ScaleIn"
JOB = "cc"


@dataclass
class Scale:
    kind: str
    delta: int
    start: Callable[[Cluster, str, str, list[str]], None]  # cluster, ns, op name, members


def _out(c: Cluster, ns: str, name: str, members: list[str]) -> None:
    c.create(scaleout(name, JOB, 1), ns)


def _in_name(c: Cluster, ns: str, name: str, members: list[str]) -> None:
    c.create(scalein(name, JOB, pod_names=[members[1]]), ns)  # not the highest index


def _kubectl(delta: int) -> Callable[[Cluster, str, str, list[str]], None]:
    def start(c: Cluster, ns: str, name: str, members: list[str]) -> None:
        c.kubectl("scale", "tj", JOB, "-n", ns, "--replicas", str(len(members) + delta))

    return start


# Pairs that go up one worker and back: each pair a test of its own, so that the suite can run
# them side by side (tests/conftest.py), each on its own job. Between them every write of the
# scale path: a ScaleOut's, a ScaleIn's by name, a `kubectl scale` up's, and a ScaleIn by count
# (which `kubectl scale` down makes: its victims chosen, recorded, then drained).
PAIRS = {
    "ScaleOut, ScaleIn by name": [
        Scale("ScaleOut", 1, _out), Scale("ScaleIn by name", -1, _in_name)
    ],
    "kubectl scale up and down": [
        Scale("kubectl scale up", 1, _kubectl(1)), Scale("kubectl scale down", -1, _kubectl(-1))
    ],
}  # fmt: skip


def members(c: Cluster, ns: str) -> list[str]:
    return list(c.status(ns, JOB).get("targetWorkers") or [])


def scalers(c: Cluster, ns: str) -> list[dict[str, Any]]:
    return [*c.api.list(SO, ns), *c.api.list(SI, ns)]


def consistent(c: Cluster, ns: str, expected: int) -> bool:
    """The world as the scalers say: all ended well, and pods = members = hosts = spec."""
    body = c.job(ns, JOB)
    status = body.get("status") or {}
    target = list(status.get("targetWorkers") or [])
    return (
        all((s.get("status") or {}).get("phase") == "ScaleSucceeded" for s in scalers(c, ns))
        and not status.get("currentScaler")
        and len(target) == expected
        and sorted(c.pods(ns, JOB, "worker")) == sorted(target)
        and sorted(c.hosts(ns, JOB)) == sorted(target)
        and body["spec"]["etReplicaSpecs"]["worker"]["replicas"] == expected
    )


def scale_once(c: Cluster, ns: str, scale: Scale, name: str, crash_at: int | None) -> int:
    """One scale, the operator killed after its `crash_at`-th write; the writes it made."""
    before = members(c, ns)
    crash = c.proxy.arm_crash(Crash(c.operator.kill, after=crash_at or 10**9))
    scale.start(c, ns, name, before)
    expected = len(before) + scale.delta
    # A scale makes a pod that must start and be ready: on a loaded machine, over 30 s.
    # `consistent` is six requests: polled as often as a scale's steps can be told apart.
    wait_for(lambda: crash.fired or consistent(c, ns, expected), 90, f"{name} done", 0.25)
    if crash.fired:  # set as the write arrived; the kill follows once it has landed
        assert crash.killed.wait(30), "the operator was not killed"
        c.operator.start()  # a new process takes over from what it observes
    c.proxy.disarm()
    await_consistent(c, ns, expected, f"{name} consistent after a crash")
    return crash.writes


def await_consistent(c: Cluster, ns: str, expected: int, what: str) -> None:
    """Wait for `consistent`; on a timeout, print what the world looks like instead. A crashed
    scale's rest (a new process's imports, a pod to start and be probed) is over 30 s on a
    loaded machine."""
    try:
        wait_for(lambda: consistent(c, ns, expected), 90, what, 0.25)
    except AssertionError:
        print(c.describe(ns, JOB))
        print(f"spec: {c.job(ns, JOB)['spec']['etReplicaSpecs']}")
        for sc in scalers(c, ns):
            print(sc["kind"], sc["metadata"]["name"], sc.get("status"))
        raise


@pytest.mark.parametrize("pair", list(PAIRS))
def test_a_crash_at_every_write_of_a_scale_is_harmless(
    cluster: Cluster, ns: str, pair: str
) -> None:
    crash_at_every_write(cluster, ns, PAIRS[pair], job(JOB, replicas=2, maxReplicas=6))


def test_a_crash_at_every_write_of_a_torchrun_job_s_scale_is_harmless(
    cluster: Cluster, ns: str
) -> None:
    """The same for torchrun's agents (the launcher made first, a rendezvous, no SSH): and
    the run is the one it began as (its rendezvous host never remade, no restart)."""
    args = ["--steps", "100000", "--step-sleep", "0.5", "--save-every", "20"]
    body = torchrun_job(JOB, 2, args, minReplicas=1, maxReplicas=6)
    launcher = naming.launcher_name(JOB)
    uid = lambda: cluster.obj("Pod", ns, launcher)["metadata"]["uid"]
    crash_at_every_write(cluster, ns, PAIRS["ScaleOut, ScaleIn by name"], body, uid)


def crash_at_every_write(
    cluster: Cluster, ns: str, scales: list[Scale], body: Any, launcher: Callable[[], str] = str
) -> None:
    """`launcher`: the launcher's identity, the same at the end as at the start."""
    cluster.create(body, ns)
    running(cluster, ns, JOB)
    began = launcher(), cluster.status(ns, JOB).get("restartCount")
    # Each round is the pair (back to 2 workers), the operator killed after the k-th write of
    # each scale in it; a scale with fewer writes ends without a crash.
    writes = [scale_once(cluster, ns, scale, f"clean-{i}", None) for i, scale in enumerate(scales)]
    # Every scale is several writes (scaler, job status, pods, host list): each one crashed at.
    assert min(writes) >= 3, writes
    for k in range(1, max(writes) + 1):
        for i, scale in enumerate(scales):
            scale_once(cluster, ns, scale, f"crash-{k}-{i}", k)
    kubectl_ops = (max(writes) + 1) * sum(1 for s in scales if s.kind.startswith("kubectl"))
    made = [s for s in scalers(cluster, ns) if naming.ANN_SCALE_GENERATION in annots(s)]
    # One scaler per `kubectl scale`, never one the operator made out of its own write.
    assert len(made) == kubectl_ops, sorted(str(annots(s)) for s in made)
    assert (launcher(), cluster.status(ns, JOB).get("restartCount")) == began


def annots(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("annotations") or {})


def test_a_crash_as_a_scale_succeeds_never_undoes_it(cluster: Cluster, ns: str) -> None:
    cluster.create(job(JOB, replicas=2, maxReplicas=6), ns)
    running(cluster, ns, JOB)
    crash = cluster.proxy.arm_crash(
        Crash(
            cluster.operator.kill,
            when=lambda _m, path, body: (
                path.endswith("/scaleouts/a/status") and b"ScaleSucceeded" in body
            ),
        )
    )
    cluster.create(scaleout("a", JOB, 1), ns)
    cluster.create(scaleout("b", JOB, 1), ns)
    assert crash.killed.wait(30), "the operator was never killed"
    cluster.proxy.disarm()
    cluster.operator.start()
    await_consistent(cluster, ns, 4, "both ScaleOuts kept")
    assert len(scalers(cluster, ns)) == 2  # no ScaleIn made to undo one of them


def test_a_crash_at_every_write_of_a_save_then_stop_loses_no_step(
    cluster: Cluster, ns: str, request: pytest.FixtureRequest
) -> None:
    """A running job that Kueue admitted suspended, then resumed, with the operator SIGKILLed
    right after every write it makes for the job (its pods, status, host list, Workloads) and
    a new one taking over each time: the stop still lets the training save first (the
    launcher's save handshake), every pod goes, its quota is given back and taken again (no
    pod beyond what Kueue admits, sampled all along), and the resumed run goes on from the
    very next step: none lost, none repeated, no failure counted."""
    cq = make_queue(cluster, ns, pods=2)  # its 2 workers; the launcher asks nothing
    args = ["--steps", "100000", "--step-sleep", "0.1", "--save-every", "1000"]
    body = torchrun_job(JOB, 2, args, minReplicas=1, maxReplicas=4)
    body["metadata"]["labels"] = {naming.LABEL_QUEUE: "lq"}
    worker = body["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    worker["resources"] = {"requests": {"cpu": f"{MILLICPU}m"}}
    with QuotaWatch(cluster, ns, cq):
        suspended_and_resumed(cluster, ns, body, request)


def suspended_and_resumed(
    cluster: Cluster, ns: str, body: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    cluster.create(body, ns)
    book = Logbook(cluster, ns, JOB)
    request.addfinalizer(book.done.set)
    book.wait_at(2, 0, 180)
    runs = cluster.status(ns, JOB).get("restartCount") or 0
    ours = lambda _m, path, _b: f"/{JOB}" in path or f"trainingjob-{JOB}" in path

    def arm() -> Crash:
        return cluster.proxy.arm_crash(Crash(cluster.operator.kill, when=ours))

    def stopped() -> bool:
        return cluster.phase(ns, JOB) == "Suspended" and not cluster.pods(ns, JOB, live=False)

    since: list[float] = []

    def resume() -> None:
        since.append(time.time())
        cluster.api.patch(naming.JOB_KIND, ns, JOB, {"spec": {"suspend": False}})

    steps: list[Step] = [
        (partial(cluster.api.patch, naming.JOB_KIND, ns, JOB, {"spec": {"suspend": True}}),
         stopped),
        (resume, lambda: book.trains_at(2, since[0]) is not None),
    ]  # fmt: skip
    crashes = crash_through(cluster, steps, arm)
    seen = book.read()
    before = [x for x in seen.steps if x[3] < since[0]]
    after = sorted(x[0] for x in seen.steps if x[3] > since[0])
    last = max(before, key=lambda x: x[3])[0]
    assert after[0] == last + 1, f"resumed at step {after[0]}, stopped after {last}"
    saved = cluster.status(ns, JOB).get("lastSaved") or {}
    assert saved.get("step") in (None, last), saved  # said unless a crash came as it ended
    assert (cluster.status(ns, JOB).get("restartCount") or 0) == runs  # no failure counted
    assert crashes >= 4, f"only {crashes} writes were crashed after"
