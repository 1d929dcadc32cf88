"""The real operator process against the emulator and the simulated kubelet."""

from __future__ import annotations

import pytest

from tests.harness import Cluster, wait_for
from tests.integration.jobs import job

pytestmark = pytest.mark.integration


def running(cluster: Cluster, ns: str, name: str, workers: int = 2) -> None:
    wait_for(lambda: cluster.phase(ns, name) == "Running", 30, f"{name} Running")
    assert len(cluster.hosts(ns, name)) == workers


def test_creation_order_and_success(cluster: Cluster, ns: str) -> None:
    cluster.create(job("happy"), ns)
    # Children appear; the launcher only once both workers answer SSH with the job's key.
    wait_for(lambda: cluster.pods(ns, "happy", "worker") == ["happy-worker-0", "happy-worker-1"],
             20, "two workers")
    wait_for(lambda: cluster.pods(ns, "happy", "launcher"), 20, "the launcher")
    assert cluster.hosts(ns, "happy") == ["happy-worker-0", "happy-worker-1"]
    ready = cluster.condition(ns, "happy", "WorkersReady")
    assert ready is not None and ready["status"] == "True"
    running(cluster, ns, "happy")
    st = cluster.status(ns, "happy")
    assert st["currentWorkers"] == ["happy-worker-0", "happy-worker-1"]
    assert st["targetWorkers"] == ["happy-worker-0", "happy-worker-1"]
    for kind, obj in (("Secret", "happy"), ("ConfigMap", "happy-config"),
                      ("Service", "happy-worker-0"), ("Service", "happy-worker-1"),
                      ("ServiceAccount", "happy-launcher"), ("Role", "happy-launcher"),
                      ("RoleBinding", "happy-launcher")):
        got = cluster.api.get(kind, ns, obj)
        assert got is not None, f"{kind} {obj} missing"
        refs = got["metadata"]["ownerReferences"]
        assert refs[0]["kind"] == "TrainingJob" and refs[0]["controller"] is True
    cluster.kubelet.finish(ns, "happy-launcher", 0)
    wait_for(lambda: cluster.phase(ns, "happy") == "Succeeded", 20, "Succeeded")
    # cleanPodPolicy Running (the default): the still-running workers go, the launcher stays.
    wait_for(lambda: cluster.pods(ns, "happy", "worker") == [], 20, "workers cleaned up")
    assert cluster.pods(ns, "happy", "launcher") == ["happy-launcher"]
    assert "Succeeded" in cluster.event_reasons(ns, "happy")
