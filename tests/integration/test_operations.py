"""Preemption notices and Prometheus metrics, against the real operator process."""

from __future__ import annotations

import pytest

from localcluster.manifests import job, scaleout
from tests.harness import Cluster, wait_for
from tests.support.waits import running, scrape

pytestmark = pytest.mark.integration


def test_disruption_target_leaves_host_list_before_the_kill(cluster: Cluster, ns: str) -> None:
    cluster.create(job("spot", replicas=3, workerRestartPolicy="Always"), ns)
    running(cluster, ns, "spot", 3)
    cluster.disrupt(ns, "spot-worker-1")
    wait_for(lambda: "spot-worker-1" not in cluster.hosts(ns, "spot"), 5, "out of the list")
    cond = cluster.condition(ns, "spot", "WorkerPreempted")
    assert cond and cond["status"] == "True" and "DisruptionTarget" in cond["message"]
    # Replaced under a new index, as the restartPolicy asks.
    wait_for(
        lambda: cluster.hosts(ns, "spot") == ["spot-worker-0", "spot-worker-2", "spot-worker-3"],
        15,
        "replacement joined",
    )


def test_eviction_in_grace_period_leaves_host_list_at_once(cluster: Cluster, ns: str) -> None:
    cluster.create(job("evict", replicas=2), ns)
    running(cluster, ns, "evict")
    cluster.linger(ns, "evict-worker-1")  # it stays terminating until the test lets it go
    try:
        cluster.api.delete("Pod", ns, "evict-worker-1")  # e.g. a node drain's eviction
        wait_for(lambda: cluster.hosts(ns, "evict") == ["evict-worker-0"], 5, "out of the list")
        pod = cluster.obj("Pod", ns, "evict-worker-1")
        assert pod is not None and pod["metadata"]["deletionTimestamp"]  # still terminating
        assert cluster.phase(ns, "evict") == "Running"
    finally:
        cluster.unlinger(ns, "evict-worker-1")


def test_node_termination_taint(cluster: Cluster, ns: str) -> None:
    """worker-1 alone on a node that its cloud announces is going away: it leaves the host
    list at once and is replaced on the other node; worker-0 stays."""
    staying, leaving = cluster.node_names()
    cluster.kubectl("cordon", leaving)
    cluster.create(job("taint", replicas=1, maxReplicas=3, workerRestartPolicy="OnFailure"), ns)
    running(cluster, ns, "taint", 1)
    cluster.kubectl("uncordon", leaving)
    cluster.kubectl("cordon", staying)
    cluster.create(scaleout("second", "taint", 1), ns)
    wait_for(lambda: cluster.hosts(ns, "taint") == ["taint-worker-0", "taint-worker-1"], 20)
    assert cluster.obj("Pod", ns, "taint-worker-1")["spec"]["nodeName"] == leaving
    cluster.kubectl("uncordon", staying)
    taint = "cloud.google.com/impending-node-termination"
    cluster.kubectl("taint", "node", leaving, f"{taint}=:NoSchedule")
    try:
        wait_for(lambda: "taint-worker-1" not in cluster.hosts(ns, "taint"), 5, "out of the list")
        cond = cluster.condition(ns, "taint", "WorkerPreempted")
        assert cond and leaving in cond["message"]
        wait_for(lambda: cluster.hosts(ns, "taint") == ["taint-worker-0", "taint-worker-2"], 15)
        assert cluster.obj("Pod", ns, "taint-worker-2")["spec"]["nodeName"] == staying
    finally:
        cluster.kubectl("taint", "node", leaving, f"{taint}:NoSchedule-")


def test_metrics_move_with_the_world(cluster: Cluster, ns: str) -> None:
    before = scrape(cluster)

    def get(m: dict[str, float], k: str) -> float:
        return m.get(k, 0.0)

    ok = 'etoperator_scale_operations_total{kind="ScaleOut",result="succeeded"}'
    bad = 'etoperator_scale_operations_total{kind="ScaleOut",result="failed"}'
    cluster.create(job("met", replicas=1, maxReplicas=2, workerRestartPolicy="Always"), ns)
    running(cluster, ns, "met", 1)
    cluster.create(scaleout("met-up", "met", 1), ns)
    wait_for(lambda: cluster.phase(ns, "met-up", "ScaleOut") == "ScaleSucceeded", 20)
    cluster.create(scaleout("met-over", "met", 5), ns)
    wait_for(lambda: cluster.phase(ns, "met-over", "ScaleOut") == "ScaleFailed", 20)
    cluster.finish(ns, "met-worker-0", 1)
    wait_for(lambda: "met-worker-2" in cluster.hosts(ns, "met"), 20)
    after = scrape(cluster)
    assert get(after, ok) - get(before, ok) == 1
    assert get(after, bad) - get(before, bad) == 1
    assert get(after, "etoperator_workers_replaced_total") > get(
        before, "etoperator_workers_replaced_total"
    )
    assert (
        get(after, "etoperator_hostlist_updates_total")
        - get(before, "etoperator_hostlist_updates_total")
        >= 3
    )
    assert get(after, 'etoperator_scale_duration_seconds_count{kind="ScaleOut"}') > get(
        before, 'etoperator_scale_duration_seconds_count{kind="ScaleOut"}'
    )
    assert get(after, 'etoperator_jobs{phase="Running"}') >= 1
    assert get(after, "etoperator_reconciles_total") > get(before, "etoperator_reconciles_total")
