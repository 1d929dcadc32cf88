"""Quota that holds: through scale-ins, scale-outs, slices and preemptions, no pod runs
beyond what Kueue admitted, sampled every 0.2 s as Kueue counts it (localcluster/queues.py,
QuotaWatch): the pods' requests within the ClusterQueue's reservation, no worker of a job that
holds no admission."""

from __future__ import annotations

from functools import partial

import pytest
import yaml

from etoperator import naming
from localcluster.manifests import scalein, scaleout
from localcluster.queues import (
    KUEUE,
    QuotaWatch,
    admitted_workers,
    live_workloads,
    make_queue,
    queued_job,
    reserved,
)
from tests.harness import Cluster, wait_for

pytestmark = pytest.mark.integration
SO, SI = naming.SCALEOUT_KIND, naming.SCALEIN_KIND


def running(cluster: Cluster, ns: str, name: str, workers: int) -> bool:
    return cluster.phase(ns, name) == "Running" and len(cluster.hosts(ns, name)) == workers


def queued(cluster: Cluster, ns: str, name: str) -> bool:
    return cluster.phase(ns, name) == "Queued" and bool(live_workloads(cluster, ns, name))


def scaling_says(cluster: Cluster, ns: str, scaler: str, reason: str) -> bool:
    return reason in str(cluster.condition(ns, scaler, "Scaling", SO))


def priorities(cluster: Cluster, ns: str) -> None:
    for name, value in (("low", 10), ("high", 1000)):
        body = {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass",
                "metadata": {"name": f"{name}-{ns}"}, "value": value}  # fmt: skip
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))


def test_a_scale_out_after_a_scale_in_asks_kueue_again(cluster: Cluster, ns: str) -> None:
    """The ScaleIn lowers the Workload's count in place and Kueue gives that quota to another
    job; the admission still records the old count, which was read as room: the ScaleOut
    back up added its worker without asking Kueue (200m of pods in a queue of 150m)."""
    cq = make_queue(cluster, ns, pods=3, millicpu=50)
    with QuotaWatch(cluster, ns, cq):
        cluster.create(queued_job("a", millicpu=50, minReplicas=1, maxReplicas=2), ns)
        wait_for(partial(running, cluster, ns, "a", 2), 60, "a running at 2")
        cluster.create(scalein("a-less", "a", count=1), ns)
        wait_for(lambda: cluster.phase(ns, "a-less", SI) == "ScaleSucceeded", 30, "a shrunk")
        wait_for(lambda: reserved(cluster, cq) == 100, 20, "a's quota given back")
        cluster.create(queued_job("b", replicas=1, millicpu=25), ns)
        wait_for(partial(running, cluster, ns, "b", 1), 60, "b admitted into the room")
        cluster.create(scaleout("a-more", "a", 1, timeout=300), ns)
        wait_for(partial(scaling_says, cluster, ns, "a-more", "WaitingForQuota"), 20, "waits")
        assert cluster.pods(ns, "a", role="worker") == ["a-worker-0"]
        cluster.finish(ns, "b-launcher", 0)
        wait_for(lambda: cluster.phase(ns, "a-more", SO) == "ScaleSucceeded", 60, "a grown")
        wait_for(partial(running, cluster, ns, "a", 2), 10, "a running at 2 again")
        assert admitted_workers(cluster, ns, "a") == 2


def test_a_grown_job_preempted_runs_nothing_until_admitted_again(cluster: Cluster, ns: str) -> None:
    """A job grown through a slice, then preempted: the Workload the slice replaced (finished
    by Kueue) was read as an admission, and the job ran new workers at once beside the
    preemptor (300m of pods in a queue of 200m)."""
    cq = make_queue(cluster, ns, pods=4, preempt=True, millicpu=50)
    priorities(cluster, ns)
    with QuotaWatch(cluster, ns, cq):
        low = queued_job("low", millicpu=50, maxReplicas=3)
        low["metadata"]["labels"][naming.LABEL_KUEUE_PRIORITY] = f"low-{ns}"
        cluster.create(low, ns)
        wait_for(partial(running, cluster, ns, "low", 2), 60, "low running")
        cluster.create(scaleout("low-more", "low", 1, timeout=120), ns)
        wait_for(lambda: cluster.phase(ns, "low-more", SO) == "ScaleSucceeded", 60, "grown")
        high = queued_job("high", millicpu=50)
        high["metadata"]["labels"][naming.LABEL_KUEUE_PRIORITY] = f"high-{ns}"
        cluster.create(high, ns)
        wait_for(partial(running, cluster, ns, "high", 2), 60, "high running")
        assert cluster.phase(ns, "low") == "Queued" and cluster.pods(ns, "low") == []
        # While high runs, low stays without a pod (sampled throughout by the watch).
        wait_for(lambda: cluster.pods(ns, "low", live=False) == [], 20, "low's pods gone")
        cluster.finish(ns, "high-launcher", 0)
        wait_for(partial(running, cluster, ns, "low", 3), 90, "low running again, at 3")


def test_a_deleted_waiting_scale_out_takes_its_slice_at_once(cluster: Cluster, ns: str) -> None:
    """Its deletion was noticed only at the job's next resync (51-58 s): its slice waited in
    the queue meanwhile, and the job said it was scaling."""
    cq = make_queue(cluster, ns, pods=3)
    with QuotaWatch(cluster, ns, cq):
        cluster.create(queued_job("full", maxReplicas=3), ns)
        wait_for(partial(running, cluster, ns, "full", 2), 60, "running")
        cluster.create(scaleout("more", "full", 1, timeout=300), ns)
        wait_for(lambda: len(live_workloads(cluster, ns, "full")) == 3, 20, "its slice made")
        cluster.kubectl("delete", "scaleout", "more", "-n", ns, "--wait=false")
        wait_for(lambda: len(live_workloads(cluster, ns, "full")) == 2, 2, "its slice gone")
        wait_for(lambda: not cluster.status(ns, "full").get("currentScaler"), 2, "no scale")
        scaling = cluster.condition(ns, "full", "Scaling") or {}
        assert scaling.get("status") == "False", scaling
        assert running(cluster, ns, "full", 2)


def test_an_eviction_ends_a_waiting_scale_out_and_the_job_says_so(
    cluster: Cluster, ns: str
) -> None:
    """After an eviction ended a ScaleOut, the job kept Scaling=True naming it."""
    cq = make_queue(cluster, ns, pods=3, preempt=True)
    priorities(cluster, ns)
    with QuotaWatch(cluster, ns, cq):
        low = queued_job("low", maxReplicas=3)
        low["metadata"]["labels"][naming.LABEL_KUEUE_PRIORITY] = f"low-{ns}"
        cluster.create(low, ns)
        wait_for(partial(running, cluster, ns, "low", 2), 60, "low running")
        cluster.create(scaleout("low-more", "low", 1, timeout=300), ns)
        wait_for(partial(scaling_says, cluster, ns, "low-more", "WaitingForQuota"), 20, "waits")
        high = queued_job("high", replicas=1)
        high["metadata"]["labels"][naming.LABEL_KUEUE_PRIORITY] = f"high-{ns}"
        cluster.create(high, ns)
        wait_for(lambda: cluster.phase(ns, "low-more", SO) == "ScaleFailed", 30, "ended")
        wait_for(partial(running, cluster, ns, "high", 1), 60, "high running")
        scaling = cluster.condition(ns, "low", "Scaling") or {}
        assert scaling.get("status") == "False", scaling
        assert not cluster.status(ns, "low").get("currentScaler")


def test_a_deleted_job_holds_its_quota_until_its_pods_are_gone(cluster: Cluster, ns: str) -> None:
    """`kubectl delete tj` while its workers take their time to end (a preStop of 30 s): its
    Workloads went with the job (the garbage collector took them within 21 s), Kueue admitted
    the next job into the quota, and its pods ran beside the deleted one's (in the Torchrun
    suite: "high-worker-0 runs, job high holds no admission"). Now they go once its last pod
    has, with the operator down meanwhile (the garbage collector keeps them)."""
    cq = make_queue(cluster, ns, pods=3)
    slow = queued_job("a", replicas=2)
    pod = slow["spec"]["etReplicaSpecs"]["worker"]["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = 45
    pod["containers"][0]["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", "30"]}}}
    with QuotaWatch(cluster, ns, cq):
        cluster.create(slow, ns)
        wait_for(partial(running, cluster, ns, "a", 2), 60, "a running at 2")
        cluster.create(queued_job("b", replicas=1), ns)
        wait_for(partial(queued, cluster, ns, "b"), 30, "b queued behind a")
        cluster.operator.kill()  # the garbage collector alone keeps the quota, and frees it
        cluster.kubectl("delete", "tj", "a", "-n", ns, "--wait=false")
        wait_for(lambda: not cluster.pods(ns, "a", live=False), 90, "a's pods gone")
        wait_for(lambda: not live_workloads(cluster, ns, "a"), 30, "a's Workloads gone after")
        cluster.operator.start()
        wait_for(partial(running, cluster, ns, "b", 1), 120, "b admitted once a's pods are gone")
