"""Two replicas with leader election: exactly one acts, the standby writes nothing, and killing
the leader mid-scale hands over without a duplicate pod or a scaler run twice."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from localcluster.cluster import OperatorProcess
from tests.harness import Cluster, wait_for
from tests.support.manifests import job, scaleout
from tests.support.waits import running

pytestmark = pytest.mark.integration
LEASE_NS = "etoperator-system"
WRITES = {"create", "update", "patch", "delete", "deletecollection"}


@pytest.fixture
def replicas(cluster: Cluster) -> Iterator[dict[str, OperatorProcess]]:
    """The session's operator makes way for two replicas that elect a leader."""
    election = ["--leader-election", "--lease-namespace", LEASE_NS]
    try:
        with cluster.operators_instead(["replica-a", "replica-b"], election) as pair:
            yield pair
    finally:
        cluster.api.delete("Lease", LEASE_NS, "etoperator")


def holder(cluster: Cluster) -> str:
    lease = cluster.api.get("Lease", LEASE_NS, "etoperator") or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def writes_by(cluster: Cluster, identity: str) -> list[str]:
    """Writes of one replica, the election's own (the Lease) aside."""
    return [
        f"{ev['verb']} {ev['requestURI']}"
        for ev in cluster.cp.audit()
        if ev.get("verb") in WRITES
        and ev.get("userAgent", "").startswith(f"etoperator/{identity}")
        and (ev.get("objectRef") or {}).get("resource") != "leases"
    ]


def test_the_standby_takes_over_a_scale_when_the_leader_dies(
    cluster: Cluster, ns: str, replicas: dict[str, OperatorProcess]
) -> None:
    leader = wait_for(lambda: holder(cluster), 20, "a leader")
    (standby,) = [name for name in replicas if name != leader]
    cluster.create(job("ha", replicas=2, maxReplicas=4), ns)
    running(cluster, ns, "ha")
    cluster.hold()
    cluster.create(scaleout("grow", "ha", 1, timeout=120), ns)
    wait_for(lambda: cluster.status(ns, "grow", "ScaleOut").get("addPods"), 10, "plan frozen")
    assert writes_by(cluster, leader), "the leader acted"
    assert writes_by(cluster, standby) == []  # the standby only watched
    replicas[leader].kill()
    killed = time.monotonic()
    cluster.release()
    wait_for(lambda: holder(cluster) == standby, 20, "the standby leads")
    wait_for(lambda: cluster.phase(ns, "grow", "ScaleOut") == "ScaleSucceeded", 20)
    took = time.monotonic() - killed
    print(f"hand-over: the scale finished {took:.1f} s after the leader was killed")
    assert cluster.pods(ns, "ha", "worker") == ["ha-worker-0", "ha-worker-1", "ha-worker-2"]
    assert cluster.status(ns, "ha")["lastWorkerIndex"] == 2
    assert cluster.status(ns, "grow", "ScaleOut")["addPods"] == ["ha-worker-2"]  # planned once
    assert writes_by(cluster, standby), "the new leader acted"
    # The Lease's Role is all they used of it (RBAC is enforced: more would have been refused).
    verbs = {
        ev["verb"]
        for ev in cluster.cp.audit()
        if (ev.get("objectRef") or {}).get("resource") == "leases"
        and ev.get("userAgent", "").startswith("etoperator/")
    }
    assert verbs == {"create", "get", "patch"}, verbs
