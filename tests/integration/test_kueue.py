"""Shared clusters: jobs queued and admitted by the real Kueue (v0.17.0, its manager, CRDs and
webhooks on the local cluster), scaled within their quota, evicted and requeued without loss.

Each test has its own ResourceFlavor, ClusterQueue (for its namespace only) and LocalQueue;
quota is in CPU requests: the launcher and each worker ask for 100m."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import yaml

from etoperator import naming
from localcluster.manifests import scalein, scaleout
from localcluster.queues import (
    KUEUE,
    QuotaWatch,
    admitted_workers,
    core_workloads,
    is_surplus,
    live_workloads,
    make_queue,
    queued_job,
    workloads,
)
from tests.faultproxy import Crash
from tests.harness import Cluster, wait_for
from tests.support.crashes import Step, crash_through

pytestmark = pytest.mark.integration


def queued(cluster: Cluster, ns: str, name: str, reason: str = "Queued") -> bool:
    cond = cluster.condition(ns, name, "Queued") or {}
    return cond.get("status") == "True" and cond.get("reason") == reason


def running(cluster: Cluster, ns: str, name: str, workers: int) -> bool:
    return cluster.phase(ns, name) == "Running" and len(cluster.hosts(ns, name)) == workers


def test_a_job_waits_for_quota_and_runs_when_the_first_ends(cluster: Cluster, ns: str) -> None:
    make_queue(cluster, ns, pods=4)  # one job of a launcher and two workers fits, not two
    cluster.create(queued_job("first"), ns)
    wait_for(partial(running, cluster, ns, "first", 2), 60, "first running")
    cluster.create(queued_job("second"), ns)

    def says_why() -> bool:  # in Kueue's words
        message = str((cluster.condition(ns, "second", "Queued") or {}).get("message"))
        return queued(cluster, ns, "second") and "lq" in message and "quota" in message

    wait_for(says_why, 20, "second queued for quota")
    assert cluster.phase(ns, "second") == "Queued"
    assert cluster.pods(ns, "second", live=False) == []
    # One core Workload per job, owned by it, never its pods' label.
    for name in ("first", "second"):
        (wl,) = core_workloads(cluster, ns, name)
        ref = wl["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["name"], ref["controller"]) == ("TrainingJob", name, True)
        uid = cluster.job(ns, name)["metadata"]["uid"]
        assert wl["metadata"]["labels"][naming.KUEUE_JOB_UID] == uid
    for pod in cluster.pods(ns, "first"):
        labels = cluster.obj("Pod", ns, pod)["metadata"].get("labels") or {}
        assert naming.LABEL_QUEUE not in labels
    cluster.finish(ns, "first-launcher", 0)
    wait_for(lambda: cluster.phase(ns, "first") == "Succeeded", 30, "first succeeded")
    wait_for(lambda: live_workloads(cluster, ns, "first") == [], 10, "its Workload finished")
    wait_for(partial(running, cluster, ns, "second", 2), 60, "second running")
    assert (cluster.condition(ns, "second", "Queued") or {}).get("reason") == "Admitted"


def test_partial_admission_starts_small_and_grows_when_quota_frees(
    cluster: Cluster, ns: str
) -> None:
    make_queue(cluster, ns, pods=4)
    cluster.create(queued_job("holder", replicas=1), ns)  # takes 2 of the 4
    wait_for(partial(running, cluster, ns, "holder", 1), 60, "holder running")
    cluster.create(queued_job("elastic", replicas=3, minReplicas=1), ns)
    wait_for(partial(running, cluster, ns, "elastic", 1), 60, "elastic running at 1 of 3")
    assert cluster.job(ns, "elastic")["spec"]["etReplicaSpecs"]["worker"]["replicas"] == 3
    cluster.finish(ns, "holder-launcher", 0)
    wait_for(partial(running, cluster, ns, "elastic", 3), 60, "elastic grown to 3")
    assert admitted_workers(cluster, ns, "elastic") == 3
    # The core (the launcher, minReplicas workers) and the surplus that grew it.
    assert sorted(is_surplus(w) for w in live_workloads(cluster, ns, "elastic")) == [False, True]


def test_scale_out_waits_for_quota_then_grows_or_rolls_back(cluster: Cluster, ns: str) -> None:
    make_queue(cluster, ns, pods=6)
    cluster.create(queued_job("a", replicas=2, maxReplicas=4), ns)
    cluster.create(queued_job("b", replicas=2, maxReplicas=4), ns)
    for name in ("a", "b"):
        wait_for(partial(running, cluster, ns, name, 2), 60, f"{name} running")
    # No room: a's ScaleOut waits, says so, and is rolled back at its timeout, its slice gone.
    cluster.create(scaleout("a-more", "a", 1, timeout=8), ns)
    wait_for(
        lambda: "WaitingForQuota" in str(cluster.condition(ns, "a-more", "Scaling", "ScaleOut"))
        and len(live_workloads(cluster, ns, "a")) == 3,  # core, surplus, its slice
        15, "waiting for quota, its slice made",
    )  # fmt: skip
    assert len(cluster.pods(ns, "a", role="worker")) == 2
    wait_for(lambda: cluster.phase(ns, "a-more", "ScaleOut") == "ScaleFailed", 20, "rolled back")
    wait_for(lambda: len(live_workloads(cluster, ns, "a")) == 2, 15, "slice removed")
    assert running(cluster, ns, "a", 2)
    wait_for(lambda: cluster.job(ns, "a")["spec"]["etReplicaSpecs"]["worker"]["replicas"] == 2,
             10, "spec replicas back to 2")  # fmt: skip
    # Again, and b's ScaleIn frees the room: a grows.
    cluster.create(scaleout("a-again", "a", 1, timeout=60), ns)
    wait_for(
        lambda: "WaitingForQuota" in str(cluster.condition(ns, "a-again", "Scaling", "ScaleOut")),
        15, "waiting for quota",
    )  # fmt: skip
    cluster.create(scalein("b-less", "b", count=1), ns)
    wait_for(lambda: cluster.phase(ns, "b-less", "ScaleIn") == "ScaleSucceeded", 30)
    wait_for(lambda: cluster.phase(ns, "a-again", "ScaleOut") == "ScaleSucceeded", 60)
    # The scaler's success is written a moment before its job's status leaves Scaling.
    for name, size in (("a", 3), ("b", 1)):
        wait_for(partial(running, cluster, ns, name, size), 10, f"{name} running at {size}")
    assert admitted_workers(cluster, ns, "a") == 3
    (wl_b,) = live_workloads(cluster, ns, "b")
    worker_set = next(ps for ps in wl_b["spec"]["podSets"] if ps["name"] == "worker")
    assert worker_set["count"] == 1  # b gave its quota back: what let a grow


def test_a_preempted_job_stops_is_requeued_and_finishes_once(cluster: Cluster, ns: str) -> None:
    make_queue(cluster, ns, pods=3, preempt=True)
    priorities(cluster, ns)
    cluster.create(with_priority(queued_job("low"), ns, "low"), ns)
    wait_for(partial(running, cluster, ns, "low", 2), 60, "low running")
    first_pods = {cluster.obj("Pod", ns, p)["metadata"]["uid"] for p in cluster.pods(ns, "low")}
    cluster.create(with_priority(queued_job("high"), ns, "high"), ns)
    wait_for(partial(running, cluster, ns, "high", 2), 60, "high running")
    assert cluster.pods(ns, "low") == [] and cluster.phase(ns, "low") == "Queued"
    assert "Preempted" in cluster.wait_event(ns, "low", "Evicted", "Warning")["message"]
    message = str((cluster.condition(ns, "low", "Queued") or {}).get("message"))
    assert "again after an eviction" in message, message
    cluster.finish(ns, "high-launcher", 0)
    wait_for(partial(running, cluster, ns, "low", 2), 60, "low running again")
    again = {cluster.obj("Pod", ns, p)["metadata"]["uid"] for p in cluster.pods(ns, "low")}
    assert not again & first_pods  # a fresh run: new pods, nothing left of the first
    cluster.finish(ns, "low-launcher", 0)
    wait_for(lambda: cluster.phase(ns, "low") == "Succeeded", 30, "low succeeded")
    # Finished is written after the job's own status, in the same pass (a crash between the two
    # must not read as Kueue ending the job).
    wait_for(lambda: live_workloads(cluster, ns, "low") == [], 30, "low's Workload finished")


def priorities(cluster: Cluster, ns: str) -> None:
    for name, value in (("low", 10), ("high", 1000)):
        body = {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass",
                "metadata": {"name": f"{name}-{ns}"}, "value": value}  # fmt: skip
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))


def with_priority(body: dict[str, Any], ns: str, level: str) -> dict[str, Any]:
    body["metadata"]["labels"][naming.LABEL_KUEUE_PRIORITY] = f"{level}-{ns}"
    return body


def test_a_preemption_takes_the_surplus_the_job_trains_on_and_grows_back(
    cluster: Cluster, ns: str
) -> None:
    """Shrink instead of evict: a job of 4 (min 2) fills its ClusterQueue; a higher-priority
    job needs two pods' quota. Kueue takes the surplus only: its two workers leave the host
    list and go, the job runs on at 2 with the same launcher (never out of Running), the
    newcomer is admitted; once it ends the job grows back to 4. Quota as Kueue counts it is
    sampled all along."""
    cq = make_queue(cluster, ns, pods=5, preempt=True)
    priorities(cluster, ns)
    with QuotaWatch(cluster, ns, cq):
        cluster.create(with_priority(queued_job("low", replicas=4, minReplicas=2), ns, "low"), ns)
        wait_for(partial(running, cluster, ns, "low", 4), 90, "low running at 4")
        launcher = cluster.obj("Pod", ns, "low-launcher")["metadata"]["uid"]
        extra = {p for p in cluster.pods(ns, "low", role="worker") if surplus_pod(cluster, ns, p)}
        assert len(extra) == 2, extra
        seen: set[str | None] = set()

        def shrunk() -> bool:
            seen.add(cluster.phase(ns, "low"))
            return running(cluster, ns, "high", 1) and running(cluster, ns, "low", 2)

        cluster.create(with_priority(queued_job("high", replicas=1), ns, "high"), ns)
        wait_for(shrunk, 90, "high admitted, low trains on at 2")
        assert seen <= {"Running", "Scaling"}, seen
        assert cluster.obj("Pod", ns, "low-launcher")["metadata"]["uid"] == launcher
        assert cluster.status(ns, "low").get("restartCount") == 0
        assert not extra & set(cluster.pods(ns, "low", live=False))  # the surplus's went
        assert cluster.job(ns, "low")["spec"]["etReplicaSpecs"]["worker"]["replicas"] == 4
        said = cluster.wait_event(ns, "low", "QuotaReclaimed", "Normal")["message"]
        assert all(name in said for name in extra), said
        message = str((cluster.condition(ns, "low", "Queued") or {}).get("message"))
        assert "took back" in message, message
        cluster.finish(ns, "high-launcher", 0)
        wait_for(partial(running, cluster, ns, "low", 4), 90, "low grown back to 4")
        assert cluster.obj("Pod", ns, "low-launcher")["metadata"]["uid"] == launcher
    assert admitted_workers(cluster, ns, "low") == 4


def test_a_borrowed_surplus_is_what_a_lending_queue_reclaims(cluster: Cluster, ns: str) -> None:
    """A cohort of two ClusterQueues of 3 pods each: a job of 4 (min 2) in the first runs on 5
    pods, its surplus borrowing 2 of the second's; a job in the second (within its own quota)
    reclaims them: Kueue takes the borrower's surplus only, which shrinks to 2 and runs on
    with the same launcher; the lender's job runs."""
    flavor = f"f-{ns}"
    docs: list[dict[str, Any]] = [
        {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": flavor}}
    ]
    for side in ("a", "b"):
        quota = [{"name": "cpu", "nominalQuota": "300m"}]
        spec = {
            "cohortName": f"co-{ns}",
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "preemption": {"reclaimWithinCohort": "Any"},
            "resourceGroups": [{"coveredResources": ["cpu"],
                                "flavors": [{"name": flavor, "resources": quota}]}],
        }  # fmt: skip
        docs += [
            {"apiVersion": KUEUE, "kind": "ClusterQueue",
             "metadata": {"name": f"cq-{side}-{ns}"}, "spec": spec},
            {"apiVersion": KUEUE, "kind": "LocalQueue",
             "metadata": {"name": f"lq-{side}", "namespace": ns},
             "spec": {"clusterQueue": f"cq-{side}-{ns}"}},
        ]  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    cluster.create(queued_job("borrower", "lq-a", replicas=4, minReplicas=2), ns)
    wait_for(partial(running, cluster, ns, "borrower", 4), 90, "the borrower at 4")
    launcher = cluster.obj("Pod", ns, "borrower-launcher")["metadata"]["uid"]
    seen: set[str | None] = set()

    def shrunk() -> bool:
        seen.add(cluster.phase(ns, "borrower"))
        return running(cluster, ns, "lender", 2) and running(cluster, ns, "borrower", 2)

    cluster.create(queued_job("lender", "lq-b"), ns)
    wait_for(shrunk, 90, "the lender running, the borrower at 2")
    assert seen <= {"Running", "Scaling"}, seen
    assert cluster.obj("Pod", ns, "borrower-launcher")["metadata"]["uid"] == launcher
    cluster.wait_event(ns, "borrower", "QuotaReclaimed", "Normal")


def surplus_pod(cluster: Cluster, ns: str, pod: str) -> bool:
    labels = cluster.obj("Pod", ns, pod)["metadata"].get("labels") or {}
    return labels.get("etoperator.kai.alibabacloud.com/surplus") == "true"


def test_with_kueue_not_answering_a_queued_job_says_so_then_starts(
    cluster: Cluster, ns: str
) -> None:
    make_queue(cluster, ns, pods=3)
    kueue = cluster.local.queues
    assert kueue is not None
    kueue.kill()  # its webhooks refuse every Workload
    try:
        cluster.create(queued_job("alone"), ns)
        wait_for(partial(queued, cluster, ns, "alone", "KueueNotAnswering"), 20, "said")
        assert cluster.pods(ns, "alone", live=False) == []
        assert cluster.phase(ns, "alone") == "Queued"
        cluster.wait_event(ns, "alone", "KueueNotAnswering", "Warning")
    finally:
        kueue.restart()
    wait_for(partial(running, cluster, ns, "alone", 2), 60, "running once Kueue is back")


def test_admission_places_pods_on_the_flavor_s_nodes(cluster: Cluster, ns: str) -> None:
    node = cluster.node_names()[1]
    cluster.kubectl("label", "node", node, f"pool-{ns}=yes")
    try:
        make_queue(cluster, ns, pods=3, labels={f"pool-{ns}": "yes"})
        cluster.create(queued_job("placed"), ns)
        wait_for(partial(running, cluster, ns, "placed", 2), 60, "running")
        for pod in cluster.pods(ns, "placed"):
            body = cluster.obj("Pod", ns, pod)
            assert body["spec"]["nodeSelector"] == {f"pool-{ns}": "yes"}
            assert body["spec"]["nodeName"] == node
    finally:
        cluster.kubectl("label", "node", node, f"pool-{ns}-")


@pytest.mark.faults
def test_a_crash_at_every_write_of_admission_and_slicing_leaks_no_quota(
    cluster: Cluster, ns: str
) -> None:
    """Through a job's life (admission, a ScaleOut through a slice, a ScaleIn, its end) the
    operator is SIGKILLed right after every Workload write it makes (made, PodsReady, a slice
    made, resized, finished), and a new one takes over each time: each step still ends with
    one core and at most one surplus Workload, no slice left over, no pod beyond what Kueue
    admitted (sampled all along), the Workloads asking for what runs, and the ended job
    holding no quota."""
    cq = make_queue(cluster, ns, pods=5)

    def consistent(workers: int) -> bool:
        live = live_workloads(cluster, ns, "cc")
        families = sorted(is_surplus(w) for w in live)
        if families not in ([False], [False, True]) or not running(cluster, ns, "cc", workers):
            return False
        sets = [ps for w in live for ps in w["spec"]["podSets"] if ps["name"] == "worker"]
        asked = sum(ps["count"] for ps in sets)
        pods = cluster.pods(ns, "cc", role="worker")
        return asked == workers and len(pods) == workers <= admitted_workers(cluster, ns, "cc")

    def ended() -> bool:
        return cluster.phase(ns, "cc") == "Succeeded" and live_workloads(cluster, ns, "cc") == []

    def arm() -> Crash:
        return cluster.proxy.arm_crash(
            Crash(cluster.operator.kill, when=lambda _m, path, _b: "/workloads" in path)
        )

    steps: list[tuple[Callable[[], object], Callable[[], bool]]] = [
        (partial(cluster.create, queued_job("cc", maxReplicas=3), ns), partial(consistent, 2)),
        (partial(cluster.create, scaleout("cc-o", "cc", 1, timeout=120), ns),
         partial(consistent, 3)),
        (partial(cluster.create, scalein("cc-i", "cc", count=1), ns), partial(consistent, 2)),
        (partial(cluster.finish, ns, "cc-launcher", 0), ended),
    ]  # fmt: skip
    with QuotaWatch(cluster, ns, cq):  # sampled between and across every crash
        crashes = crash_through(cluster, steps, arm)
    for sc, kind in (("cc-o", "ScaleOut"), ("cc-i", "ScaleIn")):
        assert cluster.phase(ns, sc, kind) == "ScaleSucceeded", sc
    assert crashes >= 5, f"only {crashes} Workload writes were crashed after"


@pytest.mark.faults
def test_a_crash_at_every_write_of_a_shrink_and_its_growth_back_is_harmless(
    cluster: Cluster, ns: str
) -> None:
    """The preemption above, with the operator SIGKILLed right after every write it makes
    for the preempted job (its pods, status, host list, Workloads) and a new one taking over
    each time: the shrink happens once (the core's workers and the launcher are never
    touched, the job never leaves Running), no pod runs beyond Kueue's admission (sampled
    all along), and the job grows back to 4."""
    cq = make_queue(cluster, ns, pods=5, preempt=True)
    priorities(cluster, ns)
    cluster.create(with_priority(queued_job("low", replicas=4, minReplicas=2), ns, "low"), ns)
    wait_for(partial(running, cluster, ns, "low", 4), 90, "low running at 4")
    core = {p: uid(cluster, ns, p) for p in cluster.pods(ns, "low")
            if not surplus_pod(cluster, ns, p)}  # fmt: skip
    seen: set[str | None] = set()

    def at(size: int) -> bool:
        seen.add(cluster.phase(ns, "low"))
        return running(cluster, ns, "low", size) and all(
            uid(cluster, ns, p) == u for p, u in core.items()
        )

    def arm() -> Crash:
        ours = lambda _m, path, _b: "/low" in path or "trainingjob-low" in path
        return cluster.proxy.arm_crash(Crash(cluster.operator.kill, when=ours))

    high = with_priority(queued_job("high", replicas=1), ns, "high")
    steps: list[Step] = [
        (partial(cluster.create, high, ns),
         lambda: running(cluster, ns, "high", 1) and at(2)),
        (partial(cluster.finish, ns, "high-launcher", 0), partial(at, 4)),
    ]  # fmt: skip
    with QuotaWatch(cluster, ns, cq):
        crashes = crash_through(cluster, steps, arm)
    assert seen <= {"Running", "Scaling"}, seen
    assert cluster.status(ns, "low").get("restartCount") == 0
    assert crashes >= 4, f"only {crashes} writes were crashed after"


def uid(cluster: Cluster, ns: str, pod: str) -> str:
    return str(cluster.obj("Pod", ns, pod)["metadata"]["uid"])


def test_a_suspended_job_leaves_the_queue_and_queues_again_on_resume(
    cluster: Cluster, ns: str
) -> None:
    make_queue(cluster, ns, pods=3)
    cluster.create(queued_job("first"), ns)
    wait_for(partial(running, cluster, ns, "first", 2), 60, "first running")
    cluster.create(queued_job("second"), ns)
    wait_for(partial(queued, cluster, ns, "second"), 20, "second queued")
    suspend = {"spec": {"suspend": True}}
    cluster.api.patch(naming.JOB_KIND, ns, "first", suspend)
    wait_for(lambda: cluster.phase(ns, "first") == "Suspended", 20, "first suspended")
    # The Workload is written last in the pass that suspends (after the job and its pods).
    wait_for(lambda: [w["spec"]["active"] for w in live_workloads(cluster, ns, "first")]
             == [False], 10, "its Workload inactive")  # fmt: skip
    wait_for(partial(running, cluster, ns, "second", 2), 60, "second admitted in its place")
    assert cluster.pods(ns, "first") == []
    cluster.api.patch(naming.JOB_KIND, ns, "first", {"spec": {"suspend": False}})
    wait_for(partial(queued, cluster, ns, "first"), 20, "first queued again")
    cluster.finish(ns, "second-launcher", 0)
    wait_for(partial(running, cluster, ns, "first", 2), 60, "first running again")


def test_a_job_taken_out_of_its_queue_runs_and_its_workload_goes(cluster: Cluster, ns: str) -> None:
    make_queue(cluster, ns, pods=1)  # room for nothing of it
    cluster.create(queued_job("leaver"), ns)
    wait_for(lambda: len(live_workloads(cluster, ns, "leaver")) == 1, 20, "its Workload")
    wait_for(partial(queued, cluster, ns, "leaver"), 20, "queued")
    cluster.kubectl("label", "tj", "leaver", "-n", ns, f"{naming.LABEL_QUEUE}-")
    wait_for(partial(running, cluster, ns, "leaver", 2), 60, "running outside the queue")
    wait_for(lambda: workloads(cluster, ns) == [], 20, "its Workload deleted")
