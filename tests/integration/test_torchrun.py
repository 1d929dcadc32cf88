"""Torchrun jobs on the real nodes: real torchrun agents, the rendezvous the launcher holds,
checkpoints on a volume every worker reaches; scaled by the same ScaleOut and ScaleIn, a
worker killed. After each change the job trains on at the new size from where it was, and a
planned change uses up none of the agents' --max-restarts."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from etoperator import clock, naming
from localcluster import digits, torchtour
from localcluster.manifests import IMAGE, scaleout, torchrun_job
from localcluster.queues import (
    KUEUE,
    MILLICPU,
    QuotaWatch,
    admitted_workers,
    core_workloads,
    make_queue,
    queued_job,
)
from localcluster.torchlogs import NOISE, Logbook, Seen
from localcluster.tour import TRANSITION_TIMEOUT
from tests.harness import Cluster, wait_for
from tests.support import samples

pytestmark = pytest.mark.integration
SAVE_EVERY = 5


def continued(s: Seen, size: int, since: float) -> None:
    """The run at the new size went on from the last checkpoint before the change: its first
    step is at most SAVE_EVERY steps behind the last step taken before, never back at 0."""
    first = min((x for x in s.steps if x[1] == size and x[3] > since), key=lambda x: x[3])
    last = max((x for x in s.steps if x[3] < first[3]), key=lambda x: x[3])
    assert last[0] - SAVE_EVERY <= first[0] - 1 <= last[0], (last, first)


def training(
    cluster: Cluster,
    ns: str,
    request: pytest.FixtureRequest,
    save_every: int = SAVE_EVERY,
    apart: bool = False,
) -> Logbook:
    """Job `tr` of 2 workers (1 to 4) training on; its rank 0's lines read all along. `apart`:
    the launcher on the first node, the workers on the second."""
    args = ["--steps", "100000", "--step-sleep", "0.1", "--save-every", str(save_every)]
    body = torchrun_job("tr", 2, args, minReplicas=1, maxReplicas=4)
    if apart:
        first, second = ({"kubernetes.io/hostname": n} for n in cluster.node_names()[:2])
        worker = body["spec"]["etReplicaSpecs"]["worker"]
        worker["template"]["spec"]["nodeSelector"] = second
        rendezvous = {"name": "rendezvous", "image": IMAGE, "imagePullPolicy": "IfNotPresent"}
        launcher = {"containers": [rendezvous], "nodeSelector": first}
        body["spec"]["etReplicaSpecs"]["launcher"] = {"template": {"spec": launcher}}
    cluster.create(body, ns)
    book = reported(Logbook(cluster, ns, "tr"), request)
    book.wait_at(2, 0, 180)
    return book


def reported(book: Logbook, request: pytest.FixtureRequest) -> Logbook:
    """`book`, read until the test ends; a failed test prints what the workers said (the
    leaving ones' too, gone with their pods)."""

    def done() -> None:
        book.done.set()
        if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
            print(book.said())

    request.addfinalizer(done)
    return book


@pytest.fixture
def logs(cluster: Cluster, ns: str, request: pytest.FixtureRequest) -> Iterator[None]:
    """A failed test shows what its jobs' pods said (rank 0's lines, torch's own)."""
    yield
    if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
        for pod in sorted(p["metadata"]["name"] for p in cluster.api.list("Pod", ns)):
            lines = [x for x in cluster.pod_log(ns, pod).splitlines() if not x.startswith(NOISE)]
            print(f"--- {pod} ---\n" + "\n".join(lines[-40:]))
            print(f"--- {pod}: where its processes stand ---\n{cluster.stacks(ns, pod)}")


def test_the_demo_s_torchrun_tour_trains_every_sample_and_matches_a_static_run(
    cluster: Cluster, ns: str, request: pytest.FixtureRequest
) -> None:
    """`make demo ARGS=--runtime=Torchrun`'s tour on the real nodes, examples/torchrun/ as a
    user runs them (the digits, a CNN, under torchrun): ScaleOut +2, ScaleIn by name,
    `kubectl scale` down, a killed worker, to its end; against the same epochs under plain
    `torchrun` on this machine. After each resize rank 0 trains at the new size from its last
    checkpoint; the planned changes used no restart, lost at most the step each cut, and the
    kill exactly one restart and the steps since the last save; every sample of every epoch
    is trained into the model that goes on; the test accuracy is within a point of the
    static run's."""
    job = torchtour.JOB
    # Half the demo's epochs, at a faster pace: the same tour, less of the suite's time.
    epochs = torchtour.example_arg("epochs") // 2
    extra = ("--log-samples=/checkpoints/samples", f"--epochs={epochs}", "--step-sleep=0.02")
    reference: list[digits.Run] = []
    static = threading.Thread(
        target=lambda: reference.append(
            digits.kept(lambda: digits.static_torchrun(epochs), "torchrun", epochs)
        )
    )
    static.start()

    def kubectl(*args: str, check: bool = True, input: str | None = None) -> Any:
        return cluster.kubectl(*args, "-n", ns, check=check, input=input)

    book = Logbook(cluster, ns, job)
    request.addfinalizer(book.done.set)
    tour = torchtour.TorchrunTour(
        kubectl, book, lambda pod: cluster.kill(ns, pod), lambda k, n: cluster.status(ns, n, k)
    )
    try:
        timings = tour.run(extra=extra)
    except AssertionError:  # what the job's pods said (rank 0's lines, torch's own)
        print(f"--- {job}-launcher ---\n{cluster.pod_log(ns, f'{job}-launcher')[-3000:]}")
        print(book.said())
        raise
    assert set(timings) == {"scale_out_+2", "scale_in_by_name", "kubectl_scale_2", "worker_killed"}
    elastic = digits.Run(book.epochs())
    assert elastic.epochs[-1].size == 1, f"the tour ended after the training: {elastic.text}"

    claim = cluster.obj("PersistentVolumeClaim", ns, f"{job}-shared")
    volume = cluster.api.get_cluster("PersistentVolume", claim["spec"]["volumeName"])
    assert volume is not None
    logged = samples.read(Path(volume["spec"]["hostPath"]["path"]) / "samples")
    cov, lost = samples.resumed(logged, digits.TRAIN_SAMPLES)
    assert sorted(cov.missed) == list(range(epochs))
    assert cov.problems(digits.MAX_RANKS - 1) == [], sorted((b.epoch, b.commit, b.t) for b in lost)
    # A batch's key is its step's place; the runs before the one at 2 ended at planned changes
    killed = book.first_at(1, 0)
    assert killed is not None
    at_2 = min(x[3] for x in book.read().steps if x[1] == 2 and x[3] < killed)
    cut = {(b.epoch, b.commit) for b in lost if b.t < at_2 - 1}
    assert len(cut) <= 3, f"steps lost to planned changes: {sorted(cut)}"
    rolled_back = {(b.epoch, b.commit) for b in lost if b.t >= at_2 - 1}
    assert len(rolled_back) <= 2 * torchtour.example_arg("save-every", extra), sorted(rolled_back)

    static.join(timeout=600)
    assert reference and reference[0].accuracy is not None and elastic.accuracy is not None
    print(
        f"test accuracy after {epochs} epochs: static {reference[0].accuracy:.4f}, elastic "
        f"{elastic.accuracy:.4f}; {cov.lost_samples} samples' updates lost, trained again"
    )
    assert reference[0].accuracy >= 0.95
    assert abs(elastic.accuracy - reference[0].accuracy) <= 0.01


def test_a_torchrun_job_that_ends_succeeds_and_its_run_ends_with_it(
    cluster: Cluster, ns: str, logs: None
) -> None:
    """The launcher's exit is the run's: every agent passed torch's exit barrier. The
    checkpoint is on the job's claim, a volume the local-path provisioner made. Its workers
    are a gang (placed whole, the launcher apart)."""
    body = torchrun_job("short", 2, ["--steps", "20"])
    body["spec"]["schedulingPolicy"] = {"minAvailable": 2}
    cluster.create(body, ns)
    group = naming.pod_group_name("short")
    wait_for(lambda: len(cluster.pods(ns, "short", "worker")) == 2, 60, "the workers")
    assert cluster.obj(naming.POD_GROUP_KIND, ns, group)["spec"]["schedulingPolicy"] == {
        "gang": {"minCount": 2}
    }
    for pod in cluster.pods(ns, "short", "worker"):
        assert cluster.obj("Pod", ns, pod)["spec"]["schedulingGroup"]["podGroupName"] == group
    wait_for(lambda: cluster.phase(ns, "short") in ("Succeeded", "Failed"), 180, "the end")
    assert cluster.phase(ns, "short") == "Succeeded", cluster.pod_log(ns, "short-launcher")
    assert "exit barrier passed" in cluster.pod_log(ns, "short-launcher")
    claim = cluster.obj("PersistentVolumeClaim", ns, "short-shared")
    assert claim["status"]["phase"] == "Bound"
    volume = cluster.api.get_cluster("PersistentVolume", claim["spec"]["volumeName"])
    assert volume is not None
    path = Path(volume["spec"]["hostPath"]["path"])
    assert (path / "checkpoint.pt").exists(), sorted(path.iterdir())
    # torchrun's agents meet at the rendezvous, not over SSH: no key pair is made or given
    assert cluster.api.get("Secret", ns, naming.secret_name("short")) is None


def test_kubectl_scale_and_a_drain_of_a_torchrun_worker_are_planned_changes(
    cluster: Cluster, ns: str, logs: None, request: pytest.FixtureRequest
) -> None:
    """`kubectl scale` up, `kubectl drain` of the node holding the new worker (an eviction,
    as spot reclaims and upgrades make), then a preemption notice (DisruptionTarget) on a
    worker: each resizes the run without a failure."""
    book = training(cluster, ns, request)

    since = time.time()
    cluster.kubectl("scale", "tj", "tr", "-n", ns, "--replicas", "3")
    # a new worker's first step: 62 s of 90 once under the suite's load (as the queued test's)
    continued(book.wait_at(3, since, TRANSITION_TIMEOUT), 3, since)

    node = cluster.obj("Pod", ns, "tr-worker-2")["spec"]["nodeName"]
    since = time.time()
    cluster.kubectl(
        "drain", node, "--pod-selector=training-job-name=tr,replica-index=2",
        "--ignore-daemonsets", "--timeout=60s",
    )  # fmt: skip
    drained = book.wait_at(2, since, 60)
    continued(drained, 2, since)
    assert {r for _, r in drained.starts} == {0}, f"planned changes used restarts: {drained}"
    wait_for(lambda: cluster.pods(ns, "tr", "worker") == ["tr-worker-0", "tr-worker-1"], 30)
    assert cluster.phase(ns, "tr") == "Running"

    since = time.time()
    cluster.disrupt(ns, "tr-worker-1")  # the pod goes once it left the rendezvous
    noticed = book.wait_at(1, since, 60)
    continued(noticed, 1, since)
    assert {r for _, r in noticed.starts} == {0}, f"a notice used restarts: {noticed}"
    wait_for(lambda: cluster.pods(ns, "tr", "worker") == ["tr-worker-0"], 30, "the noticed gone")
    cond = cluster.condition(ns, "tr", "WorkerPreempted") or {}
    assert "DisruptionTarget" in str(cond.get("message")), cond


def test_a_queued_torchrun_job_grows_through_a_slice_and_shrinks_when_preempted(
    cluster: Cluster, ns: str, logs: None, request: pytest.FixtureRequest
) -> None:
    """Kueue admits the job at 2 workers, then the ScaleOut's slice at 3; a job of higher
    priority then takes its surplus: it trains on at its core (1 worker) from its checkpoint,
    using none of the agents' restarts, and grows back to 3 once the newcomer is gone. What
    Kueue counts (sampled all along) never falls short of the pods."""
    cq = make_queue(cluster, ns, pods=3, preempt=True)  # 3 workers; the launcher asks nothing
    args = ["--steps", "100000", "--step-sleep", "0.1", "--save-every", str(SAVE_EVERY)]
    body = torchrun_job("tr", 2, args, minReplicas=1, maxReplicas=4)
    body["metadata"]["labels"] = {naming.LABEL_QUEUE: "lq"}
    worker = body["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    worker["resources"] = {"requests": {"cpu": f"{MILLICPU}m"}}
    with QuotaWatch(cluster, ns, cq):
        cluster.create(body, ns)
        book = reported(Logbook(cluster, ns, "tr"), request)
        book.wait_at(2, 0, 180)
        since = time.time()
        cluster.create(scaleout("out", "tr", 1, timeout=120), ns)
        wait_for(lambda: cluster.phase(ns, "out", "ScaleOut") == "ScaleSucceeded", 150)
        # A new worker's first step, as the tour's resizes wait for it (TRANSITION_TIMEOUT):
        # under the suite's load 45-85 s (every rank joined, DDP's first broadcast 15 s later).
        grown = book.wait_at(3, since, TRANSITION_TIMEOUT)
        continued(grown, 3, since)
        assert admitted_workers(cluster, ns, "tr") == 3
        assert {r for _, r in grown.starts} == {0}
        wpc = {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass",
               "metadata": {"name": f"high-{ns}"}, "value": 1000}  # fmt: skip
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(wpc))
        high = queued_job("high", replicas=1)  # its launcher and worker: 2 pods' quota
        high["metadata"]["labels"][naming.LABEL_KUEUE_PRIORITY] = f"high-{ns}"
        since = time.time()
        cluster.create(high, ns)
        shrunk = book.wait_at(1, since, 90)
        continued(shrunk, 1, since)
        assert {r for _, r in shrunk.starts} == {0}, f"a preemption used restarts: {shrunk}"
        wait_for(lambda: cluster.phase(ns, "high") == "Running", 60, "the newcomer running")
        since = time.time()
        cluster.kubectl("delete", "tj", "high", "-n", ns, "--wait=false")
        back = book.wait_at(3, since, TRANSITION_TIMEOUT)
        continued(back, 3, since)
        assert (
            cluster.phase(ns, "tr") == "Running" and cluster.status(ns, "tr")["restartCount"] == 0
        )
        deleted_workload_loses_nothing(cluster, ns, book)


def deleted_workload_loses_nothing(cluster: Cluster, ns: str, book: Logbook) -> None:
    """Its core Workload deleted by hand: no admission holds its pods, so the job stops and
    queues again (as Kueue's own integrations do), says so, and saves first: the new run goes
    on from the very next step (none lost, none repeated), and the status names the save."""
    core = core_workloads(cluster, ns, "tr")[0]["metadata"]["name"]
    launcher = cluster.obj("Pod", ns, "tr-launcher")["metadata"]["uid"]
    since = time.time()
    cluster.kubectl("delete", "workloads.kueue.x-k8s.io", core, "-n", ns, "--wait=false")
    cluster.wait_event(ns, "tr", "WorkloadDeleted", "Warning")

    def new_run() -> bool:
        pod = cluster.api.get("Pod", ns, "tr-launcher") or {}
        return (pod.get("metadata") or {}).get("uid") not in (None, launcher)

    wait_for(new_run, 90, "a new run's launcher")
    book.wait_at(3, time.time(), 180)
    steps = [x[0] for x in book.read().steps if x[3] > since]
    assert steps == list(range(steps[0], steps[0] + len(steps))), f"lost or repeated: {steps}"
    saved = cluster.status(ns, "tr").get("lastSaved") or {}
    # the step the stop saved: one after the delete, or the last before it (the stop came
    # between two steps, before a step was taken after the delete)
    assert saved.get("step") in [steps[0] - 1, *steps[:-3]], (saved, steps)


def test_a_suspended_torchrun_job_resumes_from_where_it_stopped(
    cluster: Cluster, ns: str, logs: None, request: pytest.FixtureRequest
) -> None:
    """A whole stop (spec.suspend) and a fresh run: the training saved as the run stopped (the
    launcher's save handshake, or the workers' SIGTERM) at a step's end, the job says which
    step, the claim outlived the run, and the new run resumes from it."""
    book = training(cluster, ns, request, save_every=1000, apart=True)
    # The launcher's node slow to act (its kubelet stopped): the workers' leaves reach the
    # rendezvous before the launcher's preStop asks for the save. Taken as membership changes
    # they restarted the training mid-step and the stop saved nothing; they wait for the save.
    with cluster.paused_kubelet(cluster.obj("Pod", ns, "tr-launcher")["spec"]["nodeName"]):
        cluster.api.patch(naming.JOB_KIND, ns, "tr", {"spec": {"suspend": True}})
        answers = wait_for(lambda: leaves_answered(cluster, ns), 60, "the workers' leaves")
    assert all("the whole run stops" in a for a in answers), answers
    # a stop waits out no grace period: the launcher ends at SIGTERM, each worker once it saved
    assert gone_before_their_grace(cluster, ns) == [], "waited out its grace period"
    last = book.read().last()
    assert last is not None and last[0] < 1000  # no periodic save yet: only the stop's
    saved = cluster.status(ns, "tr").get("lastSaved") or {}
    assert saved.get("step") == last[0], saved  # reported by the launcher's stop
    since = time.time()
    cluster.api.patch(naming.JOB_KIND, ns, "tr", {"spec": {"suspend": False}})
    resumed = book.wait_at(2, since, 180)
    first = min((x for x in resumed.steps if x[3] > since), key=lambda x: x[3])
    assert first[0] == last[0] + 1, f"resumed at {first}, stopped after {last}"
    stopped_unseen(cluster, ns, book)


def gone_before_their_grace(cluster: Cluster, ns: str) -> list[str]:
    """Waits until the test's pods are gone; names those seen after their deletionTimestamp
    (the apiserver's deletion moment plus the grace period: the kubelet's SIGKILL). Judged by
    each pod's own deadline, not a fixed wait a loaded machine overruns."""
    late: set[str] = set()

    def gone() -> bool:
        now = clock.utcnow()  # before the list: a pod it shows was there then
        pods = cluster.api.list("Pod", ns)
        for pod in pods:
            deadline = clock.parse_iso(pod["metadata"].get("deletionTimestamp"))
            # a second's slack: the timestamp is whole seconds
            if deadline is not None and now > deadline + timedelta(seconds=1):
                late.add(pod["metadata"]["name"])
        return not pods

    wait_for(gone, 90, "every pod gone")
    return sorted(late)


def leaves_answered(cluster: Cluster, ns: str) -> list[str]:
    """What each worker's leave was answered, once each was (none until then)."""
    answers = []
    for pod in ("tr-worker-0", "tr-worker-1"):
        log = cluster.pod_log(ns, pod).split("leave: holding the agent", 1)[1:]
        said = [x for x in "".join(log).splitlines() if x.startswith("leave: ")]
        if not said:
            return []
        answers.append(said[0])
    return answers


def stopped_unseen(cluster: Cluster, ns: str, book: Logbook) -> None:
    """Stopped again with the operator down from the launcher's delete until its pod is gone:
    the stop's report went with the pod (status.lastSaved kept the first stop's). The next
    run's launcher finds it on the volume and the status says it; training goes on from it."""

    def deleting() -> bool:
        pod = cluster.api.get("Pod", ns, "tr-launcher")
        return pod is None or bool(pod["metadata"].get("deletionTimestamp"))

    cluster.api.patch(naming.JOB_KIND, ns, "tr", {"spec": {"suspend": True}})
    wait_for(deleting, 30, "the launcher deleted", 0.05)
    cluster.operator.kill()
    wait_for(lambda: cluster.api.get("Pod", ns, "tr-launcher") is None, 60, "the launcher gone")
    cluster.operator.start()
    wait_for(lambda: not cluster.pods(ns, "tr", live=False), 60, "every pod gone")
    last = book.read().last()
    assert last is not None
    since = time.time()
    cluster.api.patch(naming.JOB_KIND, ns, "tr", {"spec": {"suspend": False}})

    def said() -> object:
        return (cluster.status(ns, "tr").get("lastSaved") or {}).get("step")

    wait_for(lambda: said() == last[0], 180, f"lastSaved at step {last[0]}")
    resumed = book.wait_at(2, since, 180)
    first = min((x for x in resumed.steps if x[3] > since), key=lambda x: x[3])
    assert first[0] == last[0] + 1, f"resumed at {first}, stopped after {last}"
